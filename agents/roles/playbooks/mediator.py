"""The offline Socratic mediator: question the agent, classify what it says, report with quotes.

It stands in for the mediator's model on the offline runtime and sees what that model would see:
its prompt (of which it reads only the ``<issue_report>`` block) and the answers ``ask_agent``
returns. It never looks at the runtime that produced the failures.

The interview (at most ``MAX_QUESTIONS`` questions):

1. four broad questions to the issue's agent: its errors, its tools and refusals, its model and
   limits with run times, its output format;
2. one follow-up on the signature the answers point to (the number a fix is sized by);
3. two questions to each other agent an answer names (at most two agents): a failure can be
   caused upstream, and the agent that suffers it is then only the messenger.

Blame moves to a named agent when that agent's own answers show a known signature and either the
issue's agent shows none, or the sentences carrying its signature name that agent. Evidence is
always a list of verbatim sentences from the answers or verbatim recorded errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import ValidationError

from agentmend.infrastructure.errors import AgentRunError, ErrorKind
from agentmend.infrastructure.llm.offline import OfflineCall
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.roles.ask_agent_tool import fenced_answer
from agentmend.roles.playbooks.signatures import (
    Finding,
    classify,
    contains_injection,
    denied_tools,
    full_run_seconds,
    missing_models,
    needed_tokens,
    split_sentences,
)
from agentmend.roles.prompt_blocks import PromptBlockError, extract_block
from agentmend.roles.schemas import CauseCategory, MediatorReport

__all__ = [
    "BASE_QUESTIONS",
    "FOLLOW_UPS",
    "MAX_QUESTIONS",
    "MAX_REFERENCED_AGENTS",
    "answer_text",
    "mediator_policy",
]

log = get_logger(__name__)

MAX_QUESTIONS = 10
MAX_REFERENCED_AGENTS = 2
MAX_EVIDENCE = 8

ERRORS_QUESTION = "Which errors did your recent runs end with?"
BASE_QUESTIONS: tuple[str, ...] = (
    ERRORS_QUESTION,
    "Which tools did you try to use, and were any refused?",
    "What model, max_tokens and timeout are you configured with, and how long did your "
    "recent runs take?",
    "Does your prompt state the output format, and did your replies keep to it?",
)
FOLLOW_UPS: dict[CauseCategory, str] = {
    "truncation": "How many output tokens did your answers need, and what max_tokens would "
    "let them finish?",
    "tool_denied": "Which tool was refused, and what do you need that tool for?",
    "model_unavailable": "Which model did the API reject, and which models does it serve now?",
    "timeout": "How far did your runs get before the timeout, and how long would a complete "
    "run take?",
    "format_violation": "Where does your system prompt state the output format instruction? "
    "Quote it.",
    "unknown": "What exactly did your failing runs report, and when did they start failing?",
}
_REFERENCED_QUESTIONS: tuple[str, ...] = (
    ERRORS_QUESTION,
    "What model, max_tokens, timeout and tools are you configured with?",
)

_CAPPED_NOTE = re.compile(r"\n?\[answer truncated: \d+ characters, showing \d+\]\s*$")


def answer_text(tool_output: str) -> str:
    """An ``ask_agent`` result without its ``<agent_answer>`` fence and the length-cap note."""
    return _CAPPED_NOTE.sub("", fenced_answer(tool_output)).strip()


@dataclass
class _Interview:
    """The questions asked so far and every answer, per agent."""

    call: OfflineCall
    asked: int = 0
    exhausted: bool = False
    answers: dict[str, list[str]] = field(default_factory=dict)

    async def ask(self, agent: str, question: str) -> str | None:
        if self.exhausted or self.asked >= MAX_QUESTIONS:
            return None
        self.asked += 1
        record = await self.call.call_tool("ask_agent", {"agent_name": agent, "question": question})
        if record.is_error:
            # the tool says when the question budget is used; stop asking then
            if "budget" in record.output.casefold() or "unknown tool" in record.output.casefold():
                self.exhausted = True
            log.debug("ask_agent_failed", agent=agent, error=record.output[:200])
            return None
        text = answer_text(record.output)
        self.answers.setdefault(agent, []).append(text)
        return text

    def of(self, agent: str) -> list[str]:
        return self.answers.get(agent, [])


def _issue(prompt: str) -> IssueReport:
    try:
        return IssueReport.model_validate(extract_block(prompt, "issue_report"))
    except PromptBlockError as exc:
        raise AgentRunError(ErrorKind.BAD_REQUEST, f"mediator playbook: {exc}") from exc
    except ValidationError as exc:
        raise AgentRunError(
            ErrorKind.BAD_REQUEST,
            f"mediator playbook: <issue_report> block is not an IssueReport: {exc}",
        ) from exc


# the ask_agent tool's description: "... Available agents: a, b. The answer comes back ...";
# names may hold dots and any letters (Claude Code's rule), so read up to the sentence's end
_AVAILABLE = re.compile(r"Available agents: (.*?)\. The answer comes back", re.S)


def _tool_agents(call: OfflineCall) -> list[str]:
    """Agent names the ``ask_agent`` tool's description offers (what a model is shown too)."""
    for tool in call.tools:
        if tool.name == "ask_agent":
            match = _AVAILABLE.search(tool.description)
            if match is not None and match.group(1) != "(none)":
                return [n.strip() for n in match.group(1).split(",") if n.strip()]
    return []


def _named_agents(texts: list[str], candidates: list[str], exclude: str) -> list[str]:
    """Other agents a (non-suspicious) sentence of ``texts`` mentions, in order of mention."""
    found: list[tuple[int, str]] = []
    joined = " ".join(s for t in texts for s in split_sentences(t) if not contains_injection(s))
    for name in candidates:
        if name == exclude:
            continue
        match = re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", joined)
        if match is not None:
            found.append((match.start(), name))
    return [name for _, name in sorted(found)]


@dataclass(frozen=True)
class _Verdict:
    agent: str
    finding: Finding
    evidence: list[str]
    confidence: float


def _decide(issue: IssueReport, interview: _Interview, referenced: list[str]) -> _Verdict:
    own = classify(interview.of(issue.agent_name), issue.error_logs)
    verdict = _Verdict(issue.agent_name, own, own.evidence, own.confidence)
    for other in referenced:
        theirs = classify(interview.of(other), [])
        if theirs.category == "unknown":
            continue
        pointers = [s for s in own.answer_symptoms if re.search(rf"\b{re.escape(other)}\b", s)]
        if own.category != "unknown" and not pointers:
            continue
        # second-hand report plus the agent's own account: two agents agree
        agree = bool(pointers) and own.category == theirs.category
        confidence = min(0.85, theirs.confidence + (0.15 if agree else 0.0))
        if own.category == "unknown":
            pointers = [
                s
                for t in interview.of(issue.agent_name)
                for s in split_sentences(t)
                if re.search(rf"\b{re.escape(other)}\b", s) and not contains_injection(s)
            ]
        # the other agent's own words first, then why the question went to it
        evidence = [*theirs.answer_symptoms, *pointers, *theirs.evidence]
        return _Verdict(other, theirs, evidence, confidence)
    return verdict


def _describe(agent: str, category: CauseCategory, evidence: list[str]) -> tuple[str, list[str]]:
    """(identified cause, recommendations) for the category, with numbers from the evidence."""
    if category == "truncation":
        need = needed_tokens(evidence)
        extra = f"; its answers need up to about {need} output tokens" if need else ""
        return (
            f"{agent}'s answers are cut off at its max_tokens limit before they are complete"
            f"{extra}.",
            [f"raise max_tokens to at least {need}" if need else "raise max_tokens"],
        )
    if category == "tool_denied":
        tools = denied_tools(evidence)
        named = ", ".join(tools) or "a tool"
        return (
            f"{agent}'s runs fail because permission to use {named} is denied: its task "
            "needs a tool its definition does not allow.",
            [f"add {tool} to {agent}'s tools" for tool in tools] or ["grant the refused tool"],
        )
    if category == "model_unavailable":
        models = missing_models(evidence)
        named = ", ".join(models) or "its configured model"
        return (
            f"{agent}'s requests are rejected because the model {named} is not available "
            "(not found).",
            ["switch to a model the API serves"],
        )
    if category == "timeout":
        seconds = full_run_seconds(evidence)
        extra = f"; a complete run takes about {seconds:g} s" if seconds else ""
        return (
            f"{agent}'s runs hit its timeout before they finish{extra}.",
            ["raise timeout_s above the time a complete run takes, or use a faster model"],
        )
    if category == "format_violation":
        return (
            f"{agent}'s replies break the required output format.",
            ["restate the output format instruction at the end of the system prompt"],
        )
    if category == "rate_limit":
        return (
            f"{agent}'s runs are refused by API rate limits or overload: a transient outage, "
            "not a fault of its configuration.",
            ["no configuration change; transient"],
        )
    return (
        f"No known failure signature in {agent}'s answers or recorded errors.",
        ["no configuration change without a diagnosis; escalate to a model-backed analysis"],
    )


async def mediator_policy(call: OfflineCall) -> MediatorReport:
    """Interview the issue's agent (and any agent it names), then report with quotes."""
    issue = _issue(call.prompt)
    agent = issue.agent_name
    interview = _Interview(call)
    for question in BASE_QUESTIONS:
        await interview.ask(agent, question)
    first = classify(interview.of(agent), issue.error_logs)
    follow_up = FOLLOW_UPS.get(first.category)
    if follow_up is not None:
        await interview.ask(agent, follow_up)
    candidates = list(dict.fromkeys([*issue.available_agents, *_tool_agents(call)]))
    referenced = _named_agents(interview.of(agent), candidates, agent)[:MAX_REFERENCED_AGENTS]
    for other in referenced:
        for question in _REFERENCED_QUESTIONS:
            await interview.ask(other, question)
    verdict = _decide(issue, interview, [a for a in referenced if interview.of(a)])
    evidence = list(dict.fromkeys(verdict.evidence))[:MAX_EVIDENCE]
    confidence = verdict.confidence
    if not evidence:
        confidence = min(confidence, 0.3)  # a claim with nothing to quote
    category = verdict.finding.category
    cause, recommendations = _describe(verdict.agent, category, evidence)
    log.debug(
        "mediator_playbook_decided",
        agent=verdict.agent,
        category=category,
        confidence=confidence,
        questions=interview.asked,
        set_aside=len(verdict.finding.suspicious),
    )
    return MediatorReport(
        responsible_agent=verdict.agent,
        cause_category=category,
        identified_cause=cause,
        confidence=round(confidence, 2),
        evidence=evidence,
        recommendations=recommendations,
    )
