"""What `agentmend status`, `agentmend show` and the report page show, read from the store.

Reading never opens a ``PerformanceMonitor`` (whose start-up replays the history) and never
writes: per-agent totals and the charts come from the downsampled series the monitor keeps as
runs arrive (``agentmend.infrastructure.monitoring.run_series``), recent figures from each agent's
last runs through the executions index, changes from the change log, the latest cycles by folding
their recorded events (read in one pass), and the audit trail with its chain check.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentmend.infrastructure.changes.audit.log import AuditEntry
from agentmend.infrastructure.changes.audit.verification import ChainVerification
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.detection.detector import CHART_OF_KIND
from agentmend.infrastructure.detection.issue_ledger import (
    read_active_issues,
    read_detector_states,
)
from agentmend.infrastructure.detection.series import StatisticStep, read_statistic_series
from agentmend.infrastructure.models import ChangeRecord
from agentmend.infrastructure.monitoring.execution_rollup import baseline_runs
from agentmend.infrastructure.monitoring.run_fold import add_run_totals, baseline_tail, unfolded
from agentmend.infrastructure.monitoring.run_reader import recent_runs
from agentmend.infrastructure.monitoring.run_series import (
    BUCKET_S,
    SeriesPoint,
    read_series,
    series_step,
)
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.snapshot import read_snapshot
from agentmend.infrastructure.store.sql import StoreConnection, has_table
from agentmend.loop.cycle import CycleResult
from agentmend.loop.cycle_history import CycleSummary, cycle_summaries, latest_cycles

__all__ = [
    "RECENT_RUNS",
    "STATUS_SCHEMA",
    "AgentStatus",
    "ReportData",
    "agent_statuses",
    "collect_report",
]

STATUS_SCHEMA = "agentmend.status/1"
"""The ``schema`` field of ``agentmend status --json``; bumped when a field changes meaning."""
RECENT_RUNS = 200
"""Recent figures (success rate, p95 latency) are over each agent's last this many runs."""


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """One agent's line of ``agentmend status``."""

    name: str
    runs: int
    failures: int
    recent_runs: int
    recent_success_rate: float
    p95_ms: float
    baseline_runs: int
    baseline_n: int
    last_run: datetime | None
    detector: dict[str, Any] | None = None
    """The detector's statistics and thresholds, where the store keeps them (else None)."""
    open_issues: tuple[dict[str, Any], ...] = ()

    @property
    def success_rate(self) -> float:
        return 1.0 - self.failures / self.runs if self.runs else 1.0

    @property
    def warming_up(self) -> bool:
        """Fewer runs since the last kept change than a baseline needs: not yet judged."""
        return self.baseline_runs < self.baseline_n

    def as_json(self) -> dict[str, Any]:
        return {
            "agent": self.name,
            "runs": self.runs,
            "failures": self.failures,
            "success_rate": round(self.success_rate, 6),
            "recent": {
                "runs": self.recent_runs,
                "success_rate": round(self.recent_success_rate, 6),
                "p95_ms": round(self.p95_ms, 3),
            },
            "baseline": {"runs": self.baseline_runs, "needed": self.baseline_n},
            "warming_up": self.warming_up,
            "detector": self.detector,
            "open_issues": list(self.open_issues),
            "last_run": self.last_run.isoformat() if self.last_run else None,
        }


def _has_table(conn: StoreConnection, name: str) -> bool:
    return has_table(conn, name)


def _p95(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def _baseline_runs(
    conn: StoreConnection, agent: str, cap: int, unfolded: dict[tuple[str, int], int]
) -> int:
    """Runs in the agent's active baseline (at most ``cap``), from the count the monitor's
    writer keeps per baseline epoch (``execution_rollup``) and the runs not folded into it
    yet (``unfolded``, by agent and epoch): two lookups, however long the history."""
    if not (_has_table(conn, "baseline_epochs") and _has_table(conn, "baseline_runs")):
        return 0
    row = conn.execute(
        "SELECT MAX(epoch) FROM baseline_epochs WHERE agent = ? AND status = 'active'", (agent,)
    ).fetchone()
    epoch = int(row[0]) if row is not None and row[0] is not None else 0
    return min(cap, baseline_runs(conn, agent, epoch) + unfolded.get((agent, epoch), 0))


def agent_statuses(store: Store, *, baseline_n: int) -> list[AgentStatus]:
    """Every agent with runs, by name: totals, recent figures, baseline fill, detector state
    (one read snapshot, which never holds up a monitor writing runs)."""
    with read_snapshot(store) as conn:
        if not _has_table(conn, "run_totals"):
            return []
        # on PostgreSQL, the runs of small batches no fold has added to the rollups yet
        tail = unfolded(conn)
        totals = add_run_totals(
            conn.execute("SELECT agent, runs, failures, last_ts FROM run_totals").fetchall(),
            [row for _, row in tail],
        )
        tail_baselines = baseline_tail(conn, tail)
        issues: dict[str, list[dict[str, Any]]] = {}
        charts: dict[str, dict[str, Any]] = {}
        if _has_table(conn, "monitoring_issues"):
            for row in read_active_issues(conn):
                issues.setdefault(row.agent, []).append(
                    {
                        "issue_id": row.issue_id,
                        "kind": row.kind,
                        "status": row.status,
                        "cycles": row.cycles,
                        "outcome": row.outcome,
                    }
                )
            for (agent, kind), saved in read_detector_states(conn).items():
                charts.setdefault(agent, {})[CHART_OF_KIND.get(kind, kind)] = {
                    "statistic": saved.statistic * saved.scale,
                    "threshold": saved.threshold,
                }
        statuses = []
        for agent, runs, failures, last_ts in totals:
            recent = recent_runs(conn, agent, RECENT_RUNS)
            oks = [bool(ok) for ok, _ in recent]
            statuses.append(
                AgentStatus(
                    name=agent,
                    runs=int(runs),
                    failures=int(failures),
                    recent_runs=len(recent),
                    recent_success_rate=sum(oks) / len(oks) if oks else 1.0,
                    p95_ms=_p95([float(d) for _, d in recent]),
                    baseline_runs=_baseline_runs(conn, agent, baseline_n, tail_baselines),
                    baseline_n=baseline_n,
                    last_run=datetime.fromtimestamp(float(last_ts), UTC) if last_ts else None,
                    detector=charts.get(agent),
                    open_issues=tuple(issues.get(agent, ())),
                )
            )
    return statuses


@dataclass(frozen=True)
class ReportData:
    """Everything the report page draws, read once."""

    generated_at: datetime
    agents: list[AgentStatus]
    series: dict[str, list[SeriesPoint]]
    statistics: dict[tuple[str, str], list[StatisticStep]]
    """Each (agent, chart kind)'s detector statistic over the same time axis."""
    changes: list[ChangeRecord]
    cycles: list[CycleResult]
    """The latest cycles, newest first, in full."""
    older_cycles: list[CycleSummary]
    """Cycles beyond the latest, newest first, shown as a table."""
    audit: list[AuditEntry]
    chain: ChainVerification
    chain_ms: float = 0.0
    """How long verifying the whole chain took: every row's hash and link, and the head."""
    notes: list[str] = field(default_factory=list)
    step_s: float = float(BUCKET_S)
    """Seconds per step of ``series`` (``run_series.series_step``): points further apart had
    no runs between them, and the chart's line breaks there."""


def collect_report(
    store: Store,
    manager: ImprovementManager,
    *,
    baseline_n: int,
    full_cycles: int = 50,
    max_cycles: int = 500,
    max_changes: int = 1000,
    max_audit_rows: int = 500,
    max_points: int = 200,
) -> ReportData:
    """Read what the page shows; ``full_cycles`` latest cycles in full, the rest summarised."""
    full = min(full_cycles, max_cycles)
    cycles = latest_cycles(store, limit=full)
    older = cycle_summaries(store, skip=full, limit=max_cycles - full)
    started = time.perf_counter()
    # the whole chain, once: never a sample; a head a writer holds a second is left unchecked
    chain = manager.verify_audit_chain(repair=False, head_wait_s=1.0)
    chain_ms = (time.perf_counter() - started) * 1000
    return ReportData(
        generated_at=datetime.now(UTC),
        agents=agent_statuses(store, baseline_n=baseline_n),
        series=read_series(store, max_points=max_points),
        statistics=read_statistic_series(store, max_points=max_points),
        changes=manager.get_history(limit=max_changes),
        cycles=cycles,
        older_cycles=older,
        audit=manager.audit.entries(limit=max_audit_rows),
        chain=chain,
        chain_ms=chain_ms,
        step_s=series_step(store, max_points=max_points),
    )
