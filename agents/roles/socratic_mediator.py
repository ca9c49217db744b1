"""``SocraticMediator``: from an ``IssueReport`` to a ``RootCauseAnalysis``, by questioning.

The mediator's own definition (``agents/definitions/socratic-mediator.md``) runs on the roles'
runtime with one tool, ``ask_agent``, limited to ``max_questions`` calls: the next call gets a
tool error telling the model to give its final report now. The report comes back structured
(``MediatorReport``); when a model fails to give structure, the plain-text report in the
run's text is parsed instead; when neither works the analysis says so with confidence 0.

The evidence check (what it guarantees, and what it does not)
-------------------------------------------------------------
A quote supports the analysis only if, compared case-insensitively with whitespace normalised
and surrounding quotes and end punctuation ignored, it is a verbatim part of

- an ``ask_agent`` answer of *this* analysis given by the *responsible* agent, with the text of
  the mediator's own questions cut out of the answer first (an agent that repeats the question
  does not make the question evidence), or
- the issue's recorded errors, when the responsible agent is the agent that raised the issue
  (those errors are its own runs);

and it does not also appear in any question the mediator asked (a leading question's words
are the mediator's, whoever repeats them). A quote shorter than ``MIN_QUOTE_CHARS`` supports
nothing (a word such as "error" appears everywhere). Then:

- a quote found only in *another* agent's answers is true but second-hand: it is dropped
  without penalty (it neither supports the blame nor is made up);
- every other unsupported quote (found nowhere, or only in the mediator's questions) is dropped
  and multiplies the confidence by ``UNSUPPORTED_FACTOR`` (0.8): a fabricated quote costs a
  fifth of the confidence;
- with no supported quote left, the confidence is capped at ``NO_EVIDENCE_CAP`` (0.3), below
  any sensible confidence gate: a claim without evidence changes nothing;
- a responsible agent that is not a known agent gives confidence 0 (nothing to fix).

What this guarantees: the evidence an analysis keeps was really said by the agent it blames
(or recorded for its runs) in words the mediator did not put to it. What it does not: that the
agent's words are true (an agent can be wrong, or repeat text injected into its inputs), that a
quote means what the analysis says it means, or that the cause is right. Those are for the
gates, the supervisor's review and, above all, verification, which keeps a change only when
it is shown to fix the agent's own cases.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.errors import AgentmendError, InvalidArgument
from agentmend.infrastructure.llm.base import AgentResult, AgentRuntime, ToolError, ToolSpec
from agentmend.infrastructure.models import IssueReport, RootCauseAnalysis
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.roles.ask_agent_tool import AskAgentInput, AskAgentTool
from agentmend.roles.outcomes import QuestionAnswer
from agentmend.roles.prompt_blocks import render_block
from agentmend.roles.report_parsing import ReportParseError, parse_analysis_report
from agentmend.roles.schemas import MediatorReport
from agentmend.roles.team import load_role_spec

__all__ = [
    "BUDGET_MESSAGE",
    "MIN_QUOTE_CHARS",
    "NO_EVIDENCE_CAP",
    "UNSUPPORTED_FACTOR",
    "SocraticMediator",
    "build_analysis_context",
    "check_evidence",
    "is_failed",
]

log = get_logger(__name__)

MIN_QUOTE_CHARS = 12
UNSUPPORTED_FACTOR = 0.8
NO_EVIDENCE_CAP = 0.3
BUDGET_MESSAGE = "question budget used: give your final report now"

OnQuestion = Callable[[QuestionAnswer], Awaitable[None] | None]


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def _quote_key(quote: str) -> str:
    text = _norm(quote).strip("\"'“”‘’`")
    return text.rstrip(".,;:!?").strip()


def check_evidence(
    evidence: list[str],
    sources: list[str],
    confidence: float,
    *,
    questions: Sequence[str] = (),
    second_hand: Sequence[str] = (),
) -> tuple[list[str], list[str], float]:
    """Split ``evidence`` into (supported, dropped) and adjust ``confidence``.

    Args:
        evidence: the analysis's quotes.
        sources: what may support a quote: the responsible agent's answers and, when it raised
            the issue, its recorded errors.
        confidence: the analysis's confidence before the check.
        questions: the mediator's questions: their text is cut out of every source first, and
            a quote found in one supports nothing.
        second_hand: other agents' answers: a quote found only there is dropped without the
            penalty for a made-up quote.

    See the module docstring for the rule.
    """
    asked = [_norm(question) for question in questions if question.strip()]

    def own_words(text: str) -> str:
        text = _norm(text)
        for question in asked:
            text = text.replace(question, " | ")  # an echo joins nothing across the cut
        return text

    haystack = [own_words(source) for source in sources if source]
    others = [own_words(source) for source in second_hand if source]
    supported: list[str] = []
    dropped: list[str] = []
    penalised = 0
    for quote in evidence:
        key = _quote_key(quote)
        long_enough = len(key) >= MIN_QUOTE_CHARS
        leading = any(key in question for question in asked)
        if long_enough and not leading and any(key in source for source in haystack):
            supported.append(quote)
            continue
        dropped.append(quote)
        if not (long_enough and not leading and any(key in source for source in others)):
            penalised += 1
    adjusted = confidence * UNSUPPORTED_FACTOR**penalised
    if not supported:
        adjusted = min(adjusted, NO_EVIDENCE_CAP)
    return supported, dropped, round(adjusted, 6)


def _percent(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) else "N/A"


def build_analysis_context(issue: IssueReport) -> str:
    """The issue in words (agent, error type, metrics, recent errors), for a model to read."""
    metrics = issue.metrics
    duration = metrics.get("avg_duration_ms")
    errors = "\n".join(f"- {error}" for error in issue.error_logs[-5:]) or "- (none recorded)"
    return (
        f"Agent Name: {issue.agent_name}\n"
        f"Issue Type: {issue.error_type}\n\n"
        "Performance Metrics:\n"
        f"- Success Rate: {_percent(metrics.get('success_rate'))}\n"
        f"- Avg Duration: {f'{duration:.0f}' if isinstance(duration, int | float) else 'N/A'}ms\n"
        f"- Error Count: {len(issue.error_logs)}\n"
        f"- Consecutive Failures: {metrics.get('consecutive_failures', 'N/A')}\n\n"
        f"Recent Errors:\n{errors}\n\n"
        f"Context:\n{issue.context or '(none)'}\n\n"
        "Your task: Identify the root cause through Socratic questioning.\n"
        f"Available agents to query: {', '.join(issue.available_agents) or issue.agent_name}"
    )


class SocraticMediator:
    """Questions the agents about an issue and reports its root cause.

    Args:
        runtime: the roles' runtime (offline playbooks, a model API, or a fake).
        ask_agent_tool: the team's ``AskAgentTool``.
        spec: the mediator's definition (default: the shipped one).
        max_questions: ``ask_agent`` calls allowed per analysis.
        known_agents: names a responsible agent may have (default: the ask tool's registry
            plus the issue's ``available_agents``).
        on_question: called after each question with the exchange (live progress).
    """

    def __init__(
        self,
        runtime: AgentRuntime,
        ask_agent_tool: AskAgentTool,
        *,
        spec: AgentSpec | None = None,
        max_questions: int = 10,
        known_agents: Collection[str] | None = None,
        on_question: OnQuestion | None = None,
    ) -> None:
        if max_questions < 1:
            raise InvalidArgument("max_questions", max_questions, "must be at least 1")
        self.runtime = runtime
        self.ask_agent_tool = ask_agent_tool
        self.spec = spec if spec is not None else load_role_spec("socratic-mediator")
        self.max_questions = max_questions
        self.known_agents = frozenset(known_agents) if known_agents is not None else None
        self.on_question = on_question
        self.model_calls = 0
        self.last_result: AgentResult[MediatorReport] | None = None
        self.last_questions: list[QuestionAnswer] = []

    def build_prompt(self, issue: IssueReport) -> str:
        """The prompt contract: the context in words plus the ``<issue_report>`` block."""
        unreachable = (
            f"{issue.agent_name!r} cannot be questioned: agentmend only sees its recorded runs "
            "(for example from OpenTelemetry spans), not the agent itself. Say so in your "
            "report and reason from the recorded errors and metrics; question the agents you "
            "can reach.\n\n"
            if issue.agent_name not in self.ask_agent_tool.agent_registry
            else ""
        )
        return (
            "Analyze this performance issue:\n\n"
            f"{unreachable}"
            f"{build_analysis_context(issue)}\n\n"
            f"{render_block('issue_report', issue.model_dump(mode='json'))}"
        )

    def _tool(self, exchanges: list[QuestionAnswer]) -> ToolSpec:
        """``ask_agent`` for one analysis: counts questions and keeps the raw answers."""
        tool = self.ask_agent_tool

        async def handler(arguments: dict[str, Any]) -> str:
            if len(exchanges) >= self.max_questions:
                raise ToolError(BUDGET_MESSAGE)
            name, question = str(arguments["agent_name"]), str(arguments["question"])
            result = await tool.ask_agent(name, question)
            exchange = QuestionAnswer(
                agent_name=name,
                question=question,
                answer=str(result["answer"]) if result["success"] else "",
                error=None if result["success"] else str(result["error"]),
            )
            exchanges.append(exchange)
            log.debug("question_asked", agent=name, question=question, ok=result["success"])
            if self.on_question is not None:
                notified = self.on_question(exchange)
                if inspect.isawaitable(notified):
                    await notified
            if not result["success"]:
                known = ", ".join(sorted(tool.agent_registry)) or "(none)"
                if name not in tool.agent_registry:
                    raise ToolError(f"unknown agent {name!r}; known agents: {known}")
                raise ToolError(f"agent {name!r} could not answer: {result['error']}")
            return tool.format_answer(name, exchange.answer)

        base = tool.tool_spec
        return ToolSpec(
            name=base.name,
            description=base.description + f" At most {self.max_questions} questions.",
            handler=handler,
            input_model=AskAgentInput,
        )

    async def analyze_issue(self, issue: IssueReport) -> RootCauseAnalysis:
        """Question the agents about ``issue`` and return the checked analysis.

        Never raises for a model's failure: a failed run, a missing or unparseable report or an
        unknown responsible agent give an analysis with confidence 0 whose cause says why.
        """
        exchanges: list[QuestionAnswer] = []
        self.last_questions = exchanges
        try:
            result: AgentResult[MediatorReport] = await self.runtime.run(
                self.spec,
                self.build_prompt(issue),
                tools=[self._tool(exchanges)],
                output_type=MediatorReport,
            )
        except AgentmendError as exc:  # misconfiguration of the roles' runtime
            return self._failed(issue, f"the mediator could not run: {exc}")
        self.last_result = result
        self.model_calls += max(1, result.turns)
        if result.output is not None:
            report = result.output
            analysis = RootCauseAnalysis(
                issue=issue,
                identified_cause=report.identified_cause,
                confidence_score=report.confidence,
                recommendations=list(report.recommendations),
                full_report=report.model_dump_json(),
                responsible_agent=report.responsible_agent,
                evidence=list(report.evidence),
                cause_category=report.cause_category,
            )
        else:
            why = str(result.error) if result.error is not None else "no structured report"
            try:
                analysis = parse_analysis_report(result.text, issue)
            except ReportParseError as exc:
                return self._failed(issue, f"{why}; the text fallback failed too: {exc}")
            log.info("parsed_text_report", agent=issue.agent_name, reason=why)
        return self._checked(analysis, exchanges)

    def _checked(
        self, analysis: RootCauseAnalysis, exchanges: list[QuestionAnswer]
    ) -> RootCauseAnalysis:
        issue = analysis.issue
        known = self.known_agents or frozenset(
            {*self.ask_agent_tool.agent_registry, *issue.available_agents, issue.agent_name}
        )
        responsible = analysis.responsible_agent or issue.agent_name
        if responsible not in known:
            return self._failed(
                issue,
                f"the report names {responsible!r}, which is not an agent of the team "
                f"(agents: {', '.join(sorted(known))})",
                report=analysis.full_report,
            )
        own = [e.answer for e in exchanges if e.agent_name == responsible and e.error is None]
        if responsible == issue.agent_name:
            own += issue.error_logs
        supported, unsupported, confidence = check_evidence(
            list(analysis.evidence),
            own,
            analysis.confidence_score,
            questions=[exchange.question for exchange in exchanges],
            second_hand=[e.answer for e in exchanges if e.agent_name != responsible],
        )
        if unsupported:
            log.warning(
                "dropped_unsupported_evidence",
                agent=responsible,
                dropped=len(unsupported),
                confidence_before=analysis.confidence_score,
                confidence_after=confidence,
            )
        return analysis.model_copy(
            update={
                "responsible_agent": responsible,
                "evidence": tuple(supported),
                "confidence_score": confidence,
            }
        )

    @staticmethod
    def _failed(issue: IssueReport, why: str, *, report: str = "") -> RootCauseAnalysis:
        log.warning("analysis_failed", agent=issue.agent_name, reason=why)
        return RootCauseAnalysis(
            issue=issue,
            identified_cause=f"analysis failed: {why}",
            confidence_score=0.0,
            full_report=report,
            responsible_agent=None,
            cause_category="unknown",
        )


def is_failed(analysis: RootCauseAnalysis) -> bool:
    """Whether ``analysis`` is the mediator's "could not analyse" answer."""
    return analysis.confidence_score == 0.0 and analysis.identified_cause.startswith(
        "analysis failed:"
    )
