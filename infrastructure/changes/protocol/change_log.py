"""The durable record of what the loop changed: tables and queries.

``ChangeLog`` is the SQL behind
:class:`~agentmend.infrastructure.changes.improvement_manager.ImprovementManager`:
one row per change (``changes``) and one per file it touched (``change_files``, holding the old
bytes so a rollback can restore them exactly). Every query the manager runs on a hot path is
served by an index, so logging, applying and rolling back cost the same with ten changes
stored as with ten thousand. The orchestrator's plans and decisions live in
:mod:`agentmend.infrastructure.changes.protocol.decisions`; their names are re-exported here for
existing callers.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentmend.infrastructure.changes.protocol.decisions import migrate_plan_tables
from agentmend.infrastructure.models import (
    ChangeRecord,
    ChangeStatus,
    FileChange,
    ImprovementAction,
    utc_now,
)
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection, deferred, join_in_order

__all__ = ["ChangeLog", "ChangeRow", "StoredFile"]

_CHANGE_MIGRATIONS = [
    """
    CREATE TABLE changes (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        change_id TEXT NOT NULL UNIQUE,
        created TEXT NOT NULL,
        updated TEXT NOT NULL,
        target_agent TEXT NOT NULL,
        action_type TEXT NOT NULL,
        action TEXT NOT NULL,
        status TEXT NOT NULL,
        applied_by TEXT NOT NULL,
        session_id TEXT NOT NULL,
        group_id TEXT,
        root TEXT,
        applied_at TEXT,
        verification TEXT,
        rollback_info TEXT,
        rollback_pending TEXT,
        unfinished INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX changes_agent ON changes (target_agent, seq);
    CREATE INDEX changes_session ON changes (session_id, seq);
    CREATE INDEX changes_status ON changes (status, seq);
    CREATE INDEX changes_group ON changes (group_id) WHERE group_id IS NOT NULL;
    CREATE INDEX changes_unfinished ON changes (root) WHERE unfinished = 1;
    CREATE TABLE change_files (
        change_id TEXT NOT NULL REFERENCES changes (change_id),
        seq INTEGER NOT NULL,
        path TEXT NOT NULL,
        rel_path TEXT NOT NULL,
        old_sha256 TEXT,
        new_sha256 TEXT,
        old_bytes BLOB,
        PRIMARY KEY (change_id, path)
    );
    CREATE INDEX change_files_path ON change_files (path, seq)
    """,
    # the team the root holds (its id is the same on every host; the root path is not)
    """
    ALTER TABLE changes ADD COLUMN team_id TEXT;
    CREATE INDEX changes_team ON changes (team_id, seq)
    """,
]

_ROW_COLUMNS = (
    "seq, change_id, created, action, status, applied_by, verification, rollback_info, "
    "group_id, root, rollback_pending"
)
_LIVE = (ChangeStatus.APPLIED.value, ChangeStatus.KEPT.value)


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclass(frozen=True, slots=True)
class ChangeRow:
    """A change as the protocol needs it: its record plus where its files live."""

    seq: int
    record: ChangeRecord
    root: str | None
    rollback_pending: dict[str, Any] | None

    @property
    def change_id(self) -> str:
        return self.record.change_id

    @property
    def status(self) -> ChangeStatus:
        return self.record.status


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One file of a change, with the bytes it held before (None: it did not exist)."""

    change_id: str
    seq: int
    path: str
    rel_path: str
    old_sha256: str | None
    new_sha256: str | None
    old_bytes: bytes | None


class ChangeLog:
    """Queries over ``changes`` and ``change_files``; the caller owns transactions."""

    def __init__(self, store: Store) -> None:
        store.migrate("changes", _CHANGE_MIGRATIONS)
        migrate_plan_tables(store)
        self.store = store

    @staticmethod
    def new_id() -> str:
        # 48 random bits: 8 hex digits (32 bits) would collide within ~10^5 changes.
        return secrets.token_hex(6)  # as uuid4().hex[:12] (all random digits), a third the cost

    def insert(
        self,
        conn: StoreConnection,
        *,
        change_id: str,
        action: ImprovementAction,
        status: ChangeStatus,
        applied_by: str,
        session_id: str,
        created: datetime,
        group_id: str | None = None,
        root: str | None = None,
        verification: dict[str, Any] | None = None,
        team_id: str | None = None,
    ) -> int:
        """Insert one change; returns its ``seq`` (its place in the history)."""
        return self._insert(conn, locals(), returning=True)

    def add(
        self,
        conn: StoreConnection,
        *,
        change_id: str,
        action: ImprovementAction,
        status: ChangeStatus,
        applied_by: str,
        session_id: str,
        created: datetime,
        group_id: str | None = None,
        root: str | None = None,
        team_id: str | None = None,
    ) -> None:
        """:meth:`insert` reading nothing back: inside a
        :func:`~agentmend.infrastructure.store.sql.pipelined` block it waits for nothing and
        shares the block's one round trip."""
        change = {
            "change_id": change_id, "action": action, "status": status, "applied_by": applied_by,
            "session_id": session_id, "created": created, "group_id": group_id, "root": root,
            "verification": None, "team_id": team_id,
        }  # fmt: skip
        self._insert(conn, change, returning=False)

    def _insert(self, conn: StoreConnection, change: dict[str, Any], *, returning: bool) -> int:
        change_id, action, status = change["change_id"], change["action"], change["status"]
        created, root = change["created"], change["root"]
        now = created.isoformat()
        applied = status in (ChangeStatus.APPLIED, ChangeStatus.KEPT, ChangeStatus.ROLLED_BACK)
        cursor = conn.execute(
            "INSERT INTO changes (change_id, created, updated, target_agent, action_type, action,"
            " status, applied_by, session_id, group_id, root, applied_at, verification,"
            " unfinished, team_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
            + (" RETURNING seq" if returning else ""),
            (
                change_id,
                now,
                now,
                action.target_agent,
                action.action_type.value,
                action.model_dump_json(fallback=repr),
                status.value,
                change["applied_by"],
                change["session_id"],
                change["group_id"],
                root,
                now if applied else None,
                _dump(change["verification"]),
                int(root is not None and status is ChangeStatus.PENDING),
                change["team_id"],
            ),
        )
        return int(cursor.fetchone()[0]) if returning else 0

    def insert_file(self, conn: StoreConnection, file: StoredFile) -> None:
        conn.execute(
            "INSERT INTO change_files (change_id, seq, path, rel_path, old_sha256, new_sha256,"
            " old_bytes) VALUES (?,?,?,?,?,?,?)",
            (
                file.change_id,
                file.seq,
                file.path,
                file.rel_path,
                file.old_sha256,
                file.new_sha256,
                file.old_bytes,
            ),
        )

    def insert_file_of_new(self, conn: StoreConnection, file: StoredFile) -> None:
        """:meth:`insert_file` for a change inserted just before in this transaction, whose
        ``seq`` the statement reads itself: nothing waits for the change's insert to answer,
        so both go in one round trip (``file.seq`` is not used)."""
        conn.execute(
            "INSERT INTO change_files (change_id, seq, path, rel_path, old_sha256, new_sha256,"
            " old_bytes) VALUES (?, (SELECT seq FROM changes WHERE change_id = ?), ?,?,?,?,?)",
            (
                file.change_id,
                file.change_id,
                file.path,
                file.rel_path,
                file.old_sha256,
                file.new_sha256,
                file.old_bytes,
            ),
        )

    def set_status(
        self,
        conn: StoreConnection,
        change_ids: Sequence[str],
        status: ChangeStatus,
        *,
        rollback_info: dict[str, Any] | None = None,
        verification: dict[str, Any] | None = None,
    ) -> None:
        """Move changes to ``status``; settles any unfinished work recorded on them."""
        now = utc_now().isoformat()
        for change_id in change_ids:
            conn.execute(
                "UPDATE changes SET status = ?, updated = ?, unfinished = 0,"
                " rollback_pending = NULL,"
                " applied_at = CASE WHEN ? = 1 THEN coalesce(applied_at, ?) ELSE applied_at END,"
                " rollback_info = coalesce(?, rollback_info),"
                " verification = coalesce(?, verification) WHERE change_id = ?",
                (
                    status.value,
                    now,
                    int(status is ChangeStatus.APPLIED),
                    now,
                    _dump(rollback_info),
                    _dump(verification),
                    change_id,
                ),
            )

    def mark_rolling_back(
        self, conn: StoreConnection, change_ids: Iterable[str], request: dict[str, Any]
    ) -> None:
        """Record a rollback's intent before its files are touched (recovery finishes it)."""
        text = json.dumps(request)
        for change_id in change_ids:
            conn.execute(
                "UPDATE changes SET rollback_pending = ?, unfinished = 1 WHERE change_id = ?",
                (text, change_id),
            )

    # -- reads -----------------------------------------------------------------------------

    def _rows(self, where: str, params: Sequence[Any], suffix: str = "") -> list[ChangeRow]:
        conn = self.store.connection()
        rows = conn.execute(
            f"SELECT {_ROW_COLUMNS} FROM changes {where} {suffix}", tuple(params)
        ).fetchall()
        if not rows:
            return []
        ids = [r[1] for r in rows]
        files: dict[str, list[FileChange]] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for change_id, path, old, new in conn.execute(
                "SELECT change_id, path, old_sha256, new_sha256 FROM change_files"
                f" WHERE change_id IN ({marks}) ORDER BY path",
                chunk,
            ):
                files.setdefault(change_id, []).append(
                    FileChange(path=path, old_sha256=old, new_sha256=new)
                )
        return [_change_row(r, tuple(files.get(r[1], ()))) for r in rows]

    def get(self, change_id: str) -> ChangeRow | None:
        rows = self._rows("WHERE change_id = ?", (change_id,))
        return rows[0] if rows else None

    def team_of(self, change_id: str) -> str | None:
        """The team whose folder ``change_id`` changed (None: unknown, or logged only)."""
        row = (
            self.store.connection()
            .execute("SELECT team_id FROM changes WHERE change_id = ?", (change_id,))
            .fetchone()
        )
        return None if row is None or row[0] is None else str(row[0])

    def by_session(self, session_id: str) -> list[ChangeRow]:
        return self._rows("WHERE session_id = ?", (session_id,), "ORDER BY seq")

    def history(self, agent_name: str | None, limit: int) -> list[ChangeRow]:
        """The newest ``limit`` changes (optionally of one agent), oldest first."""
        if agent_name is None:
            rows = self._rows("", (limit,), "ORDER BY seq DESC LIMIT ?")
        else:
            rows = self._rows(
                "WHERE target_agent = ?", (agent_name, limit), "ORDER BY seq DESC LIMIT ?"
            )
        return rows[::-1]

    def latest_applied(self) -> ChangeRow | None:
        rows = self._rows(
            "WHERE status = ?", (ChangeStatus.APPLIED.value,), "ORDER BY seq DESC LIMIT 1"
        )
        return rows[0] if rows else None

    def recent_statuses(self, count: int) -> list[ChangeStatus]:
        rows = (
            self.store.connection()
            .execute("SELECT status FROM changes ORDER BY seq DESC LIMIT ?", (count,))
            .fetchall()
        )
        return [ChangeStatus(r[0]) for r in rows]

    def live_group(self, row: ChangeRow) -> list[ChangeRow]:
        """The APPLIED or KEPT members of ``row``'s group (just ``row`` without a group)."""
        if row.record.group_id is None:
            return [row]
        return self._rows(
            "WHERE group_id = ? AND status IN (?, ?)", (row.record.group_id, *_LIVE), "ORDER BY seq"
        )

    def files(self, change_ids: Sequence[str]) -> list[StoredFile]:
        """The files of the given changes, with their old bytes."""
        conn = self.store.connection()
        out: list[StoredFile] = []
        for start in range(0, len(change_ids), 500):
            chunk = list(change_ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            out.extend(
                StoredFile(*r)
                for r in conn.execute(
                    "SELECT change_id, seq, path, rel_path, old_sha256, new_sha256, old_bytes"
                    f" FROM change_files WHERE change_id IN ({marks})",
                    chunk,
                )
            )
        out.sort(key=lambda f: f.seq)
        return out

    def live_changes_on(self, path: str, after_seq: int) -> list[ChangeRow]:
        """APPLIED or KEPT changes to ``path`` made after ``after_seq``: work built on it."""
        # Driven by the (path, seq) index: it costs the later changes to this one file, never
        # the whole history (CROSS JOIN keeps the planner from starting at changes_status).
        conn = self.store.connection()
        ids = [
            r[0]
            for r in conn.execute(
                f"SELECT c.change_id FROM change_files f {join_in_order(conn)} changes c"
                " ON c.change_id = f.change_id"
                " WHERE f.path = ? AND f.seq > ? AND c.status IN (?, ?)",
                (path, after_seq, *_LIVE),
            )
        ]
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        return self._rows(f"WHERE change_id IN ({marks})", ids, "ORDER BY seq")

    def live_closure(self, members: Sequence[ChangeRow]) -> list[ChangeRow]:
        """``members`` plus every live change built on their files, with its group, oldest first.

        What a cascade rollback of ``members`` (a live group) undoes: each later APPLIED or KEPT
        change to one of their files, and, since a group rolls back whole, the rest of its
        group, and so on until nothing more is found.
        """
        selected: dict[str, ChangeRow] = {}
        frontier = list(members)
        while frontier:
            for member in frontier:
                selected[member.change_id] = member
            found: dict[str, ChangeRow] = {}
            for file in self.files([member.change_id for member in frontier]):
                for later in self.live_changes_on(file.path, file.seq):
                    if later.change_id not in selected:
                        found.update((m.change_id, m) for m in self.live_group(later))
            frontier = [member for cid, member in found.items() if cid not in selected]
        return sorted(selected.values(), key=lambda member: member.seq)

    def live_by(self, target_agent: str, applied_by: str) -> list[ChangeRow]:
        """The APPLIED or KEPT changes of ``target_agent`` attributed to ``applied_by``.

        Every match, however old: recovery looks for the changes of one interrupted run.
        """
        return self._rows(
            "WHERE target_agent = ? AND applied_by = ? AND status IN (?, ?)",
            (target_agent, applied_by, *_LIVE),
            "ORDER BY seq",
        )

    def ask_unfinished(self, conn: StoreConnection, root: str) -> Callable[[], bool]:
        """Whether ``root`` has unfinished changes, asked now and read later (see
        :func:`~agentmend.infrastructure.store.sql.deferred`)."""
        rows = deferred(
            conn, "SELECT count(*) FROM changes WHERE unfinished = 1 AND root = ?", (root,)
        )
        return lambda: int(rows()[0][0]) > 0

    def unfinished(self, root: str) -> list[ChangeRow]:
        return self._rows("WHERE unfinished = 1 AND root = ?", (root,), "ORDER BY seq")

    def unfinished_roots(self) -> list[str]:
        rows = (
            self.store.connection()
            .execute("SELECT DISTINCT root FROM changes WHERE unfinished = 1")
            .fetchall()
        )
        return [str(r[0]) for r in rows]

    def statistics(self) -> tuple[dict[ChangeStatus, int], dict[str, int]]:
        conn = self.store.connection()
        by_status = {
            ChangeStatus(status): int(count)
            for status, count in conn.execute("SELECT status, count(*) FROM changes GROUP BY 1")
        }
        by_agent = {
            str(agent): int(count)
            for agent, count in conn.execute(
                "SELECT target_agent, count(*) FROM changes GROUP BY 1 ORDER BY 1"
            )
        }
        return by_status, by_agent


def _change_row(row: tuple[Any, ...], files: tuple[FileChange, ...]) -> ChangeRow:
    seq, change_id, created, action, status, applied_by, verification, rollback, group, root = row[
        :10
    ]
    record = ChangeRecord(
        change_id=change_id,
        timestamp=datetime.fromisoformat(created),
        action=ImprovementAction.model_validate_json(action),
        status=ChangeStatus(status),
        applied_by=applied_by,
        verification_result=_load(verification),
        rollback_info=_load(rollback),
        group_id=group,
        files=files,
    )
    return ChangeRow(int(seq), record, root, _load(row[10]))
