"""The rollups of the run series: kept as runs are written, equal to a backfill, and what a
chart of a long history reads from."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from agentmend.infrastructure.monitoring.agent_window import Row
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.monitoring.run_series import (
    BUCKET_S,
    MIGRATIONS,
    ROLLUP_WIDTHS,
    read_series,
    series_step,
    series_width,
)
from agentmend.infrastructure.store.api import Store, _split_sql

DAY = 86_400


def _runs(count: int, *, days: float, seed: int = 3) -> list[Row]:
    """``count`` runs of two agents over ``days`` days, at random moments, oldest first."""
    rng = random.Random(seed)
    start = 1_700_000_000.0
    moments = sorted(start + rng.random() * days * DAY for _ in range(count))
    return [
        (
            rng.choice(("a", "b")),
            "run" if rng.random() > 0.05 else "verification",
            rng.random() > 0.1,
            rng.lognormvariate(5.0, 1.0),
            None,
            1,
            1,
            0.0,
            ts,
            None,
        )
        for ts in moments
    ]


def _store_with(tmp_path: Path, rows: list[Row], batch: int) -> Store:
    store = Store(tmp_path / "s.db")
    executions = ExecutionStore(store, "ab")
    for i in range(0, len(rows), batch):  # batches end mid-bucket: rows add to stored ones
        executions.insert(rows[i : i + batch])
    return store


def test_the_rollups_kept_as_runs_are_written_equal_a_backfill_from_the_minutes(
    tmp_path: Path,
) -> None:
    rows = _runs(3_000, days=4)
    store = _store_with(tmp_path, rows, batch=137)
    runs = sum(1 for r in rows if r[1] == "run")
    with store.transaction() as conn:
        live = conn.execute("SELECT * FROM run_rollups ORDER BY width, agent, bucket").fetchall()
        conn.execute("DROP TABLE run_rollups")
        for statement in _split_sql(MIGRATIONS[1]):
            conn.execute(statement)
        backfilled = conn.execute(
            "SELECT * FROM run_rollups ORDER BY width, agent, bucket"
        ).fetchall()
        per_width = dict(conn.execute("SELECT width, SUM(runs) FROM run_rollups GROUP BY width"))
        day_buckets = conn.execute(
            "SELECT COUNT(DISTINCT bucket) FROM run_rollups WHERE width = ?", (DAY,)
        ).fetchone()[0]
    # duration sums added in another order differ in the last bits; the rest is exact
    assert [r[:5] + r[6:] for r in live] == [r[:5] + r[6:] for r in backfilled]
    assert [r[5] for r in live] == pytest.approx([r[5] for r in backfilled], rel=1e-12)
    assert per_width == dict.fromkeys(ROLLUP_WIDTHS, runs)  # verification runs left out
    assert 4 <= day_buckets <= 5
    store.close()


def test_the_minutes_kept_as_runs_are_written_bin_every_duration_as_the_backfill_does(
    tmp_path: Path,
) -> None:
    """Every bin edge, the floats either side of it, and random durations: the bins a batch's
    tally adds equal those the SQL backfill computes from the same runs."""
    edges = [2.0 ** (i / 4) for i in range(100)]
    durations = [0.0, 0.5, 1e300] + [
        d for e in edges for d in (math.nextafter(e, 0.0), e, math.nextafter(e, math.inf))
    ]
    rng = random.Random(5)
    durations += [rng.lognormvariate(5.0, 3.0) for _ in range(2_000)]
    start = 1_700_000_000.0
    rows: list[Row] = [
        ("a", "run", True, d, None, 1, 1, 0.0, start + i * 0.01, None)
        for i, d in enumerate(durations)
    ]
    store = _store_with(tmp_path, rows, batch=101)
    with store.transaction() as conn:
        live = conn.execute("SELECT * FROM run_series ORDER BY agent, bucket").fetchall()
        for table in ("run_rollups", "run_totals", "run_series"):
            conn.execute(f"DROP TABLE {table}")
        for statement in _split_sql(MIGRATIONS[0]):
            conn.execute(statement)
        backfilled = conn.execute("SELECT * FROM run_series ORDER BY agent, bucket").fetchall()
    assert sum(r[2] for r in live) == len(durations)
    assert [r[:4] + r[5:] for r in live] == [r[:4] + r[5:] for r in backfilled]
    store.close()


def test_a_long_history_is_read_from_the_coarsest_rollup_that_fills_half_the_chart(
    tmp_path: Path,
) -> None:
    rows = _runs(4_000, days=20)
    store = _store_with(tmp_path, rows, batch=500)
    # 20 days: 5-minute and 30-minute buckets give 100 points or more, 3-hour ones 161
    first, last = rows[0][8], rows[-1][8]
    assert series_width(first, last, 200) == 10_800
    assert series_width(first, last, 400) == 1_800
    assert series_width(first, last, 5) == DAY
    assert series_width(first, last, 200, widths=()) == BUCKET_S
    exact = read_series(store, raw_runs=10**9)
    for max_points, width in ((200, 10_800), (400, 1_800), (5_000, 300), (50_000, BUCKET_S)):
        series = read_series(store, raw_runs=0, max_points=max_points)
        for agent, points in series.items():
            assert 0 < len(points) <= max_points
            assert sum(p.runs for p in points) == sum(p.runs for p in exact[agent])
            assert sum(p.failures for p in points) == sum(p.failures for p in exact[agent])
            assert all(p.start_ts % width == 0 for p in points)
            assert [p.start_ts for p in points] == sorted(p.start_ts for p in points)
    store.close()


@pytest.mark.parametrize("max_points", [1, 2, 7])
def test_a_chart_of_few_points_reads_whole_days(tmp_path: Path, max_points: int) -> None:
    rows = _runs(600, days=3)
    store = _store_with(tmp_path, rows, batch=600)
    series = read_series(store, raw_runs=0, max_points=max_points)
    assert all(len(points) <= max(1, max_points) for points in series.values())
    assert all(p.start_ts % DAY == 0 for points in series.values() for p in points)
    assert sum(p.runs for points in series.values() for p in points) == sum(
        1 for r in rows if r[1] == "run"
    )
    store.close()


def test_a_store_without_rollups_is_read_from_the_minutes(tmp_path: Path) -> None:
    rows = _runs(1_000, days=2)
    store = _store_with(tmp_path, rows, batch=1_000)
    with store.transaction() as conn:  # as a store not yet opened by a writer of this version
        conn.execute("DROP TABLE run_rollups")
        conn.execute("UPDATE schema_versions SET version = 1 WHERE component = 'run_series'")
    series = read_series(store, raw_runs=0)
    assert all(p.start_ts % BUCKET_S == 0 for points in series.values() for p in points)
    assert sum(p.runs for points in series.values() for p in points) == sum(
        1 for r in rows if r[1] == "run"
    )
    store.close()


@pytest.mark.parametrize("max_points", [7, 50, 200, 5_000])
def test_the_step_of_a_series_is_the_spacing_of_its_points(tmp_path: Path, max_points: int) -> None:
    """``series_step`` is what a chart breaks its line at: the points of ``read_series`` sit
    on its grid, and the closest two of an agent's are one step apart."""
    rows = _runs(4_000, days=20)
    store = _store_with(tmp_path, rows, batch=500)
    step = series_step(store, raw_runs=0, max_points=max_points)
    series = read_series(store, raw_runs=0, max_points=max_points)
    for points in series.values():
        gaps = [b.start_ts - a.start_ts for a, b in itertools.pairwise(points)]
        assert all(gap % step == 0 for gap in gaps)
        assert min(gaps) == step
        assert all(p.last_ts is None for p in points)  # each stands for its whole step
    store.close()


def test_points_of_the_runs_themselves_end_at_their_last_run(tmp_path: Path) -> None:
    rows = _runs(600, days=1)
    store = _store_with(tmp_path, rows, batch=600)
    assert series_step(store) == BUCKET_S  # runs more than a minute apart had none between
    series = read_series(store, max_points=50)
    runs = {agent: sorted(r[8] for r in rows if r[0] == agent and r[1] == "run") for agent in "ab"}
    for agent, points in series.items():
        assert points[0].start_ts == runs[agent][0]
        assert points[-1].last_ts == runs[agent][-1]
        for a, b in itertools.pairwise(points):
            assert a.start_ts <= (a.last_ts or 0) < b.start_ts
    store.close()
