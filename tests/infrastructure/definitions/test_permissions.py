"""Permission profiles: the pure function both the runtimes and the gates use."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentmend.infrastructure.definitions.permissions import (
    ANY_OTHER_TOOL,
    SHELL_AND_WRITE_TOOLS,
    SUBAGENT_TOOLS,
    ProfileLike,
    allowed_tools,
    describe_profile,
    grants_more_than,
    newly_granted,
)
from agentmend.infrastructure.definitions.spec import PermissionProfile
from agentmend.infrastructure.errors import ConfigurationError

OFFERED = ("ask_agent", "history", "Read", "Grep", "Bash", "Write", "Edit")


def test_locked_allows_nothing() -> None:
    assert allowed_tools("locked", None, OFFERED) == frozenset()
    assert allowed_tools("locked", OFFERED, OFFERED) == frozenset()


def test_standard_is_the_declared_tools_without_shell_or_writes() -> None:
    declared = ("ask_agent", "Read", "Bash", "Edit")
    assert allowed_tools("standard", declared, OFFERED) == {"ask_agent", "Read"}


def test_standard_without_a_declaration_starts_from_everything_offered() -> None:
    # "history" is a tool nobody classed: privileged until the setting lists it as read-only
    assert allowed_tools("standard", None, OFFERED) == {"ask_agent", "Read", "Grep"}
    listed = allowed_tools("standard", None, OFFERED, read_only_tools=("hist*",))
    assert listed == {"ask_agent", "history", "Read", "Grep"}


def test_standard_never_grants_a_declared_tool_that_is_not_offered() -> None:
    assert allowed_tools("standard", ("ask_agent", "WebFetch"), ("ask_agent",)) == {"ask_agent"}


def test_open_allows_everything_offered() -> None:
    assert allowed_tools("open", ("Read",), OFFERED) == frozenset(OFFERED)


def test_custom_profiles_match_patterns_and_deny_wins() -> None:
    profile = PermissionProfile(allow=("*",), deny=("Bash", "Wr*"))
    assert allowed_tools(profile, None, OFFERED) == set(OFFERED) - {"Bash", "Write"}
    mcp_only = PermissionProfile(allow=("mcp__*",))
    assert allowed_tools(mcp_only, None, ("mcp__x__a", "Read")) == {"mcp__x__a"}
    assert allowed_tools(PermissionProfile(allow=("*",), deny=("*",)), None, OFFERED) == set()


def test_a_rule_with_a_specifier_grants_nothing_whole() -> None:
    profile = PermissionProfile(allow=("Bash(git log:*)",))
    assert allowed_tools(profile, None, OFFERED) == frozenset()


def test_an_unknown_profile_name_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="unknown permission profile 'admin'"):
        allowed_tools("admin", None, OFFERED)


@pytest.mark.parametrize(
    ("new", "old", "wider"),
    [
        ("open", "standard", True),
        ("standard", "open", False),
        ("standard", "locked", True),
        ("locked", "standard", False),
        ("standard", "standard", False),
        (PermissionProfile(allow=("*",)), "standard", True),
        (PermissionProfile(allow=("Read",)), "standard", False),
        (PermissionProfile(allow=("Bash",)), "standard", True),
        ("open", PermissionProfile(allow=("*",)), False),
        (PermissionProfile(allow=("*",), deny=("Bash",)), "open", False),
    ],
)
def test_grants_more_than_without_a_tool_set(
    new: ProfileLike, old: ProfileLike, wider: bool
) -> None:
    assert grants_more_than(new, old, declared_tools=("Read",)) is wider


def test_newly_granted_names_the_tools_an_escalation_adds() -> None:
    granted = newly_granted("open", "standard", declared_tools=("Read",))
    assert granted == SHELL_AND_WRITE_TOOLS | SUBAGENT_TOOLS | {ANY_OTHER_TOOL}
    narrow = newly_granted("open", "standard", declared_tools=("Read",), offered_tools=OFFERED)
    assert narrow == {"Bash", "Write", "Edit", "ask_agent", "history", "Grep"}


def test_describe_profile() -> None:
    assert describe_profile("locked") == "locked"
    label = describe_profile(PermissionProfile(allow=("Read",), deny=("Bash",)))
    assert label == "custom (allow: Read; deny: Bash)"


names = st.lists(st.sampled_from([*OFFERED, "WebFetch", "mcp__x__y"]), max_size=6)


@given(declared=names, offered=names)
def test_profiles_are_ordered_locked_standard_open(declared: list[str], offered: list[str]) -> None:
    locked = allowed_tools("locked", declared, offered)
    standard = allowed_tools("standard", declared, offered)
    opened = allowed_tools("open", declared, offered)
    assert locked <= standard <= opened <= frozenset(offered)
    assert not standard & SHELL_AND_WRITE_TOOLS
