"""How agentmend handles a folder of real agent files: load, byte-exact save, minimal diffs.

For every ``*.md`` in the folder (``README.md`` skipped) it loads the file, saves it unchanged
(the bytes must not move), makes one change of each kind and counts the lines each diff removes
and adds, then applies two changes through the change machinery and rolls them back (the bytes
must come back). A diff is minimal when it touches only the changed key's lines: a one-line
value is one line out and one in, a list gains or loses one line (block) or has its one line
rewritten (flow or comma string), a new setting adds the ``agentmend:`` block, and a prompt
change leaves the front matter bytes alone. When the folder has a ``MANIFEST.tsv`` whose sixth
column says what Claude Code makes of each file (``ok`` or ``invalid:<field>``), agreement with
it is counted too.

    python benchmarks/check_agent_files.py FOLDER
"""

from __future__ import annotations

import argparse
import difflib
import logging
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentmend.infrastructure.changes.effectors import group_entries, plan_change
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.definitions.spec import AgentSpec, SpecWarning, load_agent_specs
from agentmend.infrastructure.errors import AgentmendError, SpecError
from agentmend.infrastructure.models import ChangeType, ImprovementAction


@dataclass
class Row:
    """One file's results."""

    file: str
    loaded: bool = False
    problem: str = ""
    exact: bool = False
    diffs: dict[str, tuple[int, int]] = field(default_factory=dict)
    minimal: dict[str, bool] = field(default_factory=dict)
    rolled_back: bool = False


def _changed(old: str, new: str) -> tuple[int, int]:
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    removed = added = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            removed += i2 - i1
            added += j2 - j1
    return removed, added


def _block_lines(text: str, key: str) -> int:
    """How many lines the top-level ``key`` spans in the front matter."""
    lines = text.split("\n")
    end = next(i for i in range(1, len(lines)) if lines[i].rstrip() == "---")
    count = 0
    for line in lines[1:end]:
        if count and (line[:1] in (" ", "\t", "-") or not line.strip()):
            count += 1
        elif count:
            break
        elif line.startswith(f"{key}:"):
            count = 1
    return count


def _check(path: Path) -> Row:
    row = Row(path.name)
    text = path.read_bytes().decode("utf-8")
    try:
        spec = AgentSpec.from_markdown(text, path)
    except SpecError as exc:
        row.problem = f"{exc.field}: {exc.problem}"
        return row
    row.loaded = True
    row.exact = spec.to_markdown() == text
    tools = spec.tools
    changes: dict[str, dict[str, Any]] = {
        "description": {"description": "Use this agent when: asked. Examples: a diff."},
        "model": {"model": "opus" if spec.model != "opus" else "haiku"},
        "max_tokens": {"max_tokens": 999},
        "prompt": {"system_prompt": spec.system_prompt + "\n\nOne more line."},
    }
    if tools is not None:
        changes["tools+"] = {"tools": (*tools, "mcp__check__probe")}
    if tools:
        changes["tools-"] = {"tools": tools[:-1]}
    described = _block_lines(text, "description")
    for kind, values in changes.items():
        new = spec.with_changes(**values).to_markdown()
        removed, added = row.diffs[kind] = _changed(text, new)
        end = text.index("---", 3)
        row.minimal[kind] = {
            "description": (removed, added) == (described, 1),
            "model": removed <= 1 and added == 1,
            "max_tokens": removed == 0 and added <= 2,
            "prompt": new[:end] == text[:end],
            "tools+": removed <= 1 and added == 1,
            "tools-": removed == 1 and added <= 1,
        }[kind]
    row.rolled_back = _rolls_back(path, spec)
    return row


def _rolls_back(path: Path, spec: AgentSpec) -> bool:
    """Apply a prompt, a model and a tools change one after another, roll all back, compare."""
    wanted: list[tuple[ChangeType, str, Any]] = [
        (ChangeType.PROMPT_MODIFICATION, "system_prompt", {"append": "Be brief."}),
        (ChangeType.MODEL_CHANGE, "model", "opus" if spec.model != "opus" else "haiku"),
    ]
    if spec.tools is not None:
        wanted.append((ChangeType.TOOL_PERMISSION_CHANGE, "tools", {"add": ["mcp__check__probe"]}))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "team"
        root.mkdir()
        target = root / f"{spec.path_name}.md"
        target.write_bytes(path.read_bytes())
        change_ids = []
        try:
            with ImprovementManager(Path(tmp) / "state" / "history.db") as manager:
                for kind, field_name, value in wanted:
                    action = ImprovementAction(
                        target_agent=spec.name,
                        action_type=kind,
                        target_field=field_name,
                        new_value=value,
                        confidence_score=0.9,
                        rationale="corpus check",
                    )
                    change = plan_change(
                        action,
                        root=root,
                        specs=load_agent_specs(root),
                        available_models=("opus", "haiku"),
                    )
                    records = manager.apply_group(group_entries(change), root=root)
                    change_ids.append(records[0].change_id)
                changed = target.read_bytes() != path.read_bytes()
                for change_id in reversed(change_ids):
                    manager.rollback_by_id(change_id, reason="corpus check")
        except AgentmendError:
            return False
        return changed and target.read_bytes() == path.read_bytes()


def _manifest(folder: Path) -> dict[str, str]:
    manifest = folder / "MANIFEST.tsv"
    if not manifest.is_file():
        return {}
    rows = [line.split("\t") for line in manifest.read_text().splitlines()]
    return {row[0]: row[5] for row in rows if len(row) > 5 and not row[0].startswith("#")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    folder: Path = args.folder
    expected = _manifest(folder)
    paths = sorted(p for p in folder.glob("*.md") if p.name.lower() != "readme.md")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        rows = [_check(path) for path in paths]
    kinds = ["description", "model", "tools+", "tools-", "max_tokens", "prompt"]
    print(f"{'file':58} load exact " + " ".join(f"{k:>11}" for k in kinds) + " rollback")
    for row in rows:
        if not row.loaded:
            print(f"{row.file[:58]:58} no   {row.problem[:90]}")
            continue
        cells = []
        for kind in kinds:
            if kind not in row.diffs:
                cells.append(f"{'n/a':>11}")
                continue
            removed, added = row.diffs[kind]
            mark = "" if row.minimal[kind] else "!"
            cells.append(f"{f'-{removed}/+{added}{mark}':>11}")
        print(
            f"{row.file[:58]:58} yes  {'yes' if row.exact else 'NO':5} "
            + " ".join(cells)
            + f" {'yes' if row.rolled_back else 'NO'}"
        )
    loaded = [row for row in rows if row.loaded]
    print()
    print(f"files: {len(rows)}")
    print(f"loaded: {len(loaded)}")
    print(f"saved byte-exact: {sum(row.exact for row in loaded)} of {len(loaded)}")
    print(
        f"minimal diff for every kind of change: "
        f"{sum(all(row.minimal.values()) for row in loaded)} of {len(loaded)}"
    )
    for kind in kinds:
        tried = [row for row in loaded if kind in row.minimal]
        print(f"  {kind:11} minimal: {sum(row.minimal[kind] for row in tried)} of {len(tried)}")
    print(f"rolled back byte-exact: {sum(row.rolled_back for row in loaded)} of {len(loaded)}")
    if expected:
        agree = sum(row.loaded == (expected.get(row.file) == "ok") for row in rows)
        claude_ok = sum(value == "ok" for value in expected.values())
        print(f"Claude Code loads (MANIFEST.tsv): {claude_ok}; agentmend agrees on {agree}")


if __name__ == "__main__":
    main()
