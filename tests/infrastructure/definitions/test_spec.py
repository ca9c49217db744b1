"""AgentSpec files: loading, byte-exact round trips, surgical saves, docs, and every bad input."""

from __future__ import annotations

import difflib
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentmend.infrastructure.definitions.spec import (
    AGENTMEND_KEYS,
    AgentSpec,
    PermissionProfile,
    SpecWarning,
    load_agent_specs,
)
from agentmend.infrastructure.errors import SpecError
from agentmend.infrastructure.frozen import FrozenDict

REVIEWER = """\
---
# Reviews code changes before they are merged.
name: code-reviewer
description: "Expert code reviewer. Use proactively after code changes."
tools: Read, Grep, Glob   # read-only on purpose
model: claude-sonnet-4-6
maxTurns: 12

color: blue
agentmend:
  temperature: 0.2   # low: reviews should be repeatable
  # raised after truncated reviews
  max_tokens: 1024
---

You are a senior code reviewer.

Check for:
- correctness
- naming
"""

QUOTED = """\
---
name: 'researcher'
description: >
  Digs through the code base
  and reports: what, where, why.
tools:
  - Read
  - "Bash(git log:*)"
model: "claude-haiku-4-5"
permissionMode: plan
skills: [summarise, cite]
---
Research carefully.
Quote 'exactly' and "precisely": with colons.
"""

NO_TRAILING_NEWLINE = """\
---
name: terse
description: Answers in one line.
agentmend: {max_tokens: 64, permission_profile: locked}
---
Be terse."""

CRLF = (
    "---\r\n"
    "name: windows-agent\r\n"
    "description: Written on Windows.\r\n"
    "tools:\r\n"
    "- Read\r\n"
    "- Write\r\n"
    "agentmend:\r\n"
    "    timeout_s: 30\r\n"
    "---\r\n"
    "\r\n"
    "Line one.\r\n"
    "Line two.\r\n"
)

NO_BODY = """\
---
name: empty-body
description: |
  Has no system prompt.
  # this line is text, not a comment
---
"""

SAMPLES = {
    "reviewer": REVIEWER,
    "quoted": QUOTED,
    "no_trailing_newline": NO_TRAILING_NEWLINE,
    "crlf": CRLF,
    "no_body": NO_BODY,
}


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_bytes(text.encode("utf-8"))
    return path


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


# ---------------------------------------------------------------- loading and round trips


def test_reviewer_loads_every_field(tmp_path: Path) -> None:
    spec = AgentSpec.from_file(write(tmp_path, "reviewer.md", REVIEWER))
    assert spec.name == "code-reviewer"
    assert spec.description == "Expert code reviewer. Use proactively after code changes."
    assert spec.tools == ("Read", "Grep", "Glob")
    assert spec.model == "claude-sonnet-4-6"
    assert spec.max_turns == 12
    assert spec.temperature == 0.2
    assert spec.max_tokens == 1024
    assert spec.timeout_s is None
    assert spec.permission_profile == "standard"
    assert spec.extra == {"color": "blue"}
    assert spec.system_prompt.startswith("You are a senior code reviewer.\n\nCheck for:")
    assert spec.system_prompt.endswith("- naming")
    assert spec.source_path == tmp_path / "reviewer.md"


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_unchanged_spec_saves_its_original_bytes(tmp_path: Path, sample: str) -> None:
    text = SAMPLES[sample]
    path = write(tmp_path, f"{sample}.md", text)
    spec = AgentSpec.from_file(path)
    assert spec.to_markdown() == text
    spec.save()
    assert path.read_bytes() == text.encode("utf-8")
    copy = spec.save(tmp_path / "copy.md")
    assert copy.read_bytes() == text.encode("utf-8")


def test_odd_quoting_and_crlf_parse_to_plain_values() -> None:
    quoted = AgentSpec.from_markdown(QUOTED)
    assert quoted.name == "researcher"
    assert quoted.description == "Digs through the code base and reports: what, where, why.\n"
    assert quoted.tools == ("Read", "Bash(git log:*)")
    assert quoted.extra == {"permissionMode": "plan", "skills": ("summarise", "cite")}
    crlf = AgentSpec.from_markdown(CRLF)
    assert crlf.tools == ("Read", "Write")
    assert crlf.timeout_s == 30.0
    assert crlf.system_prompt == "Line one.\nLine two."
    terse = AgentSpec.from_markdown(NO_TRAILING_NEWLINE)
    assert (terse.max_tokens, terse.permission_profile, terse.system_prompt) == (
        64,
        "locked",
        "Be terse.",
    )
    assert AgentSpec.from_markdown(NO_BODY).system_prompt == ""


def test_tools_as_list_and_as_comma_string_are_the_same() -> None:
    as_list = "---\nname: a\ndescription: d\ntools:\n  - Read\n  - Grep\n---\n"
    as_flow = "---\nname: a\ndescription: d\ntools: [Read, Grep]\n---\n"
    as_string = "---\nname: a\ndescription: d\ntools: Read,Grep ,\n---\n"
    specs = [AgentSpec.from_markdown(text) for text in (as_list, as_flow, as_string)]
    assert {spec.tools for spec in specs} == {("Read", "Grep")}
    undeclared = AgentSpec.from_markdown("---\nname: a\ndescription: d\n---\n")
    assert undeclared.tools is None


def test_equality_ignores_the_remembered_source() -> None:
    loaded = AgentSpec.from_markdown(NO_TRAILING_NEWLINE)
    built = AgentSpec(
        name="terse",
        description="Answers in one line.",
        system_prompt="Be terse.",
        max_tokens=64,
        permission_profile="locked",
    )
    assert loaded == built
    assert loaded != built.with_changes(max_tokens=65)


def test_spec_built_in_code_renders_a_file_that_loads_back(tmp_path: Path) -> None:
    spec = AgentSpec(
        name="planner",
        description="Plans work.",
        tools=("Read", "Grep"),
        model="claude-opus-4-6",
        max_turns=5,
        system_prompt="Plan first.\n\nThen act.",
        temperature=0.0,
        permission_profile=PermissionProfile(allow=("Read",), deny=("Bash",)),
        extra=FrozenDict({"color": "green"}),
    )
    path = spec.save(tmp_path / "planner.md")
    text = path.read_text()
    assert text.startswith("---\nname: planner\n")
    assert text.endswith("---\n\nPlan first.\n\nThen act.\n")
    assert AgentSpec.from_file(path) == spec.with_changes(source_path=path)


# ---------------------------------------------------------------- surgical edits


@pytest.mark.parametrize(
    ("changes", "removed", "added"),
    [
        ({"max_tokens": 4096}, ["  max_tokens: 1024\n"], ["  max_tokens: 4096\n"]),
        (
            {"temperature": 0.5},
            ["  temperature: 0.2   # low: reviews should be repeatable\n"],
            ["  temperature: 0.5   # low: reviews should be repeatable\n"],
        ),
        ({"timeout_s": 90.0}, [], ["  timeout_s: 90.0\n"]),
        ({"max_tokens": None}, ["  max_tokens: 1024\n"], []),
        (
            {"tools": ("Read", "Bash")},
            ["tools: Read, Grep, Glob   # read-only on purpose\n"],
            ["tools: Read, Bash   # read-only on purpose\n"],
        ),
        (
            {"model": "claude-haiku-4-5"},
            ["model: claude-sonnet-4-6\n"],
            ["model: claude-haiku-4-5\n"],
        ),
        ({"max_turns": 30}, ["maxTurns: 12\n"], ["maxTurns: 30\n"]),
        ({"max_turns": None}, ["maxTurns: 12\n"], []),
        ({"extra": {"color": "red"}}, ["color: blue\n"], ["color: red\n"]),
        ({"extra": {"color": "blue", "memory": "project"}}, [], ["memory: project\n"]),
        (
            {"permission_profile": {"allow": ["Read"], "deny": ["Bash"]}},
            [],
            [
                "  permission_profile:\n",
                "    allow:\n",
                "      - Read\n",
                "    deny:\n",
                "      - Bash\n",
            ],
        ),
        (
            {"system_prompt": "Review for security only."},
            ["You are a senior code reviewer.\n", "\n", "Check for:\n", "- correctness\n"],
            ["Review for security only.\n"],
        ),
    ],
)
def test_a_change_rewrites_only_its_own_lines(
    tmp_path: Path, changes: dict[str, Any], removed: list[str], added: list[str]
) -> None:
    path = write(tmp_path, "reviewer.md", REVIEWER)
    changed = AgentSpec.from_file(path).with_changes(**changes)
    changed.save()
    new_text = path.read_text()
    got_removed, got_added = changed_lines(REVIEWER, new_text)
    if "system_prompt" in changes:
        # the body's last line also goes; what matters is that the front matter is untouched
        assert new_text.startswith(REVIEWER.split("\n\nYou are")[0])
        assert new_text == REVIEWER.split("You are")[0] + "Review for security only.\n"
    else:
        assert (got_removed, got_added) == (removed, added)
    assert AgentSpec.from_file(path) == changed


def test_settings_block_is_added_at_the_end_when_absent() -> None:
    spec = AgentSpec.from_markdown(QUOTED).with_changes(max_tokens=2048, permission_profile="open")
    text = spec.to_markdown()
    removed, added = changed_lines(QUOTED, text)
    assert removed == []
    assert added == ["agentmend:\n", "  max_tokens: 2048\n", "  permission_profile: open\n"]
    assert text.index("agentmend:") > text.index("skills:")
    assert AgentSpec.from_markdown(text) == spec


def test_removing_the_last_setting_removes_the_block() -> None:
    crlf = AgentSpec.from_markdown(CRLF)
    text = crlf.with_changes(timeout_s=None).to_markdown()
    assert changed_lines(CRLF, text) == (["agentmend:\r\n", "    timeout_s: 30\r\n"], [])


def test_crlf_file_keeps_crlf_and_its_indentation() -> None:
    spec = AgentSpec.from_markdown(CRLF).with_changes(
        max_tokens=100, tools=("Read",), system_prompt="One.\nTwo."
    )
    text = spec.to_markdown()
    assert "\n" not in text.replace("\r\n", "")
    assert "    max_tokens: 100\r\n" in text
    assert text.endswith("---\r\n\r\nOne.\r\nTwo.\r\n")
    assert AgentSpec.from_markdown(text) == spec


def test_flow_style_settings_are_rewritten_as_one_block() -> None:
    spec = AgentSpec.from_markdown(NO_TRAILING_NEWLINE).with_changes(max_tokens=128)
    text = spec.to_markdown()
    assert changed_lines(NO_TRAILING_NEWLINE, text) == (
        ["agentmend: {max_tokens: 64, permission_profile: locked}\n"],
        ["agentmend:\n", "  max_tokens: 128\n", "  permission_profile: locked\n"],
    )
    assert AgentSpec.from_markdown(text) == spec


def test_layout_the_editor_does_not_know_falls_back_to_a_redump() -> None:
    # valid YAML, but the whole mapping is indented: no line-level edit is attempted
    text = "---\n  name: odd\n  description: Indented.\n  color: red\n---\n\nBody stays.\n"
    spec = AgentSpec.from_markdown(text).with_changes(max_tokens=10, description="Fixed.")
    new_text = spec.to_markdown()
    assert new_text.endswith("---\n\nBody stays.\n")
    assert new_text.index("name:") < new_text.index("description:") < new_text.index("color:")
    assert AgentSpec.from_markdown(new_text) == spec


def test_block_list_tools_are_rewritten_as_a_block() -> None:
    spec = AgentSpec.from_markdown(QUOTED).with_changes(tools=("Read", "Grep", "Glob"))
    expected = QUOTED.replace('  - "Bash(git log:*)"\n', "  - Grep\n  - Glob\n")
    assert spec.to_markdown() == expected


def test_block_scalar_with_hash_lines_is_replaced_whole() -> None:
    spec = AgentSpec.from_markdown(NO_BODY).with_changes(description="Short now.")
    text = spec.to_markdown()
    assert "# this line is text" not in text
    assert AgentSpec.from_markdown(text) == spec


def test_body_only_change_leaves_the_front_matter_bytes() -> None:
    spec = AgentSpec.from_markdown(NO_BODY).with_changes(system_prompt="Now it has one.")
    text = spec.to_markdown()
    assert text == NO_BODY + "\nNow it has one.\n"
    terse = AgentSpec.from_markdown(NO_TRAILING_NEWLINE).with_changes(system_prompt="Be brief.")
    assert terse.to_markdown() == NO_TRAILING_NEWLINE.replace("Be terse.", "Be brief.")


def test_chained_changes_stay_surgical_against_the_file() -> None:
    spec = AgentSpec.from_markdown(REVIEWER).with_changes(max_tokens=2000)
    spec = spec.with_changes(max_tokens=1024, temperature=0.3)
    removed, added = changed_lines(REVIEWER, spec.to_markdown())
    assert [line.split("#")[0].strip() for line in removed] == ["temperature: 0.2"]
    assert [line.split("#")[0].strip() for line in added] == ["temperature: 0.3"]


_SETTING_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.none() | st.floats(min_value=0, max_value=1),
        "max_tokens": st.none() | st.integers(min_value=1, max_value=10**9),
        "timeout_s": st.none()
        | st.floats(min_value=0, max_value=1e9, exclude_min=True, allow_infinity=False),
        "permission_profile": st.sampled_from(["locked", "standard", "open"])
        | st.builds(
            PermissionProfile,
            allow=st.lists(st.sampled_from(["Read", "Grep", "Bash(git *)", "Write"])),
            deny=st.lists(st.sampled_from(["Bash", "WebFetch", "mcp__x__y"])),
        ),
        "evals": st.none() | st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
    },
)


def _outside_settings(text: str) -> list[str]:
    """The file's lines with the ``agentmend:`` block taken out."""
    kept: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        if line.startswith("agentmend:"):
            inside = True
        elif inside and line.strip() and not line.startswith((" ", "\t")):
            inside = False
        if not inside:
            kept.append(line)
    return kept


def _settings_lines(text: str) -> list[str]:
    outside = _outside_settings(text)
    return [line for line in text.splitlines(keepends=True) if line not in outside]


@settings(max_examples=60, deadline=None)
@given(base=st.sampled_from([REVIEWER, QUOTED, CRLF]), changes=_SETTING_CHANGES)
def test_random_setting_changes_round_trip_and_touch_only_the_settings(
    base: str, changes: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = write(Path(directory), "agent.md", base)
        changed = AgentSpec.from_file(path).with_changes(**changes)
        changed.save()
        assert AgentSpec.from_file(path) == changed
        text = path.read_bytes().decode("utf-8")
    assert _outside_settings(text) == _outside_settings(base)
    original = AgentSpec.from_markdown(base)
    for line in base.splitlines(keepends=True):
        key = line.strip().split(":")[0]
        if line.startswith(" ") and key in changes and getattr(original, key) == changes[key]:
            assert line in text  # a setting set to the value it had keeps its exact line
    for line in _settings_lines(base):
        key = line.strip().split(":")[0]
        if key in AGENTMEND_KEYS and key not in changes:
            assert line in text  # an untouched setting keeps its exact line
    if all(getattr(original, key) == getattr(changed, key) for key in changes):
        assert text == base


# ---------------------------------------------------------------- warnings and errors


def test_unknown_top_level_key_is_kept_with_a_warning(tmp_path: Path) -> None:
    text = "---\nname: a\ndescription: d\nowner: team-x  # who to ask\ncolor: red\n---\nHi.\n"
    path = write(tmp_path, "a.md", text)
    with pytest.warns(SpecWarning, match="owner") as caught:
        spec = AgentSpec.from_file(path)
    assert len(caught) == 1  # `color` is a Claude Code key: no warning
    assert spec.extra == {"owner": "team-x", "color": "red"}
    assert spec.to_markdown() == text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        changed = spec.with_changes(extra={"owner": "team-y", "color": "red"})
    assert changed_lines(text, changed.to_markdown()) == (
        ["owner: team-x  # who to ask\n"],
        ["owner: team-y  # who to ask\n"],
    )


MALFORMED = [
    ("no front matter", "name: a\n", None, "front_matter"),
    ("unclosed", "---\nname: a\ndescription: d\n", None, "front_matter"),
    ("bad yaml", "---\nname: a\ndescription: Use when\n  asked: twice\n---\n", None, "description"),
    ("not a mapping", "---\n- a\n- b\n---\n", None, "front_matter"),
    ("duplicate key", "---\nname: a\ndescription: d\nname: b\n---\n", None, "name"),
    ("missing name", "---\ndescription: d\n---\n", None, "name"),
    ("missing description", "---\nname: a\n---\n", None, "description"),
    ("empty description", "---\nname: a\ndescription: ''\n---\n", None, "description"),
    ("name with colon", "---\nname: team:lead\ndescription: d\n---\n", None, "name"),
    ("name with dash first", "---\nname: -lead\ndescription: d\n---\n", None, "name"),
    ("name too long", "---\nname: " + "a" * 257 + "\ndescription: d\n---\n", None, "name"),
    ("name not a string", "---\nname: 42\ndescription: d\n---\n", None, "name"),
    ("tools of numbers", "---\nname: a\ndescription: d\ntools: [1, 2]\n---\n", None, "tools"),
    ("tools a mapping", "---\nname: a\ndescription: d\ntools: {a: 1}\n---\n", None, "tools"),
    ("maxTurns zero", "---\nname: a\ndescription: d\nmaxTurns: 0\n---\n", None, "maxTurns"),
    ("maxTurns text", "---\nname: a\ndescription: d\nmaxTurns: '5'\n---\n", None, "maxTurns"),
    ("model empty", "---\nname: a\ndescription: d\nmodel: ''\n---\n", None, "model"),
    ("settings a list", "---\nname: a\ndescription: d\nagentmend: [1]\n---\n", None, "agentmend"),
    ("unknown setting", "x\nagentmend:\n  top_p: 0.9\n", "x", "agentmend.top_p"),
    ("temperature high", "x\nagentmend:\n  temperature: 1.5\n", "x", "agentmend.temperature"),
    ("temperature text", "x\nagentmend:\n  temperature: '0.5'\n", "x", "agentmend.temperature"),
    ("max_tokens zero", "x\nagentmend:\n  max_tokens: 0\n", "x", "agentmend.max_tokens"),
    ("max_tokens float", "x\nagentmend:\n  max_tokens: 10.5\n", "x", "agentmend.max_tokens"),
    ("max_tokens bool", "x\nagentmend:\n  max_tokens: true\n", "x", "agentmend.max_tokens"),
    ("timeout inf", "x\nagentmend:\n  timeout_s: .inf\n", "x", "agentmend.timeout_s"),
    ("timeout negative", "x\nagentmend:\n  timeout_s: -1\n", "x", "agentmend.timeout_s"),
    (
        "profile name",
        "x\nagentmend:\n  permission_profile: admin\n",
        "x",
        "agentmend.permission_profile",
    ),
    (
        "profile key",
        "x\nagentmend:\n  permission_profile: {allow: [Read], ask: [Bash]}\n",
        "x",
        "agentmend.permission_profile.ask",
    ),
    (
        "profile entries",
        "x\nagentmend:\n  permission_profile: {allow: [1]}\n",
        "x",
        "agentmend.permission_profile.allow",
    ),
    ("evals number", "x\nagentmend:\n  evals: 3\n", "x", "agentmend.evals"),
    ("permissionMode", "x\npermissionMode: yolo\n", "x", "permissionMode"),
    ("background text", "x\nbackground: 'yes'\n", "x", "background"),
]


@pytest.mark.parametrize(
    ("text", "prefix", "field"),
    [pytest.param(text, prefix, field, id=case) for case, text, prefix, field in MALFORMED],
)
def test_malformed_file_names_file_and_field(
    tmp_path: Path, text: str, prefix: str | None, field: str
) -> None:
    if prefix is not None:  # a valid head followed by the bad lines
        text = "---\nname: a\ndescription: d\n" + text.removeprefix(prefix + "\n") + "---\n"
    path = write(tmp_path, "bad.md", text)
    with pytest.raises(SpecError) as caught:
        AgentSpec.from_file(path)
    assert caught.value.path == str(path)
    assert caught.value.field == field
    assert str(path) in str(caught.value)
    assert field in str(caught.value)
    assert caught.value.problem


def test_unreadable_and_non_utf8_files_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.md"
    with pytest.raises(SpecError, match=r"missing\.md"):
        AgentSpec.from_file(missing)
    latin = tmp_path / "latin.md"
    latin.write_bytes(b"---\nname: a\ndescription: caf\xe9\n---\n")
    with pytest.raises(SpecError, match="UTF-8") as caught:
        AgentSpec.from_file(latin)
    assert caught.value.path == str(latin)


def test_with_changes_validates_and_names_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, "reviewer.md", REVIEWER)
    spec = AgentSpec.from_file(path)
    with pytest.raises(SpecError) as caught:
        spec.with_changes(max_tokens=-5)
    assert (caught.value.path, caught.value.field) == (str(path), "agentmend.max_tokens")
    with pytest.raises(SpecError) as caught:
        spec.with_changes(top_p=0.9)
    assert caught.value.field == "top_p"
    with pytest.raises(SpecError) as caught:
        spec.with_changes(extra={"model": "x"})
    assert caught.value.field == "extra"
    assert spec.max_tokens == 1024  # the original is untouched
    assert path.read_text() == REVIEWER


def test_save_without_a_path_is_refused() -> None:
    spec = AgentSpec(name="a", description="d")
    with pytest.raises(SpecError, match="source_path"):
        spec.save()


# ---------------------------------------------------------------- docs


def test_docs_are_appended_inside_agent_docs(tmp_path: Path) -> None:
    write(tmp_path, "reviewer.md", REVIEWER)
    docs = tmp_path / "code-reviewer" / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "README.md").write_text("Start here.\n")
    (docs / "architecture.md").write_text("Three layers.")
    (docs / "guides" / "style.md").write_text("Short names.\n\n")
    (docs / ".hidden.md").write_text("not shown")
    (docs / "logo.bin").write_bytes(b"\x89PNG\x00\x00\xff")
    spec = AgentSpec.from_file(tmp_path / "reviewer.md")
    assert [path for path, _ in spec.docs] == [
        "docs/README.md",
        "docs/architecture.md",
        "docs/guides/style.md",
    ]
    assert spec.full_system_prompt == (
        spec.system_prompt + "\n\n<agent_docs>\n# docs/README.md\nStart here.\n\n"
        "# docs/architecture.md\nThree layers.\n\n"
        "# docs/guides/style.md\nShort names.\n</agent_docs>"
    )
    assert spec.to_markdown() == REVIEWER  # docs are not part of the file


def test_no_docs_means_the_plain_prompt(tmp_path: Path) -> None:
    spec = AgentSpec.from_file(write(tmp_path, "reviewer.md", REVIEWER))
    assert spec.docs == ()
    assert spec.full_system_prompt == spec.system_prompt


def test_docs_symlinks_that_escape_are_ignored(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "secrets").mkdir(parents=True)
    (outside / "secret.md").write_text("TOKEN=1")
    (outside / "secrets" / "more.md").write_text("TOKEN=2")
    definitions = tmp_path / "agents"
    docs = definitions / "code-reviewer" / "docs"
    docs.mkdir(parents=True)
    write(definitions, "reviewer.md", REVIEWER)
    (docs / "real.md").write_text("Real doc.")
    (docs / "inside-link.md").symlink_to(docs / "real.md")
    (docs / "leak.md").symlink_to(outside / "secret.md")
    (docs / "leak-dir").symlink_to(outside / "secrets", target_is_directory=True)
    spec = AgentSpec.from_file(definitions / "reviewer.md")
    assert spec.docs == (("docs/inside-link.md", "Real doc."), ("docs/real.md", "Real doc."))
    assert "TOKEN" not in spec.full_system_prompt


def test_docs_folder_that_is_a_symlink_out_is_ignored(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("TOKEN=3")
    definitions = tmp_path / "agents"
    (definitions / "code-reviewer").mkdir(parents=True)
    (definitions / "code-reviewer" / "docs").symlink_to(outside, target_is_directory=True)
    write(definitions, "reviewer.md", REVIEWER)
    assert AgentSpec.from_file(definitions / "reviewer.md").docs == ()


# ---------------------------------------------------------------- directories and saving


def test_load_agent_specs_reads_a_directory(tmp_path: Path) -> None:
    write(tmp_path, "reviewer.md", REVIEWER)
    write(tmp_path, "quoted.md", QUOTED)
    write(tmp_path, "README.md", "# Our agents\n\nNo front matter here.\n")
    (tmp_path / "nested").mkdir()
    write(tmp_path / "nested", "deep.md", "---\nname: deep\ndescription: d\n---\n")
    write(tmp_path, "notes.txt", "not an agent")
    specs = load_agent_specs(tmp_path)
    assert sorted(specs) == ["code-reviewer", "researcher"]
    assert specs["researcher"].source_path == tmp_path / "quoted.md"


def test_load_agent_specs_refuses_a_file_without_front_matter(tmp_path: Path) -> None:
    write(tmp_path, "reviewer.md", REVIEWER)
    plain = write(tmp_path, "notes.md", "# Just notes\n")
    with pytest.raises(SpecError) as caught:
        load_agent_specs(tmp_path)
    assert (caught.value.path, caught.value.field) == (str(plain), "front_matter")


def test_duplicate_names_name_both_files(tmp_path: Path) -> None:
    first = write(tmp_path, "a-reviewer.md", REVIEWER)
    second = write(tmp_path, "b-reviewer.md", REVIEWER.replace("maxTurns: 12", "maxTurns: 3"))
    with pytest.raises(SpecError) as caught:
        load_agent_specs(tmp_path)
    assert caught.value.field == "name"
    assert caught.value.path == str(second)
    assert str(first) in str(caught.value)


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such directory") as caught:
        load_agent_specs(tmp_path / "nope")
    assert caught.value.path == str(tmp_path / "nope")


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = write(tmp_path, "reviewer.md", REVIEWER)
    os.chmod(path, 0o640)
    spec = AgentSpec.from_file(path)
    for tokens in (2048, 4096, 1024):
        spec.with_changes(max_tokens=tokens).save()
    assert sorted(os.listdir(tmp_path)) == ["reviewer.md"]
    assert path.read_text() == REVIEWER
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_failed_render_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = write(tmp_path, "reviewer.md", REVIEWER)
    spec = AgentSpec.from_file(path).with_changes(extra={"color": "blue", "weird": complex(1, 2)})
    with pytest.raises(SpecError):
        spec.save()
    assert path.read_text() == REVIEWER
    assert sorted(os.listdir(tmp_path)) == ["reviewer.md"]


# ---------------------------------------------------------------- the SDK


def test_to_agent_definition(tmp_path: Path) -> None:
    text = REVIEWER.replace(
        "color: blue\n",
        "color: blue\ndisallowedTools: Write, Edit\nskills: [review]\npermissionMode: plan\n",
    )
    write(tmp_path, "reviewer.md", text)
    (tmp_path / "code-reviewer" / "docs").mkdir(parents=True)
    (tmp_path / "code-reviewer" / "docs" / "README.md").write_text("House rules.")
    spec = AgentSpec.from_file(tmp_path / "reviewer.md")
    definition = spec.to_agent_definition()
    assert definition.description == spec.description
    assert definition.prompt == spec.full_system_prompt
    assert "<agent_docs>\n# docs/README.md\nHouse rules.\n</agent_docs>" in definition.prompt
    assert definition.tools == ["Read", "Grep", "Glob"]
    assert definition.model == "claude-sonnet-4-6"
    assert definition.maxTurns == 12
    assert definition.disallowedTools == ["Write", "Edit"]
    assert definition.skills == ["review"]
    assert definition.permissionMode == "plan"
    bare = AgentSpec(name="bare", description="d").to_agent_definition()
    assert (bare.tools, bare.model, bare.maxTurns) == (None, None, None)


_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
_ANY_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "name": st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True)
        | st.sampled_from(["shell-5.1-expert", "重构助手", "Code Reviewer", "ops/deploy", "yes"]),
        "description": _TEXT.filter(str.strip),
        "tools": st.none()
        | st.lists(st.sampled_from(["Read", "Grep", "Bash(git diff:*)", "a, b", "mcp__s__t"])),
        "model": st.none() | st.sampled_from(["claude-haiku-4-5", "opus", "inherit"]),
        "max_turns": st.none() | st.integers(min_value=1, max_value=1000),
        "system_prompt": _TEXT,
        "max_tokens": st.none() | st.integers(min_value=1, max_value=10**6),
        "extra": st.dictionaries(
            st.sampled_from(["owner", "x-note", "ticket"]),  # keys Claude Code does not type
            st.none() | st.booleans() | st.integers() | _TEXT | st.lists(_TEXT, max_size=3),
            max_size=3,
        ),
    },
)


@settings(max_examples=40, deadline=None)
@given(base=st.sampled_from(sorted(SAMPLES.values())), changes=_ANY_CHANGES)
def test_any_change_loads_back_as_intended(base: str, changes: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        changed = AgentSpec.from_markdown(base).with_changes(**changes)
        text = changed.to_markdown()
        assert AgentSpec.from_markdown(text) == changed
    if "system_prompt" not in changes:
        # the body is never rewritten for a front matter change
        assert text.endswith(base[base.index("---", 3) :].split("\n", 1)[-1])


def test_spec_survives_json_and_dict_round_trips(tmp_path: Path) -> None:
    spec = AgentSpec.from_file(write(tmp_path, "reviewer.md", REVIEWER)).with_changes(
        docs=[("docs/a.md", "A.")],
        permission_profile={"allow": ["Read"], "deny": []},
        source_path=str(tmp_path / "elsewhere.md"),
    )
    assert spec.source_path == tmp_path / "elsewhere.md"
    assert AgentSpec.model_validate_json(spec.model_dump_json()) == spec
    assert AgentSpec.model_validate(spec.model_dump()) == spec
