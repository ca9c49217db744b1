"""The detector's statistic over time, downsampled as the detector runs, for charts.

A chart of "when did this agent start failing" wants the statistic beneath the success rate,
and replaying months of runs through the charts to redraw it is what the run series exists to
avoid. So when the detector saves its state after a check, it also adds one point per chart to
per-minute buckets and to the same coarser rollups as the run series
(``run_series.ROLLUP_WIDTHS``), in the same transaction as the state: for an agent whose check
read ``POINT_EVERY_RUNS`` runs since its last point, or the first run of a new minute, or an
alarm. (A point at every check cost more than the check itself when a check follows each
task; between points the peak keeps growing, so no crossing is lost.)

A bucket keeps the *peak* of the statistic over the runs it covers, as a share of the
threshold (1.0 is an alarm; the peak, not the last value, because a statistic that crossed and
restarted within a minute must still show its crossing), and the last statistic and threshold
as shown by ``agentmend status``. A point is stamped with the time of the last run the check
read for that agent, so a check that runs late still draws its statistic where the runs were.
The peak of a coarser bucket is the peak of the finer ones; its last values are the latest.

A short history (minutes, as in a demo) would fit in one minute's bucket and draw as a dot, so
while the store holds at most ``run_series.RAW_RUNS`` runs, when the run series is drawn from
the runs themselves, each point is also kept as it is (width 0); that stops once the store
outgrows it, so those rows are bounded by the checks of the first ``RAW_RUNS`` runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agentmend.infrastructure.monitoring.run_series import (
    BUCKET_S,
    RAW_RUNS,
    ROLLUP_WIDTHS,
    series_width,
)
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.snapshot import read_snapshot
from agentmend.infrastructure.store.sql import StoreConnection, has_table

__all__ = [
    "COMPONENT",
    "MIGRATIONS",
    "POINT_EVERY_RUNS",
    "StatisticPoint",
    "StatisticStep",
    "add_points",
    "read_statistic_series",
]

COMPONENT = "detector_series"
POINT_EVERY_RUNS = 10
"""An agent's chart gets a point at least every this many of its runs (and each new minute)."""
MIGRATIONS = [
    """
    CREATE TABLE detector_series (
        width INTEGER NOT NULL,
        agent TEXT NOT NULL,
        kind TEXT NOT NULL,
        bucket INTEGER NOT NULL,
        peak REAL NOT NULL,
        statistic REAL NOT NULL,
        threshold REAL NOT NULL,
        ts REAL NOT NULL,
        PRIMARY KEY (width, agent, kind, bucket)
    )
    """
]

_UPSERT = (
    "INSERT INTO detector_series (width, agent, kind, bucket, peak, statistic, threshold, ts)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (width, agent, kind, bucket) DO UPDATE SET"
    " peak = CASE WHEN excluded.peak > detector_series.peak THEN excluded.peak"
    " ELSE detector_series.peak END,"
    " statistic = CASE WHEN excluded.ts >= detector_series.ts THEN excluded.statistic"
    " ELSE detector_series.statistic END,"
    " threshold = CASE WHEN excluded.ts >= detector_series.ts THEN excluded.threshold"
    " ELSE detector_series.threshold END,"
    " ts = CASE WHEN excluded.ts > detector_series.ts THEN excluded.ts ELSE detector_series.ts END"
)


@dataclass(frozen=True, slots=True)
class StatisticPoint:
    """One chart's statistic at one moment: its peak since the last point as a share of the
    threshold, and its last value and threshold as shown (``ts``: the last run read)."""

    agent: str
    kind: str
    ts: float
    peak: float
    statistic: float
    threshold: float


def add_points(
    conn: StoreConnection, points: Sequence[StatisticPoint], *, raw_runs: int = RAW_RUNS
) -> None:
    """Add points to every width's buckets, in the caller's transaction (a store migrated by
    this version); each point as it is too while the store holds at most ``raw_runs`` runs."""
    if not points or not has_table(conn, "detector_series"):
        return
    widths: tuple[int, ...] = (BUCKET_S, *ROLLUP_WIDTHS)
    if _short_history(conn, raw_runs):
        widths = (0, *widths)
    rows = []
    for p in points:
        if not (math.isfinite(p.peak) and math.isfinite(p.threshold)):
            continue  # a member that can never alarm (an infinite threshold) has nothing to draw
        for width in widths:
            # width 0 keeps each point: keyed by its microsecond, so two never merge
            bucket = int(p.ts * 1_000_000) if width == 0 else int(p.ts // width)
            rows.append((width, p.agent, p.kind, bucket, p.peak, p.statistic, p.threshold, p.ts))
    if rows:
        conn.executemany(_UPSERT, rows)


@dataclass(frozen=True, slots=True)
class StatisticStep:
    """One step of a chart's statistic series."""

    start_ts: float
    peak: float  # the highest statistic / threshold over the step (1.0: an alarm)
    statistic: float  # the last statistic of the step, as shown
    threshold: float  # the last threshold of the step, as shown


def read_statistic_series(
    store: Store, *, max_points: int = 200, raw_runs: int = RAW_RUNS
) -> dict[tuple[str, str], list[StatisticStep]]:
    """Each (agent, chart kind)'s statistic over the span of all the runs (the run series'
    time axis) in at most ``max_points`` steps: from the points themselves while the store
    holds at most ``raw_runs`` runs (as ``read_series``), else from the coarsest width that
    still gives half of them."""
    width: float
    first: float
    with read_snapshot(store) as conn:
        if not (has_table(conn, "detector_series") and has_table(conn, "run_totals")):
            return {}
        start, end = conn.execute("SELECT MIN(first_ts), MAX(last_ts) FROM run_totals").fetchone()
        if start is None:
            return {}
        start, end = float(start), float(end)
        if _short_history(conn, raw_runs):
            # as the run series: from the points themselves, in equal slices of the span
            slice_s = max(end - start, 1e-3) / max(1, max_points)
            rows = conn.execute(
                "SELECT agent, kind, peak, statistic, threshold, ts FROM detector_series"
                " WHERE width = 0 ORDER BY agent, kind, ts"
            ).fetchall()
            rows = [
                (a, k, min(max_points - 1, max(0, int((ts - start) / slice_s))), pk, st, th, ts)
                for a, k, pk, st, th, ts in rows
            ]
            width, first, step = slice_s, start / slice_s, 1
        else:
            width = series_width(start, end, max_points)
            first = int(start // width)
            count = int(end // width) - int(first) + 1
            step = max(1, math.ceil(count / max(1, max_points)))
            rows = conn.execute(
                "SELECT agent, kind, (bucket - ?) / ? AS step, peak, statistic, threshold, ts"
                " FROM detector_series WHERE width = ? AND bucket >= ?"
                " ORDER BY agent, kind, step, ts",
                (int(first), step, int(width), int(first)),
            ).fetchall()
    series: dict[tuple[str, str], list[StatisticStep]] = {}
    for agent, kind, index, peak, statistic, threshold, _ts in rows:
        steps = series.setdefault((agent, kind), [])
        start_ts = (first + int(index) * step) * width
        if steps and steps[-1].start_ts == start_ts:  # rows of one step: peak of peaks, last
            steps[-1] = StatisticStep(
                start_ts, max(steps[-1].peak, float(peak)), float(statistic), float(threshold)
            )
        else:
            steps.append(StatisticStep(start_ts, float(peak), float(statistic), float(threshold)))
    return series


def _short_history(conn: StoreConnection, raw_runs: int) -> bool:
    """The store holds few enough runs that charts are drawn from the runs themselves."""
    if not has_table(conn, "run_totals"):
        return True
    total = conn.execute("SELECT COALESCE(SUM(runs), 0) FROM run_totals").fetchone()[0]
    return int(total) <= raw_runs
