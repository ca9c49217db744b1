"""What the monitor keeps in memory per agent: a window of recent runs, counters, a baseline.

A run travels as one plain tuple (:data:`Row`), laid out as the executions table's columns so a
batch goes to SQLite as it is and costs the recording caller nothing to build. The state here
is updated a whole batch at a time (one chunk per agent per drain, with C-level builtins), never
per run, which is what keeps ``PerformanceMonitor.record`` an append.

Two kinds of state, because they answer different questions:

* :class:`AgentStats` (per agent and source): lifetime totals, the current failure streak, the
  latest errors and a bounded window of recent runs: "how is the agent doing lately?";
* :class:`Baseline` (per agent, runs of source ``run`` only): the agent's first ``capacity``
  runs since its last kept change, frozen once full: "what is normal for this agent?".
"""

from __future__ import annotations

import math
from collections import deque
from operator import itemgetter, not_
from typing import Any, Final

from agentmend.infrastructure.models import AgentMetrics

__all__ = [
    "RECENT_ERRORS",
    "RUN",
    "SOURCES",
    "VERIFICATION",
    "AgentStats",
    "Baseline",
    "Row",
    "log_duration",
]

RUN: Final = "run"
VERIFICATION: Final = "verification"
SOURCES: Final = (RUN, VERIFICATION)
RECENT_ERRORS: Final = 10
_LOG_FLOOR_MS = 1.0  # durations below 1 ms are timer noise for an agent run; keeps log() finite

# One recorded run: (agent, source, success, duration_ms, error, input_tokens, output_tokens,
# cost_usd, unix_ts, extra_json). A plain tuple: the cheapest thing to build on the caller's path.
Row = tuple[str, str, bool, float, "str | None", int, int, float, float, "str | None"]
_error = itemgetter(4)
_tokens_in, _tokens_out, _cost = itemgetter(5), itemgetter(6), itemgetter(7)


def log_duration(duration_ms: float) -> float:
    """The log-duration detectors work on (floored at 1 ms: below that is timer noise)."""
    return math.log(duration_ms if duration_ms > _LOG_FLOOR_MS else _LOG_FLOOR_MS)


class Baseline:
    """What an agent is compared against: its first ``capacity`` runs since its last kept change.

    Filled as runs arrive, then frozen once ``capacity`` runs are in; ``runs`` keeps counting
    every run of the epoch so detectors know where the baseline ends. Read-only for callers.
    """

    __slots__ = (
        "__weakref__",
        "agent",
        "capacity",
        "epoch",
        "log_durations",
        "outcomes",
        "runs",
        "sum_ms",
    )

    def __init__(self, agent: str, epoch: int, capacity: int) -> None:
        self.agent = agent
        self.epoch = epoch
        self.capacity = capacity
        self.outcomes = bytearray()  # 1 = failure, in run order
        self.log_durations: list[float] = []
        self.sum_ms = 0.0
        self.runs = 0

    def _extend(self, successes: list[bool], durations: list[float]) -> None:
        # For the monitor and its store only (callers see a read-only baseline): add the next
        # runs of the epoch, keeping the first ``capacity`` of them.
        room = self.capacity - len(self.outcomes)
        if room > 0:
            take = durations[:room]
            self.outcomes.extend(map(not_, successes[:room]))
            self.log_durations.extend(map(log_duration, take))
            self.sum_ms += math.fsum(take)
        self.runs += len(durations)

    @property
    def n(self) -> int:
        """Runs in the baseline (at most ``capacity``)."""
        return len(self.outcomes)

    @property
    def frozen(self) -> bool:
        return len(self.outcomes) >= self.capacity

    @property
    def failures(self) -> int:
        return sum(self.outcomes)

    @property
    def avg_duration_ms(self) -> float | None:
        """Mean duration of the baseline runs (None while it has none)."""
        n = len(self.outcomes)
        return self.sum_ms / n if n else None

    def summary(self) -> dict[str, Any]:
        n = self.n
        logs = self.log_durations
        mean = math.fsum(logs) / n if n else None
        sd = None
        if n > 1 and mean is not None:
            sd = math.sqrt(math.fsum((v - mean) ** 2 for v in logs) / (n - 1))
        return {
            "n": n,
            "epoch": self.epoch,
            "failure_rate": self.failures / n if n else None,
            "mean_log_duration": mean,
            "sd_log_duration": sd,
            "avg_duration_ms": self.avg_duration_ms,
            "runs_since_start": self.runs,
            "frozen": self.frozen,
        }


class AgentStats:
    """One agent's counters for one source: lifetime totals plus a bounded window of recent runs.

    Mutable and unsynchronised: the monitor holds its state lock around every use.
    """

    __slots__ = (
        "change_label",
        "consecutive_failures",
        "cost_usd",
        "errors_before_change",
        "executions",
        "failures",
        "input_tokens",
        "output_tokens",
        "recent_errors",
        "window",
    )

    def __init__(self, window: int) -> None:
        self.window: deque[tuple[bool, float]] = deque(maxlen=window)
        self.executions = 0
        self.failures = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd = 0.0
        self.consecutive_failures = 0
        self.recent_errors: deque[str] = deque(maxlen=RECENT_ERRORS)
        self.errors_before_change: deque[str] = deque(maxlen=RECENT_ERRORS)
        self.change_label: str | None = None

    def new_period(self, label: str | None) -> None:
        """A change was kept: errors so far become history, labelled with that change.

        Evidence that predates a fix must not pass for current evidence (it would point the
        diagnosis at the cause already fixed); the failure streak restarts for the same reason.
        """
        self.errors_before_change.clear()
        self.errors_before_change.extend(self.recent_errors)
        self.recent_errors.clear()
        self.change_label = label or "the last kept change"
        self.consecutive_failures = 0

    def undo_period(self) -> None:
        """The kept change was rolled back: its earlier errors are current evidence again."""
        merged = [*self.errors_before_change, *self.recent_errors]
        self.recent_errors.clear()
        self.recent_errors.extend(merged)
        self.errors_before_change.clear()
        self.change_label = None

    def add(self, rows: list[Row], successes: list[bool], durations: list[float]) -> None:
        """Count consecutive runs of this agent (``successes``/``durations`` are their columns,
        extracted once by the caller, which feeds them to the baseline too)."""
        n = len(rows)
        ok = sum(successes)
        self.executions += n
        self.failures += n - ok
        self.input_tokens += sum(map(_tokens_in, rows))
        self.output_tokens += sum(map(_tokens_out, rows))
        self.cost_usd += math.fsum(map(_cost, rows))
        self.window.extend(zip(successes, durations, strict=True))
        if ok == n:
            self.consecutive_failures = 0
        elif ok == 0:
            self.consecutive_failures += n
        else:
            self.consecutive_failures = successes[::-1].index(True)
        self.recent_errors.extend(filter(None, map(_error, rows)))

    def metrics(self, name: str, baseline_avg_duration_ms: float | None) -> AgentMetrics:
        """The public view: window fields over ``window``, lifetime fields over every run."""
        count = len(self.window)
        ok = sum(s for s, _ in self.window)
        durations = sorted(d for _, d in self.window)
        return AgentMetrics(
            agent_name=name,
            executions=self.executions,
            successes=self.executions - self.failures,
            failures=self.failures,
            success_rate=ok / count if count else 0.0,
            error_rate=(count - ok) / count if count else 0.0,
            avg_duration_ms=math.fsum(durations) / count if count else 0.0,
            p95_duration_ms=durations[max(0, math.ceil(0.95 * count) - 1)] if count else 0.0,
            baseline_avg_duration_ms=baseline_avg_duration_ms,
            consecutive_failures=self.consecutive_failures,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost_usd=self.cost_usd,
            last_error=self.recent_errors[-1] if self.recent_errors else None,
            recent_errors=tuple(self.recent_errors),
            errors_before_change=tuple(self.errors_before_change),
            errors_before_change_label=self.change_label if self.errors_before_change else None,
            recent_outcomes=tuple(s for s, _ in self.window),
        )
