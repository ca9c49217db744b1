"""The one durable store: a SQLite database in WAL mode shared by every part of the loop.

Each component (executions, changes, audit, plans, ...) owns its tables and registers its own
ordered list of migrations; the store records the version each component has reached, so a
component can evolve its schema without touching the others. Writers take the database lock up
front (``BEGIN IMMEDIATE``) so two processes never deadlock on a lock upgrade, and wait on each
other through SQLite's busy timeout rather than failing with ``database is locked``. Commits
survive a process crash; a ``durable`` transaction's also survive a power cut.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from infrastructure.errors import StoreError
from infrastructure.structured_logger import get_logger

__all__ = ["Store"]

log = get_logger(__name__)

_BUSY_TIMEOUT_MS = 30_000


class Store:
    """A handle on one SQLite database file; safe to share between threads.

    Each thread gets its own connection (SQLite connections must not be used from two threads
    at once); the handle itself is cheap to pass around.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and self.path.is_dir():
            raise StoreError(f"store path {self.path} is a directory, expected a database file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._migrated: set[str] = set()
        _live_stores.add(self)
        conn = self.connection()
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_versions ("
                " component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not an agentmend database: {exc}") from exc

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (autocommit mode; use :meth:`transaction` to write)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=_BUSY_TIMEOUT_MS / 1000,
                    isolation_level=None,
                    check_same_thread=False,
                )
                conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
                _use_wal(conn)
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA foreign_keys=ON")
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"cannot open store {self.path}: {exc}") from exc
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    @contextmanager
    def transaction(self, *, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """A write transaction that holds the database lock from its first statement.

        Inside an open transaction a plain one joins it: the outer one commits or rolls back.

        Args:
            durable: sync the commit to disk (``synchronous=FULL``). The store runs WAL with
                ``synchronous=NORMAL``, whose commits survive a process crash but may be lost
                on power failure; records that files or other state will depend on (a
                change's intent, audit rows) must be on disk first, for about 50 µs more per
                commit. A durable transaction cannot join an open one, whose commit it does
                not control.

        Raises:
            StoreError: ``durable`` inside an open transaction, or BEGIN, a statement inside
                the block or COMMIT failed (the database is locked past the busy timeout, the
                disk is full, an I/O error, a corrupt file, ...); it names the database and
                SQLite's error name (``cause``) and keeps SQLite's error as ``__cause__``.
                Any other error raised inside the block propagates unchanged after the
                rollback.
        """
        conn = self.connection()
        if conn.in_transaction:
            if durable:
                raise StoreError(
                    "a durable transaction cannot be nested inside an open transaction"
                )
            yield conn
            return
        previous: int | None = None  # the sync mode to put back after a durable commit
        try:
            if durable:
                previous = int(conn.execute("PRAGMA synchronous").fetchone()[0])
                conn.execute("PRAGMA synchronous=FULL")
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._restore_sync(conn, previous)
            raise self._error("cannot begin a transaction on", exc) from exc
        try:
            try:
                yield conn
            except sqlite3.Error as exc:
                # SQLite ends the transaction itself on some errors (disk full, I/O error);
                # a ROLLBACK then would fail and hide the error that matters.
                self._rollback(conn)
                raise self._error("a statement failed on", exc) from exc
            except BaseException:
                self._rollback(conn)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(conn)  # a COMMIT that fails may leave the transaction open
                raise self._error("cannot commit to", exc) from exc
        finally:
            self._restore_sync(conn, previous)

    def _error(self, what: str, exc: sqlite3.Error) -> StoreError:
        """``exc`` as a StoreError naming the database and SQLite's error name."""
        cause = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
        return StoreError(f"{what} {self.path}: {exc} ({cause})", path=self.path, cause=cause)

    def _rollback(self, conn: sqlite3.Connection) -> None:
        """Roll back what is still open, never masking the error being handled."""
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.error("store_rollback_failed", path=str(self.path), error=str(exc))

    def _restore_sync(self, conn: sqlite3.Connection, previous: int | None) -> None:
        if previous is None:
            return
        try:
            conn.execute(f"PRAGMA synchronous={previous}")
        except sqlite3.Error as exc:  # only slower commits follow; not worth hiding an error
            log.error("store_sync_mode_not_restored", path=str(self.path), error=str(exc))

    def migrate(self, component: str, migrations: Sequence[str]) -> None:
        """Bring ``component``'s tables up to ``len(migrations)``, applying what is missing.

        Each migration is a SQL script run in its own transaction with its version bump, so a
        crash or a failing script leaves the component at the last version that completed.
        The version is read again inside each transaction, so processes migrating the same
        store at once never run a script twice. Called inside an open transaction, the
        migrations join it and commit or roll back with it.
        """
        if component in self._migrated:
            return
        conn = self.connection()
        while True:
            with self.transaction():
                row = conn.execute(
                    "SELECT version FROM schema_versions WHERE component = ?", (component,)
                ).fetchone()
                current = int(row[0]) if row else 0
                if current > len(migrations):
                    raise StoreError(
                        f"{self.path}: component {component!r} is at schema version "
                        f"{current}, newer than this agentmend knows ({len(migrations)})"
                    )
                if current == len(migrations):
                    break
                for statement in _split_sql(migrations[current]):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_versions (component, version) VALUES (?, ?) "
                    "ON CONFLICT(component) DO UPDATE SET version = excluded.version",
                    (component, current + 1),
                )
        self._migrated.add(component)

    def schema_version(self, component: str) -> int:
        row = (
            self.connection()
            .execute("SELECT version FROM schema_versions WHERE component = ?", (component,))
            .fetchone()
        )
        return int(row[0]) if row else 0

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()

    def _reinit_after_fork(self) -> None:
        """In a forked child: forget the parent's connections and open fresh ones on demand.

        A SQLite connection must not cross a fork (the child would share the parent's file
        locks and WAL state). Closing an inherited one in the child could checkpoint or remove
        the parent's WAL, so they are parked, unclosed, for the child's lifetime instead.
        """
        _inherited_at_fork.extend(self._connections)
        self._connections = []
        self._local = threading.local()
        self._lock = threading.Lock()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# Fork safety, as OpenTelemetry's SDK does it: weak references to the live stores, re-initialised
# in the child by one hook registered at import.
_live_stores: weakref.WeakSet[Store] = weakref.WeakSet()
_inherited_at_fork: list[sqlite3.Connection] = []  # kept referenced so they are never closed


def _reinit_stores_in_child() -> None:
    for store in list(_live_stores):
        store._reinit_after_fork()


if hasattr(os, "register_at_fork"):  # absent on Windows, which has no fork
    os.register_at_fork(after_in_child=_reinit_stores_in_child)


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch the database to WAL, waiting out other first openers.

    The mode is stored in the file, so only a brand-new database needs the switch; but the
    switch takes an exclusive lock and SQLite does not wait for it through the busy timeout,
    so several processes opening a new store at once would fail with ``database is locked``.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (migrations hold no string literals with ';')."""
    return [s.strip() for s in script.split(";") if s.strip()]
