"""The SDK side of a run's tools: ``ToolSpec``s as SDK MCP tools, the profile gate, the refuser.

A ``ToolSpec`` becomes an SDK tool whose handler validates the arguments and turns a
``ToolError`` (or any other exception) into an ``is_error`` result the model sees, so it can
recover.

The permission profile is enforced by :func:`tool_gate`, a ``PreToolUse`` hook on every tool:
a call whose wire name is not in the run's allowed set is denied (``permissionDecision:
"deny"``) with a message naming the profile, and the refusal is kept in the run's state. A hook
and not ``can_use_tool`` because the CLI approves its read-only built-ins (``Read``, ``Glob``,
``Grep``) inside its working directory by itself and never asks ``can_use_tool`` about them;
``PreToolUse`` runs before that approval (observed with CLI 2.1.330). The hook blocks when it
fails (``on_failure="block"``), so a broken gate refuses rather than lets through. A denied
call's result reads ``PreToolUse:<tool> hook error: <message>`` and the CLI lists it in
``ResultMessage.permission_denials``. :func:`refuser` stays as ``can_use_tool``, for any call
the CLI would still ask about. ``claude_agent_sdk`` is imported only inside these functions.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agentmend.infrastructure.llm.base import ToolError, ToolSpec
from agentmend.infrastructure.llm.tool_loop import OUTPUT_TOOL_NAME
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from claude_agent_sdk import (
        CanUseTool,
        HookContext,
        HookInput,
        HookJSONOutput,
        HookMatcher,
        PermissionResultDeny,
        SdkMcpTool,
        ToolPermissionContext,
    )

    from agentmend.infrastructure.llm.claude.run_state import RunState

__all__ = ["refusal_message", "refuser", "sdk_tool", "tool_error", "tool_gate"]

log = get_logger(__name__)


def sdk_tool(tool: ToolSpec) -> SdkMcpTool[Any]:
    """The SDK tool for a ToolSpec: validated arguments in, text or an ``is_error`` result out."""
    from claude_agent_sdk import tool as make_sdk_tool

    schema = dict(tool.json_schema())
    # The SDK reads a dict without "type"/"properties" as a {name: python type} mapping.
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})

    async def handler(arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            validated = tool.validate_arguments(arguments)
        except ValidationError as exc:
            return tool_error(f"Invalid arguments for tool {tool.name!r}: {exc}")
        try:
            text = await tool.handler(validated)
        except ToolError as exc:
            return tool_error(str(exc) or "tool error")
        except Exception as exc:  # the model sees the failure and can recover
            log.warning("tool_handler_failed", tool=tool.name, error=repr(exc))
            return tool_error(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        return {"content": [{"type": "text", "text": text if isinstance(text, str) else str(text)}]}

    decorated: SdkMcpTool[Any] = make_sdk_tool(tool.name, tool.description, schema)(handler)
    return decorated


def tool_error(message: str) -> dict[str, Any]:
    """An MCP tool result the model reads as a failure it can recover from."""
    return {"content": [{"type": "text", "text": message}], "is_error": True}


def refusal_message(agent: str, tool: str, profile_label: str, reason: str | None = None) -> str:
    """What the model reads when a call is refused: who, which tool, under which profile."""
    because = f" ({reason})" if reason else ""
    return (
        f"Permission denied: agent {agent!r} may not use tool {tool!r} under its "
        f"permission profile {profile_label}{because}. Continue without this tool."
    )


def tool_gate(
    agent: str, profile_label: str, allowed_wire: Collection[str], state: RunState
) -> HookMatcher:
    """The ``PreToolUse`` hook that denies every tool outside ``allowed_wire`` and records it.

    ``StructuredOutput`` always passes: it is how the run answers, not a tool of the agent's.
    An allowed call gets no opinion (``{}``), so the CLI's own rules (``allowed_tools``)
    approve it as before.
    """
    from claude_agent_sdk import HookMatcher

    passes = frozenset(allowed_wire) | {OUTPUT_TOOL_NAME}

    async def gate(
        hook_input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        wire_name = str(hook_input.get("tool_name", ""))
        if wire_name in passes:
            return {}
        call_id = tool_use_id or str(hook_input.get("tool_use_id") or "") or None
        name = state.deny(call_id, wire_name)
        log.info("tool_denied", agent=agent, tool=name, profile=profile_label)
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": refusal_message(agent, name, profile_label),
            }
        }

    # None matches every tool; "block" makes a gate that raises refuse instead of allow.
    return HookMatcher(matcher=None, hooks=[gate], on_failure="block")


def refuser(agent: str, profile_label: str, state: RunState) -> CanUseTool:
    """The ``can_use_tool`` callback: every call that reaches it is outside the profile.

    The gate denies such calls first; this refuses any the CLI still asks about.
    """
    from claude_agent_sdk import PermissionResultDeny

    async def can_use_tool(
        tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultDeny:
        name = state.deny(context.tool_use_id, tool_name)
        log.info("tool_denied", agent=agent, tool=name, profile=profile_label)
        return PermissionResultDeny(
            message=refusal_message(agent, name, profile_label, context.decision_reason)
        )

    return can_use_tool
