"""Runs appended by concurrent writers without a store-wide lock, read by cursors.

* Out of order, for real: one connection holds a run's transaction open while a second writer
  commits a run with a higher id. Every reader of runs (a rollout's ``runs_after``, a watch's
  ``outcomes_after``, a monitor's refresh, which the checker uses) reads each run exactly once
  across the late commit. On SQLite the second writer cannot commit first at all: it waits for
  the first (the backend's own write serialization), and ids stay in commit order. The same
  when the late transaction had its id before it wrote any run (a savepoint rolled back).
* A writer SIGKILLed in the middle of a batch (after its ``COPY``, before its commit) leaves
  none of that batch: readers never see it, the rollups match the rows once another process
  folds the small batch it committed and never folded, and a cursor held back by the open
  transaction moves on once the server ends it.
* Sixty recording processes against a server of twenty connections, through PgBouncer in
  transaction mode: every run of every process is stored once, and no connection is refused.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from crash_child import child_env
from pg_server import PgServer, PgUnavailable
from services import unavailable

from agentmend.infrastructure.monitoring.agent_window import RUN, Row
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.monitoring.run_reader import (
    last_run_id,
    outcomes_after,
    read_horizon,
    runs_after,
)
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.timeouts import StoreTimeouts

_INSERT_ONE = (
    "INSERT INTO executions (agent, source, success, duration_ms, input_tokens,"
    " output_tokens, cost_usd, ts, writer, writer_seq) VALUES ('early', 'run', 0, 5.0, 1, 1,"
    " 0.0, {ts}, '{writer}', 1) RETURNING id"
)


def _run(agent: str, success: bool = True) -> tuple[Any, ...]:
    return (agent, RUN, success, 12.0, None, 3, 4, 0.001, time.time(), None)


def _read(conn: Any, cursor: int, count: int) -> list[Any]:
    """The runs past ``cursor`` once ``count`` are readable (at most 20 s): on PostgreSQL a
    run is read once every older write on the server has ended, and the tests' server is
    shared with other tests' writes."""
    for _ in range(400):
        rows = runs_after(conn, cursor, 1000)
        if len(rows) >= count:
            return rows
        time.sleep(0.05)
    return runs_after(conn, cursor, 1000)


def _counts(monitor: PerformanceMonitor) -> dict[str, int]:
    return {agent: m.executions for agent, m in monitor.get_metrics().items()}


class _Readers:
    """A store with a writer of its own, a monitor on another connection that reads by
    refresh (as the checker does), the store's connection and a cursor taken at the start."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.store = Store(url, files_dir=tmp_path / "w")
        self.writer = ExecutionStore(self.store, uuid.uuid4().hex)
        self._checker_store = Store(url, files_dir=tmp_path / "c")
        self.checker = PerformanceMonitor(self._checker_store)
        self.conn = self.store.connection()
        self.start = last_run_id(self.conn)

    def close(self) -> None:
        self.checker.close()
        self._checker_store.close()
        self.store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_run_committed_after_a_later_id_is_read_once_by_every_reader(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "postgresql":
        url = request.getfixturevalue("pg_server").create_database()
    else:
        url = str(tmp_path / "agentmend.db")
    readers = _Readers(url, tmp_path)
    later, checker, conn, start = readers.writer, readers.checker, readers.conn, readers.start
    early_writer = uuid.uuid4().hex
    insert = _INSERT_ONE.format(ts=time.time(), writer=early_writer)
    if backend == "postgresql":
        import psycopg

        early: Any = psycopg.connect(url, autocommit=True)
        early.execute("BEGIN")
        early_id = early.execute(insert).fetchone()[0]
        later.insert([_run("later")])  # commits first, with the higher id
        later_id = conn.execute("SELECT MAX(id) FROM executions").fetchone()[0]
        assert later_id > early_id  # the later id really committed first
        assert checker.refresh() == 1  # the committed run is counted at once
        assert runs_after(conn, start, 100) == []  # the cursor does not pass the open one
        early.execute("COMMIT")
    else:
        early = sqlite3.connect(url, isolation_level=None)
        early.execute("BEGIN IMMEDIATE")
        early_id = early.execute(insert).fetchone()[0]
        writing = threading.Thread(target=later.insert, args=([_run("later")],))
        writing.start()
        writing.join(0.5)
        assert writing.is_alive()  # SQLite: the second writer waits for the first
        assert runs_after(conn, start, 100) == []
        assert checker.refresh() == 0
        early.execute("COMMIT")
        writing.join(30)
        assert not writing.is_alive()
        later_id = conn.execute("SELECT MAX(id) FROM executions").fetchone()[0]
        assert later_id > early_id  # committed after, numbered after
    early.close()
    rows = _read(conn, start, 2)
    assert [(r.success, r.source) for r in rows] == [(False, RUN), (True, RUN)]
    assert runs_after(conn, rows[-1].id, 100) == []  # read once: the cursor is past both
    assert outcomes_after(conn, "early", start, 10) == [False]
    assert outcomes_after(conn, "later", start, 10) == [True]
    checker.refresh()
    assert _counts(checker) == {"early": 1, "later": 1}  # each run counted once
    assert checker.refresh() == 0
    readers.close()


def test_a_transaction_that_had_its_id_before_writing_runs_is_not_passed_by_a_cursor(
    pg_server: PgServer, tmp_path: Path
) -> None:
    """A savepoint rolled back releases its locks but not its transaction's id (the
    quarantine's halving does exactly that): such a transaction writes runs below ids that
    committed meanwhile, holding no lock on the runs' table in between. A cursor taken from
    the table's lock holders passed it and missed its runs; one below the oldest running
    transaction waits for it."""
    import psycopg

    url = pg_server.create_database()
    readers = _Readers(url, tmp_path)
    later, checker, conn, start = readers.writer, readers.checker, readers.conn, readers.start
    insert = _INSERT_ONE.format(ts=time.time(), writer=uuid.uuid4().hex)
    early: Any = psycopg.connect(url, autocommit=True)
    try:
        early.execute("BEGIN")
        early.execute("SAVEPOINT first_try")
        early.execute(insert)  # the transaction has its id from here on
        early.execute("ROLLBACK TO SAVEPOINT first_try")  # and no lock on the runs' table
        locks = early.execute(
            "SELECT COUNT(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype ="
            " 'relation' AND relation = CAST('executions' AS regclass)"
        ).fetchone()[0]
        assert locks == 0  # what a horizon from the lock table would have missed
        later.insert([_run("later")])  # a higher transaction id, committed first
        assert checker.refresh() == 1  # the committed run is counted at once
        assert runs_after(conn, start, 100) == []  # the cursor does not pass the open one
        assert outcomes_after(conn, "later", start, 10) == []
        early.execute(insert)
        early.execute("COMMIT")
    finally:
        early.close()
    rows = _read(conn, start, 2)
    assert [(r.success, r.source) for r in rows] == [(False, RUN), (True, RUN)]
    assert runs_after(conn, rows[-1].id, 100) == []
    assert outcomes_after(conn, "early", start, 10) == [False]
    checker.refresh()
    assert _counts(checker) == {"early": 1, "later": 1}
    readers.close()


def test_a_write_left_open_in_another_database_holds_no_reader_back(
    pg_server: PgServer, tmp_path: Path
) -> None:
    """A transaction of another database cannot write this one's runs, so readers outside a
    transaction do not wait for it; a snapshot (which cannot tell databases apart) does."""
    import psycopg

    url = pg_server.create_database()
    elsewhere: Any = psycopg.connect(pg_server.create_database(), autocommit=True)
    store = Store(url, files_dir=tmp_path / "w")
    writer = ExecutionStore(store, uuid.uuid4().hex)
    conn = store.connection()
    start = last_run_id(conn)
    try:
        elsewhere.execute("CREATE TABLE bulk_load (x int)")
        elsewhere.execute("BEGIN")
        elsewhere.execute("INSERT INTO bulk_load VALUES (1)")  # an id, held open
        writer.insert([_run("later")])
        rows = runs_after(conn, start, 100)
        assert [r.source for r in rows] == [RUN]  # read at once
        assert outcomes_after(conn, "later", start, 10) == [True]
        with store.snapshot() as snap:  # a snapshot's horizon is the whole server's
            assert read_horizon(snap) <= rows[0].id
        # a monitor's refresh reads the run once and moves past it, keeping nothing to skip
        reader = ExecutionStore(store, uuid.uuid4().hex)
        read, _ = reader.read_foreign(lambda agent: None, 100)
        assert [r[0] for r in read] == ["later"]
        assert reader.horizon > rows[0].id
        assert reader.ingested_above == set()
        assert last_run_id(conn) >= rows[0].id
    finally:
        elsewhere.close()
    store.close()


_KILLED_CHILD = """
import sys, time, uuid
from agentmend.infrastructure.monitoring.agent_window import RUN, Row
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.store import postgres
from agentmend.infrastructure.store.api import Store

copy_text = postgres.PgConnection.copy_text
def copied_then_stopped(self, *args):
    copy_text(self, *args)
    print("MID", flush=True)  # the batch's rows are in, its commit not sent
    time.sleep(120)
postgres.PgConnection.copy_text = copied_then_stopped
table = ExecutionStore(Store(sys.argv[1], files_dir=sys.argv[2]), uuid.uuid4().hex)
rows = [("killed", RUN, i % 3 != 0, 5.0, None, 1, 1, 0.0, time.time(), None) for i in range(500)]
table.insert(rows[:10])  # a small batch: one pipelined transaction, committed
print("COMMITTED", flush=True)
table.insert(rows)  # a large one: COPY, then stopped
"""


def test_a_writer_killed_mid_batch_leaves_none_of_it_and_readers_move_on(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database()
    readers = _Readers(url, tmp_path)
    other, checker, conn, start = readers.writer, readers.checker, readers.conn, readers.start
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CHILD, url, str(tmp_path / "k")],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline().strip() for _ in range(2)]
        assert lines == ["COMMITTED", "MID"]
        other.insert([_run("other") for _ in range(3)])  # commits while the batch is open
        held = _read(conn, start, 10)
        assert [r.source for r in held] == [RUN] * 10  # the killed writer's first batch only
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    deadline = time.monotonic() + 30
    rows = runs_after(conn, held[-1].id, 1000)
    while not rows:  # the server ends the killed session's transaction
        assert time.monotonic() < deadline, "the cursor never moved past the killed batch"
        time.sleep(0.05)
        rows = runs_after(conn, held[-1].id, 1000)
    assert len(rows) == 3  # the other writer's runs, and none of the killed batch
    checker.refresh()
    assert _counts(checker) == {"killed": 10, "other": 3}
    # the killed writer's small batch was committed but never folded: another process's
    # fold takes it (this one, or the other writer's own after its append), once
    assert other.fold() is not None
    again = other.fold()
    assert again is not None
    assert again.runs == 0
    stored = dict(conn.execute("SELECT agent, COUNT(*) FROM executions GROUP BY agent").fetchall())
    totals = dict(conn.execute("SELECT agent, executions FROM execution_totals").fetchall())
    series = dict(conn.execute("SELECT agent, runs FROM run_totals").fetchall())
    assert stored == totals == series == {"killed": 10, "other": 3}  # rollups match the rows
    readers.close()


RECORDERS = 60
RUNS = 60


def _record(url: str, files_dir: str, k: int, together: Any, results: Any) -> None:
    """One recording process: a monitor through the pooler, its runs, its close."""
    # without the setting, psycopg's prepared statements meet other sessions: "does not exist"
    store = Store(url, files_dir=files_dir, timeouts=StoreTimeouts(transaction_pooler=True))
    monitor = PerformanceMonitor(store)
    together.wait(120)  # every process has its sessions open before any records
    for i in range(RUNS):
        monitor.record(f"agent-{k % 6}", success=i % 5 != 0, duration_ms=float(i))
        if i % 10 == 9:
            monitor.flush()  # several transactions each, interleaved with the others'
    monitor.close()
    pending, error = monitor.write_backlog()
    results.put((k, pending, error))
    store.close()


@pytest.mark.slow
def test_sixty_recorders_share_twenty_connections_through_a_transaction_pooler(
    tmp_path: Path,
) -> None:
    from pgbouncer import PgBouncer, pgbouncer_binary

    try:
        pgbouncer_binary()
        server = PgServer(max_connections=20)
    except PgUnavailable as exc:
        unavailable(str(exc))
    bouncer = None
    try:
        direct = server.create_database()
        with Store(direct, files_dir=tmp_path / "m") as made:
            PerformanceMonitor(made).close()  # the tables
        bouncer = PgBouncer(server, pool_size=10)
        url = bouncer.url(direct)
        fork = multiprocessing.get_context("fork")
        results, together = fork.Queue(), fork.Barrier(RECORDERS)
        procs = [
            fork.Process(target=_record, args=(url, str(tmp_path / f"h{k}"), k, together, results))
            for k in range(RECORDERS)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(240)
        assert all(not proc.is_alive() for proc in procs), "a recorder did not finish"
        assert [proc.exitcode for proc in procs] == [0] * RECORDERS
        reported = sorted(results.get(timeout=10) for _ in range(RECORDERS))
        assert reported == [(k, 0, None) for k in range(RECORDERS)]  # all written, no error
        with Store(direct, files_dir=tmp_path / "m") as store:
            conn = store.connection()
            per_writer = [
                n for (n,) in conn.execute("SELECT COUNT(*) FROM executions GROUP BY writer")
            ]
            totals = conn.execute("SELECT SUM(executions) FROM execution_totals").fetchone()[0]
        assert sorted(per_writer) == [RUNS] * RECORDERS  # each process's runs, once
        assert totals == RECORDERS * RUNS
        log = (server.base / "server.log").read_text(errors="replace")
        assert "too many clients" not in log  # no session was refused by the server
    finally:
        if bouncer is not None:
            bouncer.stop()
        server.stop()


def test_writers_adding_to_the_same_rollup_rows_at_once_never_deadlock(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database()
    store = Store(url, files_dir=tmp_path)
    ExecutionStore(store, uuid.uuid4().hex)  # the tables, before the writers race
    errors: list[BaseException] = []
    go = threading.Barrier(4)

    def write(k: int) -> None:
        # its own thread, its own session, folding after every small batch (into the same
        # rollup rows as the large batches' inline upserts)
        table = ExecutionStore(store, uuid.uuid4().hex, fold_interval_s=0.0)
        agents = [f"agent-{(k + j) % 5}" for j in range(5)]  # each writer its own order
        go.wait(30)
        try:
            for b in range(25):
                now = time.time() - 600 * (b % 3)  # buckets of several minutes and hours
                rows: list[Row] = [
                    (
                        agents[i % 5],
                        RUN,
                        (i + b) % 4 != 0,
                        float(i * k + 1),
                        None,
                        1,
                        1,
                        0.0,
                        now + i,
                        None,
                    )
                    for i in range(70 if b % 2 else 7)  # COPY batches and pipelined ones
                ]
                table.insert(rows)
        except BaseException as exc:  # a deadlock is SQLSTATE 40P01
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    ExecutionStore(store, uuid.uuid4().hex).fold()  # the small batches no writer folded yet
    conn = store.connection()
    stored = dict(conn.execute("SELECT agent, COUNT(*) FROM executions GROUP BY agent").fetchall())
    totals = dict(conn.execute("SELECT agent, executions FROM execution_totals").fetchall())
    minutes = dict(
        conn.execute("SELECT agent, SUM(runs) FROM run_series GROUP BY agent").fetchall()
    )
    days = dict(
        conn.execute(
            "SELECT agent, SUM(runs) FROM run_rollups WHERE width = 86400 GROUP BY agent"
        ).fetchall()
    )
    assert sum(stored.values()) == 4 * (12 * 70 + 13 * 7)
    assert stored == totals == minutes == days  # every rollup row added to by every writer
    store.close()
