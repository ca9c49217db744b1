"""Reading a store for a page never holds up a writer: a read snapshot against a write
transaction, with a real second connection that must not wait."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.snapshot import read_snapshot


def _write(path: Path) -> None:
    """A write by another connection that refuses to wait for a lock."""
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO t VALUES (2)")
        other.execute("COMMIT")
    finally:
        other.close()


def test_a_writer_goes_on_while_a_snapshot_is_read_and_the_snapshot_stays_put(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    with Store(path) as store:
        with store.transaction() as conn:
            conn.execute("CREATE TABLE t (v INTEGER)")
            conn.execute("INSERT INTO t VALUES (1)")
        with read_snapshot(store) as conn:
            assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1
            _write(path)  # no wait: a snapshot holds no write lock
            assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1  # one snapshot
        assert not store.connection().in_transaction
        with read_snapshot(store) as conn:
            assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 2
        with store.transaction() as conn:  # what a page read with before: the writer waits
            conn.execute("SELECT COUNT(*) FROM t").fetchone()
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                _write(path)
