"""The SDK side of a run's tools: ``ToolSpec``s as SDK MCP tools, and the refusing callback.

A ``ToolSpec`` becomes an SDK tool whose handler validates the arguments and turns a
``ToolError`` (or any other exception) into an ``is_error`` result the model sees, so it can
recover. Tools outside the agent's permission profile reach ``can_use_tool``; :func:`refuser`
builds that callback, which refuses every call with a message naming the profile and keeps the
refusal in the run's state. ``claude_agent_sdk`` is imported only inside these functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from pydantic import ValidationError

from infrastructure.llm.base import ToolError, ToolSpec

if TYPE_CHECKING:
    from claude_agent_sdk import (
        CanUseTool,
        PermissionResultDeny,
        SdkMcpTool,
        ToolPermissionContext,
    )

    from infrastructure.llm.claude_run_state import RunState

__all__ = ["refuser", "sdk_tool", "tool_error"]

log = structlog.get_logger(__name__)


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


def refuser(agent: str, profile_label: str, state: RunState) -> CanUseTool:
    """The ``can_use_tool`` callback: every call that reaches it is outside the profile."""
    from claude_agent_sdk import PermissionResultDeny

    async def can_use_tool(
        tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultDeny:
        name = state.display_name(tool_name)
        state.denied.append(name)
        log.info("tool_denied", agent=agent, tool=name, profile=profile_label)
        reason = f" ({context.decision_reason})" if context.decision_reason else ""
        return PermissionResultDeny(
            message=(
                f"Permission denied: agent {agent!r} may not use tool {name!r} under its "
                f"permission profile {profile_label}{reason}. Continue without this tool."
            )
        )

    return can_use_tool
