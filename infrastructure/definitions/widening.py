"""What a new agent definition may do that the old one could not: the rights it widens.

Changing a definition this way needs an administrator, whoever makes the change: the role gate
of a cycle (``agentmend.infrastructure.changes.gates``) and a release's publication or canary
(``agentmend.infrastructure.releases``) both ask here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agentmend.infrastructure.definitions.permissions import (
    ANY_OTHER_TOOL,
    SHELL_AND_WRITE_TOOLS,
    SUBAGENT_TOOLS,
    allowed_tools,
    describe_profile,
    is_privileged,
)

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = ["definition_widening"]

_SAFE_PERMISSION_MODES = frozenset({None, "default", "plan"})


def definition_widening(
    old: AgentSpec | None, new: AgentSpec, *, read_only_tools: Iterable[str] = ()
) -> list[str]:
    """What ``new`` grants beyond ``old`` (None: a new agent) that needs the admin permission,
    each as what an administrator may do ("set the permission profile open", ...); empty when
    any principal may make the change. ``read_only_tools`` is the setting of that name."""
    needs: list[str] = []
    old_profile = old.permission_profile if old is not None else None
    profile = new.permission_profile
    if profile != old_profile and profile not in ("locked", "standard"):
        needs.append(f"set the permission profile {describe_profile(profile)}")
    old_tools = frozenset(old.tools or ()) if old is not None else frozenset()
    if new.tools is None and (old is None or old.tools is not None):
        needs.append("leave the tools undeclared (an agent that declares none gets every tool)")
    added = sorted(frozenset(new.tools or ()) - old_tools)
    listed = tuple(read_only_tools)
    risky = [tool for tool in added if is_privileged(tool, listed) or _is_pattern(tool)]
    if risky:
        needs.append(
            "add privileged (shell, file-writing, subagent, MCP or unclassed) or wildcard "
            f"tools: {', '.join(risky)}"
        )
    granted = _newly_callable(old, new, tuple(read_only_tools))
    if granted:
        needs.append(f"let the agent call {', '.join(granted)}")
    needs.extend(_widened_claude_code_keys(old, new))
    return list(dict.fromkeys(needs))


def _is_pattern(tool: str) -> bool:
    return any(char in tool for char in "*?[")


def _newly_callable(
    old: AgentSpec | None, new: AgentSpec, read_only_tools: tuple[str, ...]
) -> list[str]:
    """Privileged tools the new definition lets the agent call that the old did not."""
    universe = set(SHELL_AND_WRITE_TOOLS | SUBAGENT_TOOLS) | {ANY_OTHER_TOOL} | set(new.tools or ())
    profiles = [new.permission_profile]
    if old is not None:
        universe |= set(old.tools or ())
        profiles.append(old.permission_profile)
    for profile in profiles:
        if not isinstance(profile, str):
            universe |= set(profile.allow) | set(profile.deny)
    after = allowed_tools(
        new.permission_profile, new.tools, universe, read_only_tools=read_only_tools
    )
    before = (
        allowed_tools(old.permission_profile, old.tools, universe, read_only_tools=read_only_tools)
        if old is not None
        else set()
    )
    return sorted(tool for tool in after - before if is_privileged(tool, read_only_tools))


def _widened_claude_code_keys(old: AgentSpec | None, new: AgentSpec) -> list[str]:
    before: dict[str, Any] = old.extra if old is not None else {}
    after = new.extra
    needs: list[str] = []
    mode = after.get("permissionMode")
    if mode != before.get("permissionMode") and mode not in _SAFE_PERMISSION_MODES:
        needs.append(f"set permissionMode {mode!r}")
    known_servers = _as_list(before.get("mcpServers"))
    if any(server not in known_servers for server in _as_list(after.get("mcpServers"))):
        needs.append("add mcpServers")
    if after.get("hooks") != before.get("hooks"):
        needs.append("change hooks (they run commands)")
    kept = set(_tool_names(after.get("disallowedTools")))
    dropped = sorted(set(_tool_names(before.get("disallowedTools"))) - kept)
    if dropped:
        needs.append(f"remove disallowedTools entries: {', '.join(dropped)}")
    return needs


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _tool_names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(item) for item in _as_list(value)]
