"""One simulated run as the agent remembers it: kept by the runtime, read by the answers."""

from __future__ import annotations

from dataclasses import dataclass

from agentmend.infrastructure.errors import ErrorKind

__all__ = ["RunRecord"]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run as the agent remembers it: what it tried, what happened, under which settings.

    ``full_duration_ms`` is how long the run needed; it exceeds ``duration_ms`` only when the
    timeout cut the run short. ``format_problem`` is ``"missing"`` (the prompt has no format
    instruction), ``"ignored"`` (the reply left the format although the prompt states it),
    ``"structured"`` (the structured output could not be produced) or None.
    """

    index: int
    at_s: float
    model: str
    success: bool
    error_kind: ErrorKind | None
    error_message: str | None
    status_code: int | None
    stop_reason: str | None
    tools_called: tuple[str, ...]
    denied_tools: tuple[str, ...]
    allowed_tools: tuple[str, ...] | None
    duration_ms: float
    full_duration_ms: float
    output_tokens: int
    needed_tokens: int
    max_tokens: int
    timeout_s: float
    max_turns: int | None
    format_problem: str | None = None
