"""The durable record of what the loop changed, planned and decided: tables and queries.

``ChangeLog`` is the SQL behind
:class:`~infrastructure.changes.improvement_manager.ImprovementManager`:
one row per change (``changes``) and one per file it touched (``change_files``, holding the old
bytes so a rollback can restore them exactly). Every query the manager runs on a hot path is
served by an index, so logging, applying and rolling back cost the same with ten changes
stored as with ten thousand. ``plans`` and ``decisions`` are small typed tables for the
orchestrator's plans and the decisions taken along the loop.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import uuid4

from infrastructure.models import (
    ChangeRecord,
    ChangeStatus,
    FileChange,
    ImprovementAction,
    utc_now,
)
from infrastructure.store import Store

__all__ = [
    "ChangeLog",
    "ChangeRow",
    "Decision",
    "Plan",
    "StoredFile",
    "get_plan",
    "list_decisions",
    "list_plans",
    "record_decision",
    "save_plan",
    "update_plan",
]

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
    """
]

_PLAN_MIGRATIONS = [
    """
    CREATE TABLE plans (
        plan_id TEXT PRIMARY KEY,
        created TEXT NOT NULL,
        status TEXT NOT NULL,
        description TEXT NOT NULL,
        payload TEXT NOT NULL,
        updated TEXT NOT NULL
    );
    CREATE INDEX plans_status ON plans (status, created);
    CREATE TABLE decisions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        timestamp TEXT NOT NULL,
        kind TEXT NOT NULL,
        agent_name TEXT,
        payload TEXT NOT NULL
    );
    CREATE INDEX decisions_kind ON decisions (kind, id);
    CREATE INDEX decisions_agent ON decisions (agent_name, id)
    """
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
        store.migrate("plans", _PLAN_MIGRATIONS)
        self.store = store

    @staticmethod
    def new_id() -> str:
        # 48 random bits: the seed's 8 hex digits collide within ~10^5 changes.
        return uuid4().hex[:12]

    def insert(
        self,
        conn: sqlite3.Connection,
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
    ) -> int:
        """Insert one change; returns its ``seq`` (its place in the history)."""
        now = created.isoformat()
        applied = status in (ChangeStatus.APPLIED, ChangeStatus.KEPT, ChangeStatus.ROLLED_BACK)
        cursor = conn.execute(
            "INSERT INTO changes (change_id, created, updated, target_agent, action_type, action,"
            " status, applied_by, session_id, group_id, root, applied_at, verification,"
            " unfinished) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                change_id,
                now,
                now,
                action.target_agent,
                action.action_type.value,
                action.model_dump_json(fallback=repr),
                status.value,
                applied_by,
                session_id,
                group_id,
                root,
                now if applied else None,
                _dump(verification),
                int(root is not None and status is ChangeStatus.PENDING),
            ),
        )
        return int(cursor.lastrowid or 0)

    def insert_file(self, conn: sqlite3.Connection, file: StoredFile) -> None:
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

    def set_status(
        self,
        conn: sqlite3.Connection,
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
                " applied_at = CASE WHEN ? THEN coalesce(applied_at, ?) ELSE applied_at END,"
                " rollback_info = coalesce(?, rollback_info),"
                " verification = coalesce(?, verification) WHERE change_id = ?",
                (
                    status.value,
                    now,
                    status is ChangeStatus.APPLIED,
                    now,
                    _dump(rollback_info),
                    _dump(verification),
                    change_id,
                ),
            )

    def mark_rolling_back(
        self, conn: sqlite3.Connection, change_ids: Iterable[str], request: dict[str, Any]
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
        ids = [
            r[0]
            for r in self.store.connection().execute(
                "SELECT c.change_id FROM change_files f CROSS JOIN changes c"
                " ON c.change_id = f.change_id"
                " WHERE f.path = ? AND f.seq > ? AND c.status IN (?, ?)",
                (path, after_seq, *_LIVE),
            )
        ]
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        return self._rows(f"WHERE change_id IN ({marks})", ids, "ORDER BY seq")

    def live_by(self, target_agent: str, applied_by: str) -> list[ChangeRow]:
        """The APPLIED or KEPT changes of ``target_agent`` attributed to ``applied_by``.

        Every match, however old: recovery looks for the changes of one interrupted run.
        """
        return self._rows(
            "WHERE target_agent = ? AND applied_by = ? AND status IN (?, ?)",
            (target_agent, applied_by, *_LIVE),
            "ORDER BY seq",
        )

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


# -- plans and decisions -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """A plan the orchestrator made; ``payload`` is free-form JSON."""

    plan_id: str
    created: datetime
    status: str
    description: str
    payload: dict[str, Any]
    updated: datetime


@dataclass(frozen=True, slots=True)
class Decision:
    """A decision taken along the loop (a gate verdict, a keep, a human's approval, ...)."""

    id: int
    timestamp: datetime
    kind: str
    agent_name: str | None
    payload: dict[str, Any]


def _plan(row: tuple[Any, ...]) -> Plan:
    return Plan(
        row[0],
        datetime.fromisoformat(row[1]),
        row[2],
        row[3],
        json.loads(row[4]),
        datetime.fromisoformat(row[5]),
    )


def _decision(row: tuple[Any, ...]) -> Decision:
    return Decision(int(row[0]), datetime.fromisoformat(row[1]), row[2], row[3], json.loads(row[4]))


_PLAN_COLUMNS = "plan_id, created, status, description, payload, updated"


def save_plan(
    store: Store,
    *,
    description: str,
    payload: dict[str, Any] | None = None,
    status: str = "draft",
    plan_id: str | None = None,
) -> Plan:
    """Store a new plan and return it (``plan_id`` defaults to a fresh id)."""
    store.migrate("plans", _PLAN_MIGRATIONS)
    now = utc_now().isoformat()
    pid = plan_id or uuid4().hex[:12]
    with store.transaction() as conn:
        conn.execute(
            f"INSERT INTO plans ({_PLAN_COLUMNS}) VALUES (?,?,?,?,?,?)",
            (pid, now, status, description, json.dumps(payload or {}, default=str), now),
        )
    plan = get_plan(store, pid)
    assert plan is not None
    return plan


def get_plan(store: Store, plan_id: str) -> Plan | None:
    store.migrate("plans", _PLAN_MIGRATIONS)
    row = (
        store.connection()
        .execute(f"SELECT {_PLAN_COLUMNS} FROM plans WHERE plan_id = ?", (plan_id,))
        .fetchone()
    )
    return _plan(row) if row else None


def update_plan(
    store: Store,
    plan_id: str,
    *,
    status: str | None = None,
    description: str | None = None,
    payload: dict[str, Any] | None = None,
) -> Plan:
    """Change a plan's status, description or payload; raises KeyError for an unknown id."""
    store.migrate("plans", _PLAN_MIGRATIONS)
    with store.transaction() as conn:
        cursor = conn.execute(
            "UPDATE plans SET status = coalesce(?, status),"
            " description = coalesce(?, description), payload = coalesce(?, payload),"
            " updated = ? WHERE plan_id = ?",
            (
                status,
                description,
                None if payload is None else json.dumps(payload, default=str),
                utc_now().isoformat(),
                plan_id,
            ),
        )
        if cursor.rowcount == 0:
            raise KeyError(f"no plan with id {plan_id!r}")
    plan = get_plan(store, plan_id)
    assert plan is not None
    return plan


def list_plans(
    store: Store,
    *,
    status: str | None = None,
    limit: int | None = 50,
    payload: Mapping[str, str] | None = None,
) -> list[Plan]:
    """The newest ``limit`` plans (all with None), optionally filtered, oldest first.

    Args:
        status: only plans with this status (served by the ``plans_status`` index).
        limit: at most this many, the newest; None for every match. Recovery passes None:
            a plan a dead process left behind must be found however many came after it.
        payload: only plans whose payload holds these top-level string values (a code
            plan's ``kind`` and ``root``), filtered in SQL.
    """
    store.migrate("plans", _PLAN_MIGRATIONS)
    where: list[str] = []
    params: list[Any] = []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    for key, value in (payload or {}).items():
        if not key.isidentifier():
            raise ValueError(f"payload filter key {key!r} is not a plain field name")
        where.append("json_extract(payload, ?) = ?")
        params.extend((f"$.{key}", value))
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = (
        store.connection()
        .execute(
            f"SELECT {_PLAN_COLUMNS} FROM plans {clause} ORDER BY created DESC, rowid DESC LIMIT ?",
            (*params, -1 if limit is None else limit),
        )
        .fetchall()
    )
    return [_plan(r) for r in reversed(rows)]


def record_decision(
    store: Store,
    kind: str,
    *,
    agent_name: str | None = None,
    payload: dict[str, Any] | None = None,
    timestamp: datetime | None = None,
) -> Decision:
    """Append a decision and return it with its id."""
    store.migrate("plans", _PLAN_MIGRATIONS)
    stamp = timestamp or utc_now()
    text = json.dumps(payload or {}, default=str)
    with store.transaction() as conn:
        cursor = conn.execute(
            "INSERT INTO decisions (timestamp, kind, agent_name, payload) VALUES (?,?,?,?)",
            (stamp.isoformat(), kind, agent_name, text),
        )
        row_id = int(cursor.lastrowid or 0)
    return Decision(row_id, stamp, kind, agent_name, json.loads(text))


def list_decisions(
    store: Store, *, kind: str | None = None, agent_name: str | None = None, limit: int = 50
) -> list[Decision]:
    """The newest ``limit`` decisions (optionally filtered), oldest first."""
    store.migrate("plans", _PLAN_MIGRATIONS)
    where: list[str] = []
    params: list[Any] = []
    if kind is not None:
        where.append("kind = ?")
        params.append(kind)
    if agent_name is not None:
        where.append("agent_name = ?")
        params.append(agent_name)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = (
        store.connection()
        .execute(
            "SELECT id, timestamp, kind, agent_name, payload FROM decisions"
            f" {clause} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        .fetchall()
    )
    return [_decision(r) for r in reversed(rows)]
