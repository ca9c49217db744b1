"""A downsampled history of every agent's runs, and its totals, kept as runs are written.

Charts over months of history must not replay every run. So the monitor's writer adds each
batch to per-agent, per-minute buckets in the same transaction as the runs themselves (a bucket
is never ahead of or behind its runs; on PostgreSQL a small batch's are added by a later fold,
:mod:`~agentmend.infrastructure.monitoring.run_fold`): the count, the failures, the sum of
durations and a histogram of durations in quarter-octave bins (each 19 % wider than the last).
Coarser series are sums of these rows, and a latency quantile is read off the histogram,
interpolated within its bin (so within 19 % of the exact figure, which is what a chart of
months can show).
Verification runs are not part of the series, as they are not part of detection.

A chart of months summed from minutes would read a row per agent and minute: as many rows as
runs when runs are sparse, tens of millions when they are dense. So the same write also adds
each batch to coarser rollups (5 minutes, 30 minutes, 3 hours, a day), and a chart reads the
coarsest of them that still gives it at least half its points: a few hundred rows per agent
whatever the length of the history.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache, reduce
from itertools import compress, repeat
from operator import add, eq, floordiv, itemgetter, truth
from typing import NamedTuple

from agentmend.infrastructure.monitoring.agent_window import RUN, Row
from agentmend.infrastructure.monitoring.run_reader import production_runs
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.snapshot import read_snapshot
from agentmend.infrastructure.store.sql import StoreConnection, has_table

__all__ = [
    "BIN_COLUMNS",
    "BUCKET_S",
    "DURATION_BINS",
    "ROLLUP_WIDTHS",
    "UPSERT_MINUTES",
    "UPSERT_ROLLUP",
    "UPSERT_TOTALS",
    "SeriesPoint",
    "SeriesTally",
    "add_runs",
    "duration_quantile",
    "read_series",
    "series_step",
    "series_width",
    "tally",
    "upserts",
    "write",
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


BIN_COLUMNS = ", ".join(f"d{i}" for i in range(DURATION_BINS))
_BIN_SUMS = ", ".join(f"SUM(d{i})" for i in range(DURATION_BINS))

ROLLUP_WIDTHS = (300, 1_800, 10_800, 86_400)
"""Seconds per bucket of the coarser rollups, finest first; each a multiple of the one before,
at most 8 times it, so a chart never reads more than 8 rows per point it draws."""

_ROLLUP_BACKFILL = ";".join(
    # each level from the one below it: a pass over the minutes, then ever fewer rows
    "INSERT INTO run_rollups (width, agent, bucket, runs, failures, duration_sum, "
    f"{BIN_COLUMNS}) SELECT {width}, agent, bucket * {finer} / {width}, SUM(runs), "
    f"SUM(failures), SUM(duration_sum), {_BIN_SUMS} FROM "
    + ("run_series" if finer == BUCKET_S else f"run_rollups WHERE width = {finer}")
    + f" GROUP BY agent, bucket * {finer} / {width}"
    for finer, width in zip((BUCKET_S, *ROLLUP_WIDTHS), ROLLUP_WIDTHS, strict=False)
)

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
    INSERT INTO run_series (agent, bucket, runs, failures, duration_sum, {BIN_COLUMNS})
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
    f"""
    CREATE TABLE run_rollups (
        width INTEGER NOT NULL,
        agent TEXT NOT NULL,
        bucket INTEGER NOT NULL,
        runs INTEGER NOT NULL,
        failures INTEGER NOT NULL,
        duration_sum REAL NOT NULL,
        {", ".join(f"d{i} INTEGER NOT NULL DEFAULT 0" for i in range(DURATION_BINS))},
        PRIMARY KEY (width, agent, bucket)
    ) WITHOUT ROWID;
    {_ROLLUP_BACKFILL}
    """,
]

UPSERT_MINUTES = (
    f"INSERT INTO run_series (agent, bucket, runs, failures, duration_sum, {BIN_COLUMNS}) "
    f"VALUES ({', '.join('?' * (5 + DURATION_BINS))}) "
    "ON CONFLICT (agent, bucket) DO UPDATE SET runs = run_series.runs + excluded.runs, "
    "failures = run_series.failures + excluded.failures, "
    "duration_sum = run_series.duration_sum + excluded.duration_sum, "
    + ", ".join(f"d{i} = run_series.d{i} + excluded.d{i}" for i in range(DURATION_BINS))
)
UPSERT_ROLLUP = (
    f"INSERT INTO run_rollups (width, agent, bucket, runs, failures, duration_sum, "
    f"{BIN_COLUMNS}) VALUES ({', '.join('?' * (6 + DURATION_BINS))}) "
    "ON CONFLICT (width, agent, bucket) DO UPDATE SET runs = run_rollups.runs + excluded.runs, "
    "failures = run_rollups.failures + excluded.failures, "
    "duration_sum = run_rollups.duration_sum + excluded.duration_sum, "
    + ", ".join(f"d{i} = run_rollups.d{i} + excluded.d{i}" for i in range(DURATION_BINS))
)
UPSERT_TOTALS = (
    "INSERT INTO run_totals (agent, runs, failures, first_ts, last_ts) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (agent) DO UPDATE SET runs = run_totals.runs + excluded.runs, "
    "failures = run_totals.failures + excluded.failures, first_ts = CASE WHEN "
    "excluded.first_ts < run_totals.first_ts THEN excluded.first_ts ELSE run_totals.first_ts END, "
    "last_ts = CASE WHEN excluded.last_ts > run_totals.last_ts THEN excluded.last_ts "
    "ELSE run_totals.last_ts END"
)


# A duration's bin is the number of edges at or below it (bin i holds [edge(i - 1), edge(i))),
# the last bin holding everything longer: what the SQL backfill chooses, as the same floats
# are compared, so no rounding can move a run across an edge.
_EDGES = tuple(_edge(i) for i in range(DURATION_BINS))
_LAST_BIN = DURATION_BINS - 1


class _Tally:
    """One bucket of a batch being added: runs, failures, summed duration, sparse histogram.

    The histogram is a dict of the bins in use: a minute of a few runs touches one or two of
    the 97 bins, so rolling minutes up into coarser buckets costs per bin in use, not per bin.
    """

    __slots__ = ("bins", "duration_sum", "failures", "first_ts", "last_ts", "runs")

    def __init__(self, ts: float = 0.0) -> None:
        self.runs = 0
        self.failures = 0
        self.duration_sum = 0.0
        self.bins: dict[int, int] = {}
        self.first_ts = self.last_ts = ts  # of the runs added one by one (not merged)

    def merge(self, other: _Tally) -> None:
        self.runs += other.runs
        self.failures += other.failures
        self.duration_sum += other.duration_sum
        for b, count in other.bins.items():
            self.bins[b] = self.bins.get(b, 0) + count

    def values(self) -> tuple[object, ...]:
        dense = [0] * DURATION_BINS
        for b, count in self.bins.items():
            dense[b] = count
        return (self.runs, self.failures, self.duration_sum, *dense)


class SeriesTally(NamedTuple):
    """A batch's additions to the series, each table's rows sorted by its key (so every writer
    takes the rows' locks in one order, and two writers cannot deadlock on them)."""

    minutes: list[tuple[object, ...]]
    """(agent, bucket, runs, failures, duration sum, *bins) per agent and minute."""
    totals: list[tuple[object, ...]]
    """(agent, runs, failures, first time, last time) per agent."""
    rollups: list[tuple[object, ...]]
    """(width, agent, bucket, runs, failures, duration sum, *bins) per coarser bucket."""


def tally(rows: Iterable[Row]) -> SeriesTally | None:
    """What a batch of run rows adds to the series (None: it holds no production run).

    Computed before the batch's transaction begins: the transaction only sends it. A batch
    of a few buckets (the usual: a flush holds a fraction of a second of runs) is summed a
    column at a time with C-level builtins, each bucket's durations added in run order as
    one run at a time would; a batch of many buckets, or one whose values the column steps
    refuse, is tallied a run at a time (the same figures, and the same error).
    """
    rows = rows if isinstance(rows, list) else list(rows)
    try:
        buckets = _column_buckets(rows)
    except (TypeError, ValueError, OverflowError):
        buckets = None  # a bad value: the run-at-a-time tally names it as it always has
    if buckets is None:
        buckets = _row_buckets(rows)
    if not buckets:
        return None
    return _series_tally(buckets)


_agent, _source, _success, _duration, _ts = (itemgetter(i) for i in (0, 1, 2, 3, 8))
_COLUMN_BUCKETS = 8
"""Up to this many buckets a batch is summed a column at a time, one pass per bucket."""


def _column_buckets(rows: list[Row]) -> dict[tuple[str, int], _Tally] | None:
    """A batch's minute buckets summed column by column (None: too many buckets for it, or
    a time or duration that is not a finite number, which the run-at-a-time tally handles)."""
    if list(map(_source, rows)).count(RUN) != len(rows):
        rows = [row for row in rows if row[1] == RUN]
    if not rows:
        return {}
    durations = list(map(_duration, rows))
    stamps = list(map(_ts, rows))
    if not (math.isfinite(sum(durations)) and math.isfinite(sum(stamps))):
        return None
    successes = list(map(_success, rows))
    agents = list(map(_agent, rows))
    n = len(rows)
    first = int(min(stamps) // BUCKET_S)
    if agents.count(agents[0]) == n and int(max(stamps) // BUCKET_S) == first:
        return {(agents[0], first): _bucket(successes, durations, stamps)}
    minutes = list(map(int, map(floordiv, stamps, repeat(BUCKET_S))))
    keys = list(zip(agents, minutes, strict=True))
    distinct = dict.fromkeys(keys)
    if len(distinct) > _COLUMN_BUCKETS:
        return None
    buckets: dict[tuple[str, int], _Tally] = {}
    for key in distinct:
        mask = list(map(eq, keys, repeat(key)))
        buckets[key] = _bucket(
            list(compress(successes, mask)),
            list(compress(durations, mask)),
            list(compress(stamps, mask)),
        )
    return buckets


def _bucket(successes: list[object], durations: list[float], stamps: list[float]) -> _Tally:
    """One bucket from its runs' columns, in run order (finite durations)."""
    bucket = _Tally(float(min(stamps)))
    bucket.last_ts = float(max(stamps))
    bucket.runs = len(durations)
    ok = successes.count(True)  # == True: True, 1 and 1.0, each of them true
    if ok + successes.count(False) != len(successes):  # another kind of value: by its truth
        ok = sum(map(truth, successes))
    bucket.failures = len(successes) - ok
    bucket.duration_sum = reduce(add, durations, 0.0)  # in run order, as run by run
    bucket.bins = _bin_counts(sorted(durations))
    return bucket


def _bin_counts(ordered: list[float]) -> dict[int, int]:
    """The runs in each bin in use, from the durations in ascending order: the count below
    each edge is found by bisection, a step per edge in the durations' range instead of one
    per run. Bin ``b`` holds the durations ``d`` with ``edge(b - 1) <= d < edge(b)``, the
    same comparisons as ``bisect_right(_EDGES, d)`` makes, so the same bin."""
    edges, last = _EDGES, _LAST_BIN
    counts: dict[int, int] = {}
    below = 0  # durations under the edge before bin b
    top = min(bisect_right(edges, ordered[-1]), last)
    for b in range(bisect_right(edges, ordered[0]), top):
        under = bisect_left(ordered, edges[b])
        if under > below:
            counts[b] = under - below
            below = under
    counts[top] = len(ordered) - below
    return counts


def _row_buckets(rows: Iterable[Row]) -> dict[tuple[str, int], _Tally]:
    """A batch's minute buckets, a run at a time."""
    buckets: dict[tuple[str, int], _Tally] = {}
    edges, last = _EDGES, _LAST_BIN
    for row in rows:  # storable rows: the agent is text, the numbers are numbers
        if row[1] != RUN:
            continue
        agent, success, duration_ms, ts = row[0], row[2], row[3], row[8]
        key = (agent, int(ts // BUCKET_S))
        minute = buckets.get(key)
        if minute is None:
            minute = buckets[key] = _Tally(float(ts))
        elif ts < minute.first_ts:
            minute.first_ts = float(ts)
        elif ts > minute.last_ts:
            minute.last_ts = float(ts)
        minute.runs += 1
        if not success:
            minute.failures += 1
        minute.duration_sum += duration_ms
        b = bisect_right(edges, duration_ms)  # its bin (see _EDGES)
        if b > last:
            if not duration_ms < math.inf:  # infinite or NaN: no sum or bin can hold it
                raise OverflowError(f"a run's duration is not a finite number: {duration_ms}")
            b = last
        bins = minute.bins
        bins[b] = bins.get(b, 0) + 1
    return buckets


def _series_tally(buckets: dict[tuple[str, int], _Tally]) -> SeriesTally:
    """The rows a batch's minute buckets add to the series tables, each table's in key order."""
    # an agent's totals from its minutes: a handful per batch, not a step per run
    totals: dict[str, list[float]] = {}
    for (agent, _), minute in buckets.items():
        total = totals.get(agent)
        if total is None:
            totals[agent] = [minute.runs, minute.failures, minute.first_ts, minute.last_ts]
        else:
            total[0] += minute.runs
            total[1] += minute.failures
            total[2] = min(total[2], minute.first_ts)
            total[3] = max(total[3], minute.last_ts)
    return SeriesTally(
        [(agent, bucket, *buckets[(agent, bucket)].values()) for agent, bucket in sorted(buckets)],
        [(agent, int(t[0]), int(t[1]), t[2], t[3]) for agent, t in sorted(totals.items())],
        sorted(_rollups(buckets), key=_rollup_key),
    )


def _rollup_key(row: tuple[object, ...]) -> tuple[int, str, int]:
    return (int(row[0]), str(row[1]), int(row[2]))  # type: ignore[call-overload]


@lru_cache(maxsize=2 * DURATION_BINS)
def _one_bin_upsert(table: str, keys: tuple[str, ...], b: int) -> str:
    """The upsert of a bucket whose runs all fell in bin ``b``: the other bins are left as
    they are (a new row's are 0), so it binds 6 or 7 values instead of 100 or more."""
    columns = ", ".join(keys)
    return (
        f"INSERT INTO {table} ({columns}, runs, failures, duration_sum, d{b}) "
        f"VALUES ({', '.join('?' * (len(keys) + 4))}) "
        f"ON CONFLICT ({columns}) DO UPDATE SET runs = {table}.runs + excluded.runs, "
        f"failures = {table}.failures + excluded.failures, "
        f"duration_sum = {table}.duration_sum + excluded.duration_sum, "
        f"d{b} = {table}.d{b} + excluded.d{b}"
    )


def _bucket_upserts(
    table: str, keys: tuple[str, ...], dense: str, rows: list[tuple[object, ...]]
) -> list[tuple[str, list[tuple[object, ...]]]]:
    """A table's upserts for ``rows`` in their order, consecutive rows of one statement
    grouped: a bucket of one bin by the short statement of its bin, any other in full."""
    head = len(keys) + 3
    out: list[tuple[str, list[tuple[object, ...]]]] = []
    for row in rows:
        bins = row[head:]
        used = [i for i, count in enumerate(bins) if count]
        if len(used) == 1:
            sql, params = _one_bin_upsert(table, keys, used[0]), (*row[:head], bins[used[0]])
        else:
            sql, params = dense, row
        if out and out[-1][0] == sql:
            out[-1][1].append(params)
        else:
            out.append((sql, [params]))
    return out


def upserts(added: SeriesTally) -> list[tuple[str, list[tuple[object, ...]]]]:
    """The statements (each with the parameters of each time it runs) that add a batch's
    tally to the series tables: tables in a fixed order, each table's rows in key order, so
    concurrent writers lock shared rows in one order."""
    return [
        *_bucket_upserts("run_series", ("agent", "bucket"), UPSERT_MINUTES, added.minutes),
        (UPSERT_TOTALS, list(added.totals)),
        *_bucket_upserts("run_rollups", ("width", "agent", "bucket"), UPSERT_ROLLUP, added.rollups),
    ]


def write(conn: StoreConnection, added: SeriesTally | None) -> None:
    """Add a batch's tally to the series tables, in the caller's transaction."""
    if added is None:
        return
    for sql, params in upserts(added):
        conn.executemany(sql, params)


def add_runs(conn: StoreConnection, rows: Iterable[Row]) -> None:
    """Add a batch of run rows to their buckets, rollups and totals, in the caller's
    transaction (where the rollups table exists: a store migrated by this version)."""
    added = tally(rows)
    if added is None:
        return
    conn.executemany(UPSERT_MINUTES, added.minutes)
    conn.executemany(UPSERT_TOTALS, added.totals)
    if _has_table(conn, "run_rollups"):
        conn.executemany(UPSERT_ROLLUP, added.rollups)


def _rollups(minutes: dict[tuple[str, int], _Tally]) -> list[tuple[object, ...]]:
    """The rollup rows of a batch's minute buckets, each level summed from the one before."""
    rows: list[tuple[object, ...]] = []
    finer, finer_width = minutes, BUCKET_S
    for width in ROLLUP_WIDTHS:
        factor = width // finer_width
        coarser: dict[tuple[str, int], _Tally] = {}
        for (agent, bucket), tally in finer.items():
            key = (agent, bucket // factor)
            into = coarser.get(key)
            if into is None:
                into = coarser[key] = _Tally()
            into.merge(tally)
        rows.extend((width, agent, bucket, *t.values()) for (agent, bucket), t in coarser.items())
        finer, finer_width = coarser, width
    return rows


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One step of an agent's series: runs, failures, mean and p95 duration (approximate)."""

    start_ts: float
    runs: int
    failures: int
    mean_ms: float
    p95_ms: float
    last_ts: float | None = None
    """The time of the point's last run, for a point drawn from the runs themselves; None for
    one summed from stored buckets, which stands for its whole step."""

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
    """Each agent's series in at most ``max_points`` steps: from the runs themselves when
    there are at most ``raw_runs`` in all, else summed from the coarsest stored buckets that
    give at least half of ``max_points`` over the span of all the runs (so the agents' charts
    share one time axis, and a long history reads a few hundred rows per agent). One read
    snapshot, which never holds up the writer."""
    with read_snapshot(store) as conn:
        if not _has_table(conn, "run_series"):
            return {}
        total, first_ts, last_ts = conn.execute(
            "SELECT COALESCE(SUM(runs), 0), MIN(first_ts), MAX(last_ts) FROM run_totals"
        ).fetchone()
        if int(total) <= raw_runs:
            return _raw_series(conn, agents, max_points)
        if first_ts is None:
            return {}
        widths = ROLLUP_WIDTHS if _has_table(conn, "run_rollups") else ()
        width = series_width(float(first_ts), float(last_ts), max_points, widths)
        first = int(float(first_ts) // width)
        step = _buckets_per_step(float(first_ts), float(last_ts), width, max_points)
        table, where = "run_series", ""
        params: list[object] = [first, step]
        if width != BUCKET_S:
            table, where = "run_rollups", "WHERE width = ?"
            params.append(width)
        if agents is not None:
            where += (" AND " if where else "WHERE ") + f"agent IN ({','.join('?' * len(agents))})"
            params += list(agents)
        rows = conn.execute(
            f"SELECT agent, (bucket - ?) / ? AS step, SUM(runs), SUM(failures), "
            f"SUM(duration_sum), {_BIN_SUMS} FROM {table} {where} "
            "GROUP BY agent, step ORDER BY agent, step",
            params,
        ).fetchall()
    series: dict[str, list[SeriesPoint]] = {}
    for agent, index, runs, failures, duration_sum, *bins in rows:
        series.setdefault(agent, []).append(
            SeriesPoint(
                start_ts=float((first + int(index) * step) * width),
                runs=int(runs),
                failures=int(failures),
                mean_ms=float(duration_sum) / runs if runs else 0.0,
                p95_ms=duration_quantile(bins, 0.95),  # SUMs of integers are ints
            )
        )
    return series


def _buckets_per_step(first_ts: float, last_ts: float, width: int, max_points: int) -> int:
    count = int(last_ts // width) - int(first_ts // width) + 1
    return max(1, math.ceil(count / max(1, max_points)))


def series_step(store: Store, *, max_points: int = 200, raw_runs: int = RAW_RUNS) -> float:
    """Seconds per step of what ``read_series`` returns with the same arguments: the
    width of its stored buckets times how many it sums per point; for a series drawn from the
    runs themselves (points at their runs' own times), a minute, the finest bucket. Points
    further apart than this have no runs between them."""
    with read_snapshot(store) as conn:
        if not _has_table(conn, "run_series"):
            return float(BUCKET_S)
        total, first_ts, last_ts = conn.execute(
            "SELECT COALESCE(SUM(runs), 0), MIN(first_ts), MAX(last_ts) FROM run_totals"
        ).fetchone()
        if int(total) <= raw_runs or first_ts is None:
            return float(BUCKET_S)
        widths = ROLLUP_WIDTHS if _has_table(conn, "run_rollups") else ()
    width = series_width(float(first_ts), float(last_ts), max_points, widths)
    return float(width * _buckets_per_step(float(first_ts), float(last_ts), width, max_points))


def series_width(
    first_ts: float, last_ts: float, max_points: int, widths: Sequence[int] = ROLLUP_WIDTHS
) -> int:
    """The bucket width a chart of ``first_ts``..``last_ts`` is read from: the coarsest of
    a minute and ``widths`` with at least half of ``max_points`` buckets over the span."""
    chosen = BUCKET_S
    for width in widths:
        if int(last_ts // width) - int(first_ts // width) + 1 >= max_points / 2:
            chosen = width
    return chosen


def _raw_series(
    conn: StoreConnection, agents: Sequence[str] | None, max_points: int
) -> dict[str, list[SeriesPoint]]:
    by_agent: dict[str, list[tuple[bool, float, float]]] = {}
    for agent, success, duration_ms, ts in production_runs(conn):
        if agents is None or agent in agents:
            by_agent.setdefault(agent, []).append((success, duration_ms, ts))
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
                    last_ts=group[-1][2],
                )
            )
        series[agent] = points
    return series


def _has_table(conn: StoreConnection, name: str) -> bool:
    return has_table(conn, name)
