"""The orchestrator's plans and the decisions taken along the loop: two small typed tables.

A plan is what the orchestrator set out to do (a code update, a cycle), with a status it moves
through and a free-form JSON payload; a decision is one append-only entry (a gate verdict, a
keep, a human's approval) that says why the loop did what it did. Both live in the one store,
under the ``plans`` migration component, next to the change history of
:mod:`agentmend.infrastructure.changes.protocol.change_log` (which creates them too, so a store
opened by the change machinery always has them). Every function migrates first, so any store will
do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import uuid4

from agentmend.infrastructure.errors import InvalidArgument, NotFound
from agentmend.infrastructure.models import utc_now
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import backend_of, json_text
from agentmend.infrastructure.store.storable import json_document

__all__ = [
    "Decision",
    "Plan",
    "get_plan",
    "list_decisions",
    "list_plans",
    "migrate_plan_tables",
    "record_decision",
    "save_plan",
    "update_plan",
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


def migrate_plan_tables(store: Store) -> None:
    """Create or upgrade the ``plans`` and ``decisions`` tables of ``store`` (idempotent)."""
    store.migrate("plans", _PLAN_MIGRATIONS)


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


def _payload_text(payload: dict[str, Any]) -> str:
    """A plan's or decision's payload as the JSON text stored (written before any transaction).

    Raises:
        InvalidArgument: no JSON can hold it (a cycle, nesting past the recursion limit).
    """
    try:
        return json_document(payload)
    except ValueError as exc:
        raise InvalidArgument("payload", type(payload).__name__, str(exc)) from None


def save_plan(
    store: Store,
    *,
    description: str,
    payload: dict[str, Any] | None = None,
    status: str = "draft",
    plan_id: str | None = None,
) -> Plan:
    """Store a new plan and return it (``plan_id`` defaults to a fresh id).

    Raises:
        InvalidArgument: no JSON can hold the payload (nothing is stored).
    """
    store.migrate("plans", _PLAN_MIGRATIONS)
    now = utc_now().isoformat()
    pid = plan_id or uuid4().hex[:12]
    text = _payload_text(payload or {})
    with store.transaction() as conn:
        conn.execute(
            f"INSERT INTO plans ({_PLAN_COLUMNS}) VALUES (?,?,?,?,?,?)",
            (pid, now, status, description, text, now),
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
    """Change a plan's status, description or payload.

    Raises:
        NotFound: no plan has that id (also a ``KeyError``).
        InvalidArgument: no JSON can hold the payload (the plan is left as it was).
    """
    store.migrate("plans", _PLAN_MIGRATIONS)
    text = None if payload is None else _payload_text(payload)
    with store.transaction() as conn:
        cursor = conn.execute(
            "UPDATE plans SET status = coalesce(?, status),"
            " description = coalesce(?, description), payload = coalesce(?, payload),"
            " updated = ? WHERE plan_id = ?",
            (
                status,
                description,
                text,
                utc_now().isoformat(),
                plan_id,
            ),
        )
        if cursor.rowcount == 0:
            raise NotFound("plan", plan_id)
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
    conn = store.connection()
    where: list[str] = []
    params: list[Any] = []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    for key, value in (payload or {}).items():
        if not key.isidentifier():
            raise InvalidArgument("payload filter key", key, "is not a plain field name")
        where.append(f"{json_text(conn, 'payload', key)} = ?")
        params.append(value)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    if limit is not None:
        params.append(limit)
    # plans made in the same microsecond: the later insert first on SQLite (its rowid), by id
    # on PostgreSQL, which keeps no insertion order
    tiebreak = "rowid" if backend_of(conn) == "sqlite" else "plan_id"
    rows = conn.execute(
        f"SELECT {_PLAN_COLUMNS} FROM plans {clause} ORDER BY created DESC, {tiebreak} DESC"
        + (" LIMIT ?" if limit is not None else ""),
        params,
    ).fetchall()
    return [_plan(r) for r in reversed(rows)]


def record_decision(
    store: Store,
    kind: str,
    *,
    agent_name: str | None = None,
    payload: dict[str, Any] | None = None,
    timestamp: datetime | None = None,
) -> Decision:
    """Append a decision and return it with its id.

    Raises:
        InvalidArgument: no JSON can hold the payload (nothing is stored).
    """
    store.migrate("plans", _PLAN_MIGRATIONS)
    stamp = timestamp or utc_now()
    text = _payload_text(payload or {})
    with store.transaction() as conn:
        cursor = conn.execute(
            "INSERT INTO decisions (timestamp, kind, agent_name, payload) VALUES (?,?,?,?)"
            " RETURNING id",
            (stamp.isoformat(), kind, agent_name, text),
        )
        row_id = int(cursor.fetchone()[0])
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
