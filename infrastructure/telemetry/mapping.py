"""One mapping from spans to agent executions, for every dialect agentmend reads.

**The agent span** is the span whose ``gen_ai.operation.name`` is ``invoke_agent`` (GenAI
semantic conventions, as pydantic-ai with or without logfire and OpenLLMetry emit it; the
Claude Code CLI's ``claude_code.interaction`` carries it too), OpenInference's
``openinference.span.kind = AGENT`` or OpenLLMetry's ``traceloop.span.kind = agent``. Its
subtree is one execution:

- agent name: ``gen_ai.agent.name``, then ``gen_ai.agent.id``, then the dialects' own
  (``agent.name`` of Claude Code and OpenInference, ``traceloop.entity.name``), then the user's
  rule, then, for an OpenInference AGENT span (``@tracer.agent(name=...)`` names the agent only
  there), the span's name, then a resource attribute (``service.name`` unless configured
  otherwise; the SDKs' ``unknown_service`` placeholder names nothing). A span none of these
  name is unmappable and counted. An agent span that names no agent by its attributes and only
  wraps other agent runs (OpenInference's ``Agent workflow`` root of an openai-agents run) is
  not a run (``TraceAssembler`` drops it).
- success: the span's status is not ERROR and it has no ``error.type``; a failed chat inside a
  successful agent run does not fail the run (the agent may have recovered). Claude Code sets
  no status on its interaction span, so there the run failed when its last
  ``claude_code.llm_request`` has ``success = false`` (its ``error`` is the error text).
- error text: the status message, else the first exception event
  (``exception.type: exception.message``), else ``error.type``.
- duration: the agent span's own.
- tokens: the run's total the agent span reports (pydantic-ai's
  ``gen_ai.aggregated_usage.input_tokens``/``output_tokens``), else its own usage, else the sum
  over the model calls of its subtree (nested agent spans excluded: their tokens are theirs),
  each call counted once however many spans describe it
  (``agentmend.infrastructure.telemetry.model_calls``). Usage is read from
  ``gen_ai.usage.input_tokens``/``output_tokens`` (older ``prompt_tokens``/
  ``completion_tokens``), Claude Code's flat ``input_tokens``/``output_tokens`` and
  OpenInference's ``llm.token_count.prompt``/``completion``. Cache reads are not added: the
  ``anthropic`` SDK's input tokens already include them.
- model: from the chat spans (``gen_ai.response.model``, ``gen_ai.request.model``, ``model``,
  ``llm.model_name``).
- release: ``agentmend.release`` (and ``agentmend.team``) on the agent span or its resource,
  resolved to the release, arm and rollout when the run is recorded
  (``agentmend.infrastructure.releases.attribution``); the run is observed, never routed.

**A model call with no agent span above it** (a plain ``anthropic`` app, with or without an
instrumentation) is one execution by itself, named by its own ``gen_ai.agent.name``, the user's
rule, or the resource attribute.

The mapping reads a span's attributes through ``SpanData.known`` only, and ``DIALECT_KEYS``
lists every one it reads, so a decoder may decode those alone. A run keeps a few scalar
attributes of its span as evidence (the first 12 in key order, so every decoder keeps the same).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentmend.infrastructure.models import ExecutionRecord
from agentmend.infrastructure.release_labels import RELEASE_ATTRIBUTE, TEAM_ATTRIBUTE
from agentmend.infrastructure.telemetry.model_calls import (
    CALL_KEYS,
    USAGE_KEYS,
    ModelCall,
    call_tokens,
    number,
    usage,
)
from agentmend.infrastructure.telemetry.otlp_lean import RawAttributes
from agentmend.infrastructure.telemetry.span import STATUS_ERROR, SpanData
from agentmend.infrastructure.tracing import RECORDED_ATTRIBUTE

__all__ = [
    "DIALECT_KEYS",
    "RELEASE_LABEL",
    "RELEASE_TEAM",
    "AgentNameRule",
    "RunRow",
    "SpanMapping",
    "is_agent_span",
    "is_chat_span",
    "is_recorded_by_agentmend",
    "names_itself",
    "run_record",
]

AgentNameRule = Callable[[SpanData], str | None]
"""A user's rule naming the agent of a span (return None to fall through to the resource)."""

RELEASE_LABEL = "release_label"
"""The ``extra`` key of a run's release label (``agentmend.release``) until it is attributed."""
RELEASE_TEAM = "release_team"

RunRow = tuple[str, bool, float, "str | None", int, int, float, dict[str, Any]]
"""One run as plain values: agent name, success, duration (ms), error, input tokens, output
tokens, when it ended (seconds since the epoch), extra. No model is built per run:
``PerformanceMonitor.record_observed`` takes these as they are."""

CHAT_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_TRUE = (True, "true")
_MAX_ERROR_CHARS = 2000
_EVIDENCE_ATTRIBUTES = 12
_EVIDENCE_VALUE_CHARS = 200


def is_recorded_by_agentmend(span: SpanData) -> bool:
    """agentmend's own span, or a span of a CLI agentmend ran: recorded already, skip it."""
    # True from an SDK or OTLP attribute; "true" from OTEL_RESOURCE_ATTRIBUTES (strings only)
    return span.known.get(RECORDED_ATTRIBUTE) in _TRUE or (
        span.resource.get(RECORDED_ATTRIBUTE) in _TRUE
    )


def is_agent_span(span: SpanData) -> bool:
    """The span of one agent run, in any dialect agentmend reads."""
    attributes = span.known
    return (
        attributes.get("gen_ai.operation.name") == "invoke_agent"
        or attributes.get("openinference.span.kind") == "AGENT"
        or attributes.get("traceloop.span.kind") == "agent"
        or span.name == "claude_code.interaction"
    )


def is_chat_span(span: SpanData) -> bool:
    """The span of one model call, in any dialect agentmend reads."""
    attributes = span.known
    return (
        attributes.get("gen_ai.operation.name") in CHAT_OPERATIONS
        or attributes.get("openinference.span.kind") == "LLM"
        or attributes.get("llm.request.type") == "chat"
        or span.name == "claude_code.llm_request"
    )


_NAME_KEYS = (
    "gen_ai.agent.name",
    "gen_ai.agent.id",
    "agent.name",
    "traceloop.entity.name",
    "agent_name",
)


def _named(span: SpanData) -> str | None:
    known = span.known
    for key in _NAME_KEYS:
        value = known.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def names_itself(span: SpanData) -> bool:
    """The agent span names its agent by an attribute (not by its span name or resource)."""
    return _named(span) is not None


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
        named = _named(span)
        if named is not None:
            return named
        for chat in chats:  # Claude Code puts a subagent's agent.name on its requests
            value = chat.known.get("agent.name")
            if isinstance(value, str) and value:
                return value
        if self.agent_name_rule is not None:
            named = self.agent_name_rule(span)
            if named:
                return named
        if span.known.get("openinference.span.kind") == "AGENT" and span.name:
            return span.name  # @tracer.agent(name=...) names the agent here only
        return self._resource_name(span)

    def _resource_name(self, span: SpanData) -> str | None:
        value = span.resource.get(self.resource_attribute)
        # the SDKs' placeholder when the app set no service name names no agent
        if isinstance(value, str) and value and not value.startswith("unknown_service"):
            return value
        return None

    def execution(self, agent: SpanData, chats: Sequence[SpanData]) -> RunRow | None:
        """The run of an agent span and the chat spans of its subtree (None: unnamed)."""
        name = self.agent_name(agent, chats)
        if name is None:
            return None
        input_tokens = output_tokens = 0
        if not agent.known.keys().isdisjoint(_AGENT_TOKEN_KEYS):  # (most count none)
            input_tokens = number(agent.known, _AGGREGATED_INPUT)
            output_tokens = number(agent.known, _AGGREGATED_OUTPUT)
            if not (input_tokens or output_tokens):
                input_tokens, output_tokens = usage(agent)
        if not (input_tokens or output_tokens):
            input_tokens, output_tokens = call_tokens(chats)
        return _record(
            name,
            agent,
            input_tokens,
            output_tokens,
            _model(chats),
            "agent",
            _cli_error(agent, chats),
        )

    def chat_execution(self, chat: SpanData | ModelCall) -> RunRow | None:
        """The run of a model call with no agent span above it (None: unnamed)."""
        call = chat if isinstance(chat, ModelCall) else ModelCall((chat,))
        span = call.span
        value = span.known.get("gen_ai.agent.name")
        name: str | None = value if isinstance(value, str) and value else None
        if name is None and self.agent_name_rule is not None:
            name = self.agent_name_rule(span)
        if name is None:
            name = self._resource_name(span)
        if name is None:
            return None
        input_tokens, output_tokens = call.tokens
        failure = next(filter(None, map(_error, call.spans[1:])), None)
        return _record(name, span, input_tokens, output_tokens, call.model, "chat", failure)


def _cli_error(agent: SpanData, chats: Sequence[SpanData]) -> str | None:
    """Claude Code sets no status on ``claude_code.interaction``: its last request tells."""
    if agent.name != "claude_code.interaction" or not chats:
        return None
    last = max(chats, key=lambda chat: chat.end_ns)
    if last.known.get("success") is not False:
        return None
    return str(last.known.get("error") or "the last model request failed")[:_MAX_ERROR_CHARS]


def _record(
    name: str,
    span: SpanData,
    input_tokens: int,
    output_tokens: int,
    model: str | None,
    kind: str,
    failure: str | None = None,
) -> RunRow:
    error = _error(span) or failure
    extra: dict[str, Any] = {
        "source": "otel",
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "span_name": span.name,
        "mapped_from": kind,
        "attributes": _evidence(span),
    }
    if model:
        extra["model"] = model
    resource = span.resource
    service = resource.get("service.name")
    if isinstance(service, str):
        extra["service"] = service
    label = _attribute(span, RELEASE_ATTRIBUTE)
    if label is not None:  # resolved to release, arm and rollout when it is recorded
        extra[RELEASE_LABEL] = label
        team = _attribute(span, TEAM_ATTRIBUTE)
        if team is not None:
            extra[RELEASE_TEAM] = team
    end_ns = span.end_ns
    return (
        name,
        error is None,
        max(end_ns - span.start_ns, 0) / 1e6,
        error,
        input_tokens,
        output_tokens,
        end_ns / 1e9 if end_ns else time.time(),
        extra,
    )


def _attribute(span: SpanData, key: str) -> Any:
    """The span's attribute ``key`` (one the dialects read), else its resource's."""
    value = span.known.get(key)
    return value if value is not None else span.resource.get(key)


def run_record(row: RunRow) -> ExecutionRecord:
    """``row`` as an ``ExecutionRecord`` (for a sink that takes models, not rows)."""
    name, success, duration_ms, error, input_tokens, output_tokens, ended_at, extra = row
    return ExecutionRecord(
        agent_name=name,
        success=success,
        duration_ms=duration_ms,
        error=error,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        timestamp=datetime.fromtimestamp(ended_at, UTC),
        extra=extra,
    )


def _error(span: SpanData) -> str | None:
    error_type = span.known.get("error.type")
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


_AGGREGATED_INPUT = ("gen_ai.aggregated_usage.input_tokens",)
_AGGREGATED_OUTPUT = ("gen_ai.aggregated_usage.output_tokens",)
# every key an agent span may count its own tokens by (its run's total, or its own usage)
_AGENT_TOKEN_KEYS = frozenset((*_AGGREGATED_INPUT, *_AGGREGATED_OUTPUT, *USAGE_KEYS))
_MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "model", "llm.model_name")


def _model(chats: Sequence[SpanData]) -> str | None:
    for chat in chats:
        known = chat.known
        for key in _MODEL_KEYS:
            value = known.get(key)
            if isinstance(value, str) and value:
                return value
    return None


_SCALARS = (bool, int, float)


def _evidence(span: SpanData) -> dict[str, Any]:
    """A few scalar attributes kept for the mediator's evidence (the first in key order, so
    every decoder keeps the same ones), values cut short."""
    kept: dict[str, Any] = {}
    attributes = span.attributes
    items = (
        attributes.sorted_items(2 * _EVIDENCE_ATTRIBUTES)  # (a few may not be scalars)
        if type(attributes) is RawAttributes
        else sorted(attributes.items())
    )
    for key, value in items:
        if len(kept) >= _EVIDENCE_ATTRIBUTES:
            break
        if isinstance(value, str):
            kept[key] = value[:_EVIDENCE_VALUE_CHARS]
        elif isinstance(value, _SCALARS):
            kept[key] = value
    return kept


DIALECT_KEYS = frozenset(
    {
        RECORDED_ATTRIBUTE,
        RELEASE_ATTRIBUTE,
        TEAM_ATTRIBUTE,
        "gen_ai.operation.name",
        "openinference.span.kind",
        "traceloop.span.kind",
        "llm.request.type",
        "success",
        "error",
        "error.type",
        *_NAME_KEYS,
        *_AGGREGATED_INPUT,
        *_AGGREGATED_OUTPUT,
        *_MODEL_KEYS,
        *CALL_KEYS,
    }
)
"""Every span attribute the mapping reads (through ``SpanData.known``): a decoder must decode
these; it may leave the rest undecoded."""
