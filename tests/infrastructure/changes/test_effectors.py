"""plan_change: every kind of change as exact bytes, and every bad input refused untouched."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agentmend.infrastructure.changes.effectors import InvalidChange, group_entries, plan_change
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.proposal import ProposedChange
from agentmend.infrastructure.definitions.spec import AgentSpec, PermissionProfile, load_agent_specs
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.simulation import AVAILABLE_MODELS, copy_team

MODELS = ("claude-sonnet-4-6", "claude-haiku-4-5", "claude-opus-4-6")

ALPHA = """\
---
name: alpha
description: Answers questions about geometry.
tools:
  - Read
  - Grep
model: claude-sonnet-4-6
maxTurns: 5
agentmend:
  temperature: 0.2
  max_tokens: 1024
  timeout_s: 30
---
You are alpha.

Answer briefly.
"""

BETA = """\
---
name: beta
description: Plans work.
model: claude-haiku-4-5
agentmend:
  evals: beta/docs/exam.yaml
---
You are beta.
"""

NEW_AGENT = """\
---
name: gamma
description: Checks proofs.
tools: Read, Grep
model: claude-haiku-4-5
agentmend:
  permission_profile: locked
---
You are gamma. You check proofs line by line.
"""


@pytest.fixture
def team(tmp_path: Path) -> Path:
    root = tmp_path / "team"
    root.mkdir()
    (root / "alpha.md").write_text(ALPHA)
    (root / "beta.md").write_text(BETA)
    docs = root / "alpha" / "docs"
    docs.mkdir(parents=True)
    (docs / "style.md").write_text("Use short sentences.\n")
    (root / "beta" / "docs").mkdir(parents=True)
    (root / "beta" / "docs" / "exam.yaml").write_text("cases: []\n")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def act(
    kind: ChangeType,
    field: str | None,
    value: Any,
    *,
    agent: str = "alpha",
    confidence: float = 0.9,
) -> ImprovementAction:
    return ImprovementAction(
        target_agent=agent,
        action_type=kind,
        target_field=field,
        new_value=value,
        confidence_score=confidence,
        rationale="test",
    )


def plan(root: Path, action: ImprovementAction, models: tuple[str, ...] = MODELS) -> ProposedChange:
    return plan_change(action, root=root, specs=load_agent_specs(root), available_models=models)


def refused(root: Path, action: ImprovementAction, match: str) -> InvalidChange:
    """Plan ``action``, expect ``InvalidChange`` matching ``match``, and prove nothing moved."""
    before = snapshot(root)
    with pytest.raises(InvalidChange, match=match) as caught:
        plan(root, action)
    assert snapshot(root) == before
    assert caught.value.agent == action.target_agent
    return caught.value


def changed_lines(change: ProposedChange) -> list[str]:
    return [
        line
        for line in change.diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def reloaded(change: ProposedChange) -> AgentSpec:
    edit = change.edits[0]
    assert edit.new_content is not None
    return AgentSpec.from_markdown(edit.new_content.decode())


# -- prompt ----------------------------------------------------------------------------------


def test_prompt_replacement_rewrites_only_the_body(team: Path) -> None:
    change = plan(team, act(ChangeType.PROMPT_MODIFICATION, "system_prompt", "You are alpha v2."))
    (edit,) = change.edits
    assert edit.path == "alpha.md"
    assert edit.old_content == ALPHA.encode()
    assert edit.new_content is not None
    assert edit.new_content.decode().split("---\n")[1] == ALPHA.split("---\n")[1]
    assert reloaded(change).system_prompt == "You are alpha v2."
    assert change.action.old_value == "You are alpha.\n\nAnswer briefly."
    assert change.new_spec is not None
    assert change.new_spec.system_prompt == "You are alpha v2."
    assert change.old_spec is not None
    assert change.old_spec.system_prompt.startswith("You are alpha.")
    assert change.metadata["field"] == "system_prompt"


def test_prompt_append_adds_a_paragraph_at_the_end(team: Path) -> None:
    action = act(ChangeType.PROMPT_MODIFICATION, None, {"append": "Start with '## Answer'."})
    change = plan(team, action)
    prompt = reloaded(change).system_prompt
    assert prompt == "You are alpha.\n\nAnswer briefly.\n\nStart with '## Answer'."
    assert changed_lines(change) == ["+", "+Start with '## Answer'."]
    # what was proposed stays in the action; the history shows the old prompt beside it
    assert change.action.new_value == {"append": "Start with '## Answer'."}


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("", "must not be empty"),
        ("   \n ", "must not be empty"),
        ({"append": "  "}, "text to append is empty"),
        ({"append": "x", "also": "y"}, "append"),
        ({"prepend": "x"}, "append"),
        (42, "new prompt text"),
        ("You are alpha.\n\nAnswer briefly.", "change nothing"),
    ],
)
def test_bad_prompts_are_refused(team: Path, value: Any, match: str) -> None:
    error = refused(team, act(ChangeType.PROMPT_MODIFICATION, "system_prompt", value), match)
    assert error.field == "system_prompt"


def test_prompt_change_on_another_field_is_refused(team: Path) -> None:
    error = refused(team, act(ChangeType.PROMPT_MODIFICATION, "model", "x"), "system_prompt")
    assert error.field == "model"


# -- parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "attribute", "expected", "old", "line"),
    [
        ("temperature", 0.5, "temperature", 0.5, 0.2, "+  temperature: 0.5"),
        ("max_tokens", 4096, "max_tokens", 4096, 1024, "+  max_tokens: 4096"),
        ("max_tokens", "4096", "max_tokens", 4096, 1024, "+  max_tokens: 4096"),
        ("max_tokens", 4096.0, "max_tokens", 4096, 1024, "+  max_tokens: 4096"),
        ("timeout_s", 60, "timeout_s", 60.0, 30.0, "+  timeout_s: 60"),  # whole, as written
        ("max_turns", 9, "max_turns", 9, 5, "+maxTurns: 9"),
        ("maxTurns", 9, "max_turns", 9, 5, "+maxTurns: 9"),
    ],
)
def test_parameter_adjustment_changes_one_line(
    team: Path, field: str, value: Any, attribute: str, expected: Any, old: Any, line: str
) -> None:
    change = plan(team, act(ChangeType.PARAMETER_ADJUSTMENT, field, value))
    assert getattr(reloaded(change), attribute) == expected
    assert change.action.old_value == old
    lines = changed_lines(change)
    assert len(lines) == 2
    assert lines[1] == line


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("temperature", 2, "less than or equal to 1"),
        ("temperature", "hot", "must be a number"),
        ("temperature", float("nan"), "finite"),
        ("max_tokens", 0, "greater than 0"),
        ("max_tokens", 20.5, "must be an integer"),
        ("max_tokens", True, "must be an integer"),
        ("max_tokens", None, "must be an integer"),
        ("max_tokens", [4096], "must be an integer"),
        ("timeout_s", -1, "greater than 0"),
        ("max_tokens", 1024, "change nothing"),
    ],
)
def test_invalid_parameter_values_are_refused(
    team: Path, field: str, value: Any, match: str
) -> None:
    error = refused(team, act(ChangeType.PARAMETER_ADJUSTMENT, field, value), match)
    assert error.field == field


@pytest.mark.parametrize("field", ["top_p", None, "system_prompt", "evals"])
def test_unsupported_parameter_fields_are_refused(team: Path, field: str | None) -> None:
    refused(team, act(ChangeType.PARAMETER_ADJUSTMENT, field, 1), "supports target_field")


# -- tools and permission profiles -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["Read"], ("Read",)),
        ({"add": ["WebSearch"]}, ("Read", "Grep", "WebSearch")),
        ({"add": ["WebSearch", "Read"]}, ("Read", "Grep", "WebSearch")),
        ({"remove": ["Grep"]}, ("Read",)),
        ({"remove": ["Grep"], "add": ["ask_agent"]}, ("Read", "ask_agent")),
        ("Read, WebFetch", ("Read", "WebFetch")),
    ],
)
def test_tool_changes(team: Path, value: Any, expected: tuple[str, ...]) -> None:
    change = plan(team, act(ChangeType.TOOL_PERMISSION_CHANGE, "tools", value))
    assert reloaded(change).tools == expected
    assert change.action.old_value == ("Read", "Grep")


@pytest.mark.parametrize(
    ("agent", "value", "match"),
    [
        ("alpha", {"remove": ["Bash"]}, "does not declare it"),
        ("alpha", {"add": ["Read"]}, "change nothing"),
        ("alpha", {"grant": ["Bash"]}, "add"),
        ("alpha", {}, "add"),
        ("alpha", [""], "non-empty strings"),
        ("alpha", [1, 2], "non-empty strings"),
        ("alpha", 7, "add"),
        ("beta", {"add": ["Read"]}, "declares no tools"),
    ],
)
def test_bad_tool_changes_are_refused(team: Path, agent: str, value: Any, match: str) -> None:
    action = act(ChangeType.TOOL_PERMISSION_CHANGE, "tools", value, agent=agent)
    assert refused(team, action, match).field == "tools"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("locked", "locked"),
        ("open", "open"),
        ({"allow": ["Read", "mcp__*"], "deny": ["Bash"]}, PermissionProfile(
            allow=("Read", "mcp__*"), deny=("Bash",))),
        ({"allow": ["Read"]}, PermissionProfile(allow=("Read",))),
    ],
)  # fmt: skip
def test_permission_profile_changes(team: Path, value: Any, expected: Any) -> None:
    change = plan(team, act(ChangeType.TOOL_PERMISSION_CHANGE, "permission_profile", value))
    assert reloaded(change).permission_profile == expected
    assert change.action.old_value == "standard"


def test_custom_profile_old_value_is_plain_data(team: Path) -> None:
    custom = {"allow": ["Read"], "deny": ["Bash"]}
    first = plan(team, act(ChangeType.TOOL_PERMISSION_CHANGE, "permission_profile", custom))
    assert first.edits[0].new_content is not None
    (team / "alpha.md").write_bytes(first.edits[0].new_content)
    second = plan(team, act(ChangeType.TOOL_PERMISSION_CHANGE, "permission_profile", "standard"))
    assert second.action.model_dump(mode="json")["old_value"] == custom


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("admin", "'locked', 'standard' or 'open'"),
        ({"allow": ["Read"], "grant": ["*"]}, "only allow and deny, not 'grant'"),
        ({"allow": [""]}, "invalid custom profile"),
        (3, "give locked, standard, open"),
        ("standard", "change nothing"),
    ],
)
def test_bad_permission_profiles_are_refused(team: Path, value: Any, match: str) -> None:
    action = act(ChangeType.TOOL_PERMISSION_CHANGE, "permission_profile", value)
    assert refused(team, action, match).field == "permission_profile"


def test_tool_permission_change_needs_a_known_field(team: Path) -> None:
    refused(team, act(ChangeType.TOOL_PERMISSION_CHANGE, None, ["Read"]), "supports target_field")


# -- model -----------------------------------------------------------------------------------


def test_model_change_validated_against_available_models(team: Path) -> None:
    change = plan(team, act(ChangeType.MODEL_CHANGE, "model", "claude-haiku-4-5"))
    assert reloaded(change).model == "claude-haiku-4-5"
    assert change.action.old_value == "claude-sonnet-4-6"
    assert changed_lines(change) == ["-model: claude-sonnet-4-6", "+model: claude-haiku-4-5"]


def test_model_change_uses_the_simulations_available_models(team: Path) -> None:
    model = next(name for name in sorted(AVAILABLE_MODELS) if name != "claude-sonnet-4-6")
    action = act(ChangeType.MODEL_CHANGE, None, model)
    change = plan_change(
        action, root=team, specs=load_agent_specs(team), available_models=AVAILABLE_MODELS
    )
    assert reloaded(change).model == model


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("claude-2.1", "'claude-2.1' is not available; available models: claude-haiku-4-5"),
        ("", "non-empty name"),
        (None, "non-empty name"),
        ("claude-sonnet-4-6", "change nothing"),
    ],
)
def test_bad_models_are_refused(team: Path, value: Any, match: str) -> None:
    assert refused(team, act(ChangeType.MODEL_CHANGE, "model", value), match).field == "model"


def test_model_list_is_the_callers(team: Path) -> None:
    with pytest.raises(InvalidChange, match="available models: claude-opus-4-6"):
        plan(team, act(ChangeType.MODEL_CHANGE, "model", "claude-haiku-4-5"), ("claude-opus-4-6",))


# -- docs ------------------------------------------------------------------------------------


def test_docs_edit_creates_a_file_in_a_new_subdirectory(team: Path) -> None:
    change = plan(
        team, act(ChangeType.DOCS_EDIT, "docs/guides/proofs/induction.md", "Base case.\n")
    )
    (edit,) = change.edits
    assert edit.path == "alpha/docs/guides/proofs/induction.md"
    assert edit.old_content is None
    assert edit.new_content == b"Base case.\n"
    assert change.action.old_value is None
    assert change.new_spec is not None
    assert ("docs/guides/proofs/induction.md", "Base case.\n") in change.new_spec.docs
    assert "+++ b/alpha/docs/guides/proofs/induction.md" in change.diff


def test_docs_edit_updates_an_existing_file(team: Path) -> None:
    change = plan(team, act(ChangeType.DOCS_EDIT, "docs/style.md", "Use long sentences.\n"))
    (edit,) = change.edits
    assert edit.old_content == b"Use short sentences.\n"
    assert change.action.old_value == "Use short sentences.\n"
    assert change.new_spec is not None
    assert dict(change.new_spec.docs)["docs/style.md"] == "Use long sentences.\n"


def test_docs_edit_with_none_deletes(team: Path) -> None:
    change = plan(team, act(ChangeType.DOCS_EDIT, "docs/style.md", None))
    assert change.edits[0].new_content is None
    assert change.new_spec is not None
    assert change.new_spec.docs == ()
    assert "+++ /dev/null" in change.diff


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("docs/../alpha.md", "x", r"'\.\.' is not allowed"),
        ("docs/../../outside.md", "x", r"'\.\.' is not allowed"),
        ("docs//etc/passwd.md", "x", "absolute paths are not allowed"),
        ("docs/", "x", "docs/<relative path>"),
        ("style.md", "x", "docs/<relative path>"),
        (None, "x", "docs/<relative path>"),
        ("docs/.hidden.md", "x", "hidden file"),
        ("docs/missing.md", None, "no such doc"),
        ("docs/style.md", b"bytes", "must be text"),
        ("docs/style.md", "a\x00b", "NUL"),
        ("docs/style.md", "Use short sentences.\n", "change nothing"),
    ],
)
def test_bad_docs_edits_are_refused(team: Path, field: str | None, value: Any, match: str) -> None:
    refused(team, act(ChangeType.DOCS_EDIT, field, value), match)


def test_docs_edit_refuses_a_docs_folder_symlinked_outside(team: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, team / "beta" / "docs" / "escape")
    error = refused(
        team, act(ChangeType.DOCS_EDIT, "docs/escape/x.md", "x", agent="beta"), "symlink"
    )
    assert error.field == "docs/escape/x.md"
    assert list(outside.iterdir()) == []


def test_docs_edit_refuses_a_symlink_to_another_agents_file(team: Path) -> None:
    os.symlink(team / "alpha.md", team / "alpha" / "docs" / "link.md")
    refused(team, act(ChangeType.DOCS_EDIT, "docs/link.md", "pwned"), "outside alpha/docs/")


def test_docs_edit_refuses_an_agent_folder_symlinked_elsewhere(team: Path) -> None:
    elsewhere = team / "elsewhere" / "docs"
    elsewhere.mkdir(parents=True)
    (team / "beta" / "docs" / "exam.yaml").unlink()
    (team / "beta" / "docs").rmdir()
    (team / "beta").rmdir()
    os.symlink(team / "elsewhere", team / "beta")
    refused(team, act(ChangeType.DOCS_EDIT, "docs/x.md", "x", agent="beta"), "outside beta/docs/")


def test_docs_edit_never_touches_an_eval_suite(team: Path) -> None:
    error = refused(
        team, act(ChangeType.DOCS_EDIT, "docs/exam.yaml", "cases: []\n# easier", agent="beta"),
        "eval suite of agent 'beta'",
    )  # fmt: skip
    assert error.field == "docs/exam.yaml"


# -- creation and deletion -------------------------------------------------------------------


def test_agent_creation_writes_the_given_definition(team: Path) -> None:
    change = plan(team, act(ChangeType.AGENT_CREATION, None, NEW_AGENT, agent="gamma"))
    (edit,) = change.edits
    assert edit.path == "gamma.md"
    assert edit.old_content is None
    assert edit.new_content == NEW_AGENT.encode()
    assert change.old_spec is None
    assert change.new_spec is not None
    assert change.new_spec.permission_profile == "locked"
    assert change.new_spec.source_path == team.resolve() / "gamma.md"


@pytest.mark.parametrize(
    ("agent", "text", "match"),
    [
        ("delta", NEW_AGENT, "named 'gamma', not 'delta'"),
        ("alpha", ALPHA, "already exists"),
        ("gamma", NEW_AGENT.replace("description: Checks proofs.\n", ""), "is required"),
        ("gamma", NEW_AGENT.replace("name: gamma", "name: -gamma"), "must not start with"),
        ("gamma", NEW_AGENT.replace("claude-haiku-4-5", "gpt-4"), "'gpt-4' is not available"),
        ("gamma", NEW_AGENT.replace("model:", "sneaky: 1\nmodel:"), "not a Claude Code or"),
        ("gamma", NEW_AGENT.replace("locked", "root"), "'locked', 'standard' or 'open'"),
        ("gamma", "no front matter at all", "invalid definition"),
        ("gamma", "", "full Markdown definition"),
        ("gamma", {"name": "gamma"}, "full Markdown definition"),
    ],
)
def test_bad_agent_creations_are_refused(team: Path, agent: str, text: Any, match: str) -> None:
    refused(team, act(ChangeType.AGENT_CREATION, None, text, agent=agent), match)


def test_agent_creation_refuses_a_stray_file_of_that_name(team: Path) -> None:
    (team / "gamma.md").write_text("not an agent")
    with pytest.raises(InvalidChange, match=r"gamma\.md already exists"):
        plan_change(
            act(ChangeType.AGENT_CREATION, None, NEW_AGENT, agent="gamma"),
            root=team,
            specs={},
            available_models=MODELS,
        )


def test_agent_deletion_removes_the_definition_only(team: Path) -> None:
    change = plan(team, act(ChangeType.AGENT_DELETION, None, None))
    (edit,) = change.edits
    assert (edit.path, edit.old_content, edit.new_content) == ("alpha.md", ALPHA.encode(), None)
    assert change.action.old_value == ALPHA
    assert change.new_spec is None
    assert change.old_spec is not None
    assert change.old_spec.name == "alpha"


def test_deleting_an_unknown_agent_is_refused(team: Path) -> None:
    refused(team, act(ChangeType.AGENT_DELETION, None, None, agent="zeta"), "known agents: alpha")


# -- what every change type shares -----------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in ChangeType if k is not ChangeType.AGENT_CREATION])
def test_unknown_agents_are_named_with_the_known_ones(team: Path, kind: ChangeType) -> None:
    if kind is ChangeType.CODE_PATCH:
        refused(team, act(kind, None, "diff", agent="zeta"), "not an agent-definition change")
        return
    error = refused(team, act(kind, "model", "x", agent="zeta"), "unknown agent")
    assert "known agents: alpha, beta" in str(error)


def test_a_definition_changed_on_disk_since_loading_is_refused(team: Path) -> None:
    specs = load_agent_specs(team)
    (team / "alpha.md").write_text(ALPHA.replace("Answer briefly.", "Answer at length."))
    with pytest.raises(InvalidChange, match="changed on disk since it was loaded"):
        plan_change(
            act(ChangeType.MODEL_CHANGE, "model", "claude-haiku-4-5"),
            root=team,
            specs=specs,
            available_models=MODELS,
        )


def test_a_definition_outside_the_root_is_refused(team: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "alpha.md").write_text(ALPHA)
    with pytest.raises(InvalidChange, match="outside the team directory"):
        plan_change(
            act(ChangeType.MODEL_CHANGE, "model", "claude-haiku-4-5"),
            root=team,
            specs=load_agent_specs(other),
            available_models=MODELS,
        )


def test_a_missing_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidChange, match="does not exist"):
        plan_change(
            act(ChangeType.MODEL_CHANGE, "model", "claude-haiku-4-5"),
            root=tmp_path / "nowhere",
            specs={},
            available_models=MODELS,
        )


def test_planning_writes_nothing(team: Path) -> None:
    before = snapshot(team)
    actions = [
        act(ChangeType.PROMPT_MODIFICATION, None, {"append": "More."}),
        act(ChangeType.PARAMETER_ADJUSTMENT, "max_tokens", 8192),
        act(ChangeType.TOOL_PERMISSION_CHANGE, "tools", {"add": ["Bash"]}),
        act(ChangeType.MODEL_CHANGE, "model", "claude-opus-4-6"),
        act(ChangeType.DOCS_EDIT, "docs/new/deep.md", "x"),
        act(ChangeType.AGENT_CREATION, None, NEW_AGENT, agent="gamma"),
        act(ChangeType.AGENT_DELETION, None, None, agent="beta"),
    ]
    for action in actions:
        plan(team, action)
    assert snapshot(team) == before
    assert not (team / "alpha" / "docs" / "new").exists()


# -- through the manager ---------------------------------------------------------------------


def test_planned_bytes_apply_and_roll_back_exactly(team: Path, tmp_path: Path) -> None:
    before = snapshot(team)
    with ImprovementManager(tmp_path / "state" / "history.db") as manager:
        changes = [
            plan(team, act(ChangeType.PARAMETER_ADJUSTMENT, "max_tokens", 2048)),
            plan(team, act(ChangeType.DOCS_EDIT, "docs/a/b/c.md", "deep\n")),
        ]
        records = manager.apply_group(
            [entry for change in changes for entry in group_entries(change)], root=team
        )
        specs = load_agent_specs(team)
        assert specs["alpha"].max_tokens == 2048
        assert ("docs/a/b/c.md", "deep\n") in specs["alpha"].docs
        assert records[0].action.old_value == 1024
        assert manager.rollback_by_id(records[0].change_id, reason="test")
    after = snapshot(team)
    assert {k: v for k, v in after.items() if not k.startswith(".agent")} == before


def test_the_simulated_team_gets_surgical_diffs(tmp_path: Path) -> None:
    root = copy_team(tmp_path / "team")
    specs = load_agent_specs(root)
    for name in specs:
        change = plan_change(
            act(ChangeType.PARAMETER_ADJUSTMENT, "timeout_s", 600, agent=name),
            root=root,
            specs=specs,
            available_models=AVAILABLE_MODELS,
        )
        lines = changed_lines(change)
        assert lines[-1] == "+  timeout_s: 600", name  # whole, as its author wrote it
        assert len(lines) <= 2, name
        assert reloaded(change).timeout_s == 600.0
