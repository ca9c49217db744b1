"""One mapping from spans to agent executions, for every dialect agentmend reads.

**The agent span** is the span whose ``gen_ai.operation.name`` is ``invoke_agent`` (GenAI
semantic conventions; the Claude Code CLI's ``claude_code.interaction`` carries it too),
OpenInference's ``openinference.span.kind = AGENT``, OpenLLMetry's ``traceloop.span.kind =
agent`` or Logfire's agent-run span (an ``agent_name`` attribute on a span with a
``logfire.msg_template``). Its subtree is one execution:

- agent name: ``gen_ai.agent.name``, then ``gen_ai.agent.id``, then the dialects' own
  (``agent.name`` of Claude Code and OpenInference, ``traceloop.entity.name``, Logfire's
  ``agent_name``), then the user's rule, then a resource attribute (``service.name`` unless
  configured otherwise; the SDKs' ``unknown_service`` placeholder names nothing). A span none
  of these name is unmappable and counted.
- success: the span's status is not ERROR and it has no ``error.type``; a failed chat inside a
  successful agent run does not fail the run (the agent may have recovered). Claude Code sets
  no status on its interaction span, so there the run failed when its last
  ``claude_code.llm_request`` has ``success = false`` (its ``error`` is the error text).
- error text: the status message, else the first exception event
  (``exception.type: exception.message``), else ``error.type``.
- duration: the agent span's own.
- tokens: the agent span's own usage if it has any, else the sum over its chat descendants
  (nested agent spans excluded: their tokens are theirs). Usage is read from
  ``gen_ai.usage.input_tokens``/``output_tokens`` (older ``prompt_tokens``/
  ``completion_tokens``), Claude Code's flat ``input_tokens``/``output_tokens`` and
  OpenInference's ``llm.token_count.prompt``/``completion``. Cache reads are not added: the
  ``anthropic`` SDK's input tokens already include them.
- model: from the chat spans (``gen_ai.response.model``, ``gen_ai.request.model``, ``model``,
  ``llm.model_name``).
- release: ``agentmend.release`` (and ``agentmend.team``) on the agent span or its resource,
  resolved to the release, arm and rollout when the run is recorded
  (``agentmend.infrastructure.releases.attribution``); the run is observed, never routed.

**A chat span with no agent span above it** (a plain ``anthropic`` app) is one execution by
itself, named by its own ``gen_ai.agent.name``, the user's rule, or the resource attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentmend.infrastructure.models import ExecutionRecord
from agentmend.infrastructure.release_labels import RELEASE_ATTRIBUTE, TEAM_ATTRIBUTE
from agentmend.infrastructure.telemetry.span import STATUS_ERROR, SpanData
from agentmend.infrastructure.tracing import RECORDED_ATTRIBUTE

__all__ = [
    "RELEASE_LABEL",
    "RELEASE_TEAM",
    "AgentNameRule",
    "SpanMapping",
    "is_agent_span",
    "is_chat_span",
    "is_recorded_by_agentmend",
]

AgentNameRule = Callable[[SpanData], str | None]
"""A user's rule naming the agent of a span (return None to fall through to the resource)."""

RELEASE_LABEL = "release_label"
"""The ``extra`` key of a run's release label (``agentmend.release``) until it is attributed."""
RELEASE_TEAM = "release_team"

CHAT_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_TRUE = (True, "true")
_MAX_ERROR_CHARS = 2000
_EVIDENCE_ATTRIBUTES = 12
_EVIDENCE_VALUE_CHARS = 200


def is_recorded_by_agentmend(span: SpanData) -> bool:
    """agentmend's own span, or a span of a CLI agentmend ran: recorded already, skip it."""
    # True from an SDK or OTLP attribute; "true" from OTEL_RESOURCE_ATTRIBUTES (strings only)
    return span.attributes.get(RECORDED_ATTRIBUTE) in _TRUE or (
        span.resource.get(RECORDED_ATTRIBUTE) in _TRUE
    )


def is_agent_span(span: SpanData) -> bool:
    """The span of one agent run, in any dialect agentmend reads."""
    attributes = span.attributes
    return (
        attributes.get("gen_ai.operation.name") == "invoke_agent"
        or attributes.get("openinference.span.kind") == "AGENT"
        or attributes.get("traceloop.span.kind") == "agent"
        or span.name == "claude_code.interaction"
        or ("agent_name" in attributes and "logfire.msg_template" in attributes)
    )


def is_chat_span(span: SpanData) -> bool:
    """The span of one model call, in any dialect agentmend reads."""
    attributes = span.attributes
    return (
        attributes.get("gen_ai.operation.name") in CHAT_OPERATIONS
        or attributes.get("openinference.span.kind") == "LLM"
        or attributes.get("llm.request.type") == "chat"
        or span.name == "claude_code.llm_request"
        or ("gen_ai.request.model" in attributes and "logfire.msg_template" in attributes)
    )


@dataclass(frozen=True, slots=True)
class SpanMapping:
    """How spans become ``ExecutionRecord`` values (see the module docstring for the rules).

    Args:
        agent_name_rule: names the agent where the span's attributes do not.
        resource_attribute: the resource attribute naming the agent last (``service.name``).
    """

    agent_name_rule: AgentNameRule | None = None
    resource_attribute: str = "service.name"

    def agent_name(self, span: SpanData, chats: Sequence[SpanData] = ()) -> str | None:
        attributes = span.attributes
        for key in (
            "gen_ai.agent.name",
            "gen_ai.agent.id",
            "agent.name",
            "traceloop.entity.name",
            "agent_name",
        ):
            value = attributes.get(key)
            if isinstance(value, str) and value:
                return value
        for chat in chats:  # Claude Code puts a subagent's agent.name on its requests
            value = chat.attributes.get("agent.name")
            if isinstance(value, str) and value:
                return value
        if self.agent_name_rule is not None:
            named = self.agent_name_rule(span)
            if named:
                return named
        return self._resource_name(span)

    def _resource_name(self, span: SpanData) -> str | None:
        value = span.resource.get(self.resource_attribute)
        # the SDKs' placeholder when the app set no service name names no agent
        if isinstance(value, str) and value and not value.startswith("unknown_service"):
            return value
        return None

    def execution(self, agent: SpanData, chats: Sequence[SpanData]) -> ExecutionRecord | None:
        """The execution of an agent span and the chat spans of its subtree (None: unnamed)."""
        name = self.agent_name(agent, chats)
        if name is None:
            return None
        input_tokens, output_tokens = _usage(agent)
        if not (input_tokens or output_tokens):
            for chat in chats:
                chat_in, chat_out = _usage(chat)
                input_tokens += chat_in
                output_tokens += chat_out
        return _record(
            name,
            agent,
            input_tokens,
            output_tokens,
            _model(chats),
            "agent",
            _cli_error(agent, chats),
        )

    def chat_execution(self, chat: SpanData) -> ExecutionRecord | None:
        """The execution of a chat span with no agent span above it (None: unnamed)."""
        value = chat.attributes.get("gen_ai.agent.name")
        name: str | None = value if isinstance(value, str) and value else None
        if name is None and self.agent_name_rule is not None:
            name = self.agent_name_rule(chat)
        if name is None:
            name = self._resource_name(chat)
        if name is None:
            return None
        input_tokens, output_tokens = _usage(chat)
        return _record(name, chat, input_tokens, output_tokens, _model((chat,)), "chat")


def _cli_error(agent: SpanData, chats: Sequence[SpanData]) -> str | None:
    """Claude Code sets no status on ``claude_code.interaction``: its last request tells."""
    if agent.name != "claude_code.interaction" or not chats:
        return None
    last = max(chats, key=lambda chat: chat.end_ns)
    if last.attributes.get("success") is not False:
        return None
    return str(last.attributes.get("error") or "the last model request failed")[:_MAX_ERROR_CHARS]


def _record(
    name: str,
    span: SpanData,
    input_tokens: int,
    output_tokens: int,
    model: str | None,
    kind: str,
    failure: str | None = None,
) -> ExecutionRecord:
    error = _error(span) or failure
    extra: dict[str, Any] = {
        "source": "otel",
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "span_name": span.name,
        "mapped_from": kind,
        "attributes": _evidence(span.attributes),
    }
    if model:
        extra["model"] = model
    service = span.resource.get("service.name")
    if isinstance(service, str):
        extra["service"] = service
    label = span.get(RELEASE_ATTRIBUTE)
    if label is not None:  # resolved to release, arm and rollout when it is recorded
        extra[RELEASE_LABEL] = label
        team = span.get(TEAM_ATTRIBUTE)
        if team is not None:
            extra[RELEASE_TEAM] = team
    return ExecutionRecord(
        agent_name=name,
        success=error is None,
        duration_ms=span.duration_ms,
        error=error,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        timestamp=datetime.fromtimestamp(span.end_ns / 1e9, UTC)
        if span.end_ns
        else datetime.now(UTC),
        extra=extra,
    )


def _error(span: SpanData) -> str | None:
    error_type = span.attributes.get("error.type")
    if span.status_code != STATUS_ERROR and not error_type:
        return None
    text = span.status_message
    if not text:
        for event in span.events:
            if event.name == "exception":
                kind = event.attributes.get("exception.type")
                message = event.attributes.get("exception.message") or ""
                text = f"{kind}: {message}" if kind else str(message)
                break
    if not text:
        text = str(error_type) if error_type else "span status ERROR"
    return text[:_MAX_ERROR_CHARS]


_NUMBERS = (int, float)  # a tuple: isinstance with ``int | float`` builds a union per call


def _number(attributes: Mapping[str, Any], keys: Iterable[str]) -> int:
    for key in keys:
        value = attributes.get(key)
        if value is None or value is True or value is False:
            continue
        if isinstance(value, _NUMBERS) and value > 0:
            return int(value)
    return 0


_INPUT_KEYS = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "input_tokens",
    "llm.token_count.prompt",
)
_OUTPUT_KEYS = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "output_tokens",
    "llm.token_count.completion",
)


def _usage(span: SpanData) -> tuple[int, int]:
    return _number(span.attributes, _INPUT_KEYS), _number(span.attributes, _OUTPUT_KEYS)


def _model(chats: Sequence[SpanData]) -> str | None:
    for chat in chats:
        for key in ("gen_ai.response.model", "gen_ai.request.model", "model", "llm.model_name"):
            value = chat.attributes.get(key)
            if isinstance(value, str) and value:
                return value
    return None


_SCALARS = (bool, int, float)


def _evidence(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A few scalar attributes kept for the mediator's evidence, values cut short."""
    kept: dict[str, Any] = {}
    for key, value in attributes.items():
        if len(kept) >= _EVIDENCE_ATTRIBUTES:
            break
        if isinstance(value, str):
            kept[key] = value[:_EVIDENCE_VALUE_CHARS]
        elif isinstance(value, _SCALARS):
            kept[key] = value
    return kept
