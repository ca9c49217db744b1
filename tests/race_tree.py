"""A real race: one thread swaps files and folders for symlinks to an outside folder while
apply, rollback, recovery and code-plan execution run on the same tree.

``run_race(tmp, seconds)`` builds a team root and a project root beside an ``outside`` folder
that mirrors their names (so a write that followed a symlink would land on a file there), runs
the two threads for ``seconds`` and returns what happened: operations completed, operations
refused with a named error, anything else raised, swaps made, and the files of ``outside``
that changed (by SHA-256 of every file, and the set of names). Used by the test suite and by
``benchmarks/bench_confinement_race.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiny_project import make_project

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.apply import prepare, record_intent
from agentmend.infrastructure.changes.protocol.team_registry import team_id
from agentmend.infrastructure.code_update.updater import CodeUpdater, FileOperation
from agentmend.infrastructure.errors import AgentmendError
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.principal import ChangeAuthor
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.store.api import Store
from agentmend.roles.code_review import CodeReviewer

WRITER = b"---\nname: writer\ndescription: writes\n---\nold prompt\n"


@dataclass
class RaceResult:
    seconds: float = 0.0
    completed: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    swaps: int = 0
    outside_changed: list[str] = field(default_factory=list)

    @property
    def operations(self) -> int:
        return sum(self.completed.values()) + sum(self.refused.values())


def tree_hashes(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (symlinks not followed): file hash, or its kind."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                out[rel] = f"symlink {os.readlink(path)}"
            elif path.is_file():
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def _build(tmp: Path) -> tuple[Path, Path, Path]:
    team, project, outside = tmp / "team", tmp / "proj", tmp / "outside"
    (team / "agents" / "writer" / "docs").mkdir(parents=True)
    (team / "agents" / "writer.md").write_bytes(WRITER)
    (team / "agents" / "writer" / "docs" / "style.md").write_text("be brief\n")
    make_project(project)
    # the outside folder holds every name a redirected write could reach
    for rel in ("writer.md", "style.md", "__init__.py", "agentmend.lock", "docs/style.md"):
        (outside / rel).parent.mkdir(parents=True, exist_ok=True)
        (outside / rel).write_text(f"outside {rel}\n")
    (outside / "backups").mkdir()
    return team, project, outside


class _Swapper(threading.Thread):
    """Keeps replacing one of ``targets`` by a symlink to ``outside``, then putting it back."""

    def __init__(self, targets: list[Path], outside: Path, stop: threading.Event, seed: int):
        super().__init__(daemon=True)
        self.targets, self.outside, self.stop, self.rng = (
            targets,
            outside,
            stop,
            random.Random(seed),
        )
        self.swaps = 0
        self.errors: list[str] = []

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            target = self.rng.choice(self.targets)
            link_to = self.outside / target.name if target.suffix else self.outside
            stash = target.with_name(f"{target.name}.stash{n}")
            link = target.with_name(f"{target.name}.link{n}")
            n += 1
            try:
                os.symlink(link_to, link)
                try:
                    os.rename(target, stash)
                except FileNotFoundError:
                    stash = Path()
                try:
                    os.rename(link, target)  # the swap
                    self.swaps += 1
                except OSError:
                    os.unlink(link)
                time.sleep(self.rng.random() * 0.002)
            except OSError as exc:
                self.errors.append(f"swap {target}: {exc}")
            finally:
                self._restore(target, stash)
            time.sleep(self.rng.random() * 0.004)  # windows in which work gets through

    @staticmethod
    def _restore(target: Path, stash: Path) -> None:
        with contextlib.suppress(OSError):
            if target.is_symlink():
                os.unlink(target)
        if stash != Path() and (stash.exists() or stash.is_symlink()):
            with contextlib.suppress(OSError):
                os.rename(stash, target)  # fails if the worker made a new one meanwhile: keep it


def _action(new_value: str) -> ImprovementAction:
    return ImprovementAction(
        target_agent="writer",
        action_type=ChangeType.PROMPT_MODIFICATION,
        confidence_score=0.9,
        new_value=new_value,
    )


def _attempt(
    result: RaceResult, name: str, call: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """Run one operation: it completes, or it is refused with a named error (AgentmendError)."""
    try:
        value = call(*args, **kwargs)
    except AgentmendError as exc:
        result.refused[f"{name}: {type(exc).__name__}"] += 1
        return None
    except Exception as exc:  # the race looks for exactly these
        result.unexpected.append(f"{name}: {type(exc).__name__}: {exc}")
        return None
    result.completed[name] += 1
    return value


def _work(
    manager: ImprovementManager,
    updater: CodeUpdater,
    team: Path,
    stop: threading.Event,
    result: RaceResult,
) -> None:
    loop = asyncio.new_event_loop()
    n = 0
    try:
        while not stop.is_set():
            n += 1
            entries = [
                (_action("a"), "agents/writer.md", WRITER + f"edit {n}\n".encode()),
                (_action("d"), "agents/writer/docs/style.md", f"style {n}\n"),
            ]
            records = _attempt(result, "apply", manager.apply_group, entries, root=team)
            if records:
                cid = records[0].change_id
                _attempt(result, "rollback", manager.rollback_by_id, cid, force=True, reason="r")
            _attempt(result, "recovery", _interrupted_apply, manager, team, n)
            edit = FileOperation(path="calc/__init__.py", operation="modify", content=f"X={n}\n")
            plan = _attempt(result, "plan", updater.create_plan, f"edit {n}", [edit])
            if plan is None:
                continue
            _attempt(result, "approve", updater.approve, plan.plan_id)
            executed = _attempt(
                result, "execute", loop.run_until_complete, updater.execute(plan.plan_id)
            )
            if executed is not None and executed.status == "completed":
                _attempt(result, "plan rollback", updater.rollback, plan.plan_id, reason="r")
    finally:
        loop.close()


def _interrupted_apply(manager: ImprovementManager, team: Path, n: int) -> None:
    """An apply that stopped after writing its files (as a killed writer leaves it), recovered."""
    items = prepare([(_action("r"), "agents/writer.md", f"half {n}\n")], team)
    root = team.resolve()
    protocol = manager.protocol
    with confined.locked(root, ".agent/agentmend.lock"):
        record_intent(
            protocol.changes, protocol.audit, items, root, team=team_id(root, manager.store),
            group_id=None, session_id="race", author=ChangeAuthor(via="race"),
        )  # fmt: skip
        for item in items:
            confined.write_or_delete(root, item.target, item.new)
    manager.recover()


def run_race(tmp: Path, seconds: float, *, seed: int = 11) -> RaceResult:
    """Race the swapper against the worker for ``seconds``; see the module docstring."""
    team, project, outside = _build(tmp)
    before = tree_hashes(outside)
    settings = Settings.model_validate(
        {"test_command": (sys.executable, "-c", "pass"), "test_timeout_s": 30.0}
    )
    targets = [
        team / "agents",
        team / "agents" / "writer.md",
        team / "agents" / "writer",
        team / "agents" / "writer" / "docs",
        team / "agents" / "writer" / "docs" / "style.md",
        team / ".agent",
        team / ".agent" / "backups",
        team / ".agent" / "agentmend.lock",
        project / "calc",
        project / "calc" / "__init__.py",
        project / ".agent",
    ]
    result = RaceResult()
    stop = threading.Event()
    with ImprovementManager(
        store=Store(tmp / "ws" / "agentmend.db"), max_improvements_per_session=10**9
    ) as manager:
        updater = CodeUpdater(
            project, manager=manager, reviewer=CodeReviewer(None), settings=settings
        )
        swapper = _Swapper(targets, outside, stop, seed)
        started = time.perf_counter()
        swapper.start()
        worker = threading.Thread(
            target=_work, args=(manager, updater, team, stop, result), daemon=True
        )
        worker.start()
        time.sleep(seconds)
        stop.set()
        worker.join(60)
        swapper.join(10)
        result.seconds = time.perf_counter() - started
        result.swaps = swapper.swaps
        manager.store.close()
    after = tree_hashes(outside)
    result.outside_changed = sorted(
        rel for rel in before.keys() | after.keys() if before.get(rel) != after.get(rel)
    )
    return result
