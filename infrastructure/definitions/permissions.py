"""Which tools an agent may call without asking: permission profiles as one pure function.

An agent's ``permission_profile`` names how much of its tool surface it is trusted with:

- ``"locked"``: nothing. Every call is refused (and reported), so a locked agent can only talk.
- ``"standard"`` (the default): the tools the agent declares (``tools:`` in its definition, or
  every tool it is given when it declares none) that are known to be harmless: the read-only
  built-ins and agentmend tools (``READ_ONLY_TOOLS``), agentmend's self-edit tools, whose every
  call passes the permission gate (``GATED_TOOLS``), and whatever the ``read_only_tools``
  setting lists (names or patterns such as ``"mcp__docs__*"``). Everything else is privileged:
  the tools that run shell commands or write files (``SHELL_AND_WRITE_TOOLS``), the tools that
  spawn subagents (``SUBAGENT_TOOLS``: a subagent runs with tools of its own), every MCP tool
  (``mcp__<server>__<tool>``: what a server's tool does cannot be known from its name, and the
  gate judges definitions when no server is running, so it cannot read tool annotations), and
  every name not listed here. Reading and asking are routine; changing the machine, or
  anything not known to be harmless, is not. ``tool_class`` names each tool's class.
- ``"open"``: every tool the agent is given.
- a custom profile (any object with ``allow`` and ``deny`` collections of tool-name patterns,
  such as the spec's ``PermissionProfile``): the offered tools matching an ``allow`` pattern
  and no ``deny`` pattern (shell-style wildcards: ``"*"``, ``"mcp__*"``; deny wins). A Claude
  Code rule with a specifier (``"Bash(git log:*)"``) grants part of a tool, which a set of tool
  names cannot say, so it grants nothing here: such calls are refused, never widened.

Runtimes enforce the result on every call: the shared tool loop refuses a call outside it, and
the claude-agent-sdk runtime pre-approves it in ``allowed_tools`` and refuses every other tool
in a ``PreToolUse`` hook (which runs before the CLI's own approval of its read-only tools); each
refusal is reported as a permission denial. A gate reuses the same function to ask whether a
proposed profile change grants more than the old one (``grants_more_than``).
Names are the names an agent definition uses: built-in tools (``Read``, ``Bash``) and agentmend
tool names (``ask_agent``); mapping them to wire names is the runtime's business.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from fnmatch import fnmatchcase
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from agentmend.infrastructure.errors import ConfigurationError

__all__ = [
    "ANY_OTHER_TOOL",
    "GATED_TOOLS",
    "PROFILE_NAMES",
    "READ_ONLY_TOOLS",
    "SHELL_AND_WRITE_TOOLS",
    "SUBAGENT_TOOLS",
    "CustomProfile",
    "ProfileLike",
    "ProfileName",
    "allowed_tools",
    "describe_profile",
    "grants_more_than",
    "is_privileged",
    "newly_granted",
    "tool_class",
]

ProfileName: TypeAlias = Literal["locked", "standard", "open"]
PROFILE_NAMES: frozenset[str] = frozenset({"locked", "standard", "open"})

SHELL_AND_WRITE_TOOLS: frozenset[str] = frozenset(
    {
        # shell: runs arbitrary commands, and so can write anything
        "Bash",
        "BashOutput",
        "KillBash",
        "KillShell",
        "PowerShell",
        # file writers
        "Write",
        "Edit",
        "MultiEdit",
        "NotebookEdit",
    }
)
"""Built-in tools a ``standard`` profile never grants: they run commands or write files."""

SUBAGENT_TOOLS: frozenset[str] = frozenset({"Task", "Agent"})
"""Built-in tools that spawn a subagent, which runs with tools of its own: privileged."""

READ_ONLY_TOOLS: frozenset[str] = frozenset(
    {
        # built-ins that read files or the web, or keep the session's own notes
        "Read",
        "Glob",
        "Grep",
        "LS",
        "NotebookRead",
        "WebFetch",
        "WebSearch",
        "TodoWrite",
        "TodoRead",
        "ExitPlanMode",
        # agentmend's question tool
        "ask_agent",
    }
)
"""Tools a ``standard`` profile grants: they read, search or ask, and change nothing."""

GATED_TOOLS: frozenset[str] = frozenset(
    {"self_edit_system_prompt", "self_edit_docs", "self_edit_permissions", "self_edit_model"}
)
"""agentmend's self-edit tools: each call is a change that passes the permission gate (and
the change gates) before anything is written, so ``standard`` grants them."""

ANY_OTHER_TOOL = "<any other tool>"
"""Stands for tools nobody listed, so ``open`` (or ``allow: ["*"]``) counts as wider than any
finite list when profiles are compared without a concrete tool set."""


@runtime_checkable
class CustomProfile(Protocol):
    """A custom profile: allow and deny lists of tool-name patterns (``"*"`` = every tool)."""

    @property
    def allow(self) -> Collection[str]: ...

    @property
    def deny(self) -> Collection[str]: ...


ProfileLike: TypeAlias = "ProfileName | str | CustomProfile"


def _check_name(profile: str) -> None:
    if profile not in PROFILE_NAMES:
        raise ConfigurationError(
            f"unknown permission profile {profile!r}: use one of "
            f"{', '.join(sorted(PROFILE_NAMES))} or a custom allow/deny profile"
        )


def tool_class(name: str, read_only_tools: Iterable[str] = ()) -> str:
    """How a tool is classed: ``read-only``, ``gated`` (granted by ``standard``) or one of
    ``shell-or-write``, ``subagent``, ``mcp``, ``unknown`` (privileged).

    A Claude Code specifier (``Bash(git log:*)``) is classed by its tool; ``read_only_tools``
    (the setting: names or shell-style patterns) makes any tool ``read-only``.
    """
    bare = name.split("(", 1)[0].strip()
    if bare in SHELL_AND_WRITE_TOOLS:
        return "shell-or-write"
    if bare in READ_ONLY_TOOLS or _matches_any(bare, read_only_tools):
        return "read-only"
    if bare in GATED_TOOLS:
        return "gated"
    if bare in SUBAGENT_TOOLS:
        return "subagent"
    if bare.startswith("mcp__"):
        return "mcp"
    return "unknown"


def is_privileged(name: str, read_only_tools: Iterable[str] = ()) -> bool:
    """Whether only ``open`` or a custom profile may grant ``name`` (see ``tool_class``)."""
    return tool_class(name, read_only_tools) not in ("read-only", "gated")


def allowed_tools(
    profile: ProfileLike,
    declared_tools: Iterable[str] | None,
    offered_tools: Iterable[str],
    *,
    read_only_tools: Iterable[str] = (),
) -> frozenset[str]:
    """The offered tools this profile lets the agent call without asking.

    Args:
        profile: ``"locked"``, ``"standard"``, ``"open"`` or a custom allow/deny profile.
        declared_tools: the tools the agent's definition declares; ``None`` when it declares
            none (then ``standard`` starts from everything offered).
        offered_tools: every tool the run puts in front of the model.
        read_only_tools: the ``read_only_tools`` setting: names or patterns ``standard``
            grants although they are not known to be read-only (an MCP server's read tools).

    Raises:
        ConfigurationError: for an unknown profile name.
    """
    offered = frozenset(offered_tools)
    if isinstance(profile, str):
        _check_name(profile)
        if profile == "locked":
            return frozenset()
        if profile == "open":
            return offered
        base = offered if declared_tools is None else offered & frozenset(declared_tools)
        listed = tuple(read_only_tools)
        return frozenset(name for name in base if not is_privileged(name, listed))
    allow = tuple(profile.allow)
    deny = tuple(profile.deny)
    return frozenset(
        name for name in offered if _matches_any(name, allow) and not _matches_any(name, deny)
    )


def _matches_any(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def _universe(profiles: Iterable[ProfileLike], declared: Iterable[str] | None) -> frozenset[str]:
    """Every tool name the comparison could turn on, plus one stand-in for the unnamed rest."""
    names = set(SHELL_AND_WRITE_TOOLS | SUBAGENT_TOOLS)
    names.add(ANY_OTHER_TOOL)
    if declared is not None:
        names.update(declared)
    for profile in profiles:
        if not isinstance(profile, str):
            names.update(profile.allow)
            names.update(profile.deny)
    return frozenset(names)


def newly_granted(
    new_profile: ProfileLike,
    old_profile: ProfileLike,
    *,
    declared_tools: Iterable[str] | None = None,
    offered_tools: Iterable[str] | None = None,
    read_only_tools: Iterable[str] = (),
) -> frozenset[str]:
    """Tools the new profile allows that the old one did not.

    Without ``offered_tools`` the comparison runs over every tool either profile or the
    declaration names, the shell and write tools, and ``ANY_OTHER_TOOL``, so widening to
    ``open`` or to ``"*"`` shows up even when no concrete tool set is at hand.
    """
    declared = None if declared_tools is None else tuple(declared_tools)
    if offered_tools is None:
        universe = _universe((new_profile, old_profile), declared)
    else:
        universe = frozenset(offered_tools)
    listed = tuple(read_only_tools)
    return allowed_tools(new_profile, declared, universe, read_only_tools=listed) - allowed_tools(
        old_profile, declared, universe, read_only_tools=listed
    )


def grants_more_than(
    new_profile: ProfileLike,
    old_profile: ProfileLike,
    *,
    declared_tools: Iterable[str] | None = None,
    offered_tools: Iterable[str] | None = None,
) -> bool:
    """True when switching from ``old_profile`` to ``new_profile`` widens what is allowed.

    A gate uses this to tell an escalation (needs approval) from a narrowing (safe to apply).
    """
    return bool(
        newly_granted(
            new_profile, old_profile, declared_tools=declared_tools, offered_tools=offered_tools
        )
    )


def describe_profile(profile: ProfileLike) -> str:
    """A short human-readable label, for denial messages and audit records."""
    if isinstance(profile, str):
        return profile
    allow = ", ".join(sorted(profile.allow)) or "nothing"
    deny = ", ".join(sorted(profile.deny))
    return f"custom (allow: {allow}" + (f"; deny: {deny})" if deny else ")")
