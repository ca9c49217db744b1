"""The one durable store, shared by every part of the loop: SQLite (embedded) or PostgreSQL.

``Store(url)`` opens a SQLite file (a path or ``sqlite:///path``, the default) or a PostgreSQL
database (``postgresql://...``, the ``[postgres]`` extra) behind one interface: components speak
the plain SQL of :mod:`agentmend.infrastructure.store.sql` on the connections this hands out, and
the backend modules (:mod:`~agentmend.infrastructure.store.sqlite`,
:mod:`~agentmend.infrastructure.store.postgres`) keep every difference between the two.

Each component (executions, changes, audit, plans, ...) owns its tables and registers its own
ordered list of migrations; the store records the version each component has reached, so a
component can evolve its schema without touching the others. Write transactions are taken one
at a time, up front, on both backends, except the appends of runs on PostgreSQL, which go in
concurrently without the store-wide lock (see
:mod:`agentmend.infrastructure.monitoring.run_append`); commits survive a process crash.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmend.infrastructure.errors import SchemaBehind, StoreError
from agentmend.infrastructure.store.sql import Backend, StoreConnection
from agentmend.infrastructure.store.sqlite import SqliteBackend
from agentmend.infrastructure.store.timeouts import StoreTimeouts
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from agentmend.infrastructure.store.postgres import PostgresBackend

__all__ = ["Store", "is_store_url"]

log = get_logger(__name__)

_PG_SCHEMES = ("postgresql://", "postgres://")
_SQLITE_SCHEME = "sqlite://"


def is_store_url(location: str | Path) -> bool:
    """Whether ``location`` is a URL (``sqlite:///...``, ``postgresql://...``), not a path."""
    text = str(location)
    return text.startswith((*_PG_SCHEMES, _SQLITE_SCHEME))


class Store:
    """A handle on one store; safe to share between threads.

    Each thread gets its own connection; the handle itself is cheap to pass around.

    Args:
        location: a SQLite database file (a path, or ``sqlite://`` then the path, so
            ``sqlite:///srv/x.db`` is the absolute ``/srv/x.db``) or a PostgreSQL URL
            (``postgresql://user:password@host:port/db``).
        files_dir: where this host keeps the files that go with a PostgreSQL store (the audit
            head, ...); default the current directory's ``.agentmend``. A SQLite store keeps
            them beside its database file.
        timeouts: how long a write waits for a lock, and on PostgreSQL how long a statement
            may run and a session may idle inside a transaction
            (:class:`~agentmend.infrastructure.store.timeouts.StoreTimeouts`; from the
            settings with ``StoreTimeouts.from_settings``); the defaults when not given.

    Raises:
        StoreError: the location cannot be opened or holds something else than a store.
        PostgresExtraMissing: a PostgreSQL URL without the ``[postgres]`` extra installed.
    """

    def __init__(
        self,
        location: str | Path,
        *,
        files_dir: str | Path | None = None,
        timeouts: StoreTimeouts | None = None,
    ) -> None:
        text = os.fspath(location)
        self.timeouts = timeouts if timeouts is not None else StoreTimeouts()
        self._backend: SqliteBackend | PostgresBackend
        if text.startswith(_PG_SCHEMES):
            from agentmend.infrastructure.store.postgres import PostgresBackend

            pg = PostgresBackend(text, self.timeouts)
            self._backend = pg
            self.url = text
            base = Path(files_dir) if files_dir is not None else Path(".agentmend")
            self.path = base.absolute() / pg.local_name
        else:
            if text.startswith(_SQLITE_SCHEME):
                text = text[len(_SQLITE_SCHEME) :]
                if text.startswith("//"):  # sqlite:////srv/x.db: still /srv/x.db
                    text = "/" + text.lstrip("/")
            elif "://" in text:
                raise StoreError(
                    f"unsupported store URL {text.split('://')[0]}://...: use a file path, "
                    "sqlite:///path or postgresql://..."
                )
            if not text:
                raise StoreError("the store URL names no database file")
            self.path = Path(text)
            self.url = f"{_SQLITE_SCHEME}{self.path}"
            self._backend = SqliteBackend(self.path, self.timeouts)
        self._migrated: set[str] = set()
        _live_stores.add(self)
        self._backend.check_database()

    def __repr__(self) -> str:
        return f"Store({self.display!r})"  # never the URL: it may hold a password

    @property
    def backend(self) -> Backend:
        """``"sqlite"`` or ``"postgresql"``."""
        return "sqlite" if isinstance(self._backend, SqliteBackend) else "postgresql"

    @property
    def display(self) -> str:
        """The store as shown to people: the file, or the server and database (no password)."""
        return self._backend.display

    def local_file(self, suffix: str) -> Path:
        """This host's file ``suffix`` for the store: beside the SQLite file, or in
        ``files_dir`` for PostgreSQL (one set per host that opens the store)."""
        return self.path.with_name(self.path.name + suffix)

    def connection(self) -> StoreConnection:
        """This thread's connection (autocommit mode; use :meth:`transaction` to write)."""
        return self._backend.connection()

    def transaction(self, *, durable: bool = False) -> AbstractContextManager[StoreConnection]:
        """A write transaction that holds the store's write lock from its first statement.

        Inside an open transaction a plain one joins it: the outer one commits or rolls back.
        The lock is waited for at most ``timeouts.lock_s``. On PostgreSQL a transaction left
        idle longer than ``timeouts.idle_s`` (its process stopped) is ended by the server,
        which rolls it back and frees the lock; the next statement there fails.

        Args:
            durable: on SQLite, sync the commit to disk (``synchronous=FULL``). The store runs
                WAL with ``synchronous=NORMAL``, whose commits survive a process crash but may
                be lost on power failure; records that files or other state will depend on (a
                change's intent, audit rows) must be on disk first, for about 50 µs more per
                commit. PostgreSQL commits are durable already. A durable transaction cannot
                join an open one, whose commit it does not control.

        Raises:
            LockTimeout: another process held the write lock (or, on PostgreSQL, a lock a
                statement needed) for all of ``timeouts.lock_s``; nothing was written.
            StoreError: ``durable`` inside an open transaction, or BEGIN, a statement inside
                the block or COMMIT failed (the database is locked past the busy timeout, the
                disk is full, an I/O error, a corrupt file, the server went away, ...); it
                names the store and the backend's error name (``cause``: SQLite's error name
                or PostgreSQL's SQLSTATE) and keeps the driver's error as ``__cause__``. Any
                other error raised inside the block propagates unchanged after the rollback.
        """
        return self._backend.transaction(durable=durable)

    def snapshot(self) -> AbstractContextManager[StoreConnection]:
        """A read-only transaction: every statement inside sees the same state of the store.

        Inside an open transaction it joins it. It never waits for the write lock.
        """
        return self._backend.snapshot()

    def team_lock(self, team_id: str) -> AbstractContextManager[None]:
        """Serialize apply, verification, rollback and recovery of one team across hosts.

        On PostgreSQL a session-level advisory lock on a connection of its own, held for as
        long as the block runs (never a transaction around model calls), waited for at most
        ``timeouts.team_lock_s``. On SQLite nothing: all the workers of a SQLite store share
        one host, where the team folder's own lock file serializes them.

        Raises:
            LockTimeout: another session held the team's lock for all of the wait.
        """
        if isinstance(self._backend, SqliteBackend):
            return nullcontext()
        return self._backend.team_lock(team_id)

    def migrate(self, component: str, migrations: Sequence[str | Mapping[Backend, str]]) -> None:
        """Bring ``component``'s tables up to ``len(migrations)``, applying what is missing.

        A migration is one script for both backends, or ``{backend: script}`` where they
        differ (an empty script does nothing on that backend but still counts as a version).

        Each migration is a SQL script run in its own transaction with its version bump, so a
        crash or a failing script leaves the component at the last version that completed.
        The version is read again inside each transaction, so processes migrating the same
        store at once never run a script twice. Called inside an open transaction, the
        migrations join it and commit or roll back with it. A component already up to date
        costs one read and never waits for the write lock, so readers (``status``) answer
        while a writer holds it. A migration and its backfill may run long: once the write
        lock is held, the statement and idle bounds are lifted for its transaction.

        Raises:
            SchemaBehind: the component is behind and this connection may not change the
                schema (a PostgreSQL role without ``CREATE``: see ``agentmend store grant``).
        """
        if component in self._migrated:
            return
        found = self.schema_version(component)
        if found == len(migrations):
            self._migrated.add(component)
            return
        if found < len(migrations) and not self._backend.may_migrate():
            raise SchemaBehind(self.display, component, found, len(migrations))
        conn = self.connection()
        while True:
            with self.transaction():
                row = conn.execute(
                    "SELECT version FROM schema_versions WHERE component = ?", (component,)
                ).fetchone()
                current = int(row[0]) if row else 0
                if current > len(migrations):
                    raise StoreError(
                        f"{self.display}: component {component!r} is at schema version "
                        f"{current}, newer than this agentmend knows ({len(migrations)})"
                    )
                if current == len(migrations):
                    break
                migration = migrations[current]
                self.lift_timeouts()
                text = migration if isinstance(migration, str) else migration[self.backend]
                script = self._backend.translate_script(text)
                for statement in _split_sql(script):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_versions (component, version) VALUES (?, ?) "
                    "ON CONFLICT(component) DO UPDATE SET version = excluded.version",
                    (component, current + 1),
                )
        self._migrated.add(component)

    def lift_timeouts(self) -> None:
        """Lift the statement, idle and lock bounds for the rest of this thread's open
        transaction or snapshot, for work that is long by design (a migration and its
        backfill, a whole-store copy). On SQLite nothing: only the lock wait is bounded there,
        and the lock is held already."""
        self._backend.lift_timeouts()

    def schema_version(self, component: str) -> int:
        row = (
            self.connection()
            .execute("SELECT version FROM schema_versions WHERE component = ?", (component,))
            .fetchone()
        )
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._backend.close()

    def _reinit_after_fork(self) -> None:
        """In a forked child: forget the parent's connections and open fresh ones on demand.

        A connection must not cross a fork: a SQLite one would share the parent's file locks
        and WAL state, a PostgreSQL one the parent's session. Closing an inherited one in the
        child could checkpoint the parent's WAL or end its session, so they are parked,
        unclosed, for the child's lifetime instead.
        """
        _inherited_at_fork.extend(self._backend.reinit_after_fork())

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# Fork safety, as OpenTelemetry's SDK does it: weak references to the live stores, re-initialised
# in the child by one hook registered at import.
_live_stores: weakref.WeakSet[Store] = weakref.WeakSet()
_inherited_at_fork: list[Any] = []  # kept referenced so they are never closed


def _reinit_stores_in_child() -> None:
    for store in list(_live_stores):
        store._reinit_after_fork()


if hasattr(os, "register_at_fork"):  # absent on Windows, which has no fork
    os.register_at_fork(after_in_child=_reinit_stores_in_child)


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (migrations hold no string literals with ';')."""
    return [s.strip() for s in script.split(";") if s.strip()]
