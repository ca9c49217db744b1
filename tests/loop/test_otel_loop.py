"""Runs that arrive as spans feed the loop: detection fires on them, and the mediator is told
when the agent behind them cannot be questioned."""

from __future__ import annotations

from otel_helpers import SpanFactory

from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.llm.testing import ScriptedRuntime
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.span_processor import span_data
from agentmend.roles.ask_agent_tool import AskAgentTool
from agentmend.roles.socratic_mediator import SocraticMediator


def test_a_degradation_seen_only_in_spans_is_detected() -> None:
    factory = SpanFactory(service="checkout")
    with PerformanceMonitor(baseline_n=40) as monitor:
        assembler = TraceAssembler(monitor)
        detector = IssueDetector(baseline_n=40, false_alarm_rate=1e-3, monitor=monitor)
        for n in range(40):
            factory.agent_run("pricing-agent", fail="upstream timeout" if n == 7 else None)
        assembler.add(span_data(s) for s in factory.take())
        monitor.flush()
        assert detector.check(monitor) == []
        for _ in range(30):
            factory.agent_run("pricing-agent", fail="the price table is missing")
        assembler.add(span_data(s) for s in factory.take())
        monitor.flush()
        issues = detector.check(monitor)
    factory.close()
    assert issues
    assert {issue.agent_name for issue in issues} == {"pricing-agent"}
    assert "RuntimeError: the price table is missing" in issues[0].error_logs


def _prompt_for(agent: str) -> str:
    async def answer(question: str) -> str:
        return "fine"

    mediator = SocraticMediator(ScriptedRuntime([]), AskAgentTool({"writer": answer}))
    return mediator.build_prompt(
        IssueReport(agent_name=agent, error_type="cusum_failure_rate", available_agents=[agent])
    )


def test_the_mediator_is_told_when_the_agent_cannot_be_questioned() -> None:
    assert "'pricing-agent' cannot be questioned" in _prompt_for("pricing-agent")
    assert "cannot be questioned" not in _prompt_for("writer")
