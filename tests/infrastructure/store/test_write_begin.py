"""A PostgreSQL write transaction's ``BEGIN`` and store-wide lock travel with its first statement.

In its pipeline they cost no round trip of their own, and a transaction that runs nothing sends
nothing. A statement run on its own is preceded by them in a round trip of their own: a pipeline
made for it would leave the session without its idle bound (psycopg's flush request after the
``Sync`` stops the server's idle timer). The lock is still taken before the first statement
runs, and a lock held elsewhere is still given up on as the store's write lock, whichever way
the first statement went.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from round_trips import PgRoundTrips

from agentmend.infrastructure.errors import LockTimeout, StoreError
from agentmend.infrastructure.store import postgres
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import deferred, pipelined
from agentmend.infrastructure.store.timeouts import StoreTimeouts

_HELD_ELSEWHERE = f"SELECT pg_try_advisory_xact_lock({postgres._WRITER_LOCK_KEY})"


def _with_table(url: str, **options: Any) -> Store:
    store = Store(url, **options)
    store.migrate("things", ["CREATE TABLE things (x INTEGER)"])
    return store


def _count(store: Store) -> int:
    return int(store.connection().execute("SELECT count(*) FROM things").fetchone()[0])


def test_a_statement_on_its_own_begins_the_transaction_first(
    pg_url: str, counter: PgRoundTrips
) -> None:
    with _with_table(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as other:
        with counter.window() as seen, store.transaction() as conn:
            conn.execute("INSERT INTO things (x) VALUES (?)", (1,))
            # the lock is held from the first statement on: another session cannot take it
            assert other.execute(_HELD_ELSEWHERE).fetchone() == (False,)
        assert seen.count == 3 + 1, seen.statements  # BEGIN, the INSERT, COMMIT; other's
        assert _count(store) == 1


@pytest.mark.parametrize("parameters", [(1,), ()])
def test_a_transaction_idle_after_its_first_statement_is_ended_by_the_server(
    pg_url: str, parameters: tuple[int, ...]
) -> None:
    sql = "INSERT INTO things (x) VALUES (?)" if parameters else "INSERT INTO things (x) VALUES (1)"

    def stalled_insert(store: Store) -> None:
        with store.transaction() as conn:
            conn.execute(sql, parameters)
            time.sleep(1.0)  # a process stopped here: the server ends its session
            conn.execute(sql, parameters)

    with _with_table(pg_url, timeouts=StoreTimeouts(idle_s=0.3)) as store:
        bound = "AGENTMEND_STORE_IDLE_TRANSACTION_TIMEOUT_S"
        with pytest.raises(StoreError, match=bound) as caught:
            stalled_insert(store)
        assert caught.value.cause == "25P03"
        assert _count(store) == 0  # rolled back whole


def test_a_pipelined_block_carries_the_begin_and_the_lock(
    pg_url: str, counter: PgRoundTrips
) -> None:
    with _with_table(pg_url) as store:
        with counter.window() as seen, store.transaction() as conn:
            with pipelined(conn):
                conn.execute("INSERT INTO things (x) VALUES (?)", (1,))
                rows = deferred(conn, "SELECT count(*) FROM things")
            assert rows() == [(1,)]
        assert seen.count == 2, seen.statements  # the pipeline, COMMIT
        assert _count(store) == 1


def test_a_transaction_that_runs_nothing_sends_nothing(pg_url: str, counter: PgRoundTrips) -> None:
    with _with_table(pg_url) as store:
        with counter.window() as seen, store.transaction(durable=True) as conn:
            assert conn.in_transaction  # nested blocks join it, as before
            with store.transaction() as inner:
                assert inner is conn
        assert seen.count == 0, seen.statements
        assert not store.connection().in_transaction


def _pipelined_insert(conn: Any) -> None:
    with pipelined(conn):
        conn.execute("INSERT INTO things (x) VALUES (?)", (1,))


def _insert_with_parameters(conn: Any) -> None:
    conn.execute("INSERT INTO things (x) VALUES (?)", (1,))


def _insert_without_parameters(conn: Any) -> None:
    conn.execute("INSERT INTO things (x) VALUES (1)")


def _insert_many(conn: Any) -> None:
    conn.executemany("INSERT INTO things (x) VALUES (?)", [(1,), (2,)])


@pytest.mark.parametrize(
    "first",
    [_pipelined_insert, _insert_with_parameters, _insert_without_parameters, _insert_many],
)
def test_a_write_lock_held_elsewhere_is_given_up_on_by_name_whatever_the_first_statement(
    pg_url: str, first: Callable[[Any], None]
) -> None:
    with (
        _with_table(pg_url, timeouts=StoreTimeouts(lock_s=0.05)) as store,
        psycopg.connect(pg_url, autocommit=True) as other,
    ):
        with other.transaction():
            assert other.execute(_HELD_ELSEWHERE).fetchone() == (True,)
            with (
                pytest.raises(LockTimeout, match="the store's write lock on ") as caught,
                store.transaction() as conn,
            ):
                first(conn)
            assert caught.value.cause == "55P03"
            assert not store.connection().in_transaction  # rolled back, not left open
        assert _count(store) == 0
        with store.transaction() as conn:  # the lock released: the same statement goes in
            first(conn)
        assert _count(store) >= 1


def test_a_statement_failing_after_the_lock_is_not_named_as_the_lock(pg_url: str) -> None:
    with _with_table(pg_url) as store:

        def insert_twice() -> None:
            with store.transaction() as conn, pipelined(conn):
                conn.execute("INSERT INTO things (x) VALUES (?)", (1,))
                conn.execute("INSERT INTO missing (x) VALUES (?)", (1,))

        with pytest.raises(StoreError, match="a statement failed on ") as caught:
            insert_twice()
        assert not isinstance(caught.value, LockTimeout)
        assert caught.value.cause == "42P01"  # undefined_table
        assert _count(store) == 0
