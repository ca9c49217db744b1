"""Retention: old runs and decisions are pruned in bounded batches, never what the loop needs.

Every run adds about 140 bytes to the executions table and every MCP ``analyze`` a decision of
kilobytes, so a store left alone grows without end. A :class:`RetentionPolicy` says what may go:
runs older than ``run_days``, runs beyond the newest ``runs_per_agent`` of an agent, decisions
older than ``decision_days`` (None keeps that kind forever). What the loop still needs is never
removed, whatever the policy says:

* each agent's active baseline and the baseline a rollback would reinstate (the first
  ``baseline_n`` runs of each, its *sample*; the rest of an epoch is counted in a rollup);
* the newest ``KEEP_NEWEST`` runs of each agent and source (what opening a monitor reads for
  the recent window and errors);
* every run of an agent since its open or held issue was opened, and since its change under
  verification (pending or applied, not yet kept or rolled back) was made; and every decision
  since the oldest of those (decisions are also the record of a cycle in progress);
* the audit chain, the change history and the per-agent rollups and series: retention deletes
  rows of the ``executions`` and ``decisions`` tables only, and lifetime totals keep counting
  the runs it removed.

Deletes run in transactions of at most ``batch`` rows, so a prune never holds the database lock
long and a writer waits for one batch at most.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.monitoring.agent_window import RUN
from agentmend.infrastructure.monitoring.execution_store import delete_runs
from agentmend.infrastructure.monitoring.run_reader import nth_newest_run_id, run_ids, run_times
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection, table_names
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from agentmend.infrastructure.settings import Settings

__all__ = ["KEEP_NEWEST", "PruneResult", "RetentionPolicy", "RetentionSweeper", "prune"]

log = get_logger(__name__)

KEEP_NEWEST: Final = 100
"""Runs of each agent and source never pruned: the monitor's default window."""
_DAY_S = 86_400.0
_LIVE_CHANGES = ("pending", "applied")
_LIVE_ISSUES = ("open", "held")


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """What may be pruned; None keeps that kind forever (the default for each)."""

    run_days: float | None = None
    runs_per_agent: int | None = None
    decision_days: float | None = None
    baseline_n: int = 500
    batch: int = 5_000

    def __post_init__(self) -> None:
        for name in ("run_days", "decision_days"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigurationError(f"retention: {name} must be > 0 or None, got {value}")
        if self.runs_per_agent is not None and self.runs_per_agent < 1:
            raise ConfigurationError(
                f"retention: runs_per_agent must be >= 1 or None, got {self.runs_per_agent}"
            )
        if self.baseline_n < 1 or self.batch < 1:
            raise ConfigurationError("retention: baseline_n and batch must be >= 1")

    @classmethod
    def of(cls, settings: Settings) -> RetentionPolicy:
        """The policy the ``retention_*`` settings describe."""
        return cls(
            run_days=settings.retention_run_days,
            runs_per_agent=settings.retention_runs_per_agent,
            decision_days=settings.retention_decision_days,
            baseline_n=settings.baseline_n,
        )

    @property
    def enabled(self) -> bool:
        return (
            self.run_days is not None
            or self.runs_per_agent is not None
            or self.decision_days is not None
        )


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What one prune removed, and whether it finished (False: stopped at ``max_batches``)."""

    runs_deleted: int
    decisions_deleted: int
    complete: bool


def prune(
    store: Store,
    policy: RetentionPolicy,
    *,
    now: float | None = None,
    max_batches: int | None = None,
) -> PruneResult:
    """Delete what ``policy`` lets go, in transactions of at most ``policy.batch`` rows.

    Args:
        store: the store to prune (its tables are created if missing, so any store will do).
        policy: what may go; see the module for what never does.
        now: the time the ages are measured from (a unix timestamp; default: now).
        max_batches: stop after this many delete transactions (a background sweep's slice of
            work); None runs to the end.
    """
    now = time.time() if now is None else now
    budget = _Budget(max_batches)
    conn = store.connection()
    tables = _tables(conn)
    protected_since = _protected_since(conn, tables)
    runs = 0
    if (policy.run_days is not None or policy.runs_per_agent is not None) and (
        "execution_totals" in tables
    ):
        samples = _baseline_samples(conn, policy.baseline_n)
        for agent, source in conn.execute(
            "SELECT agent, source FROM execution_totals ORDER BY agent, source"
        ).fetchall():
            runs += _prune_runs(
                store, policy, now, budget, agent, source,
                samples.get(agent, []), protected_since.get(agent),
            )  # fmt: skip
            if budget.spent:
                break
    decisions = 0
    if policy.decision_days is not None and "decisions" in tables and not budget.spent:
        decisions = _prune_decisions(store, policy, now, budget, protected_since)
    if runs or decisions:
        log.info("retention_pruned", runs=runs, decisions=decisions, complete=not budget.spent)
    return PruneResult(runs, decisions, not budget.spent)


class RetentionSweeper:
    """Applies a policy in the background: a slice of ``batches`` deletes per round.

    A round runs every ``interval_s``, and again at once (after a pause that lets writers in)
    while the last one did not finish, so a large first prune catches up in slices. A failing
    round is logged once per outage and retried the next round. Not carried across ``fork()``:
    a forked child sweeps only if it starts a sweeper of its own.
    """

    def __init__(
        self,
        store: Store,
        policy: RetentionPolicy,
        *,
        interval_s: float = 600.0,
        batches: int = 10,
        pause_s: float = 0.05,
    ) -> None:
        self.store = store
        self.policy = policy
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(interval_s, batches, pause_s),
            name="agentmend-retention",
            daemon=True,
        )
        self._thread.start()

    def _run(self, interval_s: float, batches: int, pause_s: float) -> None:
        failing = False
        wait = interval_s
        while not self._stop.wait(wait):
            try:
                result = prune(self.store, self.policy, max_batches=batches)
            except Exception as exc:  # a locked or failing store: try again next round
                if not failing:
                    log.warning("retention_prune_failed", error=str(exc))
                failing = True
                wait = interval_s
                continue
            failing = False
            wait = interval_s if result.complete else pause_s

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop after the current delete batch (each is its own transaction)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)


class _Budget:
    __slots__ = ("left",)

    def __init__(self, batches: int | None) -> None:
        self.left = batches

    @property
    def spent(self) -> bool:
        return self.left is not None and self.left <= 0

    def take(self) -> None:
        if self.left is not None:
            self.left -= 1


def _tables(conn: StoreConnection) -> set[str]:
    return table_names(conn)


def _protected_since(conn: StoreConnection, tables: set[str]) -> dict[str, float]:
    """Per agent, the time from which its runs and decisions are evidence still in use."""
    since: dict[str, float] = {}
    if "monitoring_issues" in tables:
        for agent, opened in conn.execute(
            "SELECT agent, MIN(opened_ts) FROM monitoring_issues WHERE status IN (?, ?)"
            " GROUP BY agent",
            _LIVE_ISSUES,
        ).fetchall():
            since[agent] = min(float(opened), since.get(agent, float("inf")))
    if "changes" in tables:
        for agent, created in conn.execute(
            "SELECT target_agent, MIN(created) FROM changes WHERE status IN (?, ?)"
            " GROUP BY target_agent",
            _LIVE_CHANGES,
        ).fetchall():
            stamp = datetime.fromisoformat(created).timestamp()
            since[agent] = min(stamp, since.get(agent, float("inf")))
    return since


def _baseline_samples(conn: StoreConnection, capacity: int) -> dict[str, list[tuple[int, int]]]:
    """Per agent, the id ranges ``(low, high]`` of its active and restorable baselines' samples.

    An agent with no epoch row has the implicit first baseline: its first ``capacity`` runs.
    """
    epochs: dict[str, set[int]] = {}
    for (agent,) in conn.execute(
        "SELECT agent FROM execution_totals WHERE source = 'run'"
    ).fetchall():
        epochs[agent] = {0}
    for agent, epoch, parent in conn.execute(
        "SELECT agent, epoch, parent FROM baseline_epochs WHERE status = 'active'"
    ).fetchall():
        epochs[agent] = {int(epoch)} | ({int(parent)} if parent is not None else set())
    ranges: dict[str, list[tuple[int, int]]] = {}
    for agent, wanted in epochs.items():
        for epoch in sorted(wanted):
            segments = sorted(
                conn.execute(
                    "SELECT start_id, end_id FROM baseline_segments WHERE agent = ? AND epoch = ?",
                    (agent, epoch),
                ).fetchall()
                or [(0, None)]
            )
            room = capacity
            for start, end in segments:
                if room <= 0:
                    break
                ids = run_ids(conn, agent, RUN, after=start, through=end, limit=room)
                room -= len(ids)
                # a sample not yet full keeps the whole segment: its next runs will join it
                high = ids[-1] if ids and room <= 0 else (end if end is not None else 2**62)
                ranges.setdefault(agent, []).append((int(start), int(high)))
    return ranges


def _prune_runs(
    store: Store,
    policy: RetentionPolicy,
    now: float,
    budget: _Budget,
    agent: str,
    source: str,
    samples: list[tuple[int, int]],
    protected_since: float | None,
) -> int:
    conn = store.connection()
    floor = nth_newest_run_id(conn, agent, source, KEEP_NEWEST)
    if floor is None:
        return 0  # no more runs than are always kept
    # a run goes if it is beyond the newest ``runs_per_agent`` or older than ``run_days``
    beyond = (
        nth_newest_run_id(conn, agent, source, policy.runs_per_agent)
        if policy.runs_per_agent is not None
        else None
    )
    cutoff = now - policy.run_days * _DAY_S if policy.run_days is not None else None
    fence = float("inf") if protected_since is None else protected_since
    deleted, after = 0, 0
    while not budget.spent:
        page = run_times(conn, agent, source, after=after, before=floor, limit=policy.batch)
        if not page:
            break
        doomed: list[int] = []
        done = False
        for row_id, ts in page:
            too_many = beyond is not None and row_id < beyond
            too_old = cutoff is not None and ts < cutoff
            if not too_many and not too_old:
                done = True  # rows are written in id and time order: none further goes
                break
            if ts >= fence or any(low < row_id <= high for low, high in samples):
                continue
            doomed.append(int(row_id))
        after = page[-1][0]
        if doomed:
            with store.transaction() as tx:
                delete_runs(tx, doomed)
            deleted += len(doomed)
            budget.take()
        if done or len(page) < policy.batch:
            break
    return deleted


def _prune_decisions(
    store: Store,
    policy: RetentionPolicy,
    now: float,
    budget: _Budget,
    protected_since: dict[str, float],
) -> int:
    assert policy.decision_days is not None
    # Decisions are also the loop's record of its work in progress (a cycle's events), so
    # while any agent has evidence in use every decision since its start is kept.
    fence = min(protected_since.values(), default=float("inf"))
    cutoff = datetime.fromtimestamp(min(now - policy.decision_days * _DAY_S, fence), UTC)
    conn = store.connection()
    deleted, after = 0, 0
    while not budget.spent:
        page = conn.execute(
            "SELECT id, timestamp FROM decisions WHERE id > ? ORDER BY id LIMIT ?",
            (after, policy.batch),
        ).fetchall()
        doomed = []
        for row_id, stamp in page:
            if datetime.fromisoformat(stamp) >= cutoff:
                break  # decisions are appended in time order: the rest are younger
            doomed.append(int(row_id))
        if doomed:
            with store.transaction() as tx:
                tx.execute(
                    f"DELETE FROM decisions WHERE id IN ({','.join('?' * len(doomed))})", doomed
                )
            deleted += len(doomed)
            budget.take()
        if len(doomed) < policy.batch:
            break
        after = doomed[-1]
    return deleted
