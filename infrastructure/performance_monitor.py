"""Records every agent execution and keeps per-agent statistics, cheaply enough to call always.

``record()`` is on the caller's path of every agent run, so it does the least that can be
done: check a few numbers, build one tuple and append it to a ``collections.deque`` (whose
``append`` is atomic and documented thread-safe, so no lock is taken). Everything else is
deferred and batched: a background thread (or any reader) drains the buffer into per-agent
state, one chunk per agent per batch using C-level builtins, and, for a store-backed monitor,
writes the drained rows with one ``executemany`` per batch in one transaction.

Durability contract (store-backed): a run is durable once a flush has committed it. The flusher
commits every ``flush_interval_s`` (default 0.2 s) and is woken early when ``flush_max_batch``
(default 1000) runs are waiting, so a crash loses at most the runs recorded in the last
``flush_interval_s`` plus the time one write takes (longer only while another process holds
the database lock, up to the store's busy timeout). ``flush()`` and ``close()`` (also run at
interpreter exit; idempotent) make everything recorded so far durable.

Sources: ``record(..., source="verification")`` stores a run apart. Verification runs are
persisted and have their own metrics (``get_metrics(source="verification")``) but never feed
the default metrics, the baselines or detection, so proving a fix can neither mask nor raise
an alarm.

Baselines live here because metrics report ``baseline_avg_duration_ms`` and because they must
survive a restart: an agent's baseline is its first ``baseline_n`` runs since its last kept
change. ``start_new_baseline`` (a change was kept) starts a new one; ``restore_baseline`` (the
change was rolled back) reinstates the previous one. A store-backed monitor persists each
baseline as row-id segments of the executions table, so every process derives the same
baseline from the same rows.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import math
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from itertools import chain, groupby
from operator import itemgetter, not_
from types import TracebackType
from typing import Any, Final, NamedTuple, ParamSpec, TypeVar, cast, overload

import structlog

from infrastructure.errors import AgentmendError, ConfigurationError, StoreError
from infrastructure.models import AgentMetrics, ExecutionRecord
from infrastructure.store import Store

__all__ = [
    "RUN",
    "SOURCES",
    "VERIFICATION",
    "Baseline",
    "EventCursor",
    "InvalidExecution",
    "MonitorClosed",
    "PerformanceMonitor",
    "RunChunk",
    "Tracker",
    "log_duration",
]

log = structlog.get_logger(__name__)

RUN: Final = "run"
VERIFICATION: Final = "verification"
SOURCES: Final = (RUN, VERIFICATION)
_RECENT_ERRORS = 10
_ROWS_PER_INSERT = 100  # 1,000 bound parameters per statement, far below SQLite's limit
_MAX_BASELINE_STACK = 32  # kept changes remembered for restore_baseline
_LOG_FLOOR_MS = 1.0  # durations below 1 ms are timer noise for an agent run; keeps log() finite

P = ParamSpec("P")
R = TypeVar("R")

# One buffered run, laid out as the INSERT's columns so a batch goes to SQLite as it is:
# (agent, source, success, duration_ms, error, input_tokens, output_tokens, cost_usd,
#  unix_ts, extra_json). A plain tuple: the cheapest thing to build on the caller's path.
_Row = tuple[str, str, bool, float, "str | None", int, int, float, float, "str | None"]
_COLUMNS = (
    "agent, source, success, duration_ms, error, input_tokens, output_tokens, cost_usd, ts, extra"
)
_agent_source = itemgetter(0, 1)
_success, _duration, _error = itemgetter(2), itemgetter(3), itemgetter(4)
_tokens_in, _tokens_out, _cost = itemgetter(5), itemgetter(6), itemgetter(7)

# ``id`` is the rowid: SQLite gives each row max(id) + 1 under the write lock and runs are never
# deleted, so ids only grow in commit order and refresh() can read incrementally by id (no
# AUTOINCREMENT: its bookkeeping costs ~15 % of an insert for a guarantee not needed here).
_MIGRATIONS = [
    """
    CREATE TABLE executions (
        id INTEGER PRIMARY KEY,
        agent TEXT NOT NULL,
        source TEXT NOT NULL,
        success INTEGER NOT NULL,
        duration_ms REAL NOT NULL,
        error TEXT,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_usd REAL NOT NULL,
        ts REAL NOT NULL,
        extra TEXT,
        writer TEXT NOT NULL
    );
    CREATE INDEX executions_by_agent ON executions (agent, source, id);
    CREATE TABLE baseline_epochs (
        agent TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        parent INTEGER,
        status TEXT NOT NULL,
        created_ts REAL NOT NULL,
        PRIMARY KEY (agent, epoch)
    );
    CREATE TABLE baseline_segments (
        agent TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        start_id INTEGER NOT NULL,
        end_id INTEGER,
        PRIMARY KEY (agent, epoch, start_id)
    )
    """
]


class InvalidExecution(AgentmendError, ValueError):
    """A run that cannot be recorded (negative duration, unknown source, ...); names the field."""


class MonitorClosed(AgentmendError):
    """``record()`` on a monitor that was closed: the run would never be made durable."""


class _ClosedBuffer:
    """Stands in for the buffer after close(): the hot path pays nothing for the check."""

    __slots__ = ()

    def append(self, row: object) -> None:
        raise MonitorClosed("record() on a closed PerformanceMonitor")

    def __len__(self) -> int:
        return 0


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


class RunChunk(NamedTuple):
    """Consecutive runs of one agent as detectors read them.

    ``rows[i]`` is the ``start + i``-th run since ``baseline`` started (so the runs with
    ``start + i < baseline_n`` *are* the baseline); ``rows[i][2]`` is its success flag and
    ``rows[i][3]`` its duration in ms. ``first_run`` numbers runs across all agents.
    """

    baseline: Baseline
    start: int
    rows: list[_Row]
    first_run: int


class EventCursor:
    """A detector's position in the monitor's run chunks (see ``read_chunks``)."""

    __slots__ = ("__weakref__", "missed", "next_run", "position")

    def __init__(self, position: int, next_run: int) -> None:
        self.position = position
        self.next_run = next_run
        self.missed = 0


class _AgentStats:
    """Per-agent, per-source counters: lifetime totals plus a bounded window of recent runs."""

    __slots__ = (
        "consecutive_failures",
        "cost_usd",
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
        self.recent_errors: deque[str] = deque(maxlen=_RECENT_ERRORS)


class PerformanceMonitor:
    """Per-agent execution statistics, in memory or persisted in a :class:`Store`.

    Args:
        store: persist runs and baselines there (component ``"executions"``); None keeps
            everything in memory.
        window: recent runs per agent the rate and duration metrics are computed over.
        baseline_n: runs per baseline (the first ``baseline_n`` since the last kept change).
        flush_interval_s: the flusher's period, which bounds the crash-loss window.
        flush_max_batch: wake the flusher early once this many runs are waiting.
        detection_backlog: runs kept for detectors (a detector checked less often than this
            many runs skips the oldest and counts them in its cursor's ``missed``).
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        window: int = 100,
        baseline_n: int = 500,
        flush_interval_s: float = 0.2,
        flush_max_batch: int = 1000,
        detection_backlog: int = 10_000,
    ) -> None:
        for name, value in (
            ("window", window),
            ("baseline_n", baseline_n),
            ("flush_max_batch", flush_max_batch),
            ("detection_backlog", detection_backlog),
        ):
            if value < 1:
                raise ConfigurationError(f"PerformanceMonitor: {name} must be >= 1, got {value}")
        if not flush_interval_s > 0:
            raise ConfigurationError(
                f"PerformanceMonitor: flush_interval_s must be > 0, got {flush_interval_s}"
            )
        self.store = store
        self.window = window
        self.baseline_n = baseline_n
        self.flush_interval_s = flush_interval_s
        self._max_batch = flush_max_batch
        self._backlog = detection_backlog
        self._buffer: deque[_Row] | _ClosedBuffer = deque()
        # Lock order: _write_lock before _state_lock. The state lock guards per-agent state,
        # chunks and baselines; the write lock keeps batches reaching the store in order.
        self._state_lock = threading.RLock()
        self._write_lock = threading.Lock()
        self._stats: dict[str, dict[str, _AgentStats]] = {source: {} for source in SOURCES}
        self._baselines: dict[str, list[Baseline]] = {}  # a stack per agent; [-1] is active
        self._epochs: dict[str, int] = {}  # highest epoch number used per agent
        self._chunks: list[RunChunk] = []
        self._chunks_base = 0  # sequence number of _chunks[0]
        self._runs_total = 0  # runs ingested (the next run's number)
        self._retained_runs = 0
        self._unwritten: list[_Row] = []
        self._closed = False
        self._table = _ExecutionTable(store, uuid.uuid4().hex) if store is not None else None
        if self._table is not None:
            self._table.load(self)
        self._wake = threading.Event()
        self._waking = False
        self._thread = threading.Thread(
            target=_flusher_loop,
            args=(weakref.ref(self), self._wake, flush_interval_s),
            name="agentmend-monitor-flusher",
            daemon=True,
        )
        self._thread.start()
        _register_for_exit(self)

    # ----------------------------------------------------------------- the hot path

    @overload
    def record(self, agent_name: ExecutionRecord, *, source: str = RUN) -> None: ...

    @overload
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
        source: str = RUN,
        **extra: Any,
    ) -> None: ...

    def record(
        self,
        agent_name: str | ExecutionRecord,
        *,
        success: bool | None = None,
        duration_ms: float | None = None,
        error: str | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float = 0.0,
        source: str = RUN,
        **extra: Any,
    ) -> None:
        """Record one agent run. O(1), thread-safe, no I/O, no logging, no pydantic model.

        Pass the fields or an ``ExecutionRecord``. ``source="verification"`` stores the run
        apart from everything that feeds detection. ``extra`` is stored as JSON.

        Raises:
            InvalidExecution: a missing or negative number, or an unknown source.
            MonitorClosed: the monitor was closed.
        """
        if type(agent_name) is not str:
            self._record_model(agent_name, source)
            return
        try:
            ok = (
                agent_name
                and (success is True or success is False)
                and duration_ms >= 0.0  # type: ignore[operator]
                and input_tokens >= 0
                and output_tokens >= 0
                and cost_usd >= 0.0
                and (source is RUN or source in SOURCES)
            )
        except TypeError:
            ok = False
        if not ok:
            success = _checked_success(
                agent_name, success, duration_ms, input_tokens, output_tokens, cost_usd, source
            )
        buffer = self._buffer
        buffer.append(
            (
                agent_name,
                source,
                success,
                duration_ms,
                error,
                input_tokens,
                output_tokens,
                cost_usd,
                time.time(),
                _dumps(extra) if extra else None,
            )  # type: ignore[arg-type]
        )
        if len(buffer) >= self._max_batch and not self._waking:
            # Once per batch: Event.set() takes a lock, and the flusher may need a whole GIL
            # switch interval to run, so setting it on every record would cost more than it.
            self._waking = True
            self._wake.set()

    def _record_model(self, record: object, source: str) -> None:
        if not isinstance(record, ExecutionRecord):
            raise InvalidExecution(
                "record(): expected a str agent name or an ExecutionRecord, got "
                f"{type(record).__name__}"
            )
        if source not in SOURCES:
            raise InvalidExecution(f"record(): source must be one of {SOURCES}, got {source!r}")
        self._buffer.append(
            (
                record.agent_name,
                source,
                record.success,
                record.duration_ms,
                record.error,
                record.input_tokens,
                record.output_tokens,
                record.cost_usd,
                record.timestamp.timestamp(),
                _dumps(record.extra) if record.extra else None,
            )
        )

    def track(self, agent_name: str, *, source: str = RUN, **extra: Any) -> Tracker:
        """Time a call: a context manager (sync or async) and a decorator (sync or async).

        The run is recorded when the block or call ends: a success, or a failure if it raised
        an ``Exception`` (recorded as ``"TypeName: message"`` and re-raised). Cancellation and
        interpreter exits (a ``BaseException`` that is not an ``Exception``) are not recorded:
        they say nothing about the agent's health.
        """
        if source not in SOURCES:
            raise InvalidExecution(f"track(): source must be one of {SOURCES}, got {source!r}")
        return Tracker(self, agent_name, source, extra)

    # ----------------------------------------------------------------- reading

    def get_metrics(self, *, source: str = RUN) -> dict[str, AgentMetrics]:
        """Metrics for every agent seen, by name (sorted).

        Window fields (over the last ``window`` runs, default 100): ``success_rate``,
        ``error_rate`` (= 1 - success_rate), ``avg_duration_ms``, ``p95_duration_ms``
        (nearest rank). Lifetime fields (every run recorded or loaded): ``executions``,
        ``successes``, ``failures``, ``input_tokens``, ``output_tokens``, ``cost_usd`` and
        ``consecutive_failures`` (the current streak, however long). ``last_error`` and
        ``recent_errors`` are the latest error strings (up to 10, oldest first).
        ``baseline_avg_duration_ms`` is the mean duration of the current baseline (None before
        its first run, and for verification runs).
        """
        _check_source(source)
        with self._state_lock:
            self._drain()
            return {name: self._metrics(name, source) for name in sorted(self._stats[source])}

    def get_agent_metrics(self, agent_name: str, *, source: str = RUN) -> AgentMetrics | None:
        """One agent's metrics (see :meth:`get_metrics`), or None if it has no runs."""
        _check_source(source)
        with self._state_lock:
            self._drain()
            if agent_name not in self._stats[source]:
                return None
            return self._metrics(agent_name, source)

    def agents(self) -> list[str]:
        """Names of the agents with at least one (non-verification) run, sorted."""
        with self._state_lock:
            self._drain()
            return sorted(self._stats[RUN])

    def baseline(self, agent_name: str) -> Baseline | None:
        """The agent's current baseline (None if the agent has no runs)."""
        with self._state_lock:
            self._drain()
            stack = self._baselines.get(agent_name)
            return stack[-1] if stack else None

    def _metrics(self, name: str, source: str) -> AgentMetrics:
        st = self._stats[source][name]
        count = len(st.window)
        ok = sum(s for s, _ in st.window)
        durations = sorted(d for _, d in st.window)
        stack = self._baselines.get(name) if source == RUN else None
        return AgentMetrics(
            agent_name=name,
            executions=st.executions,
            successes=st.executions - st.failures,
            failures=st.failures,
            success_rate=ok / count if count else 0.0,
            error_rate=(count - ok) / count if count else 0.0,
            avg_duration_ms=math.fsum(durations) / count if count else 0.0,
            p95_duration_ms=durations[max(0, math.ceil(0.95 * count) - 1)] if count else 0.0,
            baseline_avg_duration_ms=stack[-1].avg_duration_ms if stack else None,
            consecutive_failures=st.consecutive_failures,
            input_tokens=st.input_tokens,
            output_tokens=st.output_tokens,
            cost_usd=st.cost_usd,
            last_error=st.recent_errors[-1] if st.recent_errors else None,
            recent_errors=tuple(st.recent_errors),
        )

    # ----------------------------------------------------------------- detector feed

    def subscribe(self) -> EventCursor:
        """A cursor at the oldest retained run (up to ``detection_backlog`` runs back)."""
        with self._state_lock:
            self._drain()
            first = self._chunks[0].first_run if self._chunks else self._runs_total
            return EventCursor(self._chunks_base, first)

    def read_chunks(self, cursor: EventCursor) -> list[RunChunk]:
        """The runs since ``cursor`` (which is advanced past them). O(new runs)."""
        with self._state_lock:
            self._drain()
            chunks = self._chunks
            if cursor.position < self._chunks_base:
                first = chunks[0].first_run if chunks else self._runs_total
                cursor.missed += first - cursor.next_run
                cursor.position = self._chunks_base
            new = chunks[cursor.position - self._chunks_base :]
            cursor.position += len(new)
            cursor.next_run = self._runs_total
            return new

    # ----------------------------------------------------------------- baselines

    def start_new_baseline(self, agent_name: str) -> Baseline:
        """A change to the agent was kept: its next ``baseline_n`` runs become its baseline.

        Runs recorded before this call stay in the old baseline, which is kept (up to 32
        deep) so :meth:`restore_baseline` can reinstate it.
        """
        with self._write_lock, self._state_lock:
            self._drain()
            stack = self._baselines.setdefault(agent_name, [])
            if not stack:
                stack.append(Baseline(agent_name, self._epochs.get(agent_name, 0), self.baseline_n))
            if self._table is not None:
                self._write_unwritten()
                epoch = self._table.start_epoch(agent_name)
            else:
                epoch = self._epochs.get(agent_name, 0) + 1
            self._epochs[agent_name] = epoch
            fresh = Baseline(agent_name, epoch, self.baseline_n)
            stack.append(fresh)
            del stack[:-_MAX_BASELINE_STACK]
            return fresh

    def restore_baseline(self, agent_name: str) -> Baseline | None:
        """The last kept change was rolled back: reinstate the baseline it replaced.

        Returns the reinstated baseline, or None if there was none to go back to. A
        reinstated baseline that was not yet full goes on filling from the next run.
        """
        with self._write_lock, self._state_lock:
            self._drain()
            stack = self._baselines.get(agent_name, [])
            if self._table is None:
                if len(stack) < 2:
                    return None
                stack.pop()
                return stack[-1]
            self._write_unwritten()
            parent = self._table.restore_epoch(agent_name)
            if parent is None:
                return None
            if len(stack) >= 2 and stack[-2].epoch == parent:
                stack.pop()
            else:
                stack[:] = [self._table.load_baseline(self, agent_name, parent)]
            return stack[-1]

    # ----------------------------------------------------------------- ingestion

    def _drain(self) -> None:
        """Move buffered runs into per-agent state (caller holds ``_state_lock``)."""
        buffer = self._buffer
        count = len(buffer)
        if not count:
            return
        pop = buffer.popleft  # type: ignore[union-attr]
        batch = [pop() for _ in range(count)]
        self._ingest(batch)
        if self._table is not None:
            self._unwritten.extend(batch)

    def _ingest(self, rows: list[_Row]) -> None:
        """Apply a batch, one vectorised step per (agent, source) in run order per agent."""
        window = self.window
        chunks = self._chunks
        for (agent, source), group in groupby(sorted(rows, key=_agent_source), _agent_source):
            g = list(group)
            n = len(g)
            table = self._stats[source]
            st = table.get(agent)
            if st is None:
                st = table[agent] = _AgentStats(window)
            successes = list(map(bool, map(_success, g)))
            durations = list(map(_duration, g))
            ok = sum(successes)
            st.executions += n
            st.failures += n - ok
            st.input_tokens += sum(map(_tokens_in, g))
            st.output_tokens += sum(map(_tokens_out, g))
            st.cost_usd += math.fsum(map(_cost, g))
            st.window.extend(zip(successes, durations, strict=True))
            if ok == n:
                st.consecutive_failures = 0
            elif ok == 0:
                st.consecutive_failures += n
            else:
                st.consecutive_failures = successes[::-1].index(True)
            st.recent_errors.extend(filter(None, map(_error, g)))
            if source == RUN:
                stack = self._baselines.get(agent)
                if not stack:
                    epoch = self._epochs.get(agent, 0)
                    stack = self._baselines[agent] = [Baseline(agent, epoch, self.baseline_n)]
                base = stack[-1]
                chunks.append(RunChunk(base, base.runs, g, self._runs_total))
                self._runs_total += n
                self._retained_runs += n
                base._extend(successes, durations)
        if self._retained_runs > 2 * self._backlog:
            drop = 0
            while self._retained_runs > self._backlog and drop < len(chunks) - 1:
                self._retained_runs -= len(chunks[drop].rows)
                drop += 1
            del chunks[:drop]
            self._chunks_base += drop

    # ----------------------------------------------------------------- durability

    def flush(self) -> None:
        """Make every run recorded so far durable (a no-op in memory).

        Raises:
            StoreError: the write failed; the runs stay buffered and are retried.
        """
        with self._write_lock:
            self._write_unwritten()

    def _write_unwritten(self) -> None:
        """Drain and write (caller holds ``_write_lock``; I/O outside the state lock)."""
        with self._state_lock:
            self._drain()
            batch, self._unwritten = self._unwritten, []
        if not batch or self._table is None:
            return
        try:
            self._table.insert(batch)
        except Exception as exc:
            with self._state_lock:
                self._unwritten[:0] = batch
            raise StoreError(f"cannot write {len(batch)} runs to the store: {exc}") from exc

    def _background_flush(self) -> None:
        with self._write_lock:
            self._write_unwritten()

    def close(self) -> None:
        """Flush, stop the flusher and refuse further runs. Idempotent; also run at exit.

        A run recorded by another thread *while* close() runs may be refused
        (``MonitorClosed``) or, in a narrow race, dropped: close after the work is done.
        """
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            with self._state_lock:
                self._drain()
                self._buffer = _ClosedBuffer()
            self._wake.set()
            self._write_unwritten()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def __enter__(self) -> PerformanceMonitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def refresh(self) -> int:
        """Ingest the runs other processes (or other handles) wrote since the last refresh.

        Incremental by row id; this monitor's own rows are never read back, so nothing is
        counted twice. Also adopts a baseline another process started or restored. Returns
        the number of runs ingested (always 0 in memory).
        """
        if self._table is None:
            return 0
        with self._state_lock:
            self._drain()
            rows = self._table.read_foreign(self)
            if rows:
                self._ingest(rows)
            return len(rows)


class _ExecutionTable:
    """The monitor's SQL: the executions table and the baseline epochs/segments tables.

    An epoch is one baseline of one agent; its runs are the agent's rows inside its row-id
    segments (a restored epoch gains a segment), so any process rebuilds it from the rows.
    """

    def __init__(self, store: Store, writer: str) -> None:
        store.migrate("executions", _MIGRATIONS)
        self.store = store
        self.writer = writer  # hex, safe to inline: own rows are told apart by it
        self.seen_id = 0  # every foreign row with id <= seen_id has been ingested
        values = f"(?,?,?,?,?,?,?,?,?,?,'{writer}')"
        head = f"INSERT INTO executions ({_COLUMNS}, writer) VALUES "
        self._insert_one = head + values
        self._insert_many = head + ",".join([values] * _ROWS_PER_INSERT)

    def insert(self, rows: list[_Row]) -> None:
        """One transaction; multi-row INSERTs, about a third cheaper per row than executemany."""
        full = len(rows) - len(rows) % _ROWS_PER_INSERT
        with self.store.transaction() as conn:
            for i in range(0, full, _ROWS_PER_INSERT):
                conn.execute(
                    self._insert_many, list(chain.from_iterable(rows[i : i + _ROWS_PER_INSERT]))
                )
            if full < len(rows):
                conn.executemany(self._insert_one, rows[full:])

    def read_foreign(self, monitor: PerformanceMonitor) -> list[_Row]:
        """Rows other writers committed since the last call; adopts changed active epochs."""
        conn = self.store.connection()
        conn.execute("BEGIN")  # one snapshot for rows and epochs
        try:
            rows = conn.execute(
                f"SELECT id, {_COLUMNS} FROM executions WHERE id > ? AND writer != ? ORDER BY id",
                (self.seen_id, self.writer),
            ).fetchall()
            for agent, epoch in conn.execute(
                "SELECT agent, epoch FROM baseline_epochs WHERE status = 'active'"
            ).fetchall():
                stack = monitor._baselines.get(agent)
                if not stack or stack[-1].epoch != epoch:
                    monitor._epochs[agent] = max(monitor._epochs.get(agent, 0), epoch)
                    monitor._baselines[agent] = [self.load_baseline(monitor, agent, epoch)]
        finally:
            conn.execute("COMMIT")
        if rows:
            self.seen_id = max(self.seen_id, rows[-1][0])
        return [
            (a, src if src in SOURCES else RUN, bool(ok), d, err, ti, to, c, ts, ex)
            for _, a, src, ok, d, err, ti, to, c, ts, ex in rows
        ]

    def load(self, monitor: PerformanceMonitor) -> None:
        """Rebuild the monitor's state from the table (one read snapshot)."""
        conn = self.store.connection()
        conn.execute("BEGIN")
        try:
            self.seen_id = upto = int(
                conn.execute("SELECT COALESCE(MAX(id), 0) FROM executions").fetchone()[0]
            )
            totals = conn.execute(
                "SELECT agent, source, COUNT(*), SUM(1 - success), SUM(input_tokens),"
                " SUM(output_tokens), SUM(cost_usd) FROM executions GROUP BY agent, source"
            ).fetchall()
            for agent, source, count, failures, tin, tout, cost in totals:
                if source not in SOURCES:
                    continue
                st = monitor._stats[source][agent] = _AgentStats(monitor.window)
                st.executions, st.failures = int(count), int(failures)
                st.input_tokens, st.output_tokens, st.cost_usd = int(tin), int(tout), float(cost)
                key = (agent, source, upto)
                recent = conn.execute(
                    "SELECT success, duration_ms FROM executions WHERE agent = ? AND source = ?"
                    " AND id <= ? ORDER BY id DESC LIMIT ?",
                    (*key, monitor.window),
                ).fetchall()
                st.window.extend((bool(ok), float(d)) for ok, d in reversed(recent))
                last_ok = conn.execute(
                    "SELECT COALESCE(MAX(id), 0) FROM (SELECT id FROM executions WHERE agent = ?"
                    " AND source = ? AND id <= ? AND success = 1 ORDER BY id DESC LIMIT 1)",
                    key,
                ).fetchone()[0]
                st.consecutive_failures = int(
                    conn.execute(
                        "SELECT COUNT(*) FROM executions WHERE agent = ? AND source = ?"
                        " AND id <= ? AND id > ?",
                        (*key, last_ok),
                    ).fetchone()[0]
                )
                errors = conn.execute(
                    "SELECT error FROM executions WHERE agent = ? AND source = ? AND id <= ?"
                    " AND error IS NOT NULL AND error != '' ORDER BY id DESC LIMIT ?",
                    (*key, _RECENT_ERRORS),
                ).fetchall()
                st.recent_errors.extend(e for (e,) in reversed(errors))
            for (agent,) in conn.execute(
                "SELECT DISTINCT agent FROM executions WHERE source = ?"
                " UNION SELECT agent FROM baseline_epochs",
                (RUN,),
            ).fetchall():
                row = conn.execute(
                    "SELECT epoch FROM baseline_epochs WHERE agent = ? AND status = 'active'",
                    (agent,),
                ).fetchone()
                epoch = int(row[0]) if row else 0
                monitor._epochs[agent] = epoch
                monitor._baselines[agent] = [self.load_baseline(monitor, agent, epoch)]
        finally:
            conn.execute("COMMIT")

    def load_baseline(self, monitor: PerformanceMonitor, agent: str, epoch: int) -> Baseline:
        """Rebuild a baseline from its segments, from the runs the monitor has ingested."""
        conn = self.store.connection()
        segments = conn.execute(
            "SELECT start_id, end_id FROM baseline_segments WHERE agent = ? AND epoch = ?",
            (agent, epoch),
        ).fetchall() or [(0, None)]
        clauses: list[str] = []
        params: list[Any] = [agent, RUN, self.seen_id, self.writer]
        for start, end in segments:
            clauses.append("(id > ?)" if end is None else "(id > ? AND id <= ?)")
            params.extend((start,) if end is None else (start, end))
        where = f"agent = ? AND source = ? AND (id <= ? OR writer = ?) AND ({' OR '.join(clauses)})"
        base = Baseline(agent, epoch, monitor.baseline_n)
        sample = conn.execute(
            f"SELECT success, duration_ms FROM executions WHERE {where} ORDER BY id LIMIT ?",
            (*params, monitor.baseline_n),
        ).fetchall()
        base._extend([bool(ok) for ok, _ in sample], [float(d) for _, d in sample])
        base.runs = int(
            conn.execute(f"SELECT COUNT(*) FROM executions WHERE {where}", params).fetchone()[0]
        )
        return base

    def _boundary(self, conn: Any) -> int:
        return int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM executions").fetchone()[0])

    def start_epoch(self, agent: str) -> int:
        """Close the active epoch at the current last row and open a new child epoch."""
        with self.store.transaction() as conn:
            boundary = self._boundary(conn)
            row = conn.execute(
                "SELECT epoch FROM baseline_epochs WHERE agent = ? AND status = 'active'", (agent,)
            ).fetchone()
            current = 0 if row is None else int(row[0])
            if row is None:  # the implicit first epoch: every run so far
                conn.execute(
                    "INSERT OR IGNORE INTO baseline_epochs VALUES (?, 0, NULL, 'active', ?)",
                    (agent, time.time()),
                )
                conn.execute(
                    "INSERT OR IGNORE INTO baseline_segments VALUES (?, 0, 0, NULL)", (agent,)
                )
            epoch = int(
                conn.execute(
                    "SELECT COALESCE(MAX(epoch), 0) + 1 FROM baseline_epochs WHERE agent = ?",
                    (agent,),
                ).fetchone()[0]
            )
            self._close_segment(conn, agent, current, boundary, "superseded")
            conn.execute(
                "INSERT INTO baseline_epochs VALUES (?, ?, ?, 'active', ?)",
                (agent, epoch, current, time.time()),
            )
            conn.execute(
                "INSERT INTO baseline_segments VALUES (?, ?, ?, NULL)", (agent, epoch, boundary)
            )
        return epoch

    def restore_epoch(self, agent: str) -> int | None:
        """Mark the active epoch rolled back and reopen its parent; None if it has none."""
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT epoch, parent FROM baseline_epochs WHERE agent = ? AND status = 'active'",
                (agent,),
            ).fetchone()
            if row is None or row[1] is None:
                return None
            current, parent = int(row[0]), int(row[1])
            boundary = self._boundary(conn)
            self._close_segment(conn, agent, current, boundary, "rolled_back")
            conn.execute(
                "UPDATE baseline_epochs SET status = 'active' WHERE agent = ? AND epoch = ?",
                (agent, parent),
            )
            conn.execute(
                "INSERT OR REPLACE INTO baseline_segments VALUES (?, ?, ?, NULL)",
                (agent, parent, boundary),
            )
        return parent

    @staticmethod
    def _close_segment(conn: Any, agent: str, epoch: int, boundary: int, status: str) -> None:
        conn.execute(
            "UPDATE baseline_segments SET end_id = ? WHERE agent = ? AND epoch = ?"
            " AND end_id IS NULL",
            (boundary, agent, epoch),
        )
        conn.execute(
            "UPDATE baseline_epochs SET status = ? WHERE agent = ? AND epoch = ?",
            (status, agent, epoch),
        )


class Tracker:
    """Times one run for :meth:`PerformanceMonitor.track`; see there.

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
        self, monitor: PerformanceMonitor, agent_name: str, source: str, extra: dict[str, Any]
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


def _checked_success(
    agent: object,
    success: object,
    duration_ms: object,
    input_tokens: object,
    output_tokens: object,
    cost_usd: object,
    source: object,
) -> bool:
    """The slow path of ``record``'s one combined check: coerce 0/1, or name the bad field."""
    if not isinstance(agent, str) or not agent:
        raise InvalidExecution(f"record(): agent_name must be a non-empty string, got {agent!r}")
    if not isinstance(success, bool | int) or (isinstance(success, int) and success not in (0, 1)):
        raise InvalidExecution(f"record({agent!r}): success must be a bool, got {success!r}")
    checks = (
        ("duration_ms", duration_ms),
        ("input_tokens", input_tokens),
        ("output_tokens", output_tokens),
        ("cost_usd", cost_usd),
    )
    for name, value in checks:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise InvalidExecution(
                f"record({agent!r}): {name} must be a number >= 0, got {value!r}"
            )
    if source not in SOURCES:
        raise InvalidExecution(
            f"record({agent!r}): source must be one of {SOURCES}, got {source!r}"
        )
    return bool(success)


def _check_source(source: str) -> None:
    if source not in SOURCES:
        raise ConfigurationError(f"source must be one of {SOURCES}, got {source!r}")


def _dumps(extra: dict[str, Any]) -> str:
    return json.dumps(extra, default=str, sort_keys=True)


def _flusher_loop(
    ref: weakref.ReferenceType[PerformanceMonitor], wake: threading.Event, interval: float
) -> None:
    # Holds only a weak reference between rounds, so an unreferenced monitor is collected and
    # its thread ends within one interval.
    failing = False
    while True:
        wake.wait(interval)
        wake.clear()
        monitor = ref()
        if monitor is None or monitor._closed:
            return
        monitor._waking = False
        try:
            monitor._background_flush()
            failing = False
        except Exception as exc:
            if not failing:  # once per outage, not once per retry
                log.warning("flush_monitor_failed", error=str(exc))
            failing = True
        del monitor


_open_monitors: weakref.WeakSet[PerformanceMonitor] = weakref.WeakSet()
_exit_lock = threading.Lock()
_exit_hook: list[bool] = []


def _register_for_exit(monitor: PerformanceMonitor) -> None:
    with _exit_lock:
        _open_monitors.add(monitor)
        if not _exit_hook:
            atexit.register(_close_all)
            _exit_hook.append(True)


def _close_all() -> None:
    for monitor in list(_open_monitors):
        try:
            monitor.close()
        except Exception as exc:  # exit goes on for the others
            log.error("close_monitor_failed", error=str(exc))
