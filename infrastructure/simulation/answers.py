"""How a simulated agent answers the mediator: from its own recent runs and its definition.

An agent knows what it went through (error messages, stop reasons, refused tool calls, how long
its runs took, how much it still had to write) and what its definition says; it does not know
what the simulation did to it. So answers report symptoms with concrete numbers and names, the
way a real agent with that history could, and never name a fault.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from statistics import fmean
from typing import TYPE_CHECKING

from agentmend.infrastructure.errors import ErrorKind
from agentmend.infrastructure.simulation.team import (
    DEFAULT_MODEL,
    DEFAULT_TIMEOUT_S,
    FORMAT_HEADING,
    FORMAT_INSTRUCTION,
    AgentProfile,
    format_instruction_line,
    has_format_instruction,
    resolve_model,
)

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec
    from agentmend.infrastructure.simulation.run_record import RunRecord

__all__ = ["RECENT_RUNS", "compose_answer"]

RECENT_RUNS = 10
"""How many of its latest runs an agent talks about."""

# "output" is not a format word: "output tokens" asks about length, and a question about
# tokens gets the tokens answer first (the mediator's truncation follow-up asks just that)
_TOPICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tokens", ("output token", "tokens did", "max_tokens would", "finish", "cut off")),
    ("errors", ("error", "fail", "wrong", "problem", "issue", "happen", "broke", "why", "symptom")),
    ("tools", ("tool", "permission", "denied", "access", "allowed")),
    ("model", ("model",)),
    ("timing", ("timeout", "time", "slow", "latency", "duration", "long", "fast", "speed", "took")),
    ("format", ("format", "heading", "structure", "markdown", "repl", "instruction")),
    ("config", ("config", "setting", "max_tokens", "token", "limit", "parameter", "temperature",
                "definition", "prompt")),
)  # fmt: skip


def _topics(question: str) -> list[str]:
    text = question.casefold()
    return [
        topic
        for topic, words in _TOPICS
        if any(re.search(rf"\b{re.escape(word)}", text) for word in words)
    ]


def _count(number: int, word: str, plural: str | None = None) -> str:
    return f"{number} {word if number == 1 else (plural or word + 's')}"


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.0f} s" if ms >= 10_000 else f"{ms / 1000:.1f} s"


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f"'{name}'" for name in names)


def compose_answer(
    profile: AgentProfile,
    question: str,
    spec: AgentSpec,
    records: Sequence[RunRecord],
    serving_models: Sequence[str],
) -> str:
    """The agent's answer: the sections the question asks about, or a summary."""
    recent = list(records[-RECENT_RUNS:])
    sections: dict[str, Callable[[], list[str]]] = {
        "errors": lambda: _errors(profile, spec, records, recent),
        "tools": lambda: _tools(profile, spec, recent),
        "model": lambda: _model(spec, recent, serving_models),
        "timing": lambda: _timing(spec, records, recent),
        "format": lambda: _format(spec, recent),
        "config": lambda: _config(spec, recent),
        "tokens": lambda: _tokens(spec, recent),
    }
    chosen = _topics(question) or ["config", "errors"]
    sentences: list[str] = []
    for topic in chosen:
        for sentence in sections[topic]():
            if sentence not in sentences:
                sentences.append(sentence)
    return " ".join(sentences)


def _errors(
    profile: AgentProfile, spec: AgentSpec, records: Sequence[RunRecord], recent: list[RunRecord]
) -> list[str]:
    if not recent:
        return ["I have no runs on record yet, so I have no errors to report."]
    failed = [record for record in recent if not record.success]
    if not failed:
        return [f"My last {_count(len(recent), 'run')} all succeeded."]
    if len(recent) == 1:
        sentences = ["My last run failed."]
    else:
        sentences = [
            f"Of my last {len(recent)} runs, {len(failed)} failed and "
            f"{len(recent) - len(failed)} succeeded."
        ]
    by_kind: dict[ErrorKind, list[RunRecord]] = {}
    for record in failed:
        assert record.error_kind is not None
        by_kind.setdefault(record.error_kind, []).append(record)
    for kind, group in sorted(by_kind.items(), key=lambda item: -len(item[1])):
        sentences.extend(_kind_sentences(kind, group, profile, spec))
    if set(by_kind) & {ErrorKind.TRUNCATED, ErrorKind.TIMEOUT}:
        sentences.extend(_typical(records))
    return sentences


def _kind_sentences(
    kind: ErrorKind, group: list[RunRecord], profile: AgentProfile, spec: AgentSpec
) -> list[str]:
    n = len(group)
    last = group[-1]
    runs = _count(n, "run")
    if kind is ErrorKind.TRUNCATED:
        needs = [record.needed_tokens for record in group]
        # what the agent would ask for: its longest answer plus a margin, in 256-token steps
        enough = -(-round(max(needs) * 1.2) // 256) * 256
        return [
            f"{runs} stopped at my max_tokens limit of {last.max_tokens} before the answer was "
            f"complete (stop reason max_tokens); those answers needed about "
            f"{round(fmean(needs))} output tokens, {max(needs)} at most, so a max_tokens of at "
            f"least {enough} would let them finish."
        ]
    if kind is ErrorKind.TOOL_DENIED:
        tools = list(dict.fromkeys(tool for record in group for tool in record.denied_tools))
        allowed = ", ".join(last.allowed_tools or ()) or "none"
        sentences = [
            f"{runs} could not be finished because I was denied permission to use "
            f"{_quoted(tools)}, which is not among my allowed tools ({allowed})."
        ]
        if profile.extra_tool in tools:
            sentences.append(f"I need {profile.extra_tool} {profile.extra_tool_purpose}.")
        return sentences
    if kind is ErrorKind.MODEL_NOT_FOUND:
        return [
            f"The API rejected {runs} before I could start: model '{last.model}' was not "
            "found (404)."
        ]
    if kind is ErrorKind.TIMEOUT:
        return [_timeouts(group)]
    if kind is ErrorKind.OUTPUT_INVALID:
        structured = [record for record in group if record.format_problem == "structured"]
        sentences = []
        if structured:
            sentences.append(
                f"{_count(len(structured), 'run')} produced no valid structured output: "
                f"'{structured[-1].error_message}'."
            )
        if len(structured) < n:
            sentences.append(
                f"{_count(n - len(structured), 'reply', 'replies')} failed the output check "
                f"because they did not start with the required '{FORMAT_HEADING}' heading."
            )
            sentences.append(_format_state(spec))
        return sentences
    if kind is ErrorKind.RATE_LIMIT:
        return [f"The API refused {runs} with rate limit errors (429)."]
    if kind is ErrorKind.OVERLOADED:
        return [f"The API was overloaded (529) for {runs}."]
    if kind is ErrorKind.SERVER_ERROR:
        return [f"The API returned an internal server error (500) for {runs}."]
    if kind is ErrorKind.BAD_REQUEST:
        return [f"The API rejected {runs} as invalid requests: '{last.error_message}'."]
    if kind is ErrorKind.MAX_TURNS:
        return [f"{runs} ran out of turns at maxTurns={last.max_turns} before the task was done."]
    if kind is ErrorKind.RUNTIME:
        return [
            f"{runs} failed with this error: '{last.error_message}'.",
            "The message says nothing more, and I have no other information about it.",
        ]
    return [f"{runs} failed: '{last.error_message}'."]


def _timeouts(group: list[RunRecord]) -> str:
    done = fmean(record.duration_ms / record.full_duration_ms for record in group)
    need = fmean(record.full_duration_ms for record in group)
    return (
        f"{_count(len(group), 'run')} hit my timeout of {group[-1].timeout_s:g} s with about "
        f"{done:.0%} of the work done, so a complete run would take about {_seconds(need)}."
    )


def _typical(records: Sequence[RunRecord]) -> list[str]:
    ok = [record for record in records if record.success]
    if not ok:
        return []
    return [
        f"My successful runs took about {_seconds(fmean(r.duration_ms for r in ok))} and wrote "
        f"about {round(fmean(r.output_tokens for r in ok))} output tokens."
    ]


def _tools(profile: AgentProfile, spec: AgentSpec, recent: list[RunRecord]) -> list[str]:
    if spec.tools is None:
        sentences = ["My definition does not restrict my tools, so every tool is allowed."]
    else:
        sentences = [f"My allowed tools are: {', '.join(spec.tools) or 'none'}."]
    called = list(dict.fromkeys(tool for record in recent for tool in record.tools_called))
    if called:
        sentences.append(f"In my recent runs I called {', '.join(called)}.")
    denials = Counter(tool for record in recent for tool in record.denied_tools)
    if not denials:
        sentences.append("None of my tool calls was refused.")
    for tool, count in denials.items():
        sentences.append(
            f"I tried to call '{tool}' in {count} of my last {len(recent)} runs, but permission "
            "was denied because it is not in my allowed tools."
        )
        if tool == profile.extra_tool:
            sentences.append(f"I need {tool} {profile.extra_tool_purpose}.")
        if spec.tools is None or tool in spec.tools:
            sentences.append(f"My definition allows '{tool}' now.")
    return sentences


def _model(spec: AgentSpec, recent: list[RunRecord], serving: Sequence[str]) -> list[str]:
    resolved = resolve_model(spec.model)
    if spec.model is None:
        sentences = [f"My definition sets no model, so I run on the default, '{DEFAULT_MODEL}'."]
    elif resolved != spec.model:
        sentences = [f"My definition sets model '{spec.model}', which means '{resolved}'."]
    else:
        sentences = [f"My definition sets model '{resolved}'."]
    missing = [r for r in recent if r.error_kind is ErrorKind.MODEL_NOT_FOUND]
    if missing:
        sentences.append(
            f"In {len(missing)} of my last {len(recent)} runs the API answered that model "
            f"'{missing[-1].model}' was not found (404), so I could not work at all."
        )
    elif recent:
        sentences.append("The model answered my recent requests.")
    sentences.append(f"The models the API serves are: {', '.join(serving)}.")
    return sentences


def _timing(spec: AgentSpec, records: Sequence[RunRecord], recent: list[RunRecord]) -> list[str]:
    if spec.timeout_s is None:
        sentences = [
            f"My definition sets no timeout, so the default of {DEFAULT_TIMEOUT_S:g} s applies."
        ]
    else:
        sentences = [f"My timeout is {spec.timeout_s:g} s."]
    if recent:
        latest = recent[-5:]
        took = ", ".join(_seconds(record.duration_ms) for record in latest)
        sentences.append(f"My last {_count(len(latest), 'run')} took {took}.")
    timeouts = [r for r in recent if r.error_kind is ErrorKind.TIMEOUT]
    if timeouts:
        sentences.append(_timeouts(timeouts))
    sentences.extend(_typical(records))
    return sentences


def _format_state(spec: AgentSpec) -> str:
    if not has_format_instruction(spec.full_system_prompt):
        return f'My system prompt does not contain the format instruction ("{FORMAT_INSTRUCTION}").'
    line, total = format_instruction_line(spec.system_prompt)
    if line is None:
        return (
            "The format instruction is in the documents appended to my prompt, not in the prompt."
        )
    if line == total:
        return (
            "My system prompt states the format instruction as its last line: "
            f'"{FORMAT_INSTRUCTION}"'
        )
    return (
        f'My system prompt states the format instruction ("{FORMAT_INSTRUCTION}") at line '
        f"{line} of {total}, with {total - line} more lines of other instructions after it."
    )


def _format(spec: AgentSpec, recent: list[RunRecord]) -> list[str]:
    sentences = [f"My replies must start with a '{FORMAT_HEADING}' heading.", _format_state(spec)]
    bad = [r for r in recent if r.format_problem in ("missing", "ignored")]
    if bad:
        sentences.append(
            f"{_count(len(bad), 'reply', 'replies')} of my last {len(recent)} failed the output "
            "check because they did not start with the heading."
        )
        if any(record.format_problem == "ignored" for record in bad):
            sentences.append("Those replies did not keep to the instruction my prompt gives.")
    elif recent:
        sentences.append("My recent replies kept to the format.")
    return sentences


def _tokens(spec: AgentSpec, recent: list[RunRecord]) -> list[str]:
    """How long the agent's answers needed to be, against the max_tokens it runs with."""
    if not recent:
        return ["I have no runs on record yet, so I cannot say how long my answers need to be."]
    limit = f"max_tokens {spec.max_tokens}" if spec.max_tokens is not None else "no max_tokens set"
    needs = [record.needed_tokens for record in recent if record.needed_tokens]
    cut = sum(record.error_kind is ErrorKind.TRUNCATED for record in recent)
    if not needs or not cut:
        wrote = round(fmean(record.output_tokens for record in recent))
        return [
            f"None of my last {_count(len(recent), 'run')} was cut off for length with {limit}; "
            f"they wrote about {wrote} output tokens."
        ]
    return [
        f"My recent answers needed about {round(fmean(needs))} output tokens ({min(needs)} to "
        f"{max(needs)}); with {limit}, {cut} of my last {_count(len(recent), 'run')} stopped "
        f"before they finished. A max_tokens of at least {max(needs)} would let all of them "
        "finish."
    ]


def _config(spec: AgentSpec, recent: list[RunRecord]) -> list[str]:
    tools = ", ".join(spec.tools) if spec.tools is not None else "not restricted"
    has = "contains" if has_format_instruction(spec.full_system_prompt) else "does not contain"
    sentences = [
        f"My configuration: model '{resolve_model(spec.model)}', max_tokens "
        f"{spec.max_tokens if spec.max_tokens is not None else 'not set'}, timeout_s "
        f"{f'{spec.timeout_s:g}' if spec.timeout_s is not None else 'not set'}, temperature "
        f"{spec.temperature if spec.temperature is not None else 'not set'}, maxTurns "
        f"{spec.max_turns if spec.max_turns is not None else 'not set'}, tools: {tools}; my "
        f"system prompt {has} the format instruction."
    ]
    needs = [record.needed_tokens for record in recent if record.needed_tokens]
    if needs:
        sentences.append(
            f"My recent answers needed about {round(fmean(needs))} output tokens "
            f"({min(needs)} to {max(needs)})."
        )
    return sentences
