"""The fleet backend: a PostgreSQL database shared by many worker processes on many hosts.

Needs the ``[postgres]`` extra (psycopg 3), imported on first use. Components speak the plain
SQL of :mod:`agentmend.infrastructure.store.sql`; this module maps it: ``?`` parameters to ``%s``,
SQLite's schema types to PostgreSQL's, booleans to 0/1 and integral ``NUMERIC`` results (a
``SUM`` of integers) back to ``int``, so rows read the same on both backends.

Write transactions keep SQLite's contract: one writer at a time. Each begins by taking a
store-wide transaction-level advisory lock, sent with ``BEGIN`` ahead of the transaction's first
statement (in the same round trip when that statement is pipelined, see
:meth:`PgConnection.begin_write`), so a component's read-then-write inside a transaction (the
next epoch number, a chain's head) cannot interleave with another's, and generated ids grow in
commit order as SQLite's do, which is what lets readers catch up by id.
Reads never wait for it. The one exception is the monitor's append of runs
(:meth:`PgConnection.append_unlocked`): it reads nothing and collides with no one, and its
readers follow transaction ids instead of ids, so many writers append at once. Commits are
durable (``synchronous_commit`` on) and the server, not this process, decides when they are on
disk, so ``durable`` adds nothing here.

Every session starts with the store's bounds (:mod:`agentmend.infrastructure.store.timeouts`):
a lock waited for past ``lock_timeout`` is a :class:`~agentmend.infrastructure.errors.LockTimeout`,
and a process stopped inside a transaction loses its session (and its locks) to the server's
``idle_in_transaction_session_timeout``; its work is then settled as a dead process's is.

A team's changes are serialized across hosts by :meth:`PostgresBackend.team_lock`: a
session-level advisory lock held on a connection of its own for as long as the apply,
verification or rollback takes, never a transaction left open around model calls. If the
process dies the server ends its session and the lock with it. Those lock-holding connections
come from a ``psycopg_pool`` pool, so an apply does not pay for a new server session (a
backend process forked by the server, about 4 ms) each time it takes its team's lock. The unlock
is sent without waiting for its answer, which the next lock reads.
"""

from __future__ import annotations

import hashlib
import re
import select
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from agentmend.infrastructure.errors import (
    INSUFFICIENT_PRIVILEGE,
    LockTimeout,
    PostgresExtraMissing,
    StoreError,
)
from agentmend.infrastructure.redaction import redact, redact_url, remember_url
from agentmend.infrastructure.store.timeouts import LOCK_SETTING, TEAM_LOCK_SETTING, StoreTimeouts
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "PgConnection",
    "PostgresBackend",
    "connection_parameters",
    "translate_script",
    "translate_statement",
    "without_password",
]

log = get_logger(__name__)

# pg_advisory_xact_lock key every write transaction takes ("agmend" in ASCII)
_WRITER_LOCK_KEY = 0x61676D656E64
_CONNECT_TIMEOUT_S = 10
_WRITE_LOCK = f"SELECT pg_advisory_xact_lock({_WRITER_LOCK_KEY})"
# BEGIN and the store-wide write lock in one round trip (a simple query may hold two statements)
_BEGIN_WRITE = f"BEGIN; {_WRITE_LOCK}"
# connections holding team locks at once in one process; one more waits for one to come back
_LOCK_HOLDERS = 64
_LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a wait past lock_timeout
# what the server says when it cancels a statement or ends a session on a bound, and the
# setting that sets the bound
_BOUND_HINTS = {
    "57014": "store_statement_timeout_s",
    "25P03": "store_idle_transaction_timeout_s",
}


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise PostgresExtraMissing("psycopg") from exc
    return psycopg


def _pool_class() -> Any:
    try:
        from psycopg_pool import ConnectionPool
    except ImportError as exc:
        raise PostgresExtraMissing("psycopg_pool") from exc
    return ConnectionPool


class PgConnection:
    """A psycopg connection that takes the store's ``?`` SQL (see :mod:`store_sql`).

    A failed statement raises :class:`StoreError` (its SQLSTATE as ``cause``), inside a
    transaction or not, so callers handle one error on either backend.
    """

    __slots__ = ("_backend", "_begin_pending", "_write_lock", "raw")

    def __init__(self, raw: psycopg.Connection[Any], backend: PostgresBackend) -> None:
        self.raw = raw
        self._backend = backend
        # A write transaction's ``BEGIN`` and store-wide lock wait for its first statement, so
        # that a pipelined one carries them (see :meth:`begin_write`).
        self._begin_pending = False
        self._write_lock: psycopg.Cursor[Any] | None = None  # the lock's, until it is answered

    @property
    def in_transaction(self) -> bool:
        return self._begin_pending or bool(self.raw.info.transaction_status != 0)  # 0 is IDLE

    def begin_write(self) -> None:
        """Open a write transaction: ``BEGIN`` and the store's write lock go to the server with
        the transaction's first statement, in the same round trip when that statement is
        pipelined (:func:`~agentmend.infrastructure.store.sql.pipelined`); a transaction that
        runs no statement sends nothing. The wait for the lock happens then, and a failure to
        get it is reported as before, naming the write lock.

        A statement run on its own still sends them in a round trip of their own first: put in
        a pipeline made for it, it would leave the session without its idle bound. psycopg ends
        a pipeline with a flush request after its ``Sync``, and the server, reading that
        request while idle in the transaction, stops timing the idle wait
        (``idle_in_transaction_session_timeout``) until the next ``Sync``: a process stopped
        right after such a statement would hold the write lock for good. After a pipeline
        block the transaction's next statements (or its ``COMMIT``) follow at once."""
        self._begin_pending = True

    def end_write(self) -> bool:
        """Forget a ``BEGIN`` never sent; whether a transaction is open on the server (so
        there is one to commit or roll back)."""
        self._begin_pending = False
        self._write_lock = None
        return bool(self.raw.info.transaction_status != 0)  # 0 is IDLE

    def _send_begin(self) -> None:
        """Send the pending ``BEGIN`` and write lock: queued in an open pipeline, else in a
        round trip now (see :meth:`begin_write`)."""
        self._begin_pending = False
        raw = self.raw
        if raw.pgconn.pipeline_status:  # ON (or ABORTED, which fails at the pipeline's end)
            raw.execute("BEGIN")
            self._write_lock = raw.execute(_WRITE_LOCK)
            return
        try:
            raw.execute(_BEGIN_WRITE)
        except self._backend.driver_error as exc:
            raise self._backend.error(
                "cannot begin a transaction on", exc, "the store's write lock"
            ) from exc

    def failed(self, exc: Exception) -> StoreError:
        """``exc``, raised by the server for this connection's statements, as a StoreError:
        one naming the write lock when the pipelined ``BEGIN``'s lock was not granted."""
        lock = self._write_lock
        if lock is not None and lock.pgresult is None:  # not answered: the lock failed
            self._write_lock = None
            return self._backend.error(
                "cannot begin a transaction on", exc, "the store's write lock"
            )
        return self._backend.error("a statement failed on", exc)

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        """psycopg's pipeline mode, its errors raised as StoreErrors (see :meth:`failed`)."""
        try:
            with self.raw.pipeline():
                yield
        except self._backend.driver_error as exc:
            raise self.failed(exc) from exc

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[Any]:
        raw = self.raw
        try:
            if self._begin_pending:
                self._send_begin()
            if not parameters:
                return raw.execute(sql)
            return raw.execute(translate_statement(sql), parameters)
        except self._backend.driver_error as exc:
            raise self.failed(exc) from exc

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> psycopg.Cursor[Any]:
        cursor = self.raw.cursor()
        try:
            if self._begin_pending:
                self._send_begin()
            cursor.executemany(translate_statement(sql), parameters)
        except self._backend.driver_error as exc:
            raise self.failed(exc) from exc
        return cursor

    def copy_text(self, table: str, columns: Sequence[str], data: str) -> None:
        """Append rows already formatted as ``COPY`` text (a line per row) to ``table``."""
        if self._begin_pending:
            self._send_begin()
        cursor = self.raw.cursor()
        try:
            with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                copy.write(data)
        except self._backend.driver_error as exc:
            raise self._backend.error("a statement failed on", exc) from exc

    def append_unlocked(
        self,
        copy: tuple[str, Sequence[str], str],
        statements: Sequence[tuple[str, Sequence[Sequence[Any]]]],
    ) -> None:
        """One write transaction that takes no store-wide lock, for appends that need no
        order (the executions' readers follow transaction ids, see
        :mod:`agentmend.infrastructure.monitoring.run_reader`): ``COPY`` text into a table
        (``copy`` = (table, columns, text)), then ``statements`` (each run once per row of
        parameters, in order) and the commit, pipelined: three round trips (``BEGIN``,
        ``COPY``'s two) and one for the rest.
        """
        raw = self.raw
        backend = self._backend
        if self.in_transaction:
            raise StoreError("an unlocked append cannot join an open transaction")
        try:
            raw.execute("BEGIN")
            self.copy_text(*copy)
            with raw.pipeline():
                cursor = raw.cursor()
                for sql, rows in statements:
                    cursor.executemany(translate_statement(sql), rows)
                raw.execute("COMMIT")
        except backend.driver_error as exc:
            backend._rollback(self)
            raise backend.error("a statement failed on", exc) from exc
        except BaseException:
            backend._rollback(self)
            raise

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        """Append ``rows`` to ``table`` with ``COPY ... FROM STDIN`` (names are constants)."""
        if self._begin_pending:
            self._send_begin()
        cursor = self.raw.cursor()
        try:
            with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        except self._backend.driver_error as exc:
            raise self._backend.error("a statement failed on", exc) from exc


# what a URL may carry that is a secret: left out of anything kept in a file
_SECRET_PARAMETERS = ("password", "sslpassword")


def connection_parameters(url: str) -> dict[str, str]:
    """The libpq parameters ``url`` names, without its secrets: what tells one store apart.

    Raises:
        StoreError: ``url`` is not a PostgreSQL URL libpq can read (its password masked).
        PostgresExtraMissing: psycopg is not installed.
    """
    psycopg = _psycopg()
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise StoreError(f"not a PostgreSQL URL: {redact_url(url)}: {redact(str(exc))}") from exc
    return {k: str(v) for k, v in params.items() if k not in _SECRET_PARAMETERS}


def without_password(url: str) -> str:
    """``url`` with its password (in the userinfo or a ``password=`` parameter) taken out.

    libpq then finds the password as it does for any connection that names none:
    ``PGPASSWORD``, the password file (``PGPASSFILE``, default ``~/.pgpass``) or a service
    file. The result names exactly the same server, database, user and options (checked).

    Raises:
        StoreError: ``url`` is not a PostgreSQL URL libpq can read, or its password cannot be
            taken out without changing what it names (an unencoded ``/``, ``?`` or ``#`` in
            it: percent-encode it).
        PostgresExtraMissing: psycopg is not installed.
    """
    from urllib.parse import parse_qsl, urlencode, urlsplit

    wanted = connection_parameters(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise StoreError(f"not a PostgreSQL URL: {redact_url(url)}: {redact(str(exc))}") from exc
    userinfo, at, hosts = parts.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0]}{at}{hosts}"
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(name in _SECRET_PARAMETERS for name, _ in pairs):
        query = urlencode([(n, v) for n, v in pairs if n not in _SECRET_PARAMETERS])
    # by hand, not urlunsplit: that drops the "//" of an empty host (postgresql:///db)
    stripped = f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
    stripped += f"#{parts.fragment}" if parts.fragment else ""
    try:
        same = connection_parameters(stripped) == wanted
    except StoreError:
        same = False
    # what masking would still find is a password left behind (one holding a "/", say)
    if not same or redact_url(stripped) != stripped:
        raise StoreError(
            f"cannot take the password out of {redact_url(url)} without changing what it "
            "names: percent-encode the password's '/', '?', '#' and '@'"
        )
    return stripped


class PostgresBackend:
    """Per-thread connections to one PostgreSQL database, each in autocommit mode."""

    name = "postgresql"

    def __init__(self, url: str, timeouts: StoreTimeouts) -> None:
        self._psycopg = _psycopg()
        self.timeouts = timeouts
        self.driver_error: type[Exception] = self._psycopg.Error
        self.url = url
        remember_url(url)  # a driver's message quoting a piece of it is masked from now on
        try:
            params = self._psycopg.conninfo.conninfo_to_dict(url)
        except self._psycopg.ProgrammingError as exc:
            raise StoreError(
                f"not a PostgreSQL URL: {redact_url(url)}: {redact(str(exc))}"
            ) from exc
        self.params = params
        # the bounds after any options of the URL's own, so they win over its -c settings
        given = str(params.get("options") or "")
        # through a transaction pooler, the next transaction may run on another server
        # session: nothing is set up per session, and psycopg prepares nothing
        pooled = timeouts.transaction_pooler
        self._options = given if pooled else f"{given} {timeouts.pg_options()}".strip()
        self._prepare_threshold = None if pooled else 5  # psycopg's default
        self._team_options = f"{given} {timeouts.pg_team_lock_options()}".strip()
        host = str(params.get("host") or "localhost")
        if "@" in host:  # libpq took the end of a password holding "@" for the host
            raise StoreError(
                f"not a PostgreSQL URL: {redact_url(url)}: the host holds an '@' (a password "
                "with '@' must be percent-encoded as %40)"
            )
        self.display = (
            f"postgresql://{params.get('user') or ''}@{host}:{params.get('port') or 5432}"
            f"/{params.get('dbname') or ''}"
        )
        self._local = threading.local()
        self._connections: list[PgConnection] = []
        self._lock = threading.Lock()
        self._holders: Any = None  # the pool of team-lock connections, made on first use
        # (pool, connection) of team locks whose unlock was sent and not yet answered
        self._unlocking: list[tuple[Any, Any]] = []

    def __repr__(self) -> str:
        return f"PostgresBackend({self.display!r})"

    @property
    def local_name(self) -> str:
        """A file name that tells this database apart on this host."""
        raw = f"{self.params.get('dbname') or 'postgres'}@{self.params.get('host') or ''}"
        raw += f"_{self.params.get('port') or 5432}"
        return re.sub(r"[^A-Za-z0-9_.@-]+", "_", raw).strip("_")

    def _connect(self) -> PgConnection:
        pg = self._psycopg
        try:
            raw = pg.connect(
                self.url,
                autocommit=True,
                connect_timeout=_CONNECT_TIMEOUT_S,
                options=self._options,
                prepare_threshold=self._prepare_threshold,
            )
        except pg.Error as exc:
            raise self.error("cannot open store", exc) from exc
        _adapt(raw)
        return PgConnection(raw, self)

    def connection(self) -> PgConnection:
        conn: PgConnection | None = getattr(self._local, "conn", None)
        if conn is not None and not self._usable(conn):
            conn.raw.close()
            conn = None  # the server went away (a restart): this statement reconnects
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._connections = [c for c in self._connections if not c.raw.closed]
                self._connections.append(conn)
        return conn

    def _usable(self, conn: PgConnection) -> bool:
        """False when ``conn`` is closed, broken by a failed statement, or idle with something
        on its socket: an idle session of ours (no ``LISTEN``: listeners have connections of
        their own) is sent nothing unasked but the server's goodbye, after a restart or an
        administrator's termination. Looked at without blocking, so the first statement after
        a restart runs on a new session instead of failing on the old one (a rare unasked
        message otherwise costs a reconnect)."""
        raw = conn.raw
        if raw.closed or raw.broken:
            return False
        pgconn = raw.pgconn
        if pgconn.transaction_status != 0:  # not idle (0): its next statement says what became
            return True  # of it, and the caller handles that
        readable, _, _ = select.select([pgconn.socket], [], [], 0)
        return not readable

    def may_migrate(self) -> bool:
        """Whether this session's role may create tables in the store's schema (with
        ``agentmend store grant``'s roles, only an administrator role may)."""
        row = (
            self.connection()
            .execute("SELECT has_schema_privilege(current_schema(), 'CREATE')")
            .fetchone()
        )
        return bool(row and row[0])

    def check_database(self) -> None:
        """Make the version table if missing; a store that has it is only read (no wait for
        the write lock)."""
        conn = self.connection()
        found = conn.execute("SELECT to_regclass('schema_versions') IS NOT NULL").fetchone()
        if found is not None and found[0]:
            return
        with self.transaction() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_versions ("
                " component TEXT PRIMARY KEY, version BIGINT NOT NULL)"
            )

    @contextmanager
    def transaction(self, *, durable: bool = False) -> Iterator[PgConnection]:
        pg = self._psycopg
        conn = self.connection()
        if conn.in_transaction:
            if durable:
                raise StoreError(
                    "a durable transaction cannot be nested inside an open transaction"
                )
            yield conn
            return
        conn.begin_write()
        try:
            yield conn
        except pg.Error as exc:  # a statement run on ``conn.raw`` directly
            self._rollback(conn)
            raise conn.failed(exc) from exc
        except BaseException:
            self._rollback(conn)
            raise
        if not conn.end_write():
            return  # no statement ran: nothing was begun
        try:
            conn.raw.execute("COMMIT")
        except pg.Error as exc:
            self._rollback(conn)
            raise self.error("cannot commit to", exc) from exc

    @contextmanager
    def snapshot(self) -> Iterator[PgConnection]:
        """A read transaction: every statement inside sees one state of the database."""
        pg = self._psycopg
        conn = self.connection()
        if conn.in_transaction:
            yield conn
            return
        try:
            conn.raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        except pg.Error as exc:
            raise self.error("cannot read from", exc) from exc
        try:
            yield conn
        finally:
            self._rollback(conn)  # read only: nothing to commit

    @contextmanager
    def team_lock(self, team_id: str) -> Iterator[None]:
        """Hold the team's session-level advisory lock on a connection of its own.

        Re-entrant within a thread, as the root's ``flock`` it is taken with is.
        """
        key = _lock_key("team:" + team_id)
        held: dict[int, int] = self._local.__dict__.setdefault("team_locks", {})
        if held.get(key):
            held[key] += 1
            try:
                yield
            finally:
                held[key] -= 1
            return
        pool, holder = self._lock_holder(key, f"team {team_id}'s lock")
        held[key] = 1
        try:
            yield
        finally:
            held.pop(key, None)
            self._unlock_later(pool, holder, key)

    def _unlock_later(self, pool: Any, holder: Any, key: int) -> None:
        """Send the unlock of ``key`` without waiting for its answer: the server releases the
        lock as soon as the message arrives, and the answer is read (and ``holder`` given
        back to ``pool``) by the next lock this process takes, or at :meth:`close`, so an
        apply does not wait a round trip for it. A session that cannot unlock is closed,
        which releases the lock."""
        pgconn = holder.pgconn
        try:
            pgconn.send_query_params(b"SELECT pg_advisory_unlock($1)", [str(key).encode()])
            _flush(pgconn)  # all of it sent now: the team must not stay locked meanwhile
        except Exception as exc:  # the session is gone, or the send could not finish
            log.warning("store_team_unlock_failed", store=self.display, error=str(exc))
            holder.close()
            pool.putconn(holder)  # a closed one is dropped, not reused
            return
        with self._lock:
            self._unlocking.append((pool, holder))

    def _settle_unlocks(self) -> None:
        """Read the answers of the unlocks sent earlier and give their connections back to
        their pool (closed, when one did not unlock)."""
        with self._lock:
            unlocking, self._unlocking = self._unlocking, []
        for pool, holder in unlocking:
            unlocked = False
            try:
                unlocked = _answer(holder.pgconn) == b"t"
            except Exception as exc:  # the server went away, or no answer in time
                log.warning("store_team_unlock_failed", store=self.display, error=str(exc))
            if not unlocked:
                holder.close()
            pool.putconn(holder)

    def _lock_holder(self, key: int, lock: str) -> tuple[Any, Any]:
        """A pooled connection holding the advisory lock ``key`` (waits for the lock), and
        the pool it goes back to.

        A pooled connection is not checked before use (that would cost a round trip per
        lock): one the server dropped meanwhile (a restart) fails the lock and is replaced
        by a fresh one, once.
        """
        pg = self._psycopg
        pool = self._pool()
        self._settle_unlocks()  # their connections back to the pool first, to be used again
        for attempt in (1, 2):
            try:
                holder = pool.getconn()
            except Exception as exc:  # PoolTimeout, or the server cannot be reached
                raise self.error("cannot get a connection to lock the team on", exc) from exc
            try:
                holder.execute("SELECT pg_advisory_lock(%s)", (key,))
                return pool, holder
            except pg.Error as exc:
                stale = holder.broken or holder.closed
                holder.close()
                pool.putconn(holder)
                if not stale or attempt == 2:
                    if getattr(exc, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
                        raise LockTimeout(
                            lock,
                            self.display,
                            self.timeouts.team_lock_s,
                            TEAM_LOCK_SETTING,
                            cause=_LOCK_NOT_AVAILABLE,
                        ) from exc
                    raise self.error("cannot lock the team on", exc) from exc
        raise AssertionError("unreachable")

    def _pool(self) -> Any:
        with self._lock:
            if self._holders is None:
                self._holders = _pool_class()(
                    self.url,
                    kwargs={
                        "autocommit": True,
                        "connect_timeout": _CONNECT_TIMEOUT_S,
                        "options": self._team_options,
                    },
                    min_size=0,
                    max_size=_LOCK_HOLDERS,
                    max_idle=60.0,
                    timeout=_CONNECT_TIMEOUT_S,
                    name=f"agentmend-team-locks-{self.local_name}",
                    open=True,
                )
            return self._holders

    def translate_script(self, script: str) -> str:
        return translate_script(script)

    def lift_timeouts(self) -> None:
        """Lift the bounds for the rest of this thread's open transaction (a migration):
        its statements may run, and wait for table locks, as long as they need."""
        self.connection().execute(
            "SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0;"
            " SET LOCAL idle_in_transaction_session_timeout = 0"
        )

    def error(
        self, what: str, exc: Exception, lock: str = "a lock on the store's tables"
    ) -> StoreError:
        """``exc`` as a StoreError naming the store and the SQLSTATE; a wait past
        ``lock_timeout`` as a LockTimeout naming ``lock``, and a bound the server enforced
        with the setting that sets it."""
        cause = getattr(exc, "sqlstate", None) or type(exc).__name__
        if cause == _LOCK_NOT_AVAILABLE:
            return LockTimeout(lock, self.display, self.timeouts.lock_s, LOCK_SETTING, cause=cause)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = _BOUND_HINTS.get(cause)
        if hint is not None:
            message += f"; the bound is Settings.{hint} (AGENTMEND_{hint.upper()})"
        elif cause == INSUFFICIENT_PRIVILEGE:
            message += "; the store's roles decide it (see `agentmend store grant`)"
        return StoreError(f"{what} {self.display}: {redact(message)} ({cause})", cause=cause)

    def _rollback(self, conn: PgConnection) -> None:
        in_transaction = conn.end_write()
        if conn.raw.closed or not in_transaction:
            return
        try:
            conn.raw.execute("ROLLBACK")
        except self._psycopg.Error as exc:
            log.error("store_rollback_failed", store=self.display, error=str(exc))

    def close(self) -> None:
        self._settle_unlocks()
        with self._lock:
            for conn in self._connections:
                conn.raw.close()
            self._connections.clear()
            holders, self._holders = self._holders, None
        if holders is not None:
            holders.close()
        self._local = threading.local()

    def reinit_after_fork(self) -> list[object]:
        """In a forked child: forget the parent's connections, returning them to be parked.

        Closing an inherited connection would end the parent's session on the shared socket.
        """
        inherited: list[object] = list(self._connections)
        if self._holders is not None:  # its worker threads did not cross the fork either
            inherited.append(self._holders)
        inherited.extend(holder for _, holder in self._unlocking)
        self._holders = None
        self._unlocking = []
        self._connections = []
        self._local = threading.local()
        self._lock = threading.Lock()
        return inherited


def _flush(pgconn: Any) -> None:
    """Send what libpq holds for ``pgconn`` (a non-blocking connection sends what the socket
    takes), waiting for the socket at most ``_CONNECT_TIMEOUT_S``.

    Raises:
        TimeoutError: not all of it could be sent in that time.
    """
    deadline = time.monotonic() + _CONNECT_TIMEOUT_S
    while pgconn.flush():  # 1: some is left to send
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the server takes nothing more")
        select.select([], [pgconn.socket], [], left)


def _answer(pgconn: Any) -> bytes | None:
    """The one value the query sent on ``pgconn`` answered, read when it arrives (waiting at
    most ``_CONNECT_TIMEOUT_S``); None when it failed.

    Raises:
        TimeoutError: no answer in that time.
        psycopg.OperationalError: the connection broke.
    """
    from psycopg.pq import ExecStatus

    deadline = time.monotonic() + _CONNECT_TIMEOUT_S
    pgconn.consume_input()
    while pgconn.is_busy():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer from the server")
        select.select([pgconn.socket], [], [], left)
        pgconn.consume_input()
    results = []
    while (result := pgconn.get_result()) is not None:
        results.append(result)
    if len(results) != 1 or results[0].status != ExecStatus.TUPLES_OK or not results[0].ntuples:
        return None
    value: bytes | None = results[0].get_value(0, 0)
    return value


def _lock_key(name: str) -> int:
    """A signed 64-bit advisory lock key for ``name``, the same on every host."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _adapt(raw: psycopg.Connection[Any]) -> None:
    """Booleans go in as 0/1 and integral NUMERICs come out as ints, as SQLite's do."""
    from psycopg.adapt import Dumper, Loader
    from psycopg.postgres import types

    class BoolAsInt(Dumper):
        oid = types["int8"].oid

        def dump(self, obj: Any) -> bytes:
            return b"1" if obj else b"0"

    class NumericAsNumber(Loader):
        def load(self, data: Any) -> Any:
            text = bytes(data).decode()
            if "." in text or "e" in text.lower() or "n" in text.lower():
                return float(text)
            return int(text)

    raw.adapters.register_dumper(bool, BoolAsInt)
    raw.adapters.register_loader("numeric", NumericAsNumber)


@lru_cache(maxsize=4096)
def translate_statement(sql: str) -> str:
    """``?`` parameters to ``%s`` and a literal ``%`` to ``%%``, outside quoted text."""
    out: list[str] = []
    quote: str | None = None
    for ch in sql:
        if quote is not None:
            if ch == quote:
                quote = None
            out.append("%%" if ch == "%" else ch)
        elif ch in ("'", '"'):
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return "".join(out)


_TYPE_MAP = (
    (
        re.compile(r"\bINTEGER PRIMARY KEY(?: AUTOINCREMENT)?\b"),
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    ),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\)\s*WITHOUT ROWID"), ")"),
)


def translate_script(script: str) -> str:
    """A schema script in SQLite's type names, in PostgreSQL's."""
    for pattern, replacement in _TYPE_MAP:
        script = pattern.sub(replacement, script)
    return script
