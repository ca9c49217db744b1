"""The audit log: who changed which agent, how, and when, in a chain that shows tampering.

Seed 002's audit table (agent name, edit type, old and new value truncated to 500 characters,
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

An unreadable head
-------------------
A head file that does not parse must not stop the loop: a write that finds it so carries on
and its head write rewrites it; the event is kept in ``audit_head_events`` and reported by
:meth:`AuditLog.verify_chain` (see :mod:`infrastructure.changes.audit_head_events`).

The head file's format and in-place writes are in :mod:`infrastructure.changes.audit_head`;
the row and head checks in :mod:`infrastructure.changes.audit_verification` (whose result
types and ``GENESIS_HASH`` are re-exported here).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from infrastructure.changes.audit_entry import AuditEntry
from infrastructure.changes.audit_head import clear_head, read_head, write_head
from infrastructure.changes.audit_head_events import head_event_findings, record_head_event
from infrastructure.changes.audit_verification import (
    GENESIS_HASH,
    ChainProblem,
    ChainVerification,
    check_head,
    check_rows,
)
from infrastructure.errors import AuditChainError, StoreError
from infrastructure.files import locked_file
from infrastructure.models import utc_now
from infrastructure.store import Store
from infrastructure.structured_logger import get_logger

__all__ = [
    "AUDIT_HMAC_KEY_ENV",
    "GENESIS_HASH",
    "VALUE_LIMIT",
    "AuditEntry",
    "AuditLog",
    "AuditTransaction",
    "ChainProblem",
    "ChainVerification",
    "audit_key_from_env",
    "verify_audit_chain",
]

log = get_logger(__name__)

AUDIT_HMAC_KEY_ENV = "AGENTMEND_AUDIT_HMAC_KEY"
VALUE_LIMIT = 500

_MIGRATIONS = [
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
]

_COLUMNS = (
    "id, timestamp, agent_name, edit_type, old_value, new_value, user_id, user_name, "
    "change_id, prev_hash, row_hash, keyed, batch"
)


def audit_key_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The HMAC key from ``AGENTMEND_AUDIT_HMAC_KEY``, for callers that wire settings."""
    value = (os.environ if environ is None else environ).get(AUDIT_HMAC_KEY_ENV)
    return value.encode("utf-8") if value else None


def _clip(value: Any) -> str | None:
    return None if value is None else str(value)[:VALUE_LIMIT]


class AuditTransaction:
    """A durable transaction that may append audit rows; see :meth:`AuditLog.transaction`."""

    def __init__(
        self,
        audit: AuditLog,
        conn: sqlite3.Connection,
        head: tuple[int, str] | None,
        unreadable: str | None = None,
    ):
        self.conn = conn
        self._audit = audit
        self._head = head
        self._unreadable = unreadable  # why the head file could not be read, if it could not
        self._tail: tuple[int, str] | None = None  # (next id, prev hash) once known
        self._batch: int | None = None
        self.last: tuple[int, str] | None = None  # (id, hash) of the last row appended

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
        """Append one row linked to the row before it (values are truncated to 500 chars)."""
        if self._tail is None:
            self._tail = self._read_tail()
        row_id, prev_hash = self._tail
        stamp = timestamp or utc_now()
        if self._batch is None:
            self._batch = row_id
            if self._unreadable is not None:
                # This commit's head write replaces the unreadable head: keep the evidence.
                record_head_event(
                    self.conn, self._audit.head_path, self._unreadable, row_id, reported=False
                )
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
            f"INSERT INTO audit_log ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (*fields[:10], row_hash, int(self._audit.keyed), self._batch),
        )
        self._tail = (row_id + 1, row_hash)
        self.last = (row_id, row_hash)
        return AuditEntry(
            row_id, stamp, agent_name, edit_type, fields[4], fields[5], fields[6],
            user_name, change_id, prev_hash, row_hash, self._audit.keyed, self._batch,
        )  # fmt: skip

    def _read_tail(self) -> tuple[int, str]:
        # The next id comes from sqlite_sequence, not max(id): rows cut off the end leave a gap
        # that verification reports even after new rows are appended.
        seq = self.conn.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = 'audit_log'"
        ).fetchone()
        last = self.conn.execute(
            "SELECT id, row_hash, prev_hash FROM audit_log ORDER BY id DESC LIMIT 1"
        ).fetchone()
        next_id = max(int(seq[0]) if seq else 0, int(last[0]) if last else 0) + 1
        prev_hash = str(last[1]) if last else GENESIS_HASH
        head = self._head
        in_step = head is None and last is None
        in_step = in_step or (head is not None and last is not None and head[1] == last[1])
        behind_by_one = head is not None and last is not None and head[1] == last[2]
        behind_by_one = behind_by_one or (head is None and last is not None and last[0] == 1)
        if not in_step and not behind_by_one and self._unreadable is None:
            log.warning(
                "audit_head_disagrees",
                head_row=head[0] if head else None,
                last_row=int(last[0]) if last else None,
                hint="run verify_audit_chain()",
            )
        return next_id, prev_hash


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
            Path(head_path)
            if head_path is not None
            else store.path.with_name(store.path.name + ".audit-head")
        )
        self._key = hmac_key.encode("utf-8") if isinstance(hmac_key, str) else hmac_key
        if self._key is not None and not self._key:
            raise StoreError("the audit HMAC key is empty")

    @property
    def keyed(self) -> bool:
        return self._key is not None

    def _hash(self, fields: tuple[Any, ...]) -> str:
        message = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        if self._key is not None:
            return hmac.new(self._key, message, hashlib.sha256).hexdigest()
        return hashlib.sha256(message).hexdigest()

    @contextmanager
    def transaction(self) -> Iterator[AuditTransaction]:
        """A durable write transaction in which :meth:`AuditTransaction.append` adds rows.

        Other writes in the same transaction (a change's new status) commit atomically with
        their audit rows. The head file is written after the commit, under the same lock.
        """
        with locked_file(self.head_path) as fd:
            head, unreadable = self._head_or_reason(fd)
            with self.store.transaction(durable=True) as conn:
                txn = AuditTransaction(self, conn, head, unreadable)
                yield txn
            if txn.last is not None:
                try:
                    write_head(fd, *txn.last)
                except OSError as exc:
                    # The rows are committed and must not be reported as failed; the stale head
                    # shows up in verify_chain(), which is where the operator looks.
                    log.error("audit_head_write_failed", path=str(self.head_path), error=str(exc))

    def _head_or_reason(self, fd: int) -> tuple[tuple[int, str] | None, str | None]:
        """The head, or None and why it cannot be read: a damaged head never blocks a write."""
        try:
            return read_head(fd, self.head_path), None
        except AuditChainError as exc:
            log.error(
                "audit_head_unreadable",
                path=str(self.head_path),
                error=str(exc),
                hint="the next commit rewrites it; verify_audit_chain() reports the event",
            )
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
                f"SELECT {_COLUMNS} FROM audit_log {clause} ORDER BY id DESC LIMIT ?",
                (*params, limit),
            )
            .fetchall()
        )
        return [_entry(row) for row in reversed(rows)]

    def verify_chain(self, *, repair: bool = True) -> ChainVerification:
        """Check every row, every link, the head file and the head's history.

        Returns a result listing each problem with its row id (truthy when there is none).
        The one tolerated disagreement, a head exactly one row behind after a crash, is
        reported in ``notes`` and, with ``repair``, fixed by rewriting the head. With
        ``repair`` and every row verifying, an unreadable head is rewritten too (still
        reported as ``head_unreadable`` in this result), and heads rewritten by writes after
        being found unreadable are marked reported; see "An unreadable head" in the module
        docstring.
        """
        with locked_file(self.head_path) as fd:
            conn = self.store.connection()
            rows = [
                _entry(r)
                for r in conn.execute(f"SELECT {_COLUMNS} FROM audit_log ORDER BY id").fetchall()
            ]
            problems = check_rows(
                rows, keyed=self.keyed, expected_hash=lambda row: self._hash(_fields(row))
            )
            rows_ok = not problems
            head_problems, notes, needs_repair = check_head(
                fd, self.head_path, rows, problems, repair
            )
            problems.extend(head_problems)
            unreadable = next((p for p in head_problems if p.kind == "head_unreadable"), None)
            repaired = False
            if repair and rows_ok and (needs_repair or unreadable is not None):
                if unreadable is not None:  # the evidence is on disk before the head changes
                    with self.store.transaction(durable=True) as wconn:
                        last_id = rows[-1].id if rows else None
                        record_head_event(
                            wconn, self.head_path, unreadable.detail, last_id, reported=True
                        )
                if rows:
                    write_head(fd, rows[-1].id, rows[-1].row_hash)
                else:
                    clear_head(fd)
                repaired = True
                log.warning("audit_head_repaired", row_id=rows[-1].id if rows else None)
            events, event_notes = head_event_findings(
                self.store, conn, acknowledge=repair and rows_ok
            )
            problems.extend(events)
            notes = event_notes + notes
        return ChainVerification(len(rows), tuple(problems), tuple(notes), repaired)


def _fields(row: AuditEntry) -> tuple[Any, ...]:
    return (
        row.id, row.timestamp.isoformat(), row.agent_name, row.edit_type, row.old_value,
        row.new_value, row.user_id, row.user_name, row.change_id, row.prev_hash, row.batch,
    )  # fmt: skip


def _entry(row: tuple[Any, ...]) -> AuditEntry:
    return AuditEntry(
        int(row[0]), datetime.fromisoformat(row[1]), row[2], row[3], row[4], row[5], row[6],
        row[7], row[8], row[9], row[10], bool(row[11]), int(row[12]),
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
