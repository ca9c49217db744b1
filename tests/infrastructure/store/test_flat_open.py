"""Opening a monitor costs the same however much history the store holds.

Measured by work, not time: SQLite's progress handler counts the virtual-machine steps the
open runs on the store's connection, so a scan over the runs shows up as steps in proportion to
them, on any machine and under any load. The histories are built through a fast path (one
``INSERT ... SELECT`` from a recursive CTE), then the rollups are rebuilt by their migration, as
they are for a store written before they existed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store

_ERROR_EVERY = 25_000  # rare errors: a scan for the latest ten would walk most of the rows


def build_history(db: Path, runs: int) -> None:
    """A store of ``runs`` runs of agents ``a`` and ``b`` (one failure in ``_ERROR_EVERY``,
    ``a`` ending on a success and 3 failures), a kept change for ``a`` after the first half."""
    with PerformanceMonitor(Store(db)):
        pass  # creates the tables
    half = runs // 2
    conn = sqlite3.connect(db)
    fill = (
        "WITH RECURSIVE n(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
        " INSERT INTO executions (agent, source, success, duration_ms, error, input_tokens,"
        " output_tokens, cost_usd, ts, extra, writer)"
        " SELECT CASE i % 2 WHEN 0 THEN 'a' ELSE 'b' END, 'run',"
        f" CASE WHEN i % {_ERROR_EVERY} = 0 THEN 0 ELSE 1 END, 100.0 + i % 7,"
        f" CASE WHEN i % {_ERROR_EVERY} = 0 THEN 'boom ' || i END, 10, 5, 0.001,"
        " 1700000000.0 + i, NULL, 'fast-path' FROM n"
    )
    with conn:
        conn.execute(fill, (1, half))
    conn.close()
    with PerformanceMonitor(Store(db)) as monitor:
        monitor.start_new_baseline("a", label="kept change")
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(fill, (half + 1, runs))
        conn.execute(
            "INSERT INTO executions (agent, source, success, duration_ms, error, input_tokens,"
            " output_tokens, cost_usd, ts, extra, writer) VALUES"
            " ('a', 'run', 1, 1.0, NULL, 0, 0, 0.0, 1799999999.0, NULL, 'fast-path'),"
            " ('a', 'run', 0, 1.0, 'last', 0, 0, 0.0, 1800000000.0, NULL, 'fast-path'),"
            " ('a', 'run', 0, 1.0, 'last', 0, 0, 0.0, 1800000001.0, NULL, 'fast-path'),"
            " ('a', 'run', 0, 1.0, 'last', 0, 0, 0.0, 1800000002.0, NULL, 'fast-path')"
        )
        # the rollups are rebuilt from the rows by their migration at the next open
        conn.execute("DROP TABLE execution_totals")
        conn.execute("DROP TABLE baseline_runs")
        conn.execute("DROP INDEX executions_errors")
        conn.execute("DELETE FROM schema_versions WHERE component = 'execution_rollup'")
    conn.close()
    with PerformanceMonitor(Store(db)):
        pass


def open_steps(db: Path) -> tuple[int, PerformanceMonitor]:
    """SQLite VM steps (in thousands) an open of a monitor on ``db`` runs, and the monitor."""
    store = Store(db)
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn = store.connection()
    assert isinstance(conn, sqlite3.Connection)  # SQLite's own step counter
    conn.set_progress_handler(count, 1000)
    monitor = PerformanceMonitor(store, flush_interval_s=3600)
    conn.set_progress_handler(None, 0)
    return steps[0], monitor


@pytest.mark.slow
def test_opening_costs_the_same_at_ten_thousand_and_at_a_million_runs(tmp_path: Path) -> None:
    small, large = tmp_path / "small.db", tmp_path / "large.db"
    build_history(small, 10_000)
    build_history(large, 1_000_000)
    small_steps, small_monitor = open_steps(small)
    large_steps, large_monitor = open_steps(large)
    # A scan of the runs would cost 100x more on the large store; the open costs the same.
    assert large_steps <= 2 * small_steps + 5
    for monitor, runs in ((small_monitor, 10_000), (large_monitor, 1_000_000)):
        a = monitor.get_agent_metrics("a")
        b = monitor.get_agent_metrics("b")
        assert a is not None
        assert b is not None
        assert a.executions + b.executions == runs + 4
        assert a.failures == runs // _ERROR_EVERY + 3  # every 25,000th i is even: agent a
        assert a.consecutive_failures == 3
        assert a.input_tokens == 10 * (runs // 2)
        assert a.recent_errors[-3:] == ("last", "last", "last")
        assert b.failures == 0
        baseline = monitor.baseline("a")
        assert baseline is not None
        assert baseline.epoch == 1
        assert baseline.n == 500  # its first 500 runs, read from the middle of the history
        assert baseline.runs == runs // 4 + 4
        monitor.close()


def test_rollups_kept_by_the_writer_match_the_runs(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with PerformanceMonitor(Store(db)) as monitor:
        for i in range(3000):
            monitor.record("a", success=i % 10 != 0, duration_ms=1.0, input_tokens=2)
            if i == 1000:
                monitor.start_new_baseline("a")
        for _ in range(4):
            monitor.record("a", success=False, duration_ms=1.0, error="late")
        live = monitor.get_agent_metrics("a")
        live_baseline = monitor.baseline("a")
    with PerformanceMonitor(Store(db)) as reopened:
        loaded = reopened.get_agent_metrics("a")
        loaded_baseline = reopened.baseline("a")
    assert live is not None
    assert loaded is not None
    assert live_baseline is not None
    assert loaded_baseline is not None
    assert loaded == live
    assert (loaded_baseline.epoch, loaded_baseline.runs) == (live_baseline.epoch, 2003)
    assert loaded.consecutive_failures == 4
