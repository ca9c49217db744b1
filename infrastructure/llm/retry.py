"""The one retry policy for calls to a model, applied only at the edge that talks to it.

Retrying in one place keeps attempts from multiplying (the SDK clients are built with
``max_retries=0``) and makes the schedule testable: the policy's ``sleep`` is injectable, so
tests pass a recording no-op and run instantly.

What is retried is decided on ``AgentRunError`` (a runtime maps its SDK's exceptions first):
rate limits, overload (529), 5xx, connection failures and request timeouts, plus the 408 and
409 statuses; any other 4xx is the caller's fault and fails at once. The wait is exponential
with jitter, except that a server's ``retry-after`` is honoured (capped at ``max_wait_s``). The
policy gives up after ``max_attempts`` or when the next wait would end past ``deadline_s``
(counted from the first attempt), re-raising the last error.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
)

from agentmend.infrastructure.errors import AgentRunError, ErrorKind, InvalidArgument
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["RetryPolicy", "is_retryable", "run_with_retry"]

T = TypeVar("T")

log = get_logger(__name__)

_RETRYABLE_KINDS = frozenset(
    {
        ErrorKind.RATE_LIMIT,
        ErrorKind.OVERLOADED,
        ErrorKind.SERVER_ERROR,
        ErrorKind.CONNECTION,
        ErrorKind.TIMEOUT,
    }
)
_RETRYABLE_STATUSES = frozenset({408, 409, 429})


def is_retryable(error: BaseException) -> bool:
    """True for the transient failures worth another attempt."""
    if not isinstance(error, AgentRunError):
        return False
    if error.status_code is not None and 400 <= error.status_code < 500:
        return error.status_code in _RETRYABLE_STATUSES
    return error.kind in _RETRYABLE_KINDS


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry a model call.

    Attributes:
        max_attempts: attempts in all, the first included (1 = no retry).
        initial_wait_s: the first backoff; it doubles per attempt, plus up to as much jitter.
        max_wait_s: cap on one wait, a server's ``retry-after`` included.
        deadline_s: no retry whose wait would end later than this after the first attempt.
        sleep: how to wait; tests inject a recording no-op.
    """

    max_attempts: int = 4
    initial_wait_s: float = 1.0
    max_wait_s: float = 30.0
    deadline_s: float = 120.0
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgument(
                "RetryPolicy.max_attempts", self.max_attempts, "must be at least 1"
            )
        if min(self.initial_wait_s, self.max_wait_s, self.deadline_s) < 0:
            raise InvalidArgument(
                "RetryPolicy waits and deadline",
                (self.initial_wait_s, self.max_wait_s, self.deadline_s),
                "must not be negative",
            )

    @classmethod
    def no_retry(cls) -> RetryPolicy:
        """One attempt only."""
        return cls(max_attempts=1)

    def wait_for(self, attempt: int, error: BaseException | None) -> float:
        """The wait after failed attempt number ``attempt`` (1-based) that raised ``error``."""
        retry_after = error.retry_after_s if isinstance(error, AgentRunError) else None
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_wait_s)
        # Jitter spreads the retries of agents that failed together (a shared rate limit).
        backoff = self.initial_wait_s * 2.0 ** min(attempt - 1, 30)
        return min(self.max_wait_s, backoff + random.uniform(0.0, self.initial_wait_s))

    def _wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return self.wait_for(state.attempt_number, error)


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning(
        "model_call_retrying",
        attempt=state.attempt_number,
        wait_s=round(state.upcoming_sleep, 3),
        kind=error.kind.value if isinstance(error, AgentRunError) else type(error).__name__,
    )


async def run_with_retry(policy: RetryPolicy, call: Callable[[], Awaitable[T]]) -> T:
    """Await ``call()`` under ``policy``; the last error is re-raised when it gives up."""
    started = time.monotonic()
    # The first attempt runs outside tenacity: most calls succeed, and the machinery costs
    # tens of microseconds per call. Tenacity takes over from the first retryable failure.
    try:
        return await call()
    except Exception as exc:
        if policy.max_attempts == 1 or not is_retryable(exc):
            raise
        first_error: Exception | None = exc

    async def attempt() -> T:
        nonlocal first_error
        if first_error is not None:
            error, first_error = first_error, None
            raise error
        return await call()

    def give_up(state: RetryCallState) -> bool:
        if state.attempt_number >= policy.max_attempts:
            return True
        # The deadline counts from the first attempt, which tenacity did not see start.
        return time.monotonic() - started + state.upcoming_sleep >= policy.deadline_s

    retrying = AsyncRetrying(
        stop=give_up,
        wait=policy._wait,
        retry=retry_if_exception(is_retryable),
        sleep=policy.sleep,
        before_sleep=_log_retry,
        reraise=True,
    )
    return await retrying(attempt)
