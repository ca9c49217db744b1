"""The Store interface behaves the same on SQLite and on a real PostgreSQL server.

Each test runs once per backend (``store_url``); PostgreSQL-only behaviour (the team lock across
connections, reconnecting after a server restart) uses ``pg_url`` or ``pg_server``.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from pg_server import PgServer

from agentmend.infrastructure.errors import PostgresExtraMissing, StoreError
from agentmend.infrastructure.store.api import Store, is_store_url
from agentmend.infrastructure.store.sql import has_table, next_id, set_next_id

_MIGRATIONS = [
    """
    CREATE TABLE things (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        count INTEGER NOT NULL,
        flag INTEGER NOT NULL,
        weight REAL NOT NULL,
        body BLOB
    );
    CREATE TABLE tally (name TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID
    """,
    "ALTER TABLE things ADD COLUMN note TEXT",
]


def _open(url: str, tmp_path: Path) -> Store:
    store = Store(url, files_dir=tmp_path)
    store.migrate("things", _MIGRATIONS)
    return store


def test_migrate_returning_upsert_and_types(store_url: str, tmp_path: Path) -> None:
    with _open(store_url, tmp_path) as store:
        assert store.schema_version("things") == 2
        with store.transaction() as conn:
            first = conn.execute(
                "INSERT INTO things (name, count, flag, weight, body, note)"
                " VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                ("a", 3, True, 0.5, b"\x00\xff", "50% done"),
            ).fetchone()[0]
            conn.execute(
                "INSERT INTO things (name, count, flag, weight) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                ("a", 99, False, 1.0),
            )
            for _ in range(3):
                conn.execute(
                    "INSERT INTO tally (name, n) VALUES (?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET n = tally.n + excluded.n",
                    ("a", 2),
                )
        conn = store.connection()
        row = conn.execute(
            "SELECT id, name, count, flag, weight, body, note FROM things WHERE name LIKE 'a%'"
        ).fetchone()
        assert tuple(row) == (first, "a", 3, 1, 0.5, b"\x00\xff", "50% done")
        assert conn.execute("SELECT n FROM tally").fetchone()[0] == 6
        total = conn.execute("SELECT SUM(count), SUM(1 - flag) FROM things").fetchone()
        assert (total[0], total[1]) == (3, 0)
        assert isinstance(total[0], int)
        assert has_table(conn, "things")
        assert not has_table(conn, "nothing_here")


def test_rollback_leaves_nothing_and_nested_joins(store_url: str, tmp_path: Path) -> None:
    with _open(store_url, tmp_path) as store:

        def nested_then_fail() -> None:
            with store.transaction() as conn:
                conn.execute("INSERT INTO tally (name, n) VALUES (?, ?)", ("x", 1))
                with store.transaction() as inner:  # joins: rolled back with the outer one
                    inner.execute("INSERT INTO tally (name, n) VALUES (?, ?)", ("y", 1))
                raise KeyError("boom")

        def duplicate() -> None:
            with store.transaction() as conn:
                conn.execute("INSERT INTO tally (name, n) VALUES (?, ?)", ("x", 1))
                conn.execute("INSERT INTO tally (name, n) VALUES (?, ?)", ("x", 2))

        with pytest.raises(KeyError):
            nested_then_fail()
        assert store.connection().execute("SELECT COUNT(*) FROM tally").fetchone()[0] == 0
        assert not store.connection().in_transaction
        with pytest.raises(StoreError) as caught:
            duplicate()
        assert caught.value.cause  # SQLite's error name or PostgreSQL's SQLSTATE
        assert store.connection().execute("SELECT COUNT(*) FROM tally").fetchone()[0] == 0
        with store.transaction(), pytest.raises(StoreError):
            store.transaction(durable=True).__enter__()


def test_sequence_survives_a_cut_and_can_be_set(store_url: str, tmp_path: Path) -> None:
    with _open(store_url, tmp_path) as store:
        with store.transaction() as conn:
            for name in "abc":
                conn.execute(
                    "INSERT INTO things (name, count, flag, weight) VALUES (?, 0, 0, 0)", (name,)
                )
            assert next_id(conn, "things") == 4
            conn.execute("DELETE FROM things WHERE name = 'c'")
            assert next_id(conn, "things") == 4  # not max(id) + 1
            set_next_id(conn, "things", 41)
            assert next_id(conn, "things") == 42
            new = conn.execute(
                "INSERT INTO things (name, count, flag, weight) VALUES ('d', 0, 0, 0) RETURNING id"
            ).fetchone()[0]
        assert new == 42


def test_snapshot_sees_one_state(store_url: str, tmp_path: Path) -> None:
    with _open(store_url, tmp_path) as store:
        seen: list[int] = []
        with store.snapshot() as conn:
            seen.append(conn.execute("SELECT COUNT(*) FROM tally").fetchone()[0])

            def write() -> None:
                with store.transaction() as other:
                    other.execute("INSERT INTO tally (name, n) VALUES ('late', 1)")

            writer = threading.Thread(target=write)
            writer.start()
            writer.join(timeout=30)
            seen.append(conn.execute("SELECT COUNT(*) FROM tally").fetchone()[0])
        seen.append(store.connection().execute("SELECT COUNT(*) FROM tally").fetchone()[0])
        assert seen == [0, 0, 1]


def test_local_files_live_beside_sqlite_or_in_files_dir(store_url: str, tmp_path: Path) -> None:
    with Store(store_url, files_dir=tmp_path / "host-files") as store:
        head = store.local_file(".audit-head")
        if store.backend == "sqlite":
            assert head == Path(store_url + ".audit-head")
        else:
            assert head.parent == (tmp_path / "host-files").absolute()
            assert "@127.0.0.1" in head.name
            assert "password" not in store.display


def test_store_urls(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "x.db"
    with Store(f"sqlite://{target}") as store:  # sqlite:///tmp/...: absolute
        assert store.backend == "sqlite"
        assert store.path == target
        assert target.is_file()
    assert is_store_url("postgresql://h/db")
    assert is_store_url("sqlite:////x.db")
    assert not is_store_url(target)
    with pytest.raises(StoreError, match="unsupported store URL mysql://"):
        Store("mysql://host/db")


def test_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the extra were not installed
    with pytest.raises(PostgresExtraMissing) as caught:
        Store("postgresql://127.0.0.1:1/none")
    assert "agentmend[postgres]" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_team_lock_excludes_across_connections(pg_url: str, tmp_path: Path) -> None:
    with Store(pg_url, files_dir=tmp_path) as store:
        holders: dict[str, list[str]] = {"team-1": [], "team-2": []}
        most: dict[str, int] = {"team-1": 0, "team-2": 0}
        guard = threading.Lock()

        def hold(name: str, team: str) -> None:
            with store.team_lock(team):
                with guard:
                    holders[team].append(name)
                    most[team] = max(most[team], len(holders[team]))
                    both = all(holders.values())
                time.sleep(0.2)
                with guard:
                    holders[team].remove(name)
                    if both:
                        overlapped.append(name)

        overlapped: list[str] = []
        threads = [threading.Thread(target=hold, args=(n, "team-1")) for n in ("a", "b", "c")]
        threads.append(threading.Thread(target=hold, args=("z", "team-2")))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert most == {"team-1": 1, "team-2": 1}  # one holder per team at a time
        assert overlapped  # the two teams' locks did not exclude each other


def _insert_across_a_restart(store: Store, server: PgServer) -> None:
    with store.transaction() as conn:
        conn.execute("INSERT INTO tally (name, n) VALUES ('lost', 1)")
        server.restart_immediate()
        conn.execute("INSERT INTO tally (name, n) VALUES ('lost too', 1)")


def test_reconnects_after_a_server_restart(own_pg_server: PgServer, tmp_path: Path) -> None:
    pg_server = own_pg_server  # restarted below: not the run's shared server
    url = pg_server.create_database()
    with _open(url, tmp_path) as store:
        with store.transaction() as conn:
            conn.execute("INSERT INTO tally (name, n) VALUES ('before', 1)")
        session = store.connection().execute("SELECT pg_backend_pid()").fetchone()
        pg_server.restart_immediate()
        # an idle session the server ended is replaced before the next statement, not failed
        assert store.connection().execute("SELECT pg_backend_pid()").fetchone() != session
        with pytest.raises(StoreError):  # in flight: a named error, nothing half-committed
            _insert_across_a_restart(store, pg_server)
        with store.transaction() as conn:  # the next one reconnects
            conn.execute("INSERT INTO tally (name, n) VALUES ('after', 1)")
        names = {r[0] for r in store.connection().execute("SELECT name FROM tally")}
        assert names == {"before", "after"}


def _holder_pid(store: Store) -> int:
    """The server process holding this store's one advisory session lock, seen from outside."""
    rows = (
        store.connection()
        .execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        .fetchall()
    )
    assert len(rows) == 1
    return int(rows[0][0])


def test_team_locks_reuse_pooled_sessions_and_survive_a_restart(
    own_pg_server: PgServer, tmp_path: Path
) -> None:
    """A team lock is held on a pooled connection (psycopg_pool): the next lock reuses its
    server session instead of starting a new one, and after a server restart the dead pooled
    connection is replaced without an error."""
    pg_server = own_pg_server  # restarted below: not the run's shared server
    url = pg_server.create_database()
    with Store(url, files_dir=tmp_path) as store:
        pids = []
        for _ in range(3):
            with store.team_lock("team-1"):
                pids.append(_holder_pid(store))
        assert len(set(pids)) == 1
        assert pids[0] != store.connection().execute("SELECT pg_backend_pid()").fetchone()[0]
        pg_server.restart_immediate()
        store.connection().execute("SELECT 1")  # the store's own session: replaced at once
        with store.team_lock("team-1"):  # the pooled one too: replaced, not reported
            assert _holder_pid(store) != pids[0]
        with store.team_lock("team-1"):
            assert _holder_pid(store) not in pids
