"""The audit log: who changed which agent, how, and when, in a chain that shows tampering.

The audit table (agent name, edit type, old and new value truncated to 500 characters,
user id, user name, timestamp) lives in the one store. Each row also carries the hash of the
row before it and its own hash over its content and that link, so editing, deleting or
reordering a row breaks the chain at a row id that :meth:`AuditLog.verify_chain` names. The
hash of the newest row (the *head*) is also kept outside the database, in ``<db>.audit-head``,
so cutting rows off the end is caught too: a database alone cannot vouch for what is missing.

Threat model
------------
The chain catches accidental and casual edits: a row changed with a SQLite browser, a row
deleted by a script, a database restored from an older copy while the head file stayed, rows cut
off the end. It does not stop an attacker who can write both the database and the head file:
without a key the hashes are plain SHA-256, so such an attacker can recompute the whole chain
and the head. That attacker is out of scope unless an HMAC key is configured (the ``hmac_key``
argument; callers read it from ``AGENTMEND_AUDIT_HMAC_KEY``) and the key is kept outside the
workspace the agents can write: row hashes are then HMAC-SHA256 and cannot be forged without
it. With a key configured every row must be keyed; rows written without the key are reported,
so configure the key before the first row is written. Nothing here hides the log from a
reader or stops anyone from deleting the database and the head file together.

A fleet's heads
---------------
On a PostgreSQL store several hosts append, each keeping its own head file (in the store's
files folder on that host). With an HMAC key, which the documented configuration requires
there, a host's head vouches for the chain up to the row it names, and rows other hosts
appended after it are accepted when every one verifies under the key and links; the head then
moves forward to the newest row; a host with no head file yet joins by checking every row under
the key. A head row missing or changed, a broken link, or a later row that fails the key is a
break as below. A writer of the database without the key can still cut rows off the end: hosts
whose heads are not past the cut accept the shorter chain, and only the hosts whose heads name
a row that is gone find it (see :mod:`agentmend.infrastructure.changes.audit.fleet_head`). Without a
key, and on SQLite, a head must name the newest row (or be one commit behind after a crash).

Crash order
-----------
An append commits the row to the database first (``synchronous=FULL``) and then writes the
head file, all under an exclusive ``flock`` on the head file, so appends from several threads
and processes are serialised and the head never goes backwards. A crash between the commit and
the head write leaves the head exactly one commit behind: it names the row just before the
newest commit, whose rows (one, or several when a group of changes committed together; they
share a ``batch`` id, the id of the commit's first row) link to it, verify, and are no older.
:meth:`AuditLog.verify_chain` accepts exactly that state, reports it as "head behind by one
commit (n row(s)), repaired" and rewrites the head; any other disagreement is a problem.

A head that disagrees
---------------------
Any other disagreement between the head file and the database (including a missing, empty or
unreadable head file while rows exist) is a *break*: applies and keeps are refused with
``AuditChainBroken``; rollbacks, recovery and acknowledgements go on and start a new segment
whose first row records the break; ``verify_chain`` reports it until an administrator
acknowledges it. See :mod:`agentmend.infrastructure.changes.audit.breaks`.

The head file's format and in-place writes are in
:mod:`agentmend.infrastructure.changes.audit.head`, the fleet's rule in
:mod:`agentmend.infrastructure.changes.audit.fleet_head`; the row and head checks in
:mod:`agentmend.infrastructure.changes.audit.verification` (whose result types and ``GENESIS_HASH``
are re-exported here).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

from agentmend.infrastructure.changes.audit.breaks import (
    ACKNOWLEDGEABLE,
    AuditChainBroken,
    HeadBreak,
    acknowledged_ids,
    break_findings,
    find_break,
    row_findings,
)
from agentmend.infrastructure.changes.audit.entry import (
    ACK_EDIT_TYPE,
    AUDIT_AGENT,
    BREAK_EDIT_TYPE,
    AuditEntry,
)
from agentmend.infrastructure.changes.audit.fleet_head import check_fleet_head, follow_head
from agentmend.infrastructure.changes.audit.head import never_written, read_head, write_head
from agentmend.infrastructure.changes.audit.head_events import head_event_findings
from agentmend.infrastructure.changes.audit.verification import (
    GENESIS_HASH,
    ChainProblem,
    ChainVerification,
    check_head,
    check_rows,
)
from agentmend.infrastructure.errors import (
    AuditChainError,
    LockTimeout,
    PermissionRequired,
    StoreError,
)
from agentmend.infrastructure.files.atomic import locked_file
from agentmend.infrastructure.files.lock_wait import LockWait
from agentmend.infrastructure.models import utc_now
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import (
    Backend,
    StoreConnection,
    backend_of,
    deferred,
    next_id,
    note_id_used,
    pipeline_supported,
    pipelined,
)
from agentmend.infrastructure.store.timeouts import LOCK_SETTING
from agentmend.infrastructure.structured_logger import get_logger

__all__ = [
    "AUDIT_HMAC_KEY_ENV",
    "GENESIS_HASH",
    "VALUE_LIMIT",
    "AuditChainBroken",
    "AuditEntry",
    "AuditLog",
    "AuditTransaction",
    "ChainProblem",
    "ChainVerification",
    "TailMoved",
    "audit_key_from_env",
    "last_audit_id",
    "note_audit_id",
    "verify_audit_chain",
]

log = get_logger(__name__)

AUDIT_HMAC_KEY_ENV = "AGENTMEND_AUDIT_HMAC_KEY"
VALUE_LIMIT = 500

_MIGRATIONS: list[str | dict[Backend, str]] = [
    """
    CREATE TABLE audit_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        timestamp TEXT NOT NULL,
        agent_name TEXT NOT NULL,
        edit_type TEXT NOT NULL,
        old_value TEXT,
        new_value TEXT,
        user_id TEXT NOT NULL,
        user_name TEXT,
        change_id TEXT,
        prev_hash TEXT NOT NULL,
        row_hash TEXT NOT NULL,
        keyed INTEGER NOT NULL,
        batch INTEGER NOT NULL
    );
    CREATE INDEX audit_log_agent ON audit_log (agent_name, id);
    CREATE INDEX audit_log_change ON audit_log (change_id)
    """,
    """
    CREATE TABLE audit_head_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        timestamp TEXT NOT NULL,
        head_path TEXT NOT NULL,
        reason TEXT NOT NULL,
        row_id INTEGER,
        reported TEXT
    )
    """,
    # no two rows may take the same predecessor: a backstop behind the one sequencer (the
    # store's write lock). Only on PostgreSQL: an existing SQLite file may hold a tampered
    # chain, which must still open so that verification can report it.
    {
        "sqlite": "",
        "postgresql": "CREATE UNIQUE INDEX audit_log_one_successor ON audit_log (prev_hash)",
    },
    # ...except a break row: the segment it starts continues from the newest row, which a
    # tampered table (rows reordered) may already show with a successor, and a rollback or
    # recovery over a break must never be refused
    {
        "sqlite": "",
        "postgresql": "DROP INDEX audit_log_one_successor;"
        " CREATE UNIQUE INDEX audit_log_one_successor ON audit_log (prev_hash)"
        f" WHERE edit_type <> '{BREAK_EDIT_TYPE}'",
    },
    # The highest id ever handed out, so that rows cut off the end leave a gap verification
    # sees. SQLite's AUTOINCREMENT counter is part of its transactions already; PostgreSQL's
    # sequences are not (a setval survives the rollback of the transaction that made it), and
    # a writer killed between its setval and its commit left a gap that read as rows removed.
    # This counter is a row, written in the transaction that appends.
    {
        "sqlite": "",
        "postgresql": "CREATE TABLE audit_counter (last_id BIGINT NOT NULL);"
        " INSERT INTO audit_counter (last_id) SELECT GREATEST("
        "COALESCE((SELECT MAX(id) FROM audit_log), 0), COALESCE(pg_sequence_last_value("
        "CAST(pg_get_serial_sequence('audit_log', 'id') AS regclass)), 0))",
    },
    # The database role that wrote each row, as the server knows it (``session_user``), not as
    # the client says: with ``agentmend store grant``'s roles a trigger enforces it. Rows from
    # before stay NULL (the default is set after the column is added, so they do not take the
    # migrating role's name). Not part of the row hash: the server sets it after the client
    # hashed the row. SQLite has no roles: NULL there.
    {
        "sqlite": "ALTER TABLE audit_log ADD COLUMN db_role TEXT",
        "postgresql": "ALTER TABLE audit_log ADD COLUMN db_role TEXT;"
        " ALTER TABLE audit_log ALTER COLUMN db_role SET DEFAULT session_user",
    },
]


def last_audit_id(conn: StoreConnection) -> int:
    """The highest audit row id ever handed out (0 before the first), inside a transaction."""
    if backend_of(conn) == "sqlite":
        return next_id(conn, "audit_log") - 1
    row = conn.execute("SELECT last_id FROM audit_counter").fetchone()
    return int(row[0]) if row is not None else 0


def _ask_last_audit_id(conn: StoreConnection) -> Callable[[], int]:
    """:func:`last_audit_id` read later (see :func:`deferred`), so it can share a round trip."""
    rows = deferred(conn, _LAST_ID_QUERY[backend_of(conn) == "sqlite"])
    return lambda: int(found[0][0]) if (found := rows()) else 0


def note_audit_id(conn: StoreConnection, row_id: int) -> None:
    """Record in the caller's transaction that ids up to ``row_id`` were handed out."""
    if backend_of(conn) == "sqlite":
        return  # AUTOINCREMENT keeps its counter in the same transaction
    conn.execute("UPDATE audit_counter SET last_id = ? WHERE last_id < ?", (row_id, row_id))


_COLUMNS = (
    "id, timestamp, agent_name, edit_type, old_value, new_value, user_id, user_name, "
    "change_id, prev_hash, row_hash, keyed, batch"
)
_INSERT_ROW = f"INSERT INTO audit_log ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
# what a reader gets: the written columns and the role the server recorded
_READ_COLUMNS = _COLUMNS + ", db_role"


class TailMoved(Exception):
    """A speculating audit transaction found the chain's tail elsewhere; nothing was written:
    run the block again without ``speculate``. Never reaches a user (``apply`` catches it), so
    it is not an ``AgentmendError``."""


def _note_ids(conn: StoreConnection, txn: AuditTransaction) -> None:
    # on SQLite AUTOINCREMENT keeps both in the same transaction already
    if txn.last is not None and not isinstance(conn, sqlite3.Connection):
        # rows cut off the end later leave this gap
        note_audit_id(conn, txn.last[0])
        # and an insert that takes the table's default id comes after them
        note_id_used(conn, "audit_log", txn.last[0])


def audit_key_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The HMAC key from ``AGENTMEND_AUDIT_HMAC_KEY``, for callers that wire settings."""
    value = (os.environ if environ is None else environ).get(AUDIT_HMAC_KEY_ENV)
    return value.encode("utf-8") if value else None


def _said(found: HeadBreak) -> dict[str, str]:
    return {"expected": found.expected, "found": found.found}


_FIELDS_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""What ``json.dumps(fields, ensure_ascii=False, separators=(",", ":"))`` uses, made once
(``dumps`` with options makes an encoder per call)."""


def _clip(value: Any) -> str | None:
    return None if value is None else str(value)[:VALUE_LIMIT]


class AuditTransaction:
    """A durable transaction that may append audit rows; see :meth:`AuditLog.transaction`."""

    def __init__(
        self,
        audit: AuditLog,
        conn: StoreConnection,
        tail: tuple[int, str],
        head_break: HeadBreak | None = None,
    ):
        self.conn = conn
        self._audit = audit
        self._tail = tail  # (next id, prev hash)
        self._break = head_break  # recorded by the first row of this commit, if any
        self._batch: int | None = None
        self.last: tuple[int, str] | None = None  # (id, hash) of the last row appended

    @property
    def tail(self) -> tuple[int, str]:
        """(next id, prev hash): where the next row goes after this transaction's rows."""
        return self._tail

    def append(
        self,
        *,
        agent_name: str,
        edit_type: str,
        old_value: Any,
        new_value: Any,
        user_id: str,
        user_name: str | None = None,
        change_id: str | None = None,
        timestamp: datetime | None = None,
    ) -> AuditEntry:
        """Append one row linked to the row before it (values are truncated to 500 chars).

        The first row of a commit made over a broken head is preceded by the break row that
        starts a new segment (see :mod:`agentmend.infrastructure.changes.audit.breaks`).
        """
        self.open_segment()
        return self._insert(
            agent_name, edit_type, old_value, new_value, user_id, user_name, change_id, timestamp
        )

    def open_segment(self) -> AuditEntry | None:
        """Write the pending break row now (None when the head was in step)."""
        if self._break is None:
            return None
        found, self._break = self._break, None
        return self._insert(AUDIT_AGENT, BREAK_EDIT_TYPE, found.expected, found.found, "agentmend")

    def _insert(
        self,
        agent_name: str,
        edit_type: str,
        old_value: Any,
        new_value: Any,
        user_id: str,
        user_name: str | None = None,
        change_id: str | None = None,
        timestamp: datetime | None = None,
    ) -> AuditEntry:
        row_id, prev_hash = self._tail
        stamp = timestamp or utc_now()
        if self._batch is None:
            self._batch = row_id
        fields = (
            row_id,
            stamp.isoformat(),
            agent_name,
            edit_type,
            _clip(old_value),
            _clip(new_value),
            str(user_id),
            user_name,
            change_id,
            prev_hash,
            self._batch,
        )
        row_hash = self._audit._hash(fields)
        self.conn.execute(
            _INSERT_ROW,
            (*fields[:10], row_hash, int(self._audit.keyed), self._batch),
        )
        self._tail = (row_id + 1, row_hash)
        self.last = (row_id, row_hash)
        return AuditEntry(
            row_id, stamp, agent_name, edit_type, fields[4], fields[5], fields[6],
            user_name, change_id, prev_hash, row_hash, self._audit.keyed, self._batch,
        )  # fmt: skip


class AuditLog:
    """The audit table of one store plus its head file; safe to share between threads."""

    def __init__(
        self,
        store: Store,
        *,
        hmac_key: bytes | str | None = None,
        head_path: str | Path | None = None,
    ) -> None:
        store.migrate("audit", _MIGRATIONS)
        self.store = store
        self.head_path = (
            Path(head_path) if head_path is not None else store.local_file(".audit-head")
        )
        self._key = hmac_key.encode("utf-8") if isinstance(hmac_key, str) else hmac_key
        if self._key is not None and not self._key:
            raise StoreError("the audit HMAC key is empty")
        # Several hosts append to a PostgreSQL store, each with a head file of its own: with a
        # key, a head vouches for the chain up to its row (see audit_fleet_head). Without one
        # every head must name the newest row, as on SQLite.
        self._fleet = store.backend == "postgresql" and self._key is not None
        self._seen = threading.local()  # the tail this thread's last commit left
        # rows this log hashed lately, (id, hash) -> the fields hashed: a tail row read back
        # the same, value for value and type for type, verifies without hashing it again
        self._hashed: dict[tuple[int, str], tuple[Any, ...]] = {}
        self._hashed_lock = threading.Lock()

    @property
    def keyed(self) -> bool:
        return self._key is not None

    def _hash(self, fields: tuple[Any, ...]) -> str:
        message = _FIELDS_JSON.encode(fields).encode("utf-8")
        if self._key is not None:
            digest = hmac.new(self._key, message, hashlib.sha256).hexdigest()
        else:
            digest = hashlib.sha256(message).hexdigest()
        if isinstance(fields[0], int):
            with self._hashed_lock:
                if len(self._hashed) >= _HASHED_KEPT:
                    self._hashed.pop(next(iter(self._hashed)))
                self._hashed[(fields[0], digest)] = fields
        return digest

    def _verifies(self, row: AuditEntry) -> bool:
        """Whether ``row``'s content matches its hash under this log's key (and keying).

        The tail rows every append checks are mostly rows this log hashed moments before: the
        same fields (equal and of the same types, so serialised the same) give the same hash.
        """
        if row.keyed != self.keyed:
            return False
        fields = _fields(row)
        with self._hashed_lock:
            hashed = self._hashed.get((row.id, row.row_hash))
        if hashed is not None and _same(hashed, fields):
            return True
        return hmac.compare_digest(self._hash(fields), row.row_hash)

    @contextmanager
    def transaction(
        self,
        *,
        safety: bool = False,
        prelude: Callable[[StoreConnection], Callable[[], None]] | None = None,
        batched: bool = False,
        speculate: bool = False,
    ) -> Iterator[AuditTransaction]:
        """A durable write transaction in which :meth:`AuditTransaction.append` adds rows.

        Other writes in the same transaction (a change's new status) commit atomically with
        their audit rows. The head file is written after the commit, under the same lock.

        On PostgreSQL the chain's tail is read in one round trip after ``BEGIN``; ``prelude``
        and ``batched`` put more in the round trips the transaction makes anyway.

        Args:
            safety: a rollback, recovery or acknowledgement, which a broken head never stops:
                its first row is preceded by a break row that starts a new segment (see
                :mod:`agentmend.infrastructure.changes.audit.breaks`).
            prelude: runs statements in the tail's round trip (their rows read through
                :func:`~agentmend.infrastructure.store.sql.deferred`) and returns a check that
                runs once they are answered, before the head is compared: an error it raises
                rolls everything back.
            batched: the block only writes (it reads nothing back): its statements and the
                chain's bookkeeping go in one round trip before the commit.
            speculate: with ``batched``, on PostgreSQL, take the chain's tail to be where this
                thread's last transaction on this log left it, and read the real one in the
                same round trip as the block's writes, before the commit: the transaction
                commits only if the two are the same and the head agrees, else it rolls back
                and :class:`TailMoved` says to run the block again without ``speculate``.

        Raises:
            AuditChainBroken: the head file and the database disagree and this is not a
                ``safety`` write; nothing is written.
            TailMoved: ``speculate`` guessed wrong (or its round trip failed); nothing is
                written.
        """
        with locked_file(self.head_path, self._head_wait()) as fd:
            head, unreadable = self._head_or_reason(fd)
            fresh = never_written(fd)
            guess = self._guess() if speculate and batched and prelude is None else None
            self._seen.tail = None  # known again only once this transaction commits
            with self.store.transaction(durable=True) as conn:
                if guess is None:
                    with pipelined(conn):
                        check = prelude(conn) if prelude is not None else None
                        read_tail = self._tail_state(conn, head, unreadable, fresh)
                    if check is not None:
                        check()
                    tail, found, ahead = read_tail()
                    if found is not None and not safety:
                        log.error("audit_append_refused", path=str(self.head_path), **_said(found))
                        raise AuditChainBroken(found.expected, found.found)
                    txn = AuditTransaction(self, conn, tail, found)
                    with pipelined(conn) if batched else nullcontext():
                        yield txn
                        _note_ids(conn, txn)
                else:
                    txn = AuditTransaction(self, conn, guess)
                    written = False
                    try:
                        with pipelined(conn):
                            read_tail = self._tail_state(conn, head, unreadable, fresh)
                            yield txn
                            written = True
                            _note_ids(conn, txn)
                    except Exception as exc:
                        if not written or isinstance(exc, LockTimeout):
                            raise  # the block's own error, or a lock it waited for in vain
                        raise TailMoved() from exc  # e.g. the guessed id taken meanwhile
                    tail, found, ahead = read_tail()
                    if tail != guess or found is not None:
                        raise TailMoved()
            if found is None:
                self._seen.tail = txn.tail
            newest = txn.last or ((ahead.id, ahead.row_hash) if ahead is not None else None)
            if newest is not None:
                if found is not None:
                    log.warning("audit_segment_started", path=str(self.head_path), **_said(found))
                try:
                    write_head(fd, *newest)
                except OSError as exc:
                    # The rows are committed and must not be reported as failed; the stale head
                    # shows up in verify_chain(), which is where the operator looks.
                    log.error("audit_head_write_failed", path=str(self.head_path), error=str(exc))

    def _guess(self) -> tuple[int, str] | None:
        """Where this thread's last committed transaction on this log left the chain's tail,
        if speculating on it can save a round trip (PostgreSQL's pipeline mode)."""
        if self.store.backend != "postgresql" or not pipeline_supported():
            return None
        tail: tuple[int, str] | None = getattr(self._seen, "tail", None)
        return tail

    def _tail_state(
        self,
        conn: StoreConnection,
        head: tuple[int, str] | None,
        unreadable: str | None,
        fresh: bool,
    ) -> Callable[[], _TailState]:
        """Ask for (next id, prev hash) for the next row, the break between head and rows if
        any, and on a fleet the newer row the head should move to (rows other hosts appended).

        The queries run now; their answer is read by the returned call, so that inside a
        :func:`~agentmend.infrastructure.store.sql.pipelined` block they share one round trip.
        """
        if self._fleet:
            return self._fleet_tail_state(conn, head, unreadable, fresh)
        # The newest commit's rows (they share its first row's id as ``batch``), the row
        # before them and the highest id ever handed out, in one statement. The next id comes
        # from that highest id, not max(id): rows cut off the end leave a gap that
        # verification reports even after new rows are appended.
        if isinstance(conn, sqlite3.Connection):  # no round trip to share: a leaner statement
            rows = _sqlite_tail(conn).copy
        else:
            rows = deferred(conn, _TAIL_AND_LAST_ID[False])

        def answer() -> _TailState:
            found = rows()
            # one row at least (the id's), whose audit columns are NULL when the table is empty
            last_id = int(found[0][-1]) if found and found[0][-1] is not None else 0
            newest = _entry(found[-1]) if found and found[-1][0] is not None else None
            following = max(last_id, newest.id if newest else 0) + 1
            prev_hash = newest.row_hash if newest else GENESIS_HASH
            if (  # in step, as find_break would say first: the older rows are not needed
                unreadable is None
                and newest is not None
                and head == (newest.id, newest.row_hash)
                and self._verifies(newest)
            ):
                return (following, prev_hash), None, None
            tail = [_entry(r) for r in found[:-1] if r[0] is not None]
            if newest is not None:
                tail.append(newest)
            return (following, prev_hash), find_break(head, unreadable, tail, self._verifies), None

        return answer

    def _fleet_tail_state(
        self,
        conn: StoreConnection,
        head: tuple[int, str] | None,
        unreadable: str | None,
        fresh: bool,
    ) -> Callable[[], _TailState]:
        """:meth:`_tail_state` on a fleet: the head vouches for its row, the key for the rest."""
        last_id = _ask_last_audit_id(conn)
        newest_rows = deferred(
            conn, f"SELECT {_READ_COLUMNS} FROM audit_log ORDER BY id DESC LIMIT 1"
        )
        since_head: Callable[[], list[Any]] = list
        if unreadable is None and (head is not None or fresh):
            start = head[0] if head is not None else 0
            since_head = deferred(
                conn, f"SELECT {_READ_COLUMNS} FROM audit_log WHERE id >= ? ORDER BY id", (start,)
            )

        def answer() -> _TailState:
            found = newest_rows()
            newest = _entry(found[0]) if found else None
            # the rows since the head matter only when the table holds any
            rows = [_entry(r) for r in since_head()] if newest is not None else []
            broken, ahead = follow_head(head, fresh, unreadable, rows, newest, self._verifies)
            following = max(last_id(), newest.id if newest else 0) + 1
            prev_hash = newest.row_hash if newest else GENESIS_HASH
            return (following, prev_hash), broken, ahead

        return answer

    def ensure_appendable(self) -> None:
        """Check, before an apply or keep starts work, that the head and the database agree.

        Raises:
            AuditChainBroken: they disagree (see
            :mod:`agentmend.infrastructure.changes.audit.breaks`).
        """
        with locked_file(self.head_path, self._head_wait()) as fd:
            head, unreadable = self._head_or_reason(fd)
            # one state of the table: on a fleet other hosts append meanwhile
            with self.store.snapshot() as conn:
                with pipelined(conn):
                    read_tail = self._tail_state(conn, head, unreadable, never_written(fd))
                _, found, ahead = read_tail()
            if ahead is not None:  # rows other hosts appended verify: the head moves to them
                write_head(fd, ahead.id, ahead.row_hash)
        if found is not None:
            raise AuditChainBroken(found.expected, found.found)

    def acknowledge_breaks(
        self, principal: Principal, *, note: str | None = None
    ) -> AuditEntry | None:
        """An administrator's acknowledgement of every unacknowledged break, as an audit row.

        Rows found edited, unlinked, missing or unkeyed in the database (the problems in
        ``ACKNOWLEDGEABLE``) are acknowledged with the breaks: after checking them, this is the
        way back to a chain that verifies, with every such row named in the acknowledgement
        and reported as a note from then on. A head that disagrees with the database now is
        recorded as a break first (the acknowledgement is a safety write), so after this call
        the head and the database agree and applies resume. Returns the acknowledgement row,
        or None when there was nothing to acknowledge (nothing is written then).

        Raises:
            PermissionRequired: ``principal`` is not an administrator; nothing is written.
        """
        if not principal.is_admin:
            raise PermissionRequired(
                principal.user_id, ADMIN, "acknowledge a break in the audit chain"
            )
        with self.transaction(safety=True) as txn:
            txn.open_segment()
            rows = [
                _entry(r)
                for r in txn.conn.execute(f"SELECT {_READ_COLUMNS} FROM audit_log ORDER BY id")
            ]
            forged = {r.id for r in rows if not self._verifies(r)}
            done = acknowledged_ids(rows, forged)
            row_problems = check_rows(
                rows, keyed=self.keyed, expected_hash=lambda row: self._hash(_fields(row))
            )
            ids = sorted(
                {r.id for r in rows if r.edit_type == BREAK_EDIT_TYPE and r.id not in done}
                | {
                    p.row_id
                    for p in row_problems
                    if p.row_id is not None and p.kind in ACKNOWLEDGEABLE and p.row_id not in done
                }
            )
            if not ids:
                return None
            entry = txn.append(
                agent_name=AUDIT_AGENT,
                edit_type=ACK_EDIT_TYPE,
                old_value=note,
                new_value=json.dumps(ids),
                user_id=principal.user_id,
                user_name=principal.name,
            )
        log.warning("audit_breaks_acknowledged", rows=ids, by=principal.user_id)
        return entry

    def _check_head(
        self, fd: int, rows: list[AuditEntry], problems: list[ChainProblem], repair: bool
    ) -> tuple[list[ChainProblem], list[str], bool]:
        if not self._fleet:
            return check_head(fd, self.head_path, rows, problems, repair)
        try:
            head = read_head(fd, self.head_path)
        except AuditChainError as exc:
            return [ChainProblem(None, "head_unreadable", str(exc))], [], False
        return check_fleet_head(
            head, never_written(fd), str(self.head_path), rows, problems, repair
        )

    def _head_or_reason(self, fd: int) -> tuple[tuple[int, str] | None, str | None]:
        """The head, or None and why it cannot be read (a break: see ``audit_breaks``)."""
        try:
            return read_head(fd, self.head_path), None
        except AuditChainError as exc:
            log.error("audit_head_unreadable", path=str(self.head_path), error=str(exc))
            return None, str(exc)

    def append(
        self,
        *,
        agent_name: str,
        edit_type: str,
        old_value: Any,
        new_value: Any,
        user_id: str,
        user_name: str | None = None,
        change_id: str | None = None,
    ) -> AuditEntry:
        """Append one row in its own durable transaction."""
        with self.transaction() as txn:
            return txn.append(
                agent_name=agent_name,
                edit_type=edit_type,
                old_value=old_value,
                new_value=new_value,
                user_id=user_id,
                user_name=user_name,
                change_id=change_id,
            )

    def entries(
        self,
        *,
        agent_name: str | None = None,
        change_id: str | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """The newest ``limit`` rows (optionally for one agent or change), oldest first."""
        where, params = [], []
        if agent_name is not None:
            where.append("agent_name = ?")
            params.append(agent_name)
        if change_id is not None:
            where.append("change_id = ?")
            params.append(change_id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = (
            self.store.connection()
            .execute(
                f"SELECT {_READ_COLUMNS} FROM audit_log {clause} ORDER BY id DESC LIMIT ?",
                (*params, limit),
            )
            .fetchall()
        )
        return [_entry(row) for row in reversed(rows)]

    def verify_chain(
        self, *, repair: bool = True, head_wait_s: float | None = None
    ) -> ChainVerification:
        """Check every row, every link, the head file, its history and the chain's breaks.

        Returns a result listing each problem with its row id (truthy when there is none).
        The one tolerated disagreement, a head exactly one commit behind after a crash, is
        reported in ``notes`` and, with ``repair``, fixed by rewriting the head; it is the only
        repair (an unreadable or missing head is reported until a safety write records the
        break and an administrator acknowledges it). Each unacknowledged break row is a
        ``chain_break`` problem, an acknowledged one a note. Heads rewritten by earlier
        versions after being found unreadable are reported until a ``repair`` run whose rows
        all verify has reported them (see
        :mod:`agentmend.infrastructure.changes.audit.head_events`).

        The head's file lock is waited for at most ``head_wait_s`` (default the store's lock
        timeout). Without ``repair``, a head held all that time (a writer stopped while it
        appends) leaves the head unchecked, said in ``notes``, and the rows verified alone.

        Raises:
            LockTimeout: with ``repair``, the head's file lock was held all along.
        """
        with ExitStack() as stack:
            try:
                fd = stack.enter_context(locked_file(self.head_path, self._head_wait(head_wait_s)))
            except LockTimeout as exc:
                if repair:
                    raise
                return self._verify_rows_alone(
                    f"the head file {self.head_path} was not checked: another process held "
                    f"its lock for {exc.waited_s:g} s (a writer, slow or stopped)"
                )
            conn = self.store.connection()
            rows = [
                _entry(r)
                for r in conn.execute(
                    f"SELECT {_READ_COLUMNS} FROM audit_log ORDER BY id"
                ).fetchall()
            ]
            problems = check_rows(
                rows, keyed=self.keyed, expected_hash=lambda row: self._hash(_fields(row))
            )
            bad = {p.row_id for p in problems if p.row_id}
            problems, row_notes = row_findings(rows, problems, bad)
            rows_ok = not problems
            head_problems, notes, needs_repair = self._check_head(fd, rows, problems, repair)
            breaks, break_notes = break_findings(rows, bad)
            problems.extend(head_problems)
            problems.extend(breaks)
            repaired = False
            if repair and rows_ok and needs_repair:
                write_head(fd, rows[-1].id, rows[-1].row_hash)
                repaired = True
                log.warning("audit_head_repaired", row_id=rows[-1].id)
            events, event_notes = head_event_findings(
                self.store, conn, acknowledge=repair and rows_ok
            )
            problems.extend(events)
            notes = event_notes + row_notes + break_notes + notes
        return ChainVerification(len(rows), tuple(problems), tuple(notes), repaired)

    def _verify_rows_alone(self, note: str) -> ChainVerification:
        """The rows, their links and breaks, without the head (whose lock a writer holds)."""
        rows = [
            _entry(r)
            for r in self.store.connection()
            .execute(f"SELECT {_READ_COLUMNS} FROM audit_log ORDER BY id")
            .fetchall()
        ]
        problems = check_rows(
            rows, keyed=self.keyed, expected_hash=lambda row: self._hash(_fields(row))
        )
        bad = {p.row_id for p in problems if p.row_id}
        problems, row_notes = row_findings(rows, problems, bad)
        breaks, break_notes = break_findings(rows, bad)
        return ChainVerification(
            len(rows), (*problems, *breaks), (*row_notes, *break_notes, note), head_unchecked=note
        )

    def _head_wait(self, seconds: float | None = None) -> LockWait:
        """How long to wait for the head's file lock: the store's lock timeout by default."""
        return _head_wait(self.store.timeouts.lock_s if seconds is None else seconds)


@functools.lru_cache(maxsize=8)
def _head_wait(seconds: float) -> LockWait:
    """The wait for the head's file lock (one value per timeout, made once)."""
    return LockWait(seconds, "the audit head's file lock", LOCK_SETTING)


_HASHED_KEPT = 64
"""Rows whose hashed fields a log remembers (a commit's rows and the one before are checked)."""


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Equal and of the same types field by field (``1 == 1.0`` but they serialise apart)."""
    # types compare by identity; map keeps the walk in C (every append checks its tail)
    return a == b and tuple(map(type, a)) == tuple(map(type, b))


def _fields(row: AuditEntry) -> tuple[Any, ...]:
    return (
        row.id, row.timestamp.isoformat(), row.agent_name, row.edit_type, row.old_value,
        row.new_value, row.user_id, row.user_name, row.change_id, row.prev_hash, row.batch,
    )  # fmt: skip


_TailState = tuple[tuple[int, str], HeadBreak | None, AuditEntry | None]
"""(next id, prev hash), the break between the head and the rows if any, the row to move to."""

_TAIL_QUERY = (
    "WITH newest AS (SELECT CASE WHEN batch < id THEN batch ELSE id END AS start"
    " FROM audit_log ORDER BY id DESC LIMIT 1)"
    f" SELECT {_READ_COLUMNS} FROM audit_log WHERE id >= coalesce("
    "(SELECT max(id) FROM audit_log WHERE id < (SELECT start FROM newest)),"
    " (SELECT start FROM newest)) ORDER BY id"
)
"""The newest commit's rows and the one row before them (what :func:`find_break` checks)."""

_LAST_ID_QUERY = {
    True: "SELECT seq FROM sqlite_sequence WHERE name = 'audit_log'",
    False: "SELECT last_id FROM audit_counter LIMIT 1",
}
"""The highest audit id ever handed out (:func:`last_audit_id`), on SQLite (True) or not."""

_TAIL_AND_LAST_ID = {
    sqlite: f"SELECT tail.*, counter.last_id FROM (SELECT ({query}) AS last_id) AS counter"
    f" LEFT JOIN ({_TAIL_QUERY}) AS tail ON 1 = 1 ORDER BY tail.id"
    for sqlite, query in _LAST_ID_QUERY.items()
}
""":data:`_TAIL_QUERY`'s rows, each followed by the highest id handed out; one row of NULLs
and that id when the table is empty."""

_TAIL_START = "(SELECT min(batch, id) FROM audit_log ORDER BY id DESC LIMIT 1)"
_SQLITE_TAIL = (
    f"SELECT {_READ_COLUMNS}, ({_LAST_ID_QUERY[True]}) FROM audit_log WHERE id >= coalesce("
    f"(SELECT max(id) FROM audit_log WHERE id < {_TAIL_START}), {_TAIL_START}) ORDER BY id"
)
""":data:`_TAIL_AND_LAST_ID` on SQLite, in half the time (no join, no common table): the same
rows when the table holds any, none when it is empty (then :data:`_SQLITE_NO_TAIL`)."""

_SQLITE_NO_TAIL = (
    f"SELECT {', '.join(['NULL'] * len(_READ_COLUMNS.split(',')))}, ({_LAST_ID_QUERY[True]})"
)
""":data:`_TAIL_AND_LAST_ID`'s one row for an empty table on SQLite: NULLs and the highest id
handed out."""


def _sqlite_tail(conn: sqlite3.Connection) -> list[Any]:
    """:data:`_TAIL_AND_LAST_ID`'s rows on SQLite."""
    return conn.execute(_SQLITE_TAIL).fetchall() or conn.execute(_SQLITE_NO_TAIL).fetchall()


def _entry(row: tuple[Any, ...]) -> AuditEntry:
    return AuditEntry(
        int(row[0]), datetime.fromisoformat(row[1]), row[2], row[3], row[4], row[5], row[6],
        row[7], row[8], row[9], row[10], bool(row[11]), int(row[12]), row[13],
    )  # fmt: skip


def verify_audit_chain(
    store: Store | str | Path,
    *,
    hmac_key: bytes | str | None = None,
    repair: bool = True,
) -> ChainVerification:
    """Verify the audit chain of a store (or a database path); see :meth:`AuditLog.verify_chain`."""
    if isinstance(store, Store):
        return AuditLog(store, hmac_key=hmac_key).verify_chain(repair=repair)
    with Store(store) as opened:
        return AuditLog(opened, hmac_key=hmac_key).verify_chain(repair=repair)
