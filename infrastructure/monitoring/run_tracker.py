"""Timing one agent run into a monitor: a context manager (sync or async) and a decorator.

Apart from the ``PerformanceMonitor`` because it is a different concern (turning a block of code
into one run) and needs nothing from the monitor but its ``record`` method, which is all it
names (``Recorder``); ``PerformanceMonitor.track`` is the way to get one.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar, cast

__all__ = ["Recorder", "Tracker"]

P = ParamSpec("P")
R = TypeVar("R")


class Recorder(Protocol):
    """What a tracker records into: the monitor's ``record`` with the run's fields."""

    def record(
        self,
        agent_name: str,
        *,
        success: bool,
        duration_ms: float,
        error: str | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float = 0.0,
        source: str = ...,
        **extra: Any,
    ) -> None: ...


class Tracker:
    """Times one run for ``PerformanceMonitor.track``; see there.

    Inside a ``with`` block, ``set_usage()`` adds token counts and cost and ``fail()`` marks
    the run failed without raising (for an agent that returns its failure as data).
    """

    __slots__ = (
        "_error",
        "_extra",
        "_monitor",
        "_source",
        "_start",
        "agent_name",
        "cost_usd",
        "input_tokens",
        "output_tokens",
    )

    def __init__(
        self, monitor: Recorder, agent_name: str, source: str, extra: dict[str, Any]
    ) -> None:
        self._monitor = monitor
        self.agent_name = agent_name
        self._source = source
        self._extra = extra
        self._start = 0.0
        self._error: str | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd = 0.0

    def set_usage(
        self, *, input_tokens: int = 0, output_tokens: int = 0, cost_usd: float = 0.0
    ) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cost_usd += cost_usd

    def fail(self, error: str) -> None:
        self._error = error

    def __enter__(self) -> Tracker:
        self._start = time.perf_counter()
        self._error = None
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        elapsed_ms = (time.perf_counter() - self._start) * 1000.0
        if exc is not None:
            if not isinstance(exc, Exception):
                return
            self._error = f"{type(exc).__name__}: {exc}"
        self._monitor.record(
            self.agent_name,
            success=self._error is None,
            duration_ms=elapsed_ms,
            error=self._error,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost_usd=self.cost_usd,
            source=self._source,
            **self._extra,
        )

    async def __aenter__(self) -> Tracker:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate a function so each call is one tracked run (a fresh timer per call)."""
        monitor, agent, source, extra = self._monitor, self.agent_name, self._source, self._extra
        if inspect.iscoroutinefunction(fn):
            async_fn = cast(Callable[P, Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with Tracker(monitor, agent, source, extra):
                    return await async_fn(*args, **kwargs)

            return cast(Callable[P, R], run_async)

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with Tracker(monitor, agent, source, extra):
                return fn(*args, **kwargs)

        return run
