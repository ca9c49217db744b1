"""The SQL interface every component speaks, whichever backend holds the store.

Components write one plain SQL text for both backends:

- parameters are ``?`` (the PostgreSQL connection rewrites them to ``%s``);
- upserts are ``INSERT ... ON CONFLICT (...) DO NOTHING | DO UPDATE SET t.col = excluded.col``
  (never ``INSERT OR ...``); in ``DO UPDATE`` a column of the existing row is qualified with
  its table name, which PostgreSQL requires and SQLite accepts;
- a generated id is read with ``RETURNING id`` (never ``lastrowid``);
- a subquery in ``FROM`` has an alias; ``LEAST``/``GREATEST`` and two-argument ``MIN``/``MAX``
  differ, so a ``CASE`` stands in for them;
- schema scripts use SQLite's type names (``INTEGER``, ``REAL``, ``TEXT``, ``BLOB``,
  ``INTEGER PRIMARY KEY [AUTOINCREMENT]``, ``WITHOUT ROWID``), which the PostgreSQL backend
  maps to its own (``BIGINT``, ``DOUBLE PRECISION``, ``BYTEA``, an identity column);
- booleans are stored as integers 0/1 on both.

What cannot be written once (the table catalogue, a sequence's next value) is a function here,
so each component's dialect difference is one call. Transactions, snapshots and locks are the
:class:`~agentmend.infrastructure.store.api.Store`'s (``transaction``, ``snapshot``, ``team_lock``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from typing import Any, Literal, Protocol

__all__ = [
    "Backend",
    "StoreConnection",
    "StoreCursor",
    "append_rows",
    "backend_of",
    "data_version",
    "deferred",
    "has_table",
    "join_in_order",
    "json_text",
    "next_id",
    "note_id_used",
    "pipeline_supported",
    "pipelined",
    "set_next_id",
    "table_names",
]

Backend = Literal["sqlite", "postgresql"]


class StoreCursor(Protocol):
    """What a statement returns: rows as tuples."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class StoreConnection(Protocol):
    """One connection of a store: a ``sqlite3.Connection`` or the PostgreSQL wrapper.

    Autocommit outside :meth:`Store.transaction`; statements take ``?`` parameters.
    """

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> StoreCursor: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> StoreCursor: ...


def backend_of(conn: StoreConnection) -> Backend:
    """Which backend ``conn`` belongs to."""
    return "sqlite" if isinstance(conn, sqlite3.Connection) else "postgresql"


def append_rows(
    conn: StoreConnection,
    table: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    per_statement: int = 100,
) -> None:
    """Append ``rows`` to ``table`` inside the caller's transaction, the fastest way each
    backend has: ``COPY`` on PostgreSQL (about six times the rows per second of multi-row
    INSERTs, measured), INSERTs of ``per_statement`` rows each on SQLite (a third cheaper
    per row than one INSERT per row). ``table`` and ``columns`` are constants, never input.
    """
    if backend_of(conn) == "postgresql":
        conn.copy_rows(table, columns, rows)  # type: ignore[attr-defined]
        return
    head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
    one = "(" + ",".join("?" * len(columns)) + ")"
    full = len(rows) - len(rows) % per_statement
    if full:
        many = head + ",".join([one] * per_statement)
        for i in range(0, full, per_statement):
            conn.execute(many, list(chain.from_iterable(rows[i : i + per_statement])))
    if full < len(rows):
        conn.executemany(head + one, rows[full:])


def has_table(conn: StoreConnection, name: str) -> bool:
    """Whether table ``name`` exists (a component whose migrations have not run yet has none)."""
    if backend_of(conn) == "sqlite":
        query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    else:
        query = (
            "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
            " AND tablename = ?"
        )
    return conn.execute(query, (name,)).fetchone() is not None


def join_in_order(conn: StoreConnection) -> str:
    """An inner join that SQLite's planner must take in the order written (``CROSS JOIN ...
    ON``, its documented hint); PostgreSQL, which has no such hint and no ``ON`` after
    ``CROSS JOIN``, plans a plain ``JOIN`` well by itself."""
    return "CROSS JOIN" if backend_of(conn) == "sqlite" else "JOIN"


def json_text(conn: StoreConnection, column: str, key: str) -> str:
    """SQL for the text at ``key`` (a constant name or dotted path, never input) in the JSON
    object held in TEXT ``column``."""
    if backend_of(conn) == "sqlite":
        return f"json_extract({column}, '$.{key}')"
    return f"(CAST({column} AS jsonb) #>> '{{{key.replace('.', ',')}}}')"


def json_list_holds(conn: StoreConnection, column: str, key: str) -> str:
    """SQL that is true when the JSON list at ``key`` (a constant dotted path, never input) in
    the JSON object held in TEXT ``column`` holds the text bound to the one ``?`` it takes."""
    if backend_of(conn) == "sqlite":
        return f"EXISTS (SELECT 1 FROM json_each({column}, '$.{key}') WHERE value = ?)"
    path = key.replace(".", ",")
    return f"(CAST({column} AS jsonb) #> '{{{path}}}') @> jsonb_build_array(CAST(? AS text))"


def unindexed(conn: StoreConnection, column: str) -> str:
    """``column`` in a form SQLite's planner will not answer from an index on it (unary ``+``,
    its documented hint), to keep it on a better range; PostgreSQL plans well without a hint
    and has no unary ``+`` for text."""
    return f"+{column}" if backend_of(conn) == "sqlite" else column


def data_version(conn: StoreConnection) -> object:
    """A value that changes whenever another connection commits a write (a page's cue to
    redraw): SQLite's ``data_version``, PostgreSQL's current WAL position."""
    if backend_of(conn) == "sqlite":
        return conn.execute("PRAGMA data_version").fetchone()[0]
    return conn.execute("SELECT CAST(pg_current_wal_lsn() AS TEXT)").fetchone()[0]


def table_names(conn: StoreConnection) -> set[str]:
    """The names of the store's tables."""
    if backend_of(conn) == "sqlite":
        query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    else:
        query = "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
    return {str(name) for (name,) in conn.execute(query)}


def next_id(conn: StoreConnection, table: str, column: str = "id") -> int:
    """The id the next insert into ``table`` will get from its generated ``id`` column.

    Not ``MAX(id) + 1``: rows cut off the end leave the counter where it was, so a reader can
    tell that they are gone. Only meaningful inside a transaction that serializes inserts.
    """
    if backend_of(conn) == "sqlite":
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
        return (int(row[0]) if row else 0) + 1
    row = conn.execute(
        "SELECT pg_sequence_last_value(CAST(pg_get_serial_sequence(?, ?) AS regclass))",
        (table, column),
    ).fetchone()
    return 1 if row[0] is None else int(row[0]) + 1  # NULL: no id handed out yet


def note_id_used(conn: StoreConnection, table: str, row_id: int) -> None:
    """Record that ``table`` holds ``row_id``, inserted with an explicit id, so the next
    generated id comes after it (SQLite's ``AUTOINCREMENT`` does so by itself)."""
    if backend_of(conn) == "sqlite":
        return
    conn.execute(
        "SELECT setval(pg_get_serial_sequence(?, 'id'), CAST(? AS BIGINT)) WHERE ? > coalesce("
        "pg_sequence_last_value(CAST(pg_get_serial_sequence(?, 'id') AS regclass)), 0)",
        (table, row_id, row_id, table),
    )


def set_next_id(conn: StoreConnection, table: str, after: int, column: str = "id") -> None:
    """Make ``table``'s next generated id ``after + 1`` (after rows were copied in with ids)."""
    if backend_of(conn) == "sqlite":
        conn.execute("DELETE FROM sqlite_sequence WHERE name = ?", (table,))
        if after > 0:
            conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, after))
        return
    conn.execute(
        "SELECT setval(pg_get_serial_sequence(?, ?), CAST(? AS BIGINT), ? = 1)",
        (table, column, max(after, 1), int(after > 0)),
    )


@contextmanager
def pipelined(conn: StoreConnection) -> Iterator[None]:
    """Send the statements run inside the block to PostgreSQL together, in one round trip at its
    end (psycopg's pipeline mode), instead of one round trip each; on SQLite, which has no
    server, nothing changes. Read a query's rows after the block through :func:`deferred`
    (reading them inside costs a round trip of its own). A failed statement skips the ones
    after it and raises when the block ends, inside the caller's transaction, which then rolls
    back; only single statements go inside (no ``COPY``, no ``;``-separated scripts).
    """
    if backend_of(conn) == "sqlite" or not pipeline_supported():
        yield  # no server, or a libpq older than 14: a round trip per statement, as without
        return
    with conn.pipeline():  # type: ignore[attr-defined]
        yield


def pipeline_supported() -> bool:
    """Whether psycopg's libpq has pipeline mode (14 or later); only asked on PostgreSQL."""
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


def deferred(
    conn: StoreConnection, sql: str, parameters: Sequence[Any] = ()
) -> Callable[[], list[Any]]:
    """Run query ``sql`` now and return how to read its rows later: after a :func:`pipelined`
    block on PostgreSQL; on SQLite the rows are read at once (a later write on the same
    connection must not change what an unfinished read sees)."""
    cursor = conn.execute(sql, parameters)
    if backend_of(conn) == "sqlite":
        rows = cursor.fetchall()
        return lambda: rows
    return cursor.fetchall
