"""A read-only snapshot of a store: what the faces that only look (status, report, serve) use.

``Store.transaction()`` takes the write lock from its first statement (``BEGIN IMMEDIATE``), which
is right for a read-modify-write and wrong for a page that reads for a second or two: every
monitor recording runs meanwhile would wait for it. A deferred transaction (``BEGIN``) reads one
consistent snapshot and, the store being in WAL mode, never blocks a writer, nor waits for one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection

__all__ = ["read_snapshot"]


@contextmanager
def read_snapshot(store: Store) -> Iterator[StoreConnection]:
    """The store's connection inside one read snapshot, ended (nothing written) on exit.

    Inside a transaction the caller already has open, that transaction is the snapshot.

    Raises:
        StoreError: the snapshot cannot be read (a corrupt file, an I/O error, ...), naming the
            database and SQLite's error name.
    """
    if store.backend != "sqlite":  # one REPEATABLE READ snapshot, read only
        with store.snapshot() as snap:
            yield snap
        return
    conn = store.connection()
    if conn.in_transaction:
        yield conn
        return
    try:
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        cause = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
        raise StoreError(
            f"cannot read {store.path}: {exc} ({cause})", path=store.path, cause=cause
        ) from exc
