"""A downsampled history of every agent's runs, and its totals, kept as runs are written.

Charts over months of history must not replay every run. So the monitor's writer adds each
batch to per-agent, per-minute buckets in the same transaction as the runs themselves (a bucket
is never ahead of or behind its runs): the count, the failures, the sum of durations and a
histogram of durations in quarter-octave bins (each 19 % wider than the last). Coarser series
are sums of these rows, and a latency quantile is read off the histogram, interpolated within
its bin (so within 19 % of the exact figure, which is what a chart of months can show).
Verification runs are not part of the series, as they are not part of detection.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from infrastructure.monitoring.agent_window import RUN, Row
from infrastructure.store import Store

__all__ = [
    "BUCKET_S",
    "DURATION_BINS",
    "SeriesPoint",
    "add_runs",
    "duration_quantile",
    "read_series",
]

COMPONENT = "run_series"
BUCKET_S = 60
"""Seconds per stored bucket; a chart sums them into coarser steps."""
BINS_PER_OCTAVE = 4
OCTAVES = 24  # up to 2**24 ms, about 4.7 hours
DURATION_BINS = 1 + BINS_PER_OCTAVE * OCTAVES
"""Bin 0 holds durations under 1 ms; bin i >= 1 holds [edge(i - 1), edge(i)) ms, where
edge(i) = 2 ** (i / 4); the last bin also holds everything longer."""


def _edge(i: int) -> float:
    return 0.0 if i < 0 else 2.0 ** (i / BINS_PER_OCTAVE)


_BIN_COLUMNS = ", ".join(f"d{i}" for i in range(DURATION_BINS))

MIGRATIONS = [
    f"""
    CREATE TABLE run_series (
        agent TEXT NOT NULL,
        bucket INTEGER NOT NULL,
        runs INTEGER NOT NULL,
        failures INTEGER NOT NULL,
        duration_sum REAL NOT NULL,
        {", ".join(f"d{i} INTEGER NOT NULL DEFAULT 0" for i in range(DURATION_BINS))},
        PRIMARY KEY (agent, bucket)
    ) WITHOUT ROWID;
    INSERT INTO run_series (agent, bucket, runs, failures, duration_sum, {_BIN_COLUMNS})
    SELECT agent, CAST(ts / {BUCKET_S} AS INTEGER), COUNT(*), SUM(1 - success),
        SUM(duration_ms),
        {
        ", ".join(
            "SUM(CASE WHEN duration_ms < 1.0 THEN 1 ELSE 0 END)"
            if i == 0
            else f"SUM(CASE WHEN duration_ms >= {_edge(i - 1)!r} THEN 1 ELSE 0 END)"
            if i == DURATION_BINS - 1
            else f"SUM(CASE WHEN duration_ms >= {_edge(i - 1)!r} "
            f"AND duration_ms < {_edge(i)!r} THEN 1 ELSE 0 END)"
            for i in range(DURATION_BINS)
        )
    }
    FROM executions WHERE source = '{RUN}'
    GROUP BY agent, CAST(ts / {BUCKET_S} AS INTEGER);
    CREATE TABLE run_totals (
        agent TEXT PRIMARY KEY,
        runs INTEGER NOT NULL,
        failures INTEGER NOT NULL,
        first_ts REAL NOT NULL,
        last_ts REAL NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO run_totals (agent, runs, failures, first_ts, last_ts)
    SELECT agent, COUNT(*), SUM(1 - success), MIN(ts), MAX(ts)
    FROM executions WHERE source = '{RUN}' GROUP BY agent
    """,
]

_UPSERT = (
    f"INSERT INTO run_series (agent, bucket, runs, failures, duration_sum, {_BIN_COLUMNS}) "
    f"VALUES ({', '.join('?' * (5 + DURATION_BINS))}) "
    "ON CONFLICT (agent, bucket) DO UPDATE SET runs = runs + excluded.runs, "
    "failures = failures + excluded.failures, "
    "duration_sum = duration_sum + excluded.duration_sum, "
    + ", ".join(f"d{i} = d{i} + excluded.d{i}" for i in range(DURATION_BINS))
)
_UPSERT_TOTALS = (
    "INSERT INTO run_totals (agent, runs, failures, first_ts, last_ts) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (agent) DO UPDATE SET runs = runs + excluded.runs, "
    "failures = failures + excluded.failures, first_ts = MIN(first_ts, excluded.first_ts), "
    "last_ts = MAX(last_ts, excluded.last_ts)"
)


def _bin(duration_ms: float) -> int:
    if duration_ms < 1.0:
        return 0
    index = int(math.log2(duration_ms) * BINS_PER_OCTAVE) + 1
    # float rounding at an edge: keep the bin the SQL backfill would choose
    if duration_ms < _edge(index - 1):
        index -= 1
    elif duration_ms >= _edge(index):
        index += 1
    return min(DURATION_BINS - 1, index)


def add_runs(conn: sqlite3.Connection, rows: Iterable[Row]) -> None:
    """Add a batch of run rows to their buckets and totals, inside the caller's transaction."""
    buckets: dict[tuple[str, int], list[float]] = {}
    totals: dict[str, list[float]] = {}
    for row in rows:
        agent, source, success, duration_ms, ts = row[0], row[1], row[2], row[3], row[8]
        if source != RUN:
            continue
        key = (str(agent), int(float(ts) // BUCKET_S))
        cell = buckets.get(key)
        if cell is None:
            cell = buckets[key] = [0.0] * (3 + DURATION_BINS)
        cell[0] += 1
        cell[1] += 0 if success else 1
        cell[2] += float(duration_ms)
        cell[3 + _bin(float(duration_ms))] += 1
        total = totals.get(key[0])
        if total is None:
            totals[key[0]] = [1, 0 if success else 1, float(ts), float(ts)]
        else:
            total[0] += 1
            total[1] += 0 if success else 1
            total[2] = min(total[2], float(ts))
            total[3] = max(total[3], float(ts))
    if buckets:
        conn.executemany(
            _UPSERT,
            [
                (agent, bucket, int(c[0]), int(c[1]), c[2], *(int(v) for v in c[3:]))
                for (agent, bucket), c in buckets.items()
            ],
        )
        conn.executemany(
            _UPSERT_TOTALS,
            [(agent, int(t[0]), int(t[1]), t[2], t[3]) for agent, t in totals.items()],
        )


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One step of an agent's series: runs, failures, mean and p95 duration (approximate)."""

    start_ts: float
    runs: int
    failures: int
    mean_ms: float
    p95_ms: float

    @property
    def success_rate(self) -> float:
        return 1.0 - self.failures / self.runs if self.runs else 1.0


def duration_quantile(bins: Sequence[int], q: float) -> float:
    """The ``q`` quantile of a duration histogram, interpolated inside its bin."""
    total = sum(bins)
    if total == 0:
        return 0.0
    target = q * total
    seen = 0.0
    for i, count in enumerate(bins):
        if count and seen + count >= target:
            low, high = (0.0, 1.0) if i == 0 else (_edge(i - 1), _edge(i))
            return low + (high - low) * (target - seen) / count
        seen += count
    return _edge(DURATION_BINS - 1)


RAW_RUNS = 20_000
"""Up to this many runs in all, a series is drawn from the runs themselves: a short history
(minutes) fits in a few per-minute buckets, which would draw as a dot."""


def read_series(
    store: Store,
    *,
    agents: Sequence[str] | None = None,
    max_points: int = 200,
    raw_runs: int = RAW_RUNS,
) -> dict[str, list[SeriesPoint]]:
    """Each agent's series in at most about ``max_points`` steps: from the runs themselves
    when there are at most ``raw_runs`` in all, else summed from the per-minute buckets over
    the span of them all (so the agents' charts share one time axis)."""
    with store.transaction() as conn:
        if not _has_table(conn):
            return {}
        total = conn.execute("SELECT COALESCE(SUM(runs), 0) FROM run_totals").fetchone()[0]
        if int(total) <= raw_runs:
            return _raw_series(conn, agents, max_points)
        span = conn.execute("SELECT MIN(bucket), MAX(bucket) FROM run_series").fetchone()
        if span[0] is None:
            return {}
        first, last = int(span[0]), int(span[1])
        step = max(1, math.ceil((last - first + 1) / max_points))
        where, params = "", [first, step]
        params_all: list[object] = list(params)
        if agents is not None:
            where = f"WHERE agent IN ({','.join('?' * len(agents))})"
            params_all += list(agents)
        rows = conn.execute(
            f"SELECT agent, (bucket - ?) / ? AS step, SUM(runs), SUM(failures), "
            f"SUM(duration_sum), {', '.join(f'SUM(d{i})' for i in range(DURATION_BINS))} "
            f"FROM run_series {where} GROUP BY agent, step ORDER BY agent, step",
            params_all,
        ).fetchall()
    series: dict[str, list[SeriesPoint]] = {}
    for agent, index, runs, failures, duration_sum, *bins in rows:
        series.setdefault(agent, []).append(
            SeriesPoint(
                start_ts=float((first + int(index) * step) * BUCKET_S),
                runs=int(runs),
                failures=int(failures),
                mean_ms=float(duration_sum) / runs if runs else 0.0,
                p95_ms=duration_quantile([int(b) for b in bins], 0.95),
            )
        )
    return series


def _raw_series(
    conn: sqlite3.Connection, agents: Sequence[str] | None, max_points: int
) -> dict[str, list[SeriesPoint]]:
    rows = conn.execute(
        "SELECT agent, success, duration_ms, ts FROM executions WHERE source = ? ORDER BY id",
        (RUN,),
    ).fetchall()
    by_agent: dict[str, list[tuple[bool, float, float]]] = {}
    for agent, success, duration_ms, ts in rows:
        if agents is None or agent in agents:
            by_agent.setdefault(agent, []).append((bool(success), float(duration_ms), float(ts)))
    series: dict[str, list[SeriesPoint]] = {}
    for agent, runs in by_agent.items():
        size = max(1, math.ceil(len(runs) / max_points))
        points = []
        for i in range(0, len(runs), size):
            group = runs[i : i + size]
            durations = sorted(d for _, d, _ in group)
            points.append(
                SeriesPoint(
                    start_ts=group[0][2],
                    runs=len(group),
                    failures=sum(1 for ok, _, _ in group if not ok),
                    mean_ms=sum(durations) / len(durations),
                    p95_ms=durations[min(len(durations) - 1, int(0.95 * len(durations)))],
                )
            )
        series[agent] = points
    return series


def _has_table(conn: sqlite3.Connection) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'run_series'"
        ).fetchone()
        is not None
    )
