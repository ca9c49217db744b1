"""agentmend's own work as spans under the caller's trace, and verdicts as evaluation events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentmend import AgentmendSpanProcessor
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import Fault, FaultKind, SimulatedRuntime
from agentmend.infrastructure.tracing import EVALUATION_EVENT
from agentmend.loop.meta_orchestrator import MetaOrchestrator

BASELINE = 50


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


@pytest.mark.slow
async def test_a_cycle_is_traced_under_the_callers_span(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    settings = Settings(baseline_n=BASELINE, false_alarm_rate=1e-4)
    with (
        PerformanceMonitor() as own_monitor,
        MetaOrchestrator.offline_simulated(
            tmp_path / "team", seed=11, settings=settings, tracer_provider=provider
        ) as orchestrator,
    ):
        # agentmend's spans reach a span processor on the same provider: none is an execution
        processor = AgentmendSpanProcessor(own_monitor)
        provider.add_span_processor(processor)
        for n in range(BASELINE):
            await orchestrator.execute_task(f"warm-up topic {n}")
        runtime = orchestrator.team.runtime
        assert isinstance(runtime, SimulatedRuntime)
        runtime.inject("research-agent", Fault(FaultKind.TRUNCATION))
        tracer = provider.get_tracer("the-app")
        cycle = None
        with tracer.start_as_current_span("handle request") as request_span:
            for n in range(40):
                task = await orchestrator.execute_task(f"faulty topic {n}")
                if task.cycles:
                    (cycle,) = task.cycles
                    break
        assert cycle is not None
        assert cycle.status == "kept"
        with tracer.start_as_current_span("undo it"):
            orchestrator.rollback(cycle.change_ids[0], reason="asked by the test")
        assert processor.force_flush()
        processor.shutdown()

    spans = exporter.get_finished_spans()
    own = [
        s for s in spans if s.instrumentation_scope and s.instrumentation_scope.name == "agentmend"
    ]
    assert own
    assert all(s.attributes and s.attributes.get("agentmend.recorded") is True for s in own)
    trace_id = request_span.get_span_context().trace_id

    (cycle_span,) = named(spans, "agentmend.improvement_cycle")
    assert cycle_span.context.trace_id == trace_id
    assert cycle_span.parent is not None
    assert cycle_span.parent.span_id == request_span.get_span_context().span_id
    attributes = cycle_span.attributes or {}
    assert attributes["agentmend.cycle_id"] == cycle.cycle_id
    assert attributes["agentmend.cycle.status"] == "kept"
    assert tuple(attributes["agentmend.change_ids"]) == cycle.change_ids  # type: ignore[arg-type]

    for role in ("socratic-mediator", "self-improver", "supervisor"):
        (role_span,) = named(spans, f"invoke_agent {role}")
        assert (role_span.attributes or {})["gen_ai.operation.name"] == "invoke_agent"
        assert (role_span.attributes or {})["gen_ai.agent.name"] == role
        assert role_span.context.trace_id == trace_id

    gates = named(spans, "agentmend.gate")
    (outcome,) = cycle.outcomes
    assert [(g.attributes or {})["agentmend.gate"] for g in gates] == [
        v.gate for v in outcome.verdicts
    ]
    assert all((g.attributes or {})["agentmend.gate.passed"] is True for g in gates)

    (verification,) = named(spans, "agentmend.verification")
    assert (verification.attributes or {})["gen_ai.agent.name"] == "research-agent"
    (event,) = [e for e in verification.events if e.name == EVALUATION_EVENT]
    verdict = cycle.verification
    assert verdict is not None
    event_attributes = event.attributes or {}
    assert event_attributes["gen_ai.evaluation.name"] == "agentmend.verification"
    assert event_attributes["gen_ai.evaluation.score.value"] == verdict.after_score
    assert event_attributes["gen_ai.evaluation.score.label"] == "pass"
    assert event_attributes["gen_ai.evaluation.explanation"] == verdict.reason

    (rollback,) = named(spans, "agentmend.rollback")
    assert (rollback.attributes or {})["agentmend.change_id"] == cycle.change_ids[0]

    counts = processor.counts()
    assert counts.executions_recorded == 0
    assert counts.own_spans == len(own)
