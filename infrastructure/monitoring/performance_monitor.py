"""Records every agent execution and keeps per-agent statistics, cheaply enough to call always.

``record()`` is on the caller's path of every agent run, so it does the least that can be
done: check a few numbers, build one tuple and append it to a ``collections.deque`` (whose
``append`` is atomic and documented thread-safe, so no lock is taken). Everything else is
deferred and batched: a background thread (or any reader) drains the buffer into per-agent
state, one chunk per agent per batch using C-level builtins, and, for a store-backed monitor,
writes the drained rows with multi-row INSERTs in one transaction per batch.

The monitor coordinates; the parts live beside it, one concept each: per-agent counters,
windows and baselines in ``agent_window``, the SQL (tables, migrations, batched writes,
incremental reads) in ``execution_store``, the detectors' bounded feed in ``run_feed``, and
``track()``'s timer in ``run_tracker``. Their public names are re-exported here.

Durability contract (store-backed): a run is durable once a flush has committed it. The flusher
commits every ``flush_interval_s`` (default 0.2 s) and is woken early when ``flush_max_batch``
(default 1000) runs are waiting, so a crash loses at most the runs recorded in the last
``flush_interval_s`` plus the time one write takes (longer only while another process holds
the database lock, up to the store's busy timeout). ``flush()`` makes everything recorded so
far durable, and ``close()`` (also run at interpreter exit) does too within its deadline
(``close_timeout_s``); runs a failed or timed-out ``close()`` could not write are kept, reported
and written by the next ``close()`` or ``flush()``, and the exit hook logs how many runs are
lost if it cannot write them either. Writes go in transactions of at most 10,000 runs.

Memory is bounded: at most ``max_backlog`` runs wait between ``record()`` and the store; past
that ``record()`` waits for the writer or refuses the run, and counts it (see
:mod:`agentmend.infrastructure.monitoring.record_backlog`). A run ``record()`` accepted is never
dropped.

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
import json
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterator
from itertools import groupby, islice
from operator import itemgetter
from typing import TYPE_CHECKING, Any, overload

from pydantic_core import to_json as _to_json

from agentmend.infrastructure.errors import AgentmendError, ConfigurationError, StoreError
from agentmend.infrastructure.models import AgentMetrics, ExecutionRecord
from agentmend.infrastructure.monitoring.agent_window import (
    RUN,
    SOURCES,
    VERIFICATION,
    AgentStats,
    Baseline,
    Row,
    log_duration,
)
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.monitoring.record_backlog import (
    DEFAULT_MAX_BACKLOG,
    DEFAULT_WAIT_S,
    BacklogGate,
    BacklogStatus,
)
from agentmend.infrastructure.monitoring.run_feed import EventCursor, RunChunk, RunFeed
from agentmend.infrastructure.monitoring.run_tracker import Tracker
from agentmend.infrastructure.monitoring.storable_runs import storable_rows
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.structured_logger import get_logger

__all__ = [
    "RUN",
    "SOURCES",
    "VERIFICATION",
    "BacklogStatus",
    "Baseline",
    "EventCursor",
    "InvalidExecution",
    "MonitorClosed",
    "PerformanceMonitor",
    "RunChunk",
    "Tracker",
    "log_duration",
    "monitor_options",
]

if TYPE_CHECKING:
    from agentmend.infrastructure.settings import Settings

log = get_logger(__name__)

_MAX_BASELINE_STACK = 32  # kept changes remembered for restore_baseline
# Runs per write transaction: a bounded WAL and a bounded wait for close() and the writer's
# waiters, at a few percent of the rate one huge transaction would reach.
_WRITE_CHUNK = 10_000
DEFAULT_CLOSE_TIMEOUT_S = 10.0
_agent_source = itemgetter(0, 1)
_agent, _source = itemgetter(0), itemgetter(1)
_success, _duration = itemgetter(2), itemgetter(3)


def _by_agent_source(rows: list[Row]) -> Iterator[tuple[tuple[str, str], list[Row]]]:
    """A batch's runs grouped by (agent, source), each group's in run order: a batch of one
    agent and source (the usual) as it is, without sorting it."""
    if rows:
        agent, source = rows[0][0], rows[0][1]
        n = len(rows)
        agents, sources = list(map(_agent, rows)), list(map(_source, rows))
        if agents.count(agent) == n and sources.count(source) == n:
            yield (agent, source), list(rows)
            return
    for key, group in groupby(sorted(rows, key=_agent_source), _agent_source):
        yield key, list(group)


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
        max_backlog: the most runs held between ``record()`` and the store (see
            :mod:`agentmend.infrastructure.monitoring.record_backlog`); bounds the monitor's memory.
        backlog_policy: what ``record()`` does when the backlog is full: ``"wait"`` for the
            writer up to ``backlog_wait_s``, then refuse; or ``"drop"`` the run at once.
            Refused runs are counted in :meth:`backlog_status` and logged once per episode.
        backlog_wait_s: the longest ``record()`` waits for room under ``"wait"``.
        close_timeout_s: how long ``close()`` (and the exit hook) writes before it gives up
            and reports what it could not write; None writes everything however long it takes.
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
        max_backlog: int = DEFAULT_MAX_BACKLOG,
        backlog_policy: str = "wait",
        backlog_wait_s: float = DEFAULT_WAIT_S,
        close_timeout_s: float | None = DEFAULT_CLOSE_TIMEOUT_S,
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
        if close_timeout_s is not None and not close_timeout_s >= 0:
            raise ConfigurationError(
                f"PerformanceMonitor: close_timeout_s must be >= 0 or None, got {close_timeout_s}"
            )
        self._gate = BacklogGate(max_backlog, backlog_policy, backlog_wait_s)
        self._room = max_backlog  # runs the buffer may take: max_backlog - len(_unwritten)
        self.close_timeout_s = close_timeout_s
        self._unwritten_at_close = 0
        self.store = store
        self.window = window
        self.baseline_n = baseline_n
        self.flush_interval_s = flush_interval_s
        self._max_batch = flush_max_batch
        self._buffer: deque[Row] | _ClosedBuffer = deque()
        # Lock order: _write_lock before _state_lock. The state lock guards per-agent state,
        # chunks and baselines; the write lock keeps batches reaching the store in order.
        self._state_lock = threading.RLock()
        self._write_lock = threading.Lock()
        self._stats: dict[str, dict[str, AgentStats]] = {source: {} for source in SOURCES}
        self._baselines: dict[str, list[Baseline]] = {}  # a stack per agent; [-1] is active
        self._epochs: dict[str, int] = {}  # highest epoch number used per agent
        self._feed = RunFeed(detection_backlog)
        self._unwritten: list[Row] = []
        self._closing: deque[Row] = deque()  # runs close() took from the buffer, not yet ingested
        self._write_error: str | None = None  # why the last write failed; None once one works
        self._closed = False
        self._table = ExecutionStore(store, uuid.uuid4().hex) if store is not None else None
        if self._table is not None:
            loaded = self._table.load(window, baseline_n)
            self._stats = loaded.stats
            for agent, base in loaded.baselines.items():
                self._epochs[agent] = base.epoch
                self._baselines[agent] = [base]
        self._start_flusher()
        _register_for_exit(self)

    def _start_flusher(self) -> None:
        self._wake = threading.Event()
        self._waking = False
        self._thread = threading.Thread(
            target=_flusher_loop,
            args=(weakref.ref(self), self._wake, self.flush_interval_s),
            name="agentmend-monitor-flusher",
            daemon=True,
        )
        self._thread.start()

    def _reinit_after_fork(self) -> None:
        """In a forked child: new locks, no unwritten runs, and a flusher of its own.

        The parent keeps (and writes, once) every run recorded before the fork; the child
        starts with an empty buffer. Its per-agent state is the parent's at the fork. The
        parent's flusher does not exist in the child and may have held a lock at the fork, so
        the locks are new ones.
        """
        self._state_lock = threading.RLock()
        self._write_lock = threading.Lock()
        self._unwritten = []
        self._closing = deque()
        self._unwritten_at_close = 0
        self._room = self._gate.limit
        self._gate.reinit_after_fork()
        if self._table is not None:
            self._table.fork_writer(uuid.uuid4().hex)
        if self._closed:
            return
        self._buffer = deque()
        self._start_flusher()

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
            InvalidExecution: a missing or negative number, an unknown source, or an extra
                that cannot be stored as JSON (a cycle, nested too deeply).
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
        if len(buffer) >= self._room:  # the backlog is full: wait for room or refuse
            if not self._admit():
                return
            buffer = self._buffer  # a close() while waiting swapped it, to refuse the run
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

    def record_observed(
        self,
        agent_name: str,
        success: bool,
        duration_ms: float,
        error: str | None,
        input_tokens: int,
        output_tokens: int,
        ended_at: float,
        extra: dict[str, Any],
    ) -> None:
        """Record one run observed elsewhere (a span, an event) that ended at ``ended_at``
        (seconds since the epoch): ``record()``'s checks and buffer, as plain values, so a
        receiver builds no model per run.

        Raises:
            InvalidExecution: a missing or negative number.
            MonitorClosed: the monitor was closed.
        """
        try:
            ok = (
                agent_name
                and type(agent_name) is str
                and (success is True or success is False)
                and duration_ms >= 0.0
                and input_tokens >= 0
                and output_tokens >= 0
            )
        except TypeError:
            ok = False
        if not ok:
            success = _checked_success(
                agent_name, success, duration_ms, input_tokens, output_tokens, 0.0, RUN
            )
        buffer = self._buffer
        if len(buffer) >= self._room:
            if not self._admit():
                return
            buffer = self._buffer
        buffer.append(
            (
                agent_name,
                RUN,
                success,
                duration_ms,
                error,
                input_tokens,
                output_tokens,
                0.0,
                ended_at,
                _dumps(extra) if extra else None,
            )
        )
        if len(buffer) >= self._max_batch and not self._waking:
            self._waking = True
            self._wake.set()

    def _admit(self) -> bool:
        """``record()``'s slow path, the backlog being full: wait for room or refuse by policy."""
        if self._closed:
            return True  # the closed buffer refuses the run with MonitorClosed
        if not self._waking:
            self._waking = True
            self._wake.set()
        return self._gate.admit(
            self._has_room,
            may_wait=self._write_error is None and threading.current_thread() is not self._thread,
        )

    def _has_room(self) -> bool:
        return self._closed or len(self._buffer) < self._room

    def _record_model(self, record: object, source: str) -> None:
        if not isinstance(record, ExecutionRecord):
            raise InvalidExecution(
                "record(): expected a str agent name or an ExecutionRecord, got "
                f"{type(record).__name__}"
            )
        if source not in SOURCES:
            raise InvalidExecution(f"record(): source must be one of {SOURCES}, got {source!r}")
        if len(self._buffer) >= self._room and not self._admit():
            return
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

    def get_metrics(self, *agent_names: str, source: str = RUN) -> dict[str, AgentMetrics]:
        """Metrics for every agent seen, by name (sorted); given names, for those of them seen.

        ``get_metrics("writer")`` is ``{"writer": ...}`` once the writer has a run, ``{}``
        before; :meth:`get_agent_metrics` gives one agent's metrics alone.

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
        for name in agent_names:
            if not isinstance(name, str):
                raise InvalidExecution(f"get_metrics(): agent names are strings, got {name!r}")
        with self._state_lock:
            self._drain()
            seen = self._stats[source]
            names = sorted(seen if not agent_names else set(agent_names) & seen.keys())
            return {name: self._metrics(name, source) for name in names}

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
        stack = self._baselines.get(name) if source == RUN else None
        return self._stats[source][name].metrics(name, stack[-1].avg_duration_ms if stack else None)

    # ----------------------------------------------------------------- detector feed

    def subscribe(self, *, from_now: bool = False) -> EventCursor:
        """A cursor at the oldest retained run (up to ``detection_backlog`` runs back), or
        past the newest with ``from_now``."""
        with self._state_lock:
            self._drain()
            return self._feed.subscribe(from_now=from_now)

    def read_chunks(self, cursor: EventCursor) -> list[RunChunk]:
        """The runs since ``cursor`` (which is advanced past them). O(new runs)."""
        with self._state_lock:
            self._drain()
            return self._feed.read(cursor)

    # ----------------------------------------------------------------- baselines

    def start_new_baseline(self, agent_name: str, *, label: str | None = None) -> Baseline:
        """A change to the agent was kept: its next ``baseline_n`` runs become its baseline.

        Runs recorded before this call stay in the old baseline, which is kept (up to 32
        deep) so :meth:`restore_baseline` can reinstate it. The agent's recent errors so far
        become history (``errors_before_change``, labelled with ``label``, the kept change):
        from now on ``recent_errors`` holds only errors from after the change.
        """
        with self._write_lock, self._state_lock:
            self._drain()
            stack = self._baselines.setdefault(agent_name, [])
            if not stack:
                stack.append(Baseline(agent_name, self._epochs.get(agent_name, 0), self.baseline_n))
            if self._table is not None:
                self._write_unwritten()
                epoch = self._table.start_epoch(agent_name, label)
            else:
                epoch = self._epochs.get(agent_name, 0) + 1
            stats = self._stats[RUN].get(agent_name)
            if stats is not None:
                stats.new_period(label)
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
            stats = self._stats[RUN].get(agent_name)
            if self._table is None:
                if len(stack) < 2:
                    return None
                stack.pop()
                if stats is not None:
                    stats.undo_period()
                return stack[-1]
            self._write_unwritten()
            parent = self._table.restore_epoch(agent_name)
            if parent is None:
                return None
            if stats is not None:
                stats.undo_period()
            if len(stack) >= 2 and stack[-2].epoch == parent:
                stack.pop()
            else:
                stack[:] = [self._table.load_baseline(agent_name, parent, self.baseline_n)]
            return stack[-1]

    # ----------------------------------------------------------------- ingestion

    def _drain(self, buffer: deque[Row] | None = None, limit: int | None = None) -> None:
        """Move buffered runs into per-agent state (caller holds ``_state_lock``): the
        record buffer's, or up to ``limit`` of ``buffer``'s."""
        source = self._buffer if buffer is None else buffer
        count = len(source) if limit is None else min(limit, len(source))
        if not count:
            return
        if self._table is not None:  # still pending once out of the buffer: no room made
            self._room = self._gate.limit - len(self._unwritten) - count
        pop = source.popleft  # type: ignore[union-attr]  # not the closed buffer: it is empty
        batch = list(islice(iter(pop, None), count))  # a run is a tuple, never None
        if self._table is not None:
            # what is counted under a name is what the store holds under it; in memory, nothing
            # is stored, and the check would cost a fifth of record()'s amortised cost
            batch = storable_rows(batch)
        self._ingest(batch)
        if self._table is not None:
            self._unwritten.extend(batch)
            self._room = self._gate.limit - len(self._unwritten)
        else:
            self._gate.freed(True)

    def _ingest(self, rows: list[Row]) -> None:
        """Apply a batch, one vectorised step per (agent, source) in run order per agent."""
        window = self.window
        feed = self._feed
        for (agent, source), g in _by_agent_source(rows):
            table = self._stats[source]
            st = table.get(agent)
            if st is None:
                st = table[agent] = AgentStats(window)
            successes = list(map(bool, map(_success, g)))
            durations = list(map(_duration, g))
            st.add(g, successes, durations)
            if source == RUN:
                stack = self._baselines.get(agent)
                if not stack:
                    epoch = self._epochs.get(agent, 0)
                    stack = self._baselines[agent] = [Baseline(agent, epoch, self.baseline_n)]
                base = stack[-1]
                feed.append(base, g)
                base._extend(successes, durations)
        feed.trim()

    # ----------------------------------------------------------------- durability

    def flush(self) -> None:
        """Make every run recorded so far durable (a no-op in memory).

        Writes in transactions of at most 10,000 runs, so the write-ahead log stays small
        however large the backlog.

        Raises:
            StoreError: a write failed; the runs not yet written stay buffered and are retried.
        """
        with self._write_lock:
            self._write_unwritten()
            if self._table is not None:  # the rollups then count every run written
                self._table.fold_quietly(wait=True)

    def _write_unwritten(self, deadline: float | None = None, *, chunks: int | None = None) -> None:
        """Drain, then write in bounded transactions until nothing is left, ``deadline``
        (a ``time.monotonic()`` value) has passed or ``chunks`` transactions were written.

        The caller holds ``_write_lock``; I/O happens outside the state lock. A run leaves
        ``_unwritten`` only once its transaction has committed, so a failed write loses none.
        """
        with self._state_lock:
            self._drain()
            if self._table is None:  # in memory: nothing to write, so every run counts now
                self._drain(self._closing)
        table = self._table
        if table is None:
            return
        written = 0
        while chunks is None or written < chunks:
            if deadline is not None and time.monotonic() >= deadline:
                return
            with self._state_lock:
                if len(self._unwritten) < _WRITE_CHUNK and self._closing:
                    # after close(): ingested a chunk at a time, so the deadline holds
                    self._drain(self._closing, _WRITE_CHUNK)
                batch = self._unwritten[:_WRITE_CHUNK]
            if not batch:
                return
            try:
                table.insert(batch)
            except Exception as exc:
                self._write_error = f"{type(exc).__name__}: {exc}"
                raise StoreError(f"cannot write {len(batch)} runs to the store: {exc}") from exc
            self._write_error = None
            with self._state_lock:
                del self._unwritten[: len(batch)]
                self._room = self._gate.limit - len(self._unwritten)
                # an episode of refusals ends once the backlog is down to half its bound
                has_room = len(self._buffer) + len(self._unwritten) <= self._gate.limit // 2
            self._gate.freed(has_room)
            written += 1

    def write_backlog(self) -> tuple[int, str | None]:
        """(runs recorded but not yet in the store, why the last write failed or None).

        While the store fails (a full disk, a locked or broken database) the background
        writer keeps the runs and retries; this is what a status shows meanwhile.
        """
        with self._state_lock:
            count = len(self._unwritten) + len(self._buffer) + len(self._closing)
        return count, self._write_error

    def backlog_status(self) -> BacklogStatus:
        """The runs between ``record()`` and the store: pending, the bound, what was refused."""
        with self._state_lock:
            pending = len(self._unwritten) + len(self._buffer) + len(self._closing)
        gate = self._gate
        return BacklogStatus(
            pending=pending,
            limit=gate.limit,
            policy=gate.policy,
            refused=gate.refused,
            unwritten_at_close=self._unwritten_at_close,
            write_error=self._write_error,
        )

    def _background_flush(self) -> None:
        # One transaction per hold of the write lock, so close(), flush() and baseline changes
        # wait for one bounded write, never for the whole backlog.
        while not self._closed:
            with self._write_lock:
                if self._closed:
                    return
                self._write_unwritten(chunks=1)
                if not self._unwritten:
                    return

    def close(self, *, timeout_s: float | None = None) -> int:
        """Flush, stop the flusher and refuse further runs. Also run at interpreter exit.

        Writes in bounded transactions until everything is stored or the deadline passes
        (``timeout_s``, default the monitor's ``close_timeout_s``): a huge backlog costs at
        most the deadline, and the runs left are reported (logged, returned, and shown in
        :meth:`backlog_status`) rather than hung on. They stay kept: a later ``close()`` (or
        ``flush()``) writes them; at interpreter exit they are lost with the process, and the
        exit hook logs how many.

        The monitor is closed even when the final write fails (``record`` refuses from then
        on), but the runs it could not write are kept, as above. Once everything is written,
        close() is a no-op.

        A run recorded by another thread *while* close() runs may be refused
        (``MonitorClosed``) or, in a narrow race, dropped: close after the work is done.

        Returns:
            The runs left unwritten at the deadline (0 once everything is in the store).

        Raises:
            StoreError: a write failed; the runs not yet written stay kept, to be retried.
        """
        timeout = self.close_timeout_s if timeout_s is None else timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._write_lock:
            if not self._closed:
                self._closed = True
                with self._state_lock:
                    buffer, self._buffer = self._buffer, _ClosedBuffer()
                    # popped, not iterated: a record() racing the swap may still append
                    pop = buffer.popleft  # type: ignore[union-attr]
                    self._closing.extend([pop() for _ in range(len(buffer))])
                self._wake.set()
                self._gate.freed(False)  # waiters see the monitor closed
            elif not self._unwritten and not self._closing:
                return 0
            self._write_unwritten(deadline)
            if self._table is not None:  # leave no run of this process to another's fold
                self._table.fold_quietly(wait=True)
            left = self._unwritten_at_close = len(self._unwritten) + len(self._closing)
        if left:
            log.warning("close_deadline_passed", runs_unwritten=left, timeout_s=timeout)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        return left

    def _unwritten_count(self) -> int:
        with self._state_lock:
            return len(self._unwritten) + len(self._buffer) + len(self._closing)

    def __enter__(self) -> PerformanceMonitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def refresh(self) -> int:
        """Ingest the runs other processes (or other handles) wrote since the last refresh.

        Incremental by the run cursor (``run_reader``): a run another writer commits late,
        below runs already read, is still read once; this monitor's own rows are never read
        back, so nothing is counted twice. Also adopts a baseline another process started or
        restored. Returns the number of runs ingested (always 0 in memory).
        """
        if self._table is None:
            return 0
        with self._state_lock:
            self._drain()
            rows, adopted = self._table.read_foreign(self._active_epoch, self.baseline_n)
            for agent, base in adopted.items():
                self._epochs[agent] = max(self._epochs.get(agent, 0), base.epoch)
                self._baselines[agent] = [base]
            if rows:
                self._ingest(rows)
            return len(rows)

    def _active_epoch(self, agent: str) -> int | None:
        stack = self._baselines.get(agent)
        return stack[-1].epoch if stack else None


def monitor_options(settings: Settings) -> dict[str, Any]:
    """The :class:`PerformanceMonitor` arguments ``settings`` hold, for ``**`` into it."""
    return {
        "baseline_n": settings.baseline_n,
        "max_backlog": settings.max_record_backlog,
        "backlog_policy": settings.record_backlog_policy,
        "backlog_wait_s": settings.record_backlog_wait_s,
        "close_timeout_s": settings.close_timeout_s,
    }


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


# one encoder for every run: json.dumps with options builds a new one per call
_json_dumps = json.JSONEncoder(default=str).encode


def _dumps(extra: dict[str, Any]) -> str:
    """A run's ``extra`` as JSON text, as the store keeps it.

    pydantic-core's encoder, at about a quarter of the standard library's cost (a receiver
    pays it for every run): keys in the order they were set, compact, text in UTF-8; bytes,
    sets, dates, enums and models as it writes them (text, a list, ISO 8601, the value, an
    object). What it cannot write (a lone surrogate, bytes that are not UTF-8, an object of a
    type it does not know) goes through ``json`` instead, such an object as its ``str()``.

    Raises:
        InvalidExecution: neither can write it (a cycle, nesting past Python's recursion
            limit); the run is not recorded.
    """
    try:
        return _to_json(extra, inf_nan_mode="constants").decode()
    except Exception:  # PydanticSerializationError: written the standard library's way
        try:
            return _json_dumps(extra)
        except (RecursionError, ValueError, TypeError) as exc:
            raise InvalidExecution(f"record(): extra cannot be stored as JSON ({exc})") from None


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


def _reinit_monitors_in_child() -> None:
    # As OpenTelemetry's SDK does: the live monitors (weakly held) are re-initialised in a
    # forked child, so buffered runs are not written twice and the child's runs get a flusher.
    global _exit_lock
    _exit_lock = threading.Lock()
    for monitor in list(_open_monitors):
        monitor._reinit_after_fork()


if hasattr(os, "register_at_fork"):  # absent on Windows, which has no fork
    os.register_at_fork(after_in_child=_reinit_monitors_in_child)


def _close_all() -> None:
    # The last chance to write: close() retries runs an earlier close() failed to write, within
    # one deadline shared by all the monitors, and whatever is left is lost with the process, so
    # say how much.
    monitors = list(_open_monitors)
    timeouts = [m.close_timeout_s for m in monitors if m.close_timeout_s is not None]
    deadline = None
    if timeouts and len(timeouts) == len(monitors):
        deadline = time.monotonic() + max(timeouts)
    for monitor in monitors:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            left = monitor.close(timeout_s=remaining)
        except Exception as exc:  # exit goes on for the others
            log.error("close_monitor_failed", error=str(exc), runs_lost=monitor._unwritten_count())
            continue
        if left:
            log.error("close_monitor_runs_lost", runs_lost=left, timeout_s=remaining)
