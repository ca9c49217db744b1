"""Rows the store refuses are set apart with their reason; the rest of their batch is written.

Values are made storable before a batch is written
(:mod:`agentmend.infrastructure.store.storable`), but a server may still refuse a row for a
reason no check foresaw (a total that would overflow its column, a rule a later version adds).
A writer that retried such a batch would retry it forever and every later run would be lost.
So when a batch fails with an error of its data (:func:`is_row_error`), the writer writes it
again through :func:`append_isolating`: halves under savepoints, down to the single rows the
server refuses, which go to the ``quarantined_rows`` table (the row as printable ASCII, and
why) in the same transaction. ``agentmend status`` counts them.

An error that is not about the data (the server is down, the disk is full, the schema is wrong)
is raised as before, and the writer keeps the batch and retries it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.snapshot import read_snapshot
from agentmend.infrastructure.store.sql import StoreConnection, has_table

__all__ = [
    "COMPONENT",
    "MIGRATIONS",
    "append_isolating",
    "is_row_error",
    "quarantined_counts",
]

COMPONENT = "quarantine"
MIGRATIONS = [
    """
    CREATE TABLE quarantined_rows (
        id INTEGER PRIMARY KEY,
        component TEXT NOT NULL,
        ts REAL NOT NULL,
        reason TEXT NOT NULL,
        row_text TEXT NOT NULL
    )
    """
]
_MAX_ROW_CHARS = 8_000
_MAX_REASON_CHARS = 1_000
_SAVEPOINT = "agentmend_isolate"

T = TypeVar("T")


def is_row_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the server (or the driver) refusing the data written, not the
    store being unavailable: PostgreSQL's data exceptions (SQLSTATE class 22, such as a NUL
    in text or a number out of range), a value no driver can encode or bind."""
    if isinstance(exc, StoreError):
        cause = str(exc.cause or "")
        if cause.startswith("22") or cause == "DataError":
            return True
        inner = exc.__cause__  # what the backend raised, wrapped
        return (
            isinstance(inner, Exception)
            and not isinstance(inner, StoreError)
            and (is_row_error(inner))
        )
    if isinstance(exc, UnicodeError | OverflowError | sqlite3.DataError):
        return True
    return isinstance(exc, sqlite3.ProgrammingError) and "binding parameter" in str(exc)


def append_isolating(
    conn: StoreConnection,
    component: str,
    rows: Sequence[T],
    append: Callable[[Sequence[T]], None],
) -> list[T]:
    """Append ``rows`` with ``append`` inside the caller's transaction, setting apart the
    rows the store refuses; returns the rows set apart (the others are appended, in order).

    Costs about two appends per row set apart, per halving: a few dozen appends for one bad
    row in ten thousand.

    Raises:
        the first error that is not a row error (:func:`is_row_error`).
    """
    refused: list[tuple[T, BaseException]] = []
    _attempt(conn, rows, append, refused)
    for row, exc in refused:
        _set_aside(conn, component, row, exc)
    return [row for row, _ in refused]


def _attempt(
    conn: StoreConnection,
    rows: Sequence[T],
    append: Callable[[Sequence[T]], None],
    refused: list[tuple[T, BaseException]],
) -> None:
    if not rows:
        return
    conn.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        append(rows)
    except Exception as exc:
        conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        if not is_row_error(exc):
            raise
        if len(rows) == 1:
            refused.append((rows[0], exc))
            return
        middle = len(rows) // 2
        _attempt(conn, rows[:middle], append, refused)
        _attempt(conn, rows[middle:], append, refused)
        return
    conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")


def _set_aside(conn: StoreConnection, component: str, row: object, exc: BaseException) -> None:
    # ascii(): printable ASCII whatever the row holds, so this insert cannot fail the same way
    reason = ascii(f"{type(exc).__name__}: {exc}")[1:-1][:_MAX_REASON_CHARS]
    conn.execute(
        "INSERT INTO quarantined_rows (component, ts, reason, row_text) VALUES (?, ?, ?, ?)",
        (component, time.time(), reason, ascii(row)[:_MAX_ROW_CHARS]),
    )


def quarantined_counts(store: Store) -> dict[str, int]:
    """Rows set apart so far, by component; empty when none ever was (reads only)."""
    with read_snapshot(store) as conn:
        if not has_table(conn, "quarantined_rows"):
            return {}
        rows: list[Any] = conn.execute(
            "SELECT component, COUNT(*) FROM quarantined_rows GROUP BY component ORDER BY component"
        ).fetchall()
    return {str(component): int(count) for component, count in rows}
