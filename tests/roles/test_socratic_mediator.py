"""SocraticMediator: questions through ask_agent, evidence checked, text fallback, failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmend.infrastructure.llm.offline import OfflineRuntime
from agentmend.infrastructure.llm.testing import ScriptedRuntime, Step
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime, copy_team
from agentmend.roles.ask_agent_tool import AskAgentTool
from agentmend.roles.outcomes import QuestionAnswer
from agentmend.roles.playbooks import offline_policies
from agentmend.roles.prompt_blocks import extract_block
from agentmend.roles.schemas import MediatorReport
from agentmend.roles.socratic_mediator import (
    BUDGET_MESSAGE,
    NO_EVIDENCE_CAP,
    SocraticMediator,
    check_evidence,
    is_failed,
)
from agentmend.roles.team import AgentTeam

ANSWER = (
    "Of my last 10 runs, 6 failed. 6 runs stopped at my max_tokens limit of 2048 before the "
    "answer was complete."
)
ISSUE = IssueReport(
    agent_name="research-agent",
    error_type="cusum_failure_rate",
    metrics={"success_rate": 0.4, "avg_duration_ms": 1234.0},
    error_logs=["truncated: response stopped at max_tokens=2048 before the answer was complete"],
    context="failure rate above its baseline",
    available_agents=["research-agent", "quality-agent"],
)


def ask_tool(answer: str = ANSWER) -> tuple[AskAgentTool, list[str]]:
    asked: list[str] = []

    async def research(question: str) -> str:
        asked.append(question)
        return answer

    async def quality(question: str) -> str:
        asked.append(question)
        return "My runs are fine."

    return AskAgentTool({"research-agent": research, "quality-agent": quality}), asked


def report(**changes: object) -> MediatorReport:
    fields: dict[str, object] = {
        "responsible_agent": "research-agent",
        "cause_category": "truncation",
        "identified_cause": "max_tokens 2048 is too small",
        "confidence": 0.9,
        "evidence": ["6 runs stopped at my max_tokens limit of 2048"],
        "recommendations": ["raise max_tokens"],
    }
    fields.update(changes)
    return MediatorReport.model_validate(fields)


def question(text: str = "Which errors did your recent runs end with?") -> Step:
    return Step.tool_call("ask_agent", {"agent_name": "research-agent", "question": text})


async def test_questions_then_a_structured_report() -> None:
    tool, asked = ask_tool()
    runtime = ScriptedRuntime([question(), Step.output(report())])
    seen: list[QuestionAnswer] = []
    mediator = SocraticMediator(runtime, tool, on_question=seen.append)
    analysis = await mediator.analyze_issue(ISSUE)
    assert asked == ["Which errors did your recent runs end with?"]
    assert analysis.responsible_agent == "research-agent"
    assert analysis.cause_category == "truncation"
    assert analysis.confidence_score == pytest.approx(0.9)
    assert analysis.evidence == ("6 runs stopped at my max_tokens limit of 2048",)
    assert analysis.issue == ISSUE
    assert seen == [QuestionAnswer(agent_name="research-agent", question=asked[0], answer=ANSWER)]
    assert mediator.last_questions == seen
    assert mediator.model_calls == 2
    # the answer reached the model fenced as untrusted data
    run = runtime.runs[0]
    assert "<agent_answer" in run.requests[1].messages[-1].content[0].content  # type: ignore[union-attr]
    runtime.assert_complete()


async def test_the_prompt_carries_the_issue_as_a_block_and_in_words() -> None:
    tool, _ = ask_tool()
    runtime = ScriptedRuntime([Step.output(report())])
    await SocraticMediator(runtime, tool).analyze_issue(ISSUE)
    prompt = runtime.runs[0].prompt
    assert extract_block(prompt, "issue_report") == ISSUE.model_dump(mode="json")
    assert "Agent Name: research-agent" in prompt
    assert "- Success Rate: 40%" in prompt
    assert "Available agents to query: research-agent, quality-agent" in prompt
    assert [t.name for t in runtime.runs[0].tools] == ["ask_agent"]


async def test_a_fabricated_quote_is_dropped_and_costs_confidence() -> None:
    tool, _ = ask_tool()
    made_up = "the agent said it needs admin rights to work"
    runtime = ScriptedRuntime(
        [question(), Step.output(report(evidence=[made_up, "max_tokens limit of 2048"]))]
    )
    analysis = await SocraticMediator(runtime, tool).analyze_issue(ISSUE)
    assert analysis.evidence == ("max_tokens limit of 2048",)
    assert analysis.confidence_score == pytest.approx(0.9 * 0.8)


async def test_a_recorded_error_counts_as_evidence_without_questions() -> None:
    tool, asked = ask_tool()
    quote = "response stopped at max_tokens=2048"
    runtime = ScriptedRuntime([Step.output(report(evidence=[f'"{quote}."']))])
    analysis = await SocraticMediator(runtime, tool).analyze_issue(ISSUE)
    assert asked == []
    assert analysis.evidence == (f'"{quote}."',)
    assert analysis.confidence_score == pytest.approx(0.9)


async def test_a_claim_without_evidence_is_capped_below_the_gate() -> None:
    tool, _ = ask_tool()
    runtime = ScriptedRuntime([question(), Step.output(report(evidence=[]))])
    analysis = await SocraticMediator(runtime, tool).analyze_issue(ISSUE)
    assert analysis.confidence_score == NO_EVIDENCE_CAP
    assert not is_failed(analysis)


def test_check_evidence_rule() -> None:
    sources = ["Of my last 10 runs, 6 failed.  My   timeout is 90 s."]
    supported, unsupported, confidence = check_evidence(
        ["my TIMEOUT is 90 s", "failed", "I was never told my timeout"], sources, 1.0
    )
    assert supported == ["my TIMEOUT is 90 s"]
    assert unsupported == ["failed", "I was never told my timeout"]  # too short; made up
    assert confidence == pytest.approx(0.64)


def test_check_evidence_ignores_the_mediators_words_and_second_hand_quotes() -> None:
    asked = "Were your answers cut off at max_tokens=2048 before they were complete?"
    echo = f"You asked: {asked} I cannot say. My timeout is 90 s."
    supported, dropped, confidence = check_evidence(
        [
            "cut off at max_tokens=2048",  # the question's words, echoed
            "complete? I cannot say",  # spans the echo's cut: joins nothing
            "My timeout is 90 s",  # the agent's own words
            "the quality agent's notes are fine",  # another agent's words: true, not evidence
        ],
        [echo],
        1.0,
        questions=[asked],
        second_hand=["The quality agent's notes are fine."],
    )
    assert supported == ["My timeout is 90 s"]
    assert dropped == [
        "cut off at max_tokens=2048",
        "complete? I cannot say",
        "the quality agent's notes are fine",
    ]
    assert confidence == pytest.approx(0.8**2)  # the second-hand quote is not penalised


async def test_an_echo_of_the_mediators_leading_question_is_no_evidence() -> None:
    leading = "Were your answers cut off at max_tokens=2048 before they were complete?"

    async def echo(question: str) -> str:
        return f"You asked: {question} I do not know."

    tool = AskAgentTool({"research-agent": echo})
    quote = "answers cut off at max_tokens=2048"
    runtime = ScriptedRuntime([question(leading), Step.output(report(evidence=[quote]))])
    issue = ISSUE.model_copy(update={"error_logs": ()})
    analysis = await SocraticMediator(runtime, tool).analyze_issue(issue)
    assert analysis.evidence == ()
    assert analysis.confidence_score == NO_EVIDENCE_CAP


async def test_evidence_must_come_from_the_responsible_agent() -> None:
    tool, _ = ask_tool()
    # blames research-agent, quoting what quality-agent said: dropped, though not made up
    ask_quality = Step.tool_call(
        "ask_agent", {"agent_name": "quality-agent", "question": "How are your runs?"}
    )
    runtime = ScriptedRuntime(
        [ask_quality, question(), Step.output(report(evidence=["My runs are fine"]))]
    )
    analysis = await SocraticMediator(runtime, tool).analyze_issue(ISSUE)
    assert analysis.evidence == ()
    assert analysis.confidence_score == NO_EVIDENCE_CAP
    # blames quality-agent, quoting the errors recorded for research-agent's runs
    blame_quality = report(
        responsible_agent="quality-agent", evidence=["response stopped at max_tokens=2048"]
    )
    runtime = ScriptedRuntime([Step.output(blame_quality)])
    analysis = await SocraticMediator(runtime, tool).analyze_issue(ISSUE)
    assert analysis.responsible_agent == "quality-agent"
    assert analysis.evidence == ()
    assert analysis.confidence_score == NO_EVIDENCE_CAP


async def test_the_question_budget_forces_the_final_report() -> None:
    tool, asked = ask_tool()
    runtime = ScriptedRuntime(
        [question("one"), question("two"), question("three"), Step.output(report())]
    )
    mediator = SocraticMediator(runtime, tool, max_questions=2)
    analysis = await mediator.analyze_issue(ISSUE)
    assert asked == ["one", "two"]
    result = mediator.last_result
    assert result is not None
    third = result.tool_calls[2]
    assert third.is_error
    assert BUDGET_MESSAGE in third.output
    assert analysis.confidence_score == pytest.approx(0.9)


async def test_a_question_to_an_unknown_agent_is_a_tool_error_the_model_sees() -> None:
    tool, asked = ask_tool()
    ask = Step.tool_call("ask_agent", {"agent_name": "ghost", "question": "who are you?"})
    runtime = ScriptedRuntime([ask, Step.output(report())])
    mediator = SocraticMediator(runtime, tool)
    await mediator.analyze_issue(ISSUE)
    assert asked == []
    (exchange,) = mediator.last_questions
    assert exchange.error is not None
    assert "not found" in exchange.error
    assert mediator.last_result is not None
    assert "unknown agent 'ghost'" in mediator.last_result.tool_calls[0].output


SEED_TEXT = """ROOT CAUSE ANALYSIS REPORT
Analyzed Agent: research-agent
Cause Category: truncation
Confidence Score: 0.8
Root Cause:
max_tokens is too small.
Evidence:
- 6 runs stopped at my max_tokens limit of 2048
Recommendations:
1. raise max_tokens
"""


async def test_seed_text_report_is_parsed_when_structure_fails() -> None:
    tool, _ = ask_tool()
    bad = Step.output({"nonsense": True})
    runtime = ScriptedRuntime([question(), Step.text(SEED_TEXT), bad, bad])
    analysis = await SocraticMediator(runtime, tool).analyze_issue(ISSUE)
    assert analysis.identified_cause == "max_tokens is too small."
    assert analysis.cause_category == "truncation"
    assert analysis.confidence_score == pytest.approx(0.8)
    assert analysis.evidence == ("6 runs stopped at my max_tokens limit of 2048",)
    assert analysis.full_report == SEED_TEXT


async def test_unparseable_output_gives_a_failed_analysis_with_the_reason() -> None:
    tool, _ = ask_tool()
    bad = Step.output({"nonsense": True})
    runtime = ScriptedRuntime([Step.text("I am not sure what happened."), bad, bad])
    analysis = await SocraticMediator(runtime, tool).analyze_issue(ISSUE)
    assert is_failed(analysis)
    assert analysis.confidence_score == 0.0
    assert "output_invalid" in analysis.identified_cause
    assert "no 'Root Cause:' section" in analysis.identified_cause


async def test_a_report_naming_an_unknown_agent_fails() -> None:
    tool, _ = ask_tool()
    runtime = ScriptedRuntime([Step.output(report(responsible_agent="root-agent"))])
    analysis = await SocraticMediator(runtime, tool).analyze_issue(ISSUE)
    assert is_failed(analysis)
    assert "'root-agent', which is not an agent of the team" in analysis.identified_cause


async def test_a_misconfigured_runtime_gives_a_failed_analysis() -> None:
    tool, _ = ask_tool()
    analysis = await SocraticMediator(OfflineRuntime({}), tool).analyze_issue(ISSUE)
    assert is_failed(analysis)
    assert "no policy for agent 'socratic-mediator'" in analysis.identified_cause


async def test_offline_playbook_diagnoses_a_simulated_truncation(tmp_path: Path) -> None:
    runtime = SimulatedRuntime(seed=5)
    with PerformanceMonitor(baseline_n=20) as monitor:
        team = AgentTeam(copy_team(tmp_path / "team"), runtime, monitor=monitor)
        runtime.inject("research-agent", FaultKind.TRUNCATION)
        for n in range(4):
            await team.run("research-agent", f"topic {n}")
        metrics = monitor.get_agent_metrics("research-agent")
        assert metrics is not None
        issue = IssueReport(
            agent_name="research-agent",
            error_type="consecutive_failures",
            metrics=metrics.model_dump(),
            error_logs=list(metrics.recent_errors),
            available_agents=team.names,
        )
    mediator = SocraticMediator(
        OfflineRuntime(offline_policies()), AskAgentTool(team.ask_agent_registry())
    )
    analysis = await mediator.analyze_issue(issue)
    assert analysis.responsible_agent == "research-agent"
    assert analysis.cause_category == "truncation"
    assert analysis.confidence_score >= 0.7
    assert analysis.evidence
    assert mediator.last_questions
    assert all(q.agent_name == "research-agent" for q in mediator.last_questions)
