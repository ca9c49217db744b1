"""Reading many recorded cycles at once, and the cycle of one change, without a scan per cycle.

``replay_cycle`` finds one cycle's events by looking through every cycle event in the store,
which is right for one cycle and quadratic for a page of hundreds. These readers go by row id
instead: a cycle's events all come after its ``cycle_started`` decision, so the latest N cycles
are one range read from the oldest of their starts, and a change's cycle is found through the
``change_applied`` event that names it. Both fold the same events ``replay_cycle`` folds, so
the results are equal to it. Older cycles, shown as a table row each, are read as a summary from
their first and last events alone (``cycle_summaries``): folding every event of hundreds of
cycles costs seconds, and a row shows none of them. A cycle that ended ``watching`` is shown
with its watch's verdict once there is one (``cycle.with_watch_verdict``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from agentmend.infrastructure.changes.protocol.decisions import migrate_plan_tables
from agentmend.infrastructure.changes.watch import read_watch
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import (
    StoreConnection,
    json_list_holds,
    json_text,
    unindexed,
)
from agentmend.loop.cycle import (
    DECISION_PREFIX,
    CycleEvent,
    CycleResult,
    fold_events,
    with_watch_verdict,
)

__all__ = ["CycleSummary", "cycle_of_change", "cycle_summaries", "latest_cycles"]

_STARTED = DECISION_PREFIX + "cycle_started"
_FINISHED = DECISION_PREFIX + "cycle_finished"
_APPLIED = DECISION_PREFIX + "change_applied"


def latest_cycles(store: Store, *, limit: int = 50) -> list[CycleResult]:
    """The newest ``limit`` cycles, newest first, read in one pass from the oldest's start."""
    migrate_plan_tables(store)
    conn = store.connection()
    starts = conn.execute(
        f"SELECT id, {json_text(conn, 'payload', 'cycle_id')} FROM decisions WHERE kind = ? "
        "ORDER BY id DESC LIMIT ?",
        (_STARTED, limit),
    ).fetchall()
    if not starts:
        return []
    wanted = [str(cycle_id) for _, cycle_id in starts]
    events = _events_from(conn, int(starts[-1][0]), set(wanted))
    return [
        with_watch_verdict(store, fold_events(events[cycle_id]))
        for cycle_id in wanted
        if cycle_id in events
    ]


@dataclass(frozen=True, slots=True)
class CycleSummary:
    """A cycle as one row of a table: its id, start, issue and outcome (as its fold says)."""

    cycle_id: str
    started_at: datetime
    issue: IssueReport
    status: str
    """How it ended; ``error`` for a cycle that never finished, as ``fold_events`` has it."""


def cycle_summaries(store: Store, *, skip: int = 0, limit: int = 500) -> list[CycleSummary]:
    """Up to ``limit`` cycles after the newest ``skip``, newest first, from their first and
    last events only."""
    migrate_plan_tables(store)
    conn = store.connection()
    starts = conn.execute(
        "SELECT id, timestamp, payload FROM decisions WHERE kind = ? "
        "ORDER BY id DESC LIMIT ? OFFSET ?",
        (_STARTED, limit, skip),
    ).fetchall()
    if not starts:
        return []
    statuses = {
        str(cycle_id): _status(store, str(status), watch_id)
        for cycle_id, status, watch_id in conn.execute(
            f"SELECT {json_text(conn, 'payload', 'cycle_id')},"
            f" {json_text(conn, 'payload', 'data.status')},"
            f" {json_text(conn, 'payload', 'data.watch_id')} "
            "FROM decisions WHERE kind = ? AND id >= ? ORDER BY id",
            (_FINISHED, int(starts[-1][0])),
        )
    }
    summaries = []
    for _, stamp, payload in starts:
        started = json.loads(payload)
        cycle_id = str(started["cycle_id"])
        summaries.append(
            CycleSummary(
                cycle_id=cycle_id,
                started_at=datetime.fromisoformat(stamp),
                issue=IssueReport.model_validate(started["data"]["issue"]),
                status=statuses.get(cycle_id, "error"),
            )
        )
    return summaries


def cycle_of_change(store: Store, change_id: str) -> CycleResult | None:
    """The cycle that applied ``change_id``, or None (a change applied outside a cycle)."""
    migrate_plan_tables(store)
    conn = store.connection()
    applied = conn.execute(
        f"SELECT id, {json_text(conn, 'payload', 'cycle_id')} FROM decisions WHERE kind = ? AND "
        f"{json_list_holds(conn, 'payload', 'data.change_ids')} ORDER BY id DESC LIMIT 1",
        (_APPLIED, change_id),
    ).fetchone()
    if applied is None:
        return None
    cycle_id = str(applied[1])
    start = conn.execute(
        "SELECT id FROM decisions WHERE kind = ? AND id <= ? "
        f"AND {json_text(conn, 'payload', 'cycle_id')} = ? ORDER BY id DESC LIMIT 1",
        (_STARTED, int(applied[0]), cycle_id),
    ).fetchone()
    if start is None:  # the store lost the cycle's start: nothing whole to fold
        return None
    events = _events_from(conn, int(start[0]), {cycle_id})
    return with_watch_verdict(store, fold_events(events[cycle_id]))


def _status(store: Store, status: str, watch_id: object) -> str:
    """A cycle's status for a table row: a watched cycle's is its watch's verdict once given."""
    if status != "watching" or not watch_id:
        return status
    watch = read_watch(store, str(watch_id))
    return watch.verdict if watch is not None else status


def _events_from(
    conn: StoreConnection, first_id: int, cycle_ids: set[str]
) -> dict[str, list[CycleEvent]]:
    """The events of ``cycle_ids`` recorded at or after decision ``first_id``, in order."""
    events: dict[str, list[CycleEvent]] = {}
    # every cycle event kind sorts in [cycle., cycle/); kept off the kind index, so the read is
    # the id range (the decisions since one start), not every cycle event ever
    kind = unindexed(conn, "kind")
    rows = conn.execute(
        f"SELECT timestamp, payload, {json_text(conn, 'payload', 'cycle_id')} FROM decisions "
        f"WHERE id >= ? AND {kind} >= 'cycle.' AND {kind} < 'cycle/' ORDER BY id",
        (first_id,),
    )
    for stamp, payload, cycle_id in rows:
        if cycle_id in cycle_ids:
            events.setdefault(cycle_id, []).append(
                CycleEvent.model_validate(
                    {**json.loads(payload), "timestamp": datetime.fromisoformat(stamp)}
                )
            )
    return events
