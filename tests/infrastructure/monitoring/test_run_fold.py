"""Deferred rollups on PostgreSQL: small batches appended alone, folded into the rollups later.

Real server, real processes and threads: after a fold the rollups equal a recount from the runs
whatever order writers committed in, two folders never fold a run twice, a baseline started
between a run's append and its fold counts the run in the epoch whose segment holds it, a
monitor opening (and ``status``) before a fold counts every run anyway, and retention folds
before it prunes (and keeps a run no fold could take yet). A writer killed before folding is in
``tests/faults/test_unlocked_appends.py``; a server restart mid-run in
``tests/infrastructure/store/test_store_fleet.py``.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import PgServer

from agentmend.faces.report.data import agent_statuses
from agentmend.infrastructure.monitoring import run_fold
from agentmend.infrastructure.monitoring.agent_window import RUN, Row
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore, delete_runs
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store

_NEVER = 1e9  # a fold interval no test reaches: the writer leaves its runs unfolded


def _run(agent: str, i: int, source: str = RUN) -> Row:
    # failures every third run, durations over several bins, timestamps over two minutes
    return (agent, source, i % 3 != 0, 1.0 + i * 7.5, None, i, 2 * i, 0.25, 1.7e9 + i, None)


def _recount(conn: Any) -> dict[str, Any]:
    """Every rollup's figures as recounted from the runs themselves."""
    return {
        "totals": sorted(
            conn.execute(
                "SELECT agent, source, COUNT(*), SUM(1 - success), SUM(input_tokens),"
                " SUM(output_tokens), ROUND(CAST(SUM(cost_usd) AS NUMERIC), 6)"
                " FROM executions GROUP BY agent, source"
            ).fetchall()
        ),
        "series": sorted(
            conn.execute(
                "SELECT agent, COUNT(*), SUM(1 - success) FROM executions WHERE source = 'run'"
                " GROUP BY agent"
            ).fetchall()
        ),
    }


def _rollups(conn: Any) -> dict[str, Any]:
    """The same figures as the rollups hold them; every series level and the baseline counts
    must agree with the per-agent figures."""
    series = sorted(conn.execute("SELECT agent, runs, failures FROM run_totals").fetchall())
    for table, where in [
        ("run_series", ""),
        *[("run_rollups", f" WHERE width = {w}") for w in (300, 1800, 10800, 86400)],
    ]:
        summed = conn.execute(
            f"SELECT agent, SUM(runs), SUM(failures) FROM {table}{where} GROUP BY agent"
        ).fetchall()
        assert sorted(summed) == series, (table, where)
    baselines = conn.execute("SELECT agent, SUM(runs) FROM baseline_runs GROUP BY agent")
    assert sorted(baselines.fetchall()) == [(a, n) for a, n, _ in series]
    return {
        "totals": sorted(
            conn.execute(
                "SELECT agent, source, executions, failures, input_tokens, output_tokens,"
                " ROUND(CAST(cost_usd AS NUMERIC), 6) FROM execution_totals"
            ).fetchall()
        ),
        "series": series,
    }


def _write(url: str, files_dir: str, k: int, together: Any) -> None:
    """One writer process: one-run batches of two agents it shares with others, folding after
    every batch it can (so folds race with other writers' appends and folds)."""
    store = Store(url, files_dir=files_dir)
    table = ExecutionStore(store, uuid.uuid4().hex, fold_interval_s=0.0)
    together.wait(60)
    for i in range(30):
        source = "verification" if i % 10 == 9 else RUN
        table.insert([_run(f"agent-{(k + i) % 3}", k * 100 + i, source)])
    store.close()  # no last fold: some runs are left to the test's


@pytest.mark.slow
def test_one_run_batches_of_many_processes_committed_out_of_order_fold_to_a_recount(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database()
    store = Store(url, files_dir=tmp_path / "t")
    table = ExecutionStore(store, uuid.uuid4().hex, fold_interval_s=_NEVER)
    conn = store.connection()
    late: Any = psycopg.connect(url, autocommit=True)
    fork = multiprocessing.get_context("fork")
    together = fork.Barrier(7)
    procs = [
        fork.Process(target=_write, args=(url, str(tmp_path / f"w{k}"), k, together))
        for k in range(6)
    ]
    try:
        for proc in procs:
            proc.start()
        together.wait(60)
        time.sleep(0.02)  # some runs committed and folded, then one held open among the rest
        # a run whose transaction began before others' and commits after them all
        late.execute("BEGIN")
        late.execute(
            "INSERT INTO executions (agent, source, success, duration_ms, input_tokens,"
            " output_tokens, cost_usd, ts, writer, writer_seq, rolled) VALUES"
            " ('agent-0', 'run', 0, 3.0, 1, 1, 0.5, 1.7e9, 'late', 1, FALSE)"
        )
        for proc in procs:
            proc.join(120)
        assert [proc.exitcode for proc in procs] == [0] * 6
        table.fold()  # below the open transaction's id only: its run cannot be taken
        assert conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0] == 180
        late.execute("COMMIT")
    finally:
        late.close()
    folded = table.fold()
    assert folded is not None
    assert folded.runs >= 1
    assert _rollups(conn) == _recount(conn)  # the late run counted once, and nothing else twice
    assert conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0] == 181
    store.close()


def test_folders_racing_fold_each_run_once(pg_server: PgServer, tmp_path: Path) -> None:
    url = pg_server.create_database()
    store = Store(url, files_dir=tmp_path)
    ExecutionStore(store, uuid.uuid4().hex)  # the tables
    done = threading.Event()
    folded: list[int] = []
    errors: list[BaseException] = []

    def fold(wait: bool) -> None:  # its own thread: its own session
        conn = store.connection()
        try:
            while True:
                last = done.is_set()
                result = run_fold.fold(conn, wait=wait)
                if result is not None:
                    folded.append(result.runs)
                if last:
                    return
        except BaseException as exc:
            errors.append(exc)

    def write(k: int) -> None:
        table = ExecutionStore(store, uuid.uuid4().hex, fold_interval_s=_NEVER)
        try:
            for i in range(40):
                table.insert([_run(f"agent-{k}", i) for _ in range(1 + i % 3)])
        except BaseException as exc:
            errors.append(exc)

    folders = [threading.Thread(target=fold, args=(k % 2 == 0,)) for k in range(3)]
    writers = [threading.Thread(target=write, args=(k,)) for k in range(3)]
    for thread in folders + writers:
        thread.start()
    for thread in writers:
        thread.join(60)
    done.set()
    for thread in folders:
        thread.join(60)
    assert errors == []
    conn = store.connection()
    runs = conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    assert runs == 3 * sum(1 + i % 3 for i in range(40))
    assert sum(folded) == runs  # every run folded, by one folder or another, once
    assert len([n for n in folded if n]) > 1  # more than one fold took runs
    assert _rollups(conn) == _recount(conn)
    store.close()


def _segment_recount(conn: Any, agent: str) -> dict[int, int]:
    """Runs per epoch as the segments hold them (what a baseline rebuilt from its rows counts)."""
    rows = conn.execute(
        "SELECT s.epoch, COUNT(e.id) FROM baseline_segments s JOIN executions e"
        " ON e.agent = s.agent AND e.source = 'run' AND e.id > s.start_id"
        " AND (s.end_id IS NULL OR e.id <= s.end_id) WHERE s.agent = ? GROUP BY s.epoch",
        (agent,),
    ).fetchall()
    return {int(epoch): int(n) for epoch, n in rows}


def test_a_baseline_started_between_append_and_fold_counts_runs_in_their_segments(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database()
    store = Store(url, files_dir=tmp_path)
    table = ExecutionStore(store, uuid.uuid4().hex, fold_interval_s=_NEVER)
    conn = store.connection()
    for i in range(3):
        table.insert([_run("a", i)])  # not folded yet
    late: Any = psycopg.connect(url, autocommit=True)
    try:
        late.execute("BEGIN")  # a run numbered before the boundary, committed after it
        late.execute(
            "INSERT INTO executions (agent, source, success, duration_ms, input_tokens,"
            " output_tokens, cost_usd, ts, writer, writer_seq, rolled) VALUES"
            " ('a', 'run', 1, 3.0, 1, 1, 0.5, 1.7e9, 'late', 1, FALSE)"
        )
        table.insert([_run("a", 3)])
        assert table.start_epoch("a", "a change") == 1
        late.execute("COMMIT")
    finally:
        late.close()
    for i in range(2):
        table.insert([_run("a", 10 + i)])
    restored_at = table.restore_epoch("a")
    assert restored_at == 0
    table.insert([_run("a", 20)])
    table.fold()
    counted = dict(conn.execute("SELECT epoch, runs FROM baseline_runs WHERE agent = 'a'"))
    recount = _segment_recount(conn, "a")
    assert counted == recount
    assert recount == {0: 6, 1: 2}  # 4 + the late one before, 1 after the restore; 2 in epoch 1
    store.close()


def test_a_monitor_opening_and_status_count_runs_no_fold_has_taken(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database()
    store = Store(url, files_dir=tmp_path / "w")
    table = ExecutionStore(store, uuid.uuid4().hex, fold_interval_s=_NEVER)
    table.insert([_run("a", i) for i in range(40)])  # one batch, not folded
    for i in range(5):
        table.insert([_run("b", i)])
    holder: Any = psycopg.connect(url, autocommit=True)
    try:
        holder.execute("BEGIN")  # holds the fold cursor: the monitor's own fold skips
        holder.execute("SELECT position FROM run_fold FOR UPDATE")
        with Store(url, files_dir=tmp_path / "m") as other:
            monitor = PerformanceMonitor(other)
            metrics = monitor.get_metrics()
            assert {agent: m.executions for agent, m in metrics.items()} == {"a": 40, "b": 5}
            assert metrics["a"].failures == 14
            assert metrics["b"].consecutive_failures == 0  # run 4 succeeded
            assert monitor._baselines["a"][-1].runs == 40
            monitor.close()
            # status and the report read the rollups and the same tail
            statuses = {s.name: s for s in agent_statuses(other, baseline_n=30)}
            assert {a: (s.runs, s.failures) for a, s in statuses.items()} == {
                "a": (40, 14),
                "b": (5, 2),
            }
            assert (statuses["a"].baseline_runs, statuses["b"].baseline_runs) == (30, 5)
        folded = store.connection().execute("SELECT COUNT(*) FROM execution_totals")
        assert folded.fetchone()[0] == 0  # nothing was folded: the counts came from the tail
    finally:
        holder.close()
    store.close()


def test_retention_folds_before_it_prunes_and_keeps_runs_no_fold_could_take(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database()
    store = Store(url, files_dir=tmp_path)
    table = ExecutionStore(store, uuid.uuid4().hex, fold_interval_s=_NEVER)
    conn = store.connection()
    for i in range(4):
        table.insert([_run("a", i)])
    older: Any = psycopg.connect(url, autocommit=True)
    try:
        older.execute("BEGIN")
        older.execute("SELECT pg_current_xact_id()")  # an older transaction, still running
        table.insert([_run("a", 4)])  # committed, but above the horizon the open one holds
        ids = [int(i) for (i,) in conn.execute("SELECT id FROM executions ORDER BY id")]
        with store.transaction() as tx:
            delete_runs(tx, ids)
        left = [int(i) for (i,) in conn.execute("SELECT id FROM executions").fetchall()]
        assert ids[-1] in left  # kept: no fold could count it yet
        assert len(left) < len(ids)  # the ones folded went
        older.execute("COMMIT")
    finally:
        older.close()
    table.fold()
    executions = conn.execute("SELECT executions FROM execution_totals WHERE agent = 'a'")
    assert executions.fetchone()[0] == 5  # the pruned runs were counted before they went
    assert run_fold.unfolded(conn) == []
    store.close()


def test_a_store_copy_counts_the_runs_its_source_had_not_folded(
    pg_server: PgServer, tmp_path: Path
) -> None:
    from agentmend.infrastructure.store.copying import copy_store

    url = pg_server.create_database()
    source = Store(url, files_dir=tmp_path / "s")
    table = ExecutionStore(source, uuid.uuid4().hex, fold_interval_s=_NEVER)
    table.insert([_run("a", i) for i in range(100)])  # a large batch: rolled up inline
    for i in range(7):
        table.insert([_run("b", i)])  # small ones: not folded
    target = Store(tmp_path / "copy.db")
    report = copy_store(source, target, hmac_key="k" * 32)
    assert report.rows["executions"] == 107
    conn = target.connection()
    assert _rollups(conn) == _recount(conn)  # the copied rollups and the source's tail
    assert conn.execute("SELECT COUNT(*) FROM run_totals").fetchone()[0] == 2
    assert run_fold.unfolded(source.connection()) != []  # the source was left as it was
    source.close()
    target.close()
