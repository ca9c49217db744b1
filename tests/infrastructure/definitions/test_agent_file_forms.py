"""Agent files in every form Claude Code reads: load, byte-exact save, minimal diffs, rollback.

The fixtures (``tests/fixtures/agent_files/``, listed in ``agent_file_fixtures.py``) cover front
matter that is not strict YAML (unquoted ``: `` in one-line values, tab indentation), CRLF,
flow/block/comma lists with and without quotes, empty lists, comments, dotted and non-Latin
names and a file with no final newline. ``test_claude_code_agreement.py`` checks the same files
against the bundled Claude Code CLI.
"""

from __future__ import annotations

import difflib
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_file_fixtures import EXPECTED, FIXTURES, INVALID, VALID, Reads, Refused, fixture_text

from agentmend.infrastructure.changes.effectors import group_entries, plan_change
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.definitions.claude_compat import lenient_text
from agentmend.infrastructure.definitions.names import name_problem, path_name
from agentmend.infrastructure.definitions.spec import (
    AgentSpec,
    PermissionProfile,
    SpecWarning,
    load_agent_specs,
)
from agentmend.infrastructure.errors import SpecError
from agentmend.infrastructure.models import ChangeType, ImprovementAction

NEW_DESCRIPTION = "Use this agent when: asked to check. Examples: a diff."


def load(text: str) -> AgentSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)  # 'color' and 'skills' are known; be safe
        return AgentSpec.from_markdown(text)


def changed_lines(old: str, new: str) -> tuple[list[str], list[str]]:
    """The lines removed from ``old`` and added in ``new`` (line breaks kept)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    removed: list[str] = []
    added: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            removed += a[i1:i2]
            added += b[j1:j2]
    return removed, added


def reads(file_name: str) -> Reads:
    expected = EXPECTED[file_name]
    assert isinstance(expected, Reads)
    return expected


# -- load, save, AgentDefinition --------------------------------------------------------------


def test_the_fixtures_are_the_files_the_table_lists() -> None:
    assert {path.name for path in FIXTURES.glob("*.md")} == set(EXPECTED)


@pytest.mark.parametrize("file_name", VALID)
def test_each_form_loads_as_claude_code_reads_it(file_name: str) -> None:
    expected = reads(file_name)
    spec = load(fixture_text(file_name))
    assert (spec.name, spec.description, spec.tools, spec.model, spec.system_prompt) == (
        expected.name,
        expected.description,
        expected.tools,
        expected.model,
        expected.prompt,
    )
    definition = spec.to_agent_definition()
    assert definition.description == expected.description
    assert definition.prompt == expected.prompt
    assert definition.tools == (list(expected.tools) if expected.tools is not None else None)
    assert definition.model == expected.model


@pytest.mark.parametrize("file_name", VALID)
def test_an_unchanged_spec_saves_byte_for_byte(tmp_path: Path, file_name: str) -> None:
    path = tmp_path / file_name
    shutil.copyfile(FIXTURES / file_name, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        AgentSpec.from_file(path).save()
    assert path.read_bytes() == (FIXTURES / file_name).read_bytes()


@pytest.mark.parametrize("file_name", INVALID)
def test_what_claude_code_refuses_is_refused_naming_file_and_field(
    tmp_path: Path, file_name: str
) -> None:
    expected = EXPECTED[file_name]
    assert isinstance(expected, Refused)
    path = tmp_path / file_name
    shutil.copyfile(FIXTURES / file_name, path)
    with pytest.raises(SpecError) as caught:
        AgentSpec.from_file(path)
    assert caught.value.field == expected.field
    assert str(path) in str(caught.value)
    assert path.read_bytes() == (FIXTURES / file_name).read_bytes()


# -- one change, one line ---------------------------------------------------------------------

# what adding WebFetch and dropping the first tool do to each file's tools lines
TOOLS_ADDED: dict[str, tuple[list[str], list[str]]] = {
    "block-mixed.md": ([], ["  - WebFetch\n"]),
    "colon-description.md": (["tools: Read, Grep\n"], ["tools: Read, Grep, WebFetch\n"]),
    "comma-quoted.md": (['tools: "Read,Grep,Glob"\n'], ['tools: "Read,Grep,Glob,WebFetch"\n']),
    "comments.md": (
        ["tools: Read, Grep   # read-only on purpose\n"],
        ["tools: Read, Grep, WebFetch   # read-only on purpose\n"],
    ),
    "crlf.md": (["tools: Read, Write\r\n"], ["tools: Read, Write, WebFetch\r\n"]),
    "dotted-name.md": (["tools: Read, Bash\n"], ["tools: Read, Bash, WebFetch\n"]),
    "examples-description.md": (["tools: Read, Bash\n"], ["tools: Read, Bash, WebFetch\n"]),
    "flow-double-quoted.md": (
        ['tools: ["Read", "Grep", "Glob"]\n'],
        ['tools: ["Read", "Grep", "Glob", "WebFetch"]\n'],
    ),
    "flow-empty.md": (["tools: []\n"], ["tools: [WebFetch]\n"]),
    "flow-single-quoted.md": (
        ["tools: [ 'Read', 'Grep' ]\n"],
        ["tools: [ 'Read', 'Grep', 'WebFetch' ]\n"],
    ),
    "no-final-newline.md": (["tools: [Read]\n"], ["tools: [Read, WebFetch]\n"]),
    "non-latin-name.md": (["tools: Read, Edit\n"], ["tools: Read, Edit, WebFetch\n"]),
    "tab-indented.md": ([], ["\t- WebFetch\n"]),
    "yaml12-scalars.md": (["tools: Read\n"], ["tools: Read, WebFetch\n"]),
}
FIRST_TOOL_REMOVED: dict[str, tuple[list[str], list[str]]] = {
    "block-mixed.md": (["  - Read\n"], []),
    "comma-quoted.md": (['tools: "Read,Grep,Glob"\n'], ['tools: "Grep,Glob"\n']),
    "flow-double-quoted.md": (['tools: ["Read", "Grep", "Glob"]\n'], ['tools: ["Grep", "Glob"]\n']),
    "flow-single-quoted.md": (["tools: [ 'Read', 'Grep' ]\n"], ["tools: [ 'Grep' ]\n"]),
    "no-final-newline.md": (["tools: [Read]\n"], ["tools: []\n"]),
    "tab-indented.md": (["\t- Read\n"], []),
    "yaml12-scalars.md": (["tools: Read\n"], ["tools: ''\n"]),
}


@pytest.mark.parametrize("file_name", VALID)
def test_a_tool_added_keeps_the_lists_style(file_name: str) -> None:
    text = fixture_text(file_name)
    spec = load(text)
    assert spec.tools is not None
    changed = spec.with_changes(tools=(*spec.tools, "WebFetch"))
    new_text = changed.to_markdown()
    assert changed_lines(text, new_text) == TOOLS_ADDED[file_name]
    assert load(new_text) == changed


@pytest.mark.parametrize("file_name", sorted(FIRST_TOOL_REMOVED))
def test_a_tool_removed_keeps_the_lists_style(file_name: str) -> None:
    text = fixture_text(file_name)
    spec = load(text)
    assert spec.tools
    changed = spec.with_changes(tools=spec.tools[1:])
    new_text = changed.to_markdown()
    assert changed_lines(text, new_text) == FIRST_TOOL_REMOVED[file_name]
    assert load(new_text) == changed


def _key_line(text: str, key: str) -> str:
    return next(line for line in text.splitlines(keepends=True) if line.startswith(f"{key}:"))


@pytest.mark.parametrize("file_name", VALID)
@pytest.mark.parametrize(
    ("field", "key", "value"),
    [
        ("description", "description", NEW_DESCRIPTION),
        ("model", "model", "claude-haiku-4-5"),
    ],
)
def test_a_scalar_change_is_one_line_that_strict_yaml_and_claude_code_both_read(
    file_name: str, field: str, key: str, value: str
) -> None:
    text = fixture_text(file_name)
    changed = load(text).with_changes(**{field: value})
    new_text = changed.to_markdown()
    removed, added = changed_lines(text, new_text)
    assert removed == [_key_line(text, key)]
    assert len(added) == 1
    line = added[0]
    # the new line reads the same as strict YAML and through Claude Code's repair
    content = line.split(" #", 1)[0].rstrip() if file_name == "comments.md" else line
    assert yaml.safe_load(content) == {key: value}
    assert yaml.safe_load(lenient_text(content.rstrip("\r\n"), lambda _: False)) == {key: value}
    assert load(new_text) == changed


@pytest.mark.parametrize("file_name", VALID)
def test_a_setting_adds_only_the_agentmend_block(file_name: str) -> None:
    text = fixture_text(file_name)
    changed = load(text).with_changes(max_tokens=512)
    new_text = changed.to_markdown()
    newline = "\r\n" if "\r\n" in text else "\n"
    assert changed_lines(text, new_text) == (
        [],
        [f"agentmend:{newline}", f"  max_tokens: 512{newline}"],
    )
    assert load(new_text) == changed


@pytest.mark.parametrize("file_name", VALID)
def test_a_prompt_change_leaves_the_front_matter_bytes(file_name: str) -> None:
    text = fixture_text(file_name)
    spec = load(text)
    changed = spec.with_changes(system_prompt=spec.system_prompt + "\n\nBe brief.")
    new_text = changed.to_markdown()
    end = text.index("---", 3)
    assert new_text[:end] == text[:end]
    removed, added = changed_lines(text, new_text)
    assert len(removed) <= 1  # the last line, when the file has no final newline
    assert [line.rstrip("\r\n") for line in added][-2:] == ["", "Be brief."]
    assert load(new_text) == changed


def test_any_list_valued_key_keeps_its_style_even_inside_the_profile() -> None:
    text = (
        "---\n"
        "name: lists\n"
        "description: Lists everywhere.\n"
        "disallowedTools: ['Bash']\n"
        "agentmend:\n"
        "  permission_profile:\n"
        '    allow: ["Read", "Grep"]   # read only\n'
        "    deny:\n"
        "      - Bash\n"
        "  max_tokens: 100\n"
        "---\n"
        "Hi.\n"
    )
    spec = load(text)
    changed = spec.with_changes(
        permission_profile=PermissionProfile(
            allow=("Read", "Grep", "WebFetch"), deny=("Bash", "Write")
        ),
        extra={"disallowedTools": ["Bash", "Write"]},
    )
    new_text = changed.to_markdown()
    assert changed_lines(text, new_text) == (
        ["disallowedTools: ['Bash']\n", '    allow: ["Read", "Grep"]   # read only\n'],
        [
            "disallowedTools: ['Bash', 'Write']\n",
            '    allow: ["Read", "Grep", "WebFetch"]   # read only\n',
            "      - Write\n",
        ],
    )
    assert load(new_text) == changed


def test_a_file_that_needs_the_repair_keeps_its_repaired_lines_when_others_change() -> None:
    text = fixture_text("examples-description.md")
    changed = load(text).with_changes(model="claude-haiku-4-5", tools=("Read",))
    new_text = changed.to_markdown()
    assert _key_line(new_text, "description") == _key_line(text, "description")
    assert changed_lines(text, new_text) == (
        ["tools: Read, Bash\n", "model: opus\n"],
        ["tools: Read\n", "model: claude-haiku-4-5\n"],
    )
    assert load(new_text) == changed


def test_a_comment_that_the_repair_would_swallow_is_not_kept() -> None:
    # in a file only the repair reads, 'model: x  # note' would read as the model "x  # note"
    text = "---\nname: swallow\ndescription: Use when: asked\nmodel: haiku  # cheap\n---\nHi.\n"
    spec = load(text)
    assert spec.model == "haiku  # cheap"  # as Claude Code reads it
    changed = spec.with_changes(model="sonnet")
    new_text = changed.to_markdown()
    assert changed_lines(text, new_text) == (["model: haiku  # cheap\n"], ["model: sonnet\n"])
    assert load(new_text).model == "sonnet"


# -- exact rollback through the change machinery -----------------------------------------------


def _team(tmp_path: Path) -> Path:
    root = tmp_path / "team"
    root.mkdir()
    for file_name in VALID:
        shutil.copyfile(FIXTURES / file_name, root / file_name)
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.relative_to(root).as_posix().startswith(".agent")
    }


def _action(agent: str, kind: ChangeType, field: str, value: Any) -> ImprovementAction:
    return ImprovementAction(
        action_type=kind,
        target_agent=agent,
        target_field=field,
        new_value=value,
        confidence_score=0.9,
        rationale="fixture change",
    )


def test_changes_to_every_form_apply_and_roll_back_exactly(tmp_path: Path) -> None:
    root = _team(tmp_path)
    before = _snapshot(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        specs = load_agent_specs(root)
        assert sorted(specs) == sorted(reads(name).name for name in VALID)
        entries = []
        for name in specs:
            for kind, field, value in (
                (ChangeType.TOOL_PERMISSION_CHANGE, "tools", {"add": ["WebFetch"]}),
                (ChangeType.DOCS_EDIT, "docs/notes.md", "Notes.\n"),
            ):
                change = plan_change(
                    _action(name, kind, field, value),
                    root=root,
                    specs=specs,
                    available_models=("claude-haiku-4-5",),
                )
                entries.extend(group_entries(change))
        with ImprovementManager(tmp_path / "state" / "history.db") as manager:
            records = manager.apply_group(entries, root=root)
            after = load_agent_specs(root)
            for name, spec in after.items():
                assert spec.tools is not None, name
                assert spec.tools[-1] == "WebFetch", name
                assert spec.docs == (("docs/notes.md", "Notes.\n"),), name
            assert (root / "重构助手" / "docs" / "notes.md").is_file()
            assert (root / "shell-5.1-expert" / "docs" / "notes.md").is_file()
            assert manager.rollback_by_id(records[0].change_id, reason="test")
    assert _snapshot(root) == before


# -- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("powershell-5.1-expert", None),
        ("重构", None),
        ("Code_Reviewer", None),
        ("a" * 256, None),
        ("😀" * 128, None),  # 256 UTF-16 units
        ("😀" * 129, "at most 256"),
        ("", "empty"),
        ("-lead", "'-'"),
        ("team:lead", "':'"),
        ("team\uff1alead", "':'"),  # a fullwidth colon is ':' once NFKC-normalised
    ],
)
def test_names_follow_claude_codes_rule(name: str, problem: str | None) -> None:
    found = name_problem(name)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


@pytest.mark.parametrize(
    "name", ["powershell-5.1-expert", "重构", "Code_Reviewer", "two words", "a.b"]
)
def test_a_safe_name_is_its_own_path_form(name: str) -> None:
    assert path_name(name) == name


@pytest.mark.parametrize("name", ["a/b", "a\\b", "..", ".hidden", "x?", "tab\there", "end."])
def test_an_unsafe_name_gets_a_distinct_safe_path_form(name: str) -> None:
    form = path_name(name)
    assert form != name
    assert not any(char in form for char in '/\\?*<>|"\t')
    assert not form.startswith(".")
    assert form != path_name(name + "x")
    assert Path(form).name == form


def test_an_unsafe_name_keeps_its_docs_and_definition_inside_the_team(tmp_path: Path) -> None:
    root = tmp_path / "team"
    root.mkdir()
    text = "---\nname: ops/deploy\ndescription: Deploys.\n---\nYou deploy.\n"
    form = path_name("ops/deploy")
    (root / f"{form}.md").write_text(text)
    (root / form / "docs").mkdir(parents=True)
    (root / form / "docs" / "runbook.md").write_text("Roll forward.\n")
    spec = load_agent_specs(root)["ops/deploy"]
    assert spec.path_name == form
    assert spec.docs == (("docs/runbook.md", "Roll forward.\n"),)
    change = plan_change(
        _action("ops/deploy", ChangeType.DOCS_EDIT, "docs/more.md", "More.\n"),
        root=root,
        specs={"ops/deploy": spec},
        available_models=(),
    )
    assert change.edits[0].path == f"{form}/docs/more.md"


# -- the repair rule itself -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "repaired"),
    [
        ("description: Use when: asked", 'description: "Use when: asked"'),
        ('description: say "hi": now', 'description: "say \\"hi\\": now"'),
        ("description: a\\b: c", 'description: "a\\\\b: c"'),
        ("description: C# and F#", 'description: "C# and F#"'),
        ("model: sonnet  # fast", 'model: "sonnet  # fast"'),
        ('description: "already: quoted"', 'description: "already: quoted"'),
        ("tools: [Read, Grep]", "tools: [Read, Grep]"),
        ("description: plain words", "description: plain words"),
        ("maxTurns2: 5: 6", "maxTurns2: 5: 6"),  # a digit in the key: not matched
        ("  nested: a: b", "  nested: a: b"),  # indented: not matched
        ("description: Use when: asked\r", "description: Use when: asked\r"),  # CRLF
        ("\t- Read", "  - Read"),
        ("\t\tdeep: x", "    deep: x"),
    ],
)
def test_the_repair_matches_claude_codes_rule(line: str, repaired: str) -> None:
    def parses_as_list(value: str) -> bool:
        return isinstance(yaml.safe_load(value), list)

    assert lenient_text(line, parses_as_list) == repaired


def test_a_fence_inside_the_front_matter_is_refused_naming_the_key() -> None:
    text = "---\nname: fence\ndescription: before --- after\n---\nBody.\n"
    with pytest.raises(SpecError) as caught:
        load(text)
    assert caught.value.field == "description"
    assert "---" in caught.value.problem
