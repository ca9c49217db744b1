"""agentmend's own work as OpenTelemetry spans, under the caller's trace.

Needs only ``opentelemetry-api`` (installed with ``anthropic`` and ``mcp``), never the SDK: with
no TracerProvider registered the API hands out non-recording spans that cost next to nothing,
and once the user registers one (or passes one to ``MetaOrchestrator.for_team(...,
tracer_provider=...)``) the cycle, the roles, each gate, verification and rollback appear in their
trace viewer. The roles' spans are ``invoke_agent`` spans (GenAI semantic conventions); every span
carries ``agentmend.recorded = true`` so agentmend's own span processor and receiver skip them
(those runs are recorded already, and the roles are never executions of the team). MCP calls are not
wrapped: the MCP SDK emits an ``execute_tool`` span for each already.

Verification verdicts are ``gen_ai.evaluation.result`` events on the verification span of the
agent they judged: the vendor-neutral way trace viewers (Phoenix, Langfuse, MLflow) take
external scores.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "EVALUATION_EVENT",
    "RECORDED_ATTRIBUTE",
    "agentmend_tracer",
    "emit_evaluation",
    "role_span",
    "set_outcome",
    "trace_environment",
    "work_span",
]

TRACER_NAME = "agentmend"
RECORDED_ATTRIBUTE = "agentmend.recorded"
"""Set to true on every span agentmend emits (and on the resource of the CLIs it starts): such
runs are recorded by agentmend already, so the span processor and the receiver skip them."""
EVALUATION_EVENT = "gen_ai.evaluation.result"


def agentmend_tracer(provider: TracerProvider | None = None) -> Tracer:
    """agentmend's tracer on ``provider``, else on whatever global provider is registered."""
    return trace.get_tracer(TRACER_NAME, tracer_provider=provider)


def _attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {RECORDED_ATTRIBUTE: True}
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, list | tuple):
            value = tuple(str(v) for v in value)
        elif not isinstance(value, str | bool | int | float):
            value = str(value)
        kept[key] = value
    return kept


@contextmanager
def role_span(tracer: Tracer, role: str, **attributes: Any) -> Iterator[Span]:
    """An ``invoke_agent`` span for one run of a role (mediator, improver, supervisor)."""
    with tracer.start_as_current_span(
        f"invoke_agent {role}",
        kind=trace.SpanKind.INTERNAL,
        attributes=_attributes(
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": role, **attributes}
        ),
    ) as span:
        yield span


@contextmanager
def work_span(tracer: Tracer, name: str, **attributes: Any) -> Iterator[Span]:
    """A span for one step of agentmend's own work (``agentmend.gate``, ``.verification``...)."""
    with tracer.start_as_current_span(name, attributes=_attributes(attributes)) as span:
        yield span


def set_outcome(span: Span, ok: bool, message: str | None = None) -> None:
    """Mark ``span`` as a failure (with ``message``) or leave it OK."""
    if not ok:
        span.set_status(Status(StatusCode.ERROR, message))


def emit_evaluation(
    span: Span, *, name: str, agent: str, score: float, passed: bool, explanation: str
) -> None:
    """A verdict as a ``gen_ai.evaluation.result`` event on ``span`` (label pass or fail)."""
    span.add_event(
        EVALUATION_EVENT,
        _attributes(
            {
                "gen_ai.evaluation.name": name,
                "gen_ai.evaluation.score.value": score,
                "gen_ai.evaluation.score.label": "pass" if passed else "fail",
                "gen_ai.evaluation.explanation": explanation,
                "gen_ai.agent.name": agent,
            }
        ),
    )


def trace_environment() -> dict[str, str]:
    """``TRACEPARENT`` (and ``TRACESTATE``) of the current span, for a child process's env.

    The Claude Code CLI reads ``TRACEPARENT`` so its spans nest under the caller's. Empty when
    no span is recording or being propagated.
    """
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    found = {"TRACEPARENT": carrier["traceparent"]} if "traceparent" in carrier else {}
    if found and carrier.get("tracestate"):
        found["TRACESTATE"] = carrier["tracestate"]
    return found
