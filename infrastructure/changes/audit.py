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
A head file that does not parse (torn, garbled, edited) must not stop the loop: a write that
finds it so logs ``audit_head_unreadable`` naming the file, carries on, and its post-commit
head write rewrites it. That rewrite would erase the evidence (rows cut off before it can no
longer be told from rows never written), so the event is kept in the store, in
``audit_head_events``, committed with the rows whose head replaced the unreadable one.
:meth:`AuditLog.verify_chain` reports each event as a ``head_was_unreadable`` problem until a
``repair`` run whose rows all verify has reported it; from then on it is a note ("head was
rewritten after being unreadable at <time>: <reason naming the file>"), on every run, for good.
``verify_chain(repair=True)`` itself rewrites an unreadable head when every row verifies,
reports ``head_unreadable`` in that run's problems, and keeps the same note afterwards.

The head file is never replaced: it is one fixed-size record rewritten in place at offset 0 and
synced (a record this small is written whole; its checksum catches a torn one), because
replacing a file by rename costs about a millisecond on ext4, twice the budget of a whole
durable ``log_change``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from infrastructure.errors import AuditChainError, StoreError
from infrastructure.files import locked_file
from infrastructure.models import utc_now
from infrastructure.store import Store

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

log = structlog.get_logger(__name__)

AUDIT_HMAC_KEY_ENV = "AGENTMEND_AUDIT_HMAC_KEY"
VALUE_LIMIT = 500
GENESIS_HASH = "0" * 64
_HEAD_SIZE = 256  # one record well inside a 512-byte sector
_HEAD_MAGIC = "agentmend-audit-head v1"

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


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit row as stored."""

    id: int
    timestamp: datetime
    agent_name: str
    edit_type: str
    old_value: str | None
    new_value: str | None
    user_id: str
    user_name: str | None
    change_id: str | None
    prev_hash: str
    row_hash: str
    keyed: bool
    batch: int  # id of the first row committed in the same transaction


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """One thing wrong with the chain; ``row_id`` is None for problems with the head file.

    ``kind`` is one of: edited, broken_link, missing_rows, unkeyed, keyed_without_key (rows);
    head_missing, head_unreadable, head_mismatch, cut_off (the head file now);
    head_was_unreadable (a write found the head unreadable and rewrote it; reported until a
    ``repair`` run has reported it, a note after).
    """

    row_id: int | None
    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class ChainVerification:
    """The outcome of :meth:`AuditLog.verify_chain`; truthy when the chain verifies."""

    rows_checked: int
    problems: tuple[ChainProblem, ...] = ()
    notes: tuple[str, ...] = ()
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    @property
    def problem_row_ids(self) -> tuple[int, ...]:
        return tuple(p.row_id for p in self.problems if p.row_id is not None)

    def raise_for_problems(self) -> None:
        """For callers that want strictness: raise ``AuditChainError`` listing the problems."""
        if self.problems:
            listed = "; ".join(
                f"row {p.row_id}: {p.kind}: {p.detail}"
                if p.row_id is not None
                else f"{p.kind}: {p.detail}"
                for p in self.problems
            )
            raise AuditChainError(f"audit chain does not verify: {listed}")


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
                self._audit._record_head_event(self.conn, self._unreadable, row_id, reported=False)
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
                    _write_head(fd, *txn.last)
                except OSError as exc:
                    # The rows are committed and must not be reported as failed; the stale head
                    # shows up in verify_chain(), which is where the operator looks.
                    log.error("audit_head_write_failed", path=str(self.head_path), error=str(exc))

    def _head_or_reason(self, fd: int) -> tuple[tuple[int, str] | None, str | None]:
        """The head, or None and why it cannot be read: a damaged head never blocks a write."""
        try:
            return _read_head(fd, self.head_path), None
        except AuditChainError as exc:
            log.error(
                "audit_head_unreadable",
                path=str(self.head_path),
                error=str(exc),
                hint="the next commit rewrites it; verify_audit_chain() reports the event",
            )
            return None, str(exc)

    def _record_head_event(
        self, conn: sqlite3.Connection, reason: str, row_id: int | None, *, reported: bool
    ) -> None:
        now = utc_now().isoformat()
        conn.execute(
            "INSERT INTO audit_head_events (timestamp, head_path, reason, row_id, reported)"
            " VALUES (?,?,?,?,?)",
            (now, str(self.head_path), reason, row_id, now if reported else None),
        )

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
            problems = self._check_rows(rows)
            rows_ok = not problems
            head_problems, notes, needs_repair = self._check_head(fd, rows, problems, repair)
            problems.extend(head_problems)
            unreadable = next((p for p in head_problems if p.kind == "head_unreadable"), None)
            repaired = False
            if repair and rows_ok and (needs_repair or unreadable is not None):
                if unreadable is not None:  # the evidence is on disk before the head changes
                    with self.store.transaction(durable=True) as wconn:
                        last_id = rows[-1].id if rows else None
                        self._record_head_event(wconn, unreadable.detail, last_id, reported=True)
                if rows:
                    _write_head(fd, rows[-1].id, rows[-1].row_hash)
                else:
                    _clear_head(fd)
                repaired = True
                log.warning("audit_head_repaired", row_id=rows[-1].id if rows else None)
            events, event_notes = self._head_events(conn, acknowledge=repair and rows_ok)
            problems.extend(events)
            notes = event_notes + notes
        return ChainVerification(len(rows), tuple(problems), tuple(notes), repaired)

    def _head_events(
        self, conn: sqlite3.Connection, *, acknowledge: bool
    ) -> tuple[list[ChainProblem], list[str]]:
        """Heads rewritten after being unreadable: problems until reported, notes after."""
        problems: list[ChainProblem] = []
        notes: list[str] = []
        fresh: list[int] = []
        for event_id, stamp, reason, row_id, reported in conn.execute(
            "SELECT id, timestamp, reason, row_id, reported FROM audit_head_events ORDER BY id"
        ):
            at = f" (to name row {row_id})" if row_id is not None else ""
            text = f"head was rewritten{at} after being unreadable at {stamp}: {reason}"
            if reported is None:
                detail = f"{text}; rows cut off before then cannot be detected through the head"
                problems.append(ChainProblem(None, "head_was_unreadable", detail))
                fresh.append(int(event_id))
            else:
                notes.append(text)
        if acknowledge and fresh:
            with self.store.transaction(durable=True) as wconn:
                wconn.executemany(
                    "UPDATE audit_head_events SET reported = ? WHERE id = ?",
                    [(utc_now().isoformat(), i) for i in fresh],
                )
        return problems, notes

    def _check_rows(self, rows: list[AuditEntry]) -> list[ChainProblem]:
        problems: list[ChainProblem] = []
        prev_id, prev_hash = 0, GENESIS_HASH
        for row in rows:
            if row.keyed and not self.keyed:
                problems.append(
                    ChainProblem(row.id, "keyed_without_key", "row is HMAC-keyed; give the key")
                )
            elif self.keyed and not row.keyed:
                problems.append(
                    ChainProblem(row.id, "unkeyed", "row is not authenticated by the HMAC key")
                )
            elif not hmac.compare_digest(self._hash(_fields(row)), row.row_hash):
                problems.append(
                    ChainProblem(row.id, "edited", "content does not match its hash (or key)")
                )
            if row.prev_hash != prev_hash:
                gap = (
                    f"rows {prev_id + 1}..{row.id - 1} are missing" if row.id > prev_id + 1 else ""
                )
                detail = gap or f"does not link to row {prev_id} (deleted, reordered or edited)"
                problems.append(ChainProblem(row.id, "broken_link", detail))
            elif row.id != prev_id + 1:
                problems.append(
                    ChainProblem(row.id, "missing_rows", f"rows {prev_id + 1}..{row.id - 1} gone")
                )
            prev_id, prev_hash = row.id, row.row_hash
        return problems

    def _check_head(
        self, fd: int, rows: list[AuditEntry], row_problems: list[ChainProblem], repair: bool
    ) -> tuple[list[ChainProblem], list[str], bool]:
        try:
            head = _read_head(fd, self.head_path)
        except AuditChainError as exc:
            return [ChainProblem(None, "head_unreadable", str(exc))], [], False
        last = rows[-1] if rows else None
        if head is None and last is None:
            return [], [], False
        if head is not None and last is not None and head == (last.id, last.row_hash):
            return [], [], False
        # The crash between a commit and its head write: the head names the row just before
        # the newest commit (whose rows share a batch id), and that commit's rows verify, link
        # to the row the head names, and are no older than it.
        assert last is not None or head is not None
        tail: list[AuditEntry] = []
        for row in reversed(rows):
            if row.batch != rows[-1].batch:
                break
            tail.insert(0, row)
        before = rows[-len(tail) - 1] if len(rows) > len(tail) else None
        bad = {p.row_id for p in row_problems}
        if (
            tail
            and tail[0].id == tail[0].batch
            and not any(r.id in bad for r in tail)
            and head == ((before.id, before.row_hash) if before else None)
            and tail[0].prev_hash == (before.row_hash if before else GENESIS_HASH)
            and (before is None or tail[0].timestamp >= before.timestamp)
        ):
            done = "repaired" if repair else "not repaired"
            return [], [f"head behind by one commit ({len(tail)} row(s)), {done}"], True
        if head is None:
            return [ChainProblem(None, "head_missing", f"{self.head_path} is missing")], [], False
        if last is None or head[0] > last.id:
            ends = f"row {last.id}" if last else "no rows"
            detail = f"head names row {head[0]} but the table ends at {ends}: rows cut off"
            return [ChainProblem(None, "cut_off", detail)], [], False
        detail = f"head names row {head[0]} but the newest row is {last.id} with another hash"
        return [ChainProblem(None, "head_mismatch", detail)], [], False


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


def _head_record(row_id: int, row_hash: str) -> bytes:
    body = f"{_HEAD_MAGIC} {row_id} {row_hash}"
    check = hashlib.sha256(body.encode("ascii")).hexdigest()[:16]
    return f"{body} {check}\n".encode("ascii").ljust(_HEAD_SIZE, b" ")


def _write_head(fd: int, row_id: int, row_hash: str) -> None:
    os.pwrite(fd, _head_record(row_id, row_hash), 0)
    os.fdatasync(fd)


def _clear_head(fd: int) -> None:
    """The head of an empty log: a blank record, which reads as "no row yet"."""
    os.pwrite(fd, b" " * _HEAD_SIZE, 0)
    os.fdatasync(fd)


def _read_head(fd: int, path: Path) -> tuple[int, str] | None:
    """The (row id, hash) the head file names; None when it is empty (no row yet).

    Raises:
        AuditChainError: the file is not a head record or fails its checksum; names ``path``.
    """
    try:
        raw = os.pread(fd, _HEAD_SIZE, 0).decode("ascii", errors="replace").strip()
    except OSError as exc:
        raise AuditChainError(f"audit head file {path} cannot be read: {exc}") from exc
    if not raw:
        return None
    parts = raw.split(" ")
    if len(parts) != 5 or " ".join(parts[:2]) != _HEAD_MAGIC or not parts[2].isdigit():
        raise AuditChainError(f"audit head file {path} is not an agentmend audit head")
    body = " ".join(parts[:4])
    if hashlib.sha256(body.encode("ascii")).hexdigest()[:16] != parts[4]:
        raise AuditChainError(
            f"audit head file {path}: its checksum does not match (torn or edited)"
        )
    return int(parts[2]), parts[3]


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
