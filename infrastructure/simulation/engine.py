"""One simulated run: a pure function of the definition, the draws and the active conditions.

The checks run in the order a real run meets them: the API accepts or rejects the request
(model, limits, throttling, outages), the agent calls its tools (permissions, turns), writes its
answer (length against ``max_tokens``, time against ``timeout_s``), and the reply is checked
against the format. The first that fails ends the run, as it would for real.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentmend.infrastructure.errors import AgentRunError, ErrorKind
from agentmend.infrastructure.llm.base import ToolCallRecord
from agentmend.infrastructure.simulation.outputs import off_format_text, reply_text, topic_of
from agentmend.infrastructure.simulation.team import (
    FORMAT_HEADING,
    TOKEN_SPREAD,
    AgentProfile,
    ModelProfile,
    format_instruction_line,
    has_format_instruction,
)

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = ["Conditions", "Draws", "Outcome", "draw", "simulate"]

_TRANSIENT = (
    (ErrorKind.OVERLOADED, 529, "overloaded_error: Overloaded"),
    (ErrorKind.SERVER_ERROR, 500, "api_error: Internal server error"),
    (ErrorKind.RATE_LIMIT, 429, "rate_limit_error: request rate limit exceeded, retry later"),
)
_TOOL_ARGUMENT = {
    "Read": "file_path",
    "Write": "file_path",
    "Edit": "file_path",
    "Grep": "pattern",
    "Glob": "pattern",
    "WebSearch": "query",
    "WebFetch": "url",
    "Bash": "command",
    "TodoWrite": "todos",
}


@dataclass(frozen=True, slots=True)
class Draws:
    """Every random number one run may use, drawn up front so branches never shift them."""

    transient: float
    transient_kind: int
    slip: float
    jitter: float
    api_ms: float
    tool_ms: tuple[float, ...]
    trace: str


def draw(seed: int, agent: str, index: int) -> Draws:
    """The draws of ``agent``'s ``index``-th run: a function of the three, nothing else."""
    digest = hashlib.sha256(f"{seed}\x00{agent}\x00{index}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:16], "big"))
    return Draws(
        transient=rng.random(),
        transient_kind=rng.randrange(len(_TRANSIENT)),
        slip=rng.random(),
        jitter=rng.uniform(-1.0, 1.0),
        api_ms=rng.uniform(150.0, 400.0),
        tool_ms=tuple(rng.uniform(250.0, 750.0) for _ in range(8)),
        trace=digest[16:22].hex(),
    )


@dataclass(frozen=True, slots=True)
class Conditions:
    """What the active faults amount to for one run (neutral values: a healthy world)."""

    model_gone: bool = False
    throttled: bool = False
    token_factor: float = 1.0
    latency_factor: float = 1.0
    extra_tools: tuple[str, ...] = ()
    format_strict: bool = False
    opaque_error: bool = False
    opaque_message: str | None = None


@dataclass(slots=True)
class Outcome:
    """A run as it unfolds; the runtime turns it into an ``AgentResult`` and a memory."""

    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    elapsed_ms: float = 0.0
    full_ms: float | None = None
    output_tokens: int = 0
    needed_tokens: int = 0
    text: str = ""
    stop_reason: str | None = None
    error: AgentRunError | None = None
    format_problem: str | None = None

    def fail(self, kind: ErrorKind, message: str, **details: float | int | None) -> Outcome:
        status = details.get("status_code")
        retry = details.get("retry_after_s")
        self.error = AgentRunError(
            kind,
            message,
            status_code=int(status) if status is not None else None,
            retry_after_s=float(retry) if retry is not None else None,
        )
        return self


def simulate(
    spec: AgentSpec,
    prompt: str,
    profile: AgentProfile,
    model_name: str,
    model: ModelProfile | None,
    conditions: Conditions,
    draws: Draws,
    *,
    base_failure_rate: float,
    max_tokens: int,
    timeout_s: float,
) -> Outcome:
    """Run ``spec`` on ``prompt`` in the world ``conditions`` describe."""
    outcome = Outcome(elapsed_ms=draws.api_ms)
    if model is None or conditions.model_gone:
        return outcome.fail(
            ErrorKind.MODEL_NOT_FOUND, f"not_found_error: model: {model_name}", status_code=404
        )
    if spec.max_tokens is not None and spec.max_tokens > model.max_output_tokens:
        return outcome.fail(
            ErrorKind.BAD_REQUEST,
            f"invalid_request_error: max_tokens: {spec.max_tokens} > {model.max_output_tokens}, "
            f"which is the maximum allowed number of output tokens for {model.name}",
            status_code=400,
        )
    if conditions.throttled:
        return outcome.fail(
            ErrorKind.RATE_LIMIT,
            "rate_limit_error: Number of requests has exceeded your rate limit",
            status_code=429,
            retry_after_s=5.0,
        )
    if draws.transient < base_failure_rate:
        kind, status, message = _TRANSIENT[draws.transient_kind]
        retry = 2.0 if status == 429 else None
        return outcome.fail(kind, message, status_code=status, retry_after_s=retry)
    slow = conditions.latency_factor
    outcome.elapsed_ms = 0.0
    if not _call_tools(spec, prompt, profile, conditions, draws, outcome):
        return outcome
    if conditions.opaque_error:
        outcome.elapsed_ms += draws.api_ms * slow
        code = int(hashlib.sha256(spec.name.encode()).hexdigest()[:4], 16) % 9000 + 1000
        message = conditions.opaque_message or (
            f"E_UPSTREAM_{code}: unexpected response from a dependency (trace {draws.trace})"
        )
        return outcome.fail(ErrorKind.RUNTIME, message)
    jitter = 1 + TOKEN_SPREAD * draws.jitter
    need = max(1, round(profile.answer_tokens * conditions.token_factor * jitter))
    outcome.needed_tokens = need
    written = min(need, max_tokens)
    tool_ms = outcome.elapsed_ms
    full_ms = tool_ms + model.generation_ms(written) * slow
    timeout_ms = timeout_s * 1000.0
    if full_ms > timeout_ms:
        share = max(0.0, (timeout_ms - tool_ms) / (full_ms - tool_ms))
        outcome.elapsed_ms = timeout_ms
        outcome.full_ms = full_ms
        outcome.output_tokens = int(written * share)
        return outcome.fail(
            ErrorKind.TIMEOUT,
            f"run exceeded timeout_s={timeout_s:g} (stopped after {timeout_s:g} s)",
        )
    outcome.elapsed_ms = full_ms
    outcome.output_tokens = written
    complete = reply_text(profile, prompt)
    if need > max_tokens:
        outcome.text = complete[: max(1, len(complete) * max_tokens // need)]
        outcome.stop_reason = "max_tokens"
        return outcome.fail(
            ErrorKind.TRUNCATED,
            f"response stopped at max_tokens={max_tokens} before the answer was complete",
        )
    outcome.stop_reason = "end_turn"
    # Under drift only an instruction stated last holds; any model slips now and then.
    drifted = conditions.format_strict and not _instruction_is_last(spec.system_prompt)
    slipped = draws.slip < 1.0 - model.quality
    if not has_format_instruction(spec.full_system_prompt):
        outcome.format_problem = "missing"
    elif drifted or slipped:
        outcome.format_problem = "ignored"
    if outcome.format_problem is not None:
        outcome.text = off_format_text(profile, prompt)
        return outcome.fail(
            ErrorKind.OUTPUT_INVALID,
            f"reply does not start with the required '{FORMAT_HEADING}' heading",
        )
    outcome.text = complete
    return outcome


def _instruction_is_last(prompt: str) -> bool:
    line, total = format_instruction_line(prompt)
    return line is not None and line == total


def _call_tools(
    spec: AgentSpec,
    prompt: str,
    profile: AgentProfile,
    conditions: Conditions,
    draws: Draws,
    outcome: Outcome,
) -> bool:
    """Make the agent's tool calls; False when a denial or the turn limit ended the run."""
    needed = list(profile.uses_tools)
    for extra in conditions.extra_tools:
        if extra not in needed:
            needed.insert(min(1, len(needed)), extra)
    allowed = spec.tools
    topic = topic_of(prompt)
    # Each tool call is a turn and so is the final answer; maxTurns cuts the list short.
    limit = len(needed) if spec.max_turns is None else min(len(needed), spec.max_turns)
    for number, tool in enumerate(needed[:limit]):
        took = draws.tool_ms[number % len(draws.tool_ms)] * conditions.latency_factor
        outcome.elapsed_ms += took
        call_id = f"toolu_sim_{number:02d}_{draws.trace}"
        arguments = {_TOOL_ARGUMENT.get(tool, "input"): topic}
        if allowed is not None and tool not in allowed:
            outcome.denied.append(tool)
            denial = f"Permission to use {tool} has been denied."
            outcome.tool_calls.append(
                ToolCallRecord(call_id, tool, arguments, denial, is_error=True)
            )
            outcome.fail(
                ErrorKind.TOOL_DENIED,
                f"permission to use tool '{tool}' was denied "
                f"(allowed tools: {', '.join(allowed) or 'none'})",
            )
            return False
        outcome.tool_calls.append(
            ToolCallRecord(call_id, tool, arguments, f"{tool}: ok", duration_ms=took)
        )
    if spec.max_turns is not None and len(needed) + 1 > spec.max_turns:
        outcome.fail(
            ErrorKind.MAX_TURNS, f"reached maxTurns={spec.max_turns} before the task was finished"
        )
        return False
    return True
