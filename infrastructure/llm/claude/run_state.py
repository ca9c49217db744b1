"""What one Claude Code CLI run has shown so far, read from the SDK's message stream.

``RunState`` keeps the last assistant text, the tool calls with their results and timings, the
refusals (by tool call id, so our record of a refusal and the CLI's report of the same one count
once), the final ``ResultMessage``, the model, the CLI's synthetic assistant error and the tail
of its stderr. It is updated message by message, so a run that fails or times out still
reports what it did. The CLI emits one ``AssistantMessage`` per content block of a response;
messages from inside a subagent carry the spawning call's id and are skipped.
``claude_agent_sdk`` is imported only inside :meth:`RunState.observe`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentmend.infrastructure.llm.base import ToolCallRecord
from agentmend.infrastructure.llm.tool_loop import OUTPUT_TOOL_NAME

__all__ = ["STDERR_LINES", "RunState", "content_text"]

STDERR_LINES = 20
"""How many of the CLI's last stderr lines a run keeps (quoted when the process fails)."""


@dataclass
class RunState:
    """What the message stream has shown so far; kept when the run fails or times out."""

    tool_prefix: str
    text: str = ""  # the text of the last assistant response that had any
    text_message_id: str | None = None
    calls: dict[str, ToolCallRecord] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    denied: dict[str, str] = field(default_factory=dict)  # tool call id -> bare tool name
    result: Any = None  # the ResultMessage
    model: str | None = None
    assistant_error: str | None = None
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_LINES))

    def display_name(self, wire_name: str) -> str:
        return wire_name.removeprefix(self.tool_prefix)

    def deny(self, call_id: str | None, wire_name: str) -> str:
        """Note a refused call; returns the tool's bare name."""
        name = self.display_name(wire_name)
        self.denied.setdefault(call_id or f"unidentified-{len(self.denied)}", name)
        return name

    def denials(self) -> tuple[str, ...]:
        """The refused calls' tool names, in order: ours, then any only the CLI reported."""
        found = dict(self.denied)
        reported = getattr(self.result, "permission_denials", None) or ()
        for denial in reported:
            if isinstance(denial, Mapping):
                call_id = str(denial.get("tool_use_id") or f"reported-{len(found)}")
                found.setdefault(call_id, self.display_name(str(denial.get("tool_name", ""))))
        return tuple(found.values())

    def observe(self, message: Any) -> None:
        from claude_agent_sdk import (
            AssistantMessage,
            ResultMessage,
            TextBlock,
            ToolResultBlock,
            ToolUseBlock,
            UserMessage,
        )

        if isinstance(message, ResultMessage):
            self.result = message
            return
        # Messages from inside a subagent carry the spawning call's id; they are not ours.
        if getattr(message, "parent_tool_use_id", None) is not None:
            return
        if isinstance(message, AssistantMessage):
            if message.error is not None:
                self.assistant_error = message.error
                return
            self.model = message.model
            for block in message.content:
                if isinstance(block, TextBlock):
                    # The CLI emits one AssistantMessage per content block of a response.
                    if message.message_id != self.text_message_id or message.message_id is None:
                        self.text = ""
                        self.text_message_id = message.message_id
                    self.text += block.text
                elif isinstance(block, ToolUseBlock) and block.name != OUTPUT_TOOL_NAME:
                    self.started[block.id] = time.perf_counter()
                    self.calls[block.id] = ToolCallRecord(
                        id=block.id,
                        name=self.display_name(block.name),
                        input=dict(block.input),
                        output="",
                    )
        elif isinstance(message, UserMessage) and isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolResultBlock):
                    self._finish_call(block.tool_use_id, block.content, bool(block.is_error))

    def _finish_call(self, call_id: str, content: Any, is_error: bool) -> None:
        call = self.calls.get(call_id)
        if call is None:
            return
        started = self.started.pop(call_id, None)
        elapsed = (time.perf_counter() - started) * 1000.0 if started is not None else 0.0
        self.calls[call_id] = ToolCallRecord(
            id=call.id,
            name=call.name,
            input=call.input,
            output=content_text(content),
            is_error=is_error,
            duration_ms=elapsed,
        )


def content_text(content: Any) -> str:
    """The text of a tool result's content (a string, or a list of MCP content blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(item.get("text", "")) for item in content if isinstance(item, Mapping)
        ).strip()
    return "" if content is None else str(content)
