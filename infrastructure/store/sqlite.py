"""The embedded backend: one SQLite database file in WAL mode, shared by threads and processes.

Writers take the database lock up front (``BEGIN IMMEDIATE``) so two processes never deadlock on
a lock upgrade, and wait on each other through SQLite's busy timeout (the store's lock timeout)
rather than failing at once with ``database is locked``; a wait that runs out (the holder is
stuck or stopped) is a :class:`~agentmend.infrastructure.errors.LockTimeout`. Readers never wait
for a writer (WAL). Commits survive a process crash; a ``durable`` transaction's also
survive a power cut. A connection keeps the sync mode of its last transaction and switches
only when the next one needs the other (durable work comes in runs: an apply is two durable
transactions), so a run of durable transactions pays for no switch.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from agentmend.infrastructure.errors import LockTimeout, StoreError
from agentmend.infrastructure.store.timeouts import LOCK_SETTING, StoreTimeouts
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["SqliteBackend"]

log = get_logger(__name__)

_SYNC_NORMAL = 1  # a plain transaction's sync mode: its commit survives a process crash
_SYNC_FULL = 2  # a durable transaction's: its commit survives a power cut too


class SqliteBackend:
    """Per-thread connections on one database file (SQLite connections must not be shared)."""

    name = "sqlite"

    def __init__(self, path: Path, timeouts: StoreTimeouts) -> None:
        self.path = path
        self.timeouts = timeouts
        if path.exists() and path.is_dir():
            raise StoreError(f"store path {path} is a directory, expected a database file")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    @property
    def display(self) -> str:
        return str(self.path)

    def connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=self.timeouts.lock_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
                conn.execute(f"PRAGMA busy_timeout={round(self.timeouts.lock_s * 1000)}")
                _use_wal(conn, self.timeouts.lock_s)
                conn.execute(f"PRAGMA synchronous={_SYNC_NORMAL}")
                conn.execute("PRAGMA foreign_keys=ON")
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"cannot open store {self.path}: {exc}") from exc
            self._local.conn = conn
            self._local.sync = _SYNC_NORMAL
            with self._lock:
                self._connections.append(conn)
        return conn

    def may_migrate(self) -> bool:
        """Whoever can write the file may migrate it."""
        return True

    def check_database(self) -> None:
        try:
            self.connection().execute(
                "CREATE TABLE IF NOT EXISTS schema_versions ("
                " component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not an agentmend database: {exc}") from exc

    def transaction(self, *, durable: bool = False) -> _Transaction:
        """A write transaction (``BEGIN IMMEDIATE``); inside an open one it joins it."""
        return _Transaction(self, durable)

    def _set_sync(self, conn: sqlite3.Connection, mode: int) -> None:
        """Put ``conn`` in sync mode ``mode`` unless its last transaction left it there.

        Statements run outside a transaction keep the mode the last one left: a durable mode
        only makes their commits slower, never less safe.
        """
        if getattr(self._local, "sync", None) == mode:
            return
        self._local.sync = None  # unknown until the switch succeeds
        conn.execute(f"PRAGMA synchronous={mode}")
        self._local.sync = mode

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every statement inside sees one state of the database."""
        conn = self.connection()
        if conn.in_transaction:
            yield conn
            return
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def translate_script(self, script: str) -> str:
        return script  # schema scripts are written in SQLite's dialect

    def lift_timeouts(self) -> None:
        """Nothing to lift: SQLite bounds only the wait for the lock, taken already."""

    def _error(self, what: str, exc: sqlite3.Error) -> StoreError:
        """``exc`` as a StoreError naming the database and SQLite's error name; a busy
        timeout that ran out as a LockTimeout."""
        cause = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
        if cause.startswith("SQLITE_BUSY"):
            return LockTimeout(
                "the store's write lock",
                str(self.path),
                self.timeouts.lock_s,
                LOCK_SETTING,
                path=self.path,
                cause=cause,
            )
        return StoreError(f"{what} {self.path}: {exc} ({cause})", path=self.path, cause=cause)

    def _rollback(self, conn: sqlite3.Connection) -> None:
        """Roll back what is still open, never masking the error being handled."""
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.error("store_rollback_failed", path=str(self.path), error=str(exc))

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()

    def reinit_after_fork(self) -> list[object]:
        """In a forked child: forget the parent's connections, returning them to be parked.

        A SQLite connection must not cross a fork (the child would share the parent's file
        locks and WAL state). Closing an inherited one in the child could checkpoint or remove
        the parent's WAL, so the caller keeps them, unclosed, for the child's lifetime instead.
        """
        inherited: list[object] = list(self._connections)
        self._connections = []
        self._local = threading.local()
        self._lock = threading.Lock()
        return inherited


class _Transaction:
    """:meth:`SqliteBackend.transaction`'s block, as a class: every apply opens two, and a
    generator-based context manager costs a few microseconds more per use.

    Commits what the block did, or rolls it back on any error (a SQLite error becomes a
    :class:`~agentmend.infrastructure.errors.StoreError`); a block that joined an open
    transaction leaves both to the outer one.
    """

    __slots__ = ("_backend", "_conn", "_durable", "_joined")

    def __init__(self, backend: SqliteBackend, durable: bool) -> None:
        self._backend, self._durable = backend, durable
        self._conn: sqlite3.Connection | None = None
        self._joined = False

    def __enter__(self) -> sqlite3.Connection:
        backend = self._backend
        conn = self._conn = backend.connection()
        if conn.in_transaction:
            if self._durable:
                raise StoreError(
                    "a durable transaction cannot be nested inside an open transaction"
                )
            self._joined = True
            return conn
        try:
            backend._set_sync(conn, _SYNC_FULL if self._durable else _SYNC_NORMAL)
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise backend._error("cannot begin a transaction on", exc) from exc
        return conn

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._joined:
            return
        backend, conn = self._backend, self._conn
        assert conn is not None
        if exc is not None:
            backend._rollback(conn)
            if isinstance(exc, sqlite3.Error):
                # SQLite ends the transaction itself on some errors (disk full, I/O error);
                # a ROLLBACK then would fail and hide the error that matters.
                raise backend._error("a statement failed on", exc) from exc
            return  # the block's own error propagates unchanged
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as error:
            backend._rollback(conn)  # a COMMIT that fails may leave the transaction open
            raise backend._error("cannot commit to", error) from error


def _use_wal(conn: sqlite3.Connection, wait_s: float) -> None:
    """Switch the database to WAL, waiting out other first openers.

    The mode is stored in the file, so only a brand-new database needs the switch; but the
    switch takes an exclusive lock and SQLite does not wait for it through the busy timeout,
    so several processes opening a new store at once would fail with ``database is locked``.
    """
    deadline = time.monotonic() + wait_s
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
