"""A monitor and a store survive ``os.fork()``: nothing written twice, the child writes its own.

Real forks of the test process: pre-fork servers (gunicorn) and ``multiprocessing`` with the
fork start method do exactly this to a monitor created at import time.
"""

from __future__ import annotations

import os
import sqlite3
import time
import warnings
from pathlib import Path

import pytest

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

# Exit codes of the child, so the parent can say what went wrong there.
_CHILD_OK = 0
_CHILD_FLUSHER_DEAD = 10
_CHILD_RUNS_NOT_WRITTEN = 11
_CHILD_SAME_CONNECTION = 12
_CHILD_BUFFER_NOT_EMPTY = 13
_CHILD_CRASHED = 14


def _rows(path: Path, where: str) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM executions WHERE {where}").fetchone()[0])


def _fork() -> int:
    with warnings.catch_warnings():  # the test process runs threads; the child only uses ours
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _child(monitor: PerformanceMonitor, store: Store, parent_conn: int, db: Path) -> int:
    if monitor._unwritten_count() != 0:
        return _CHILD_BUFFER_NOT_EMPTY
    if id(store.connection()) == parent_conn:
        return _CHILD_SAME_CONNECTION
    if not monitor._thread.is_alive():
        return _CHILD_FLUSHER_DEAD
    monitor.record("child", success=True, duration_ms=2.0)
    monitor.record("child", success=False, duration_ms=3.0)
    deadline = time.monotonic() + 10.0  # the flusher runs every second
    while _rows(db, "agent = 'child'") < 2:  # written by the child's flusher, not by flush()
        if time.monotonic() > deadline:
            return _CHILD_RUNS_NOT_WRITTEN
        time.sleep(0.05)
    monitor.flush()
    monitor.close()
    return _CHILD_OK


def test_runs_recorded_before_a_fork_are_written_once_and_the_child_writes_its_own(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agentmend.db"
    store = Store(db)
    monitor = PerformanceMonitor(store, flush_interval_s=1.0)
    try:
        for i in range(3):
            monitor.record("parent", success=True, duration_ms=float(i + 1))
        assert _rows(db, "agent = 'parent'") == 0  # still buffered at the fork
        parent_conn = id(store.connection())
        pid = _fork()
        if pid == 0:  # the child: never return into pytest
            code = _CHILD_CRASHED
            try:
                code = _child(monitor, store, parent_conn, db)
            finally:
                os._exit(code)
        monitor.flush()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == _CHILD_OK
        assert _rows(db, "agent = 'parent'") == 3
        assert _rows(db, "agent = 'child'") == 2
        assert monitor._thread.is_alive()  # the parent's flusher is untouched
        monitor.record("parent", success=True, duration_ms=4.0)
        monitor.flush()
        assert _rows(db, "agent = 'parent'") == 4
    finally:
        monitor.close()
        store.close()


def test_a_store_in_a_forked_child_opens_its_own_connection_and_keeps_the_parents_open(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agentmend.db"
    store = Store(db)
    try:
        inherited = store.connection()
        pid = _fork()
        if pid == 0:
            code = _CHILD_CRASHED
            try:
                fresh = store.connection()
                fresh.execute("CREATE TABLE made_in_child (x INTEGER)")
                # The inherited connection is parked, not closed: still usable, never closed.
                inherited.execute("SELECT 1").fetchone()
                code = _CHILD_OK if fresh is not inherited else _CHILD_SAME_CONNECTION
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == _CHILD_OK
        tables = {r[0] for r in inherited.execute("SELECT name FROM sqlite_master")}
        assert "made_in_child" in tables
    finally:
        store.close()
