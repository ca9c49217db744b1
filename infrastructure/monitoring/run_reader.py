"""The one reader of recorded runs: everything outside the monitor's writer reads them here.

The report and ``status`` (an agent's recent runs), rollouts (every run after a cursor), watches
on live changes (an agent's runs before and after a change) and retention (the runs a policy
may prune) all ask these functions; none of them names the ``executions`` table. So the table's
layout, its indexes and the cursor a reader keeps can change in one place
(``tests/project/test_layering.py`` holds every other module to it).

Each function takes a connection (a store's, a transaction's or a read-only snapshot's) and
answers for a store no monitor has written to yet as for one with no runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentmend.infrastructure.monitoring.agent_window import RUN
from agentmend.infrastructure.store.sql import StoreConnection, has_table

__all__ = [
    "RunRow",
    "last_run_id",
    "nth_newest_run_id",
    "outcomes_after",
    "production_runs",
    "recent_outcomes",
    "recent_runs",
    "run_ids",
    "run_times",
    "runs_after",
]

_TABLE = "executions"


@dataclass(frozen=True, slots=True)
class RunRow:
    """One recorded run as a cursor reads it: enough to attribute and judge it."""

    id: int
    source: str
    success: bool
    duration_ms: float
    extra: Any
    """The run's extra fields as stored (JSON text, or already decoded on PostgreSQL)."""


def _has_runs(conn: StoreConnection) -> bool:
    # no monitor may have written to this store yet (a failed statement would also end a
    # PostgreSQL transaction, so the catalogue is asked instead)
    return has_table(conn, _TABLE)


def last_run_id(conn: StoreConnection) -> int:
    """The id of the newest run in the store (0 if none): runs after it are "from now on"."""
    if not _has_runs(conn):
        return 0
    row = conn.execute(f"SELECT MAX(id) FROM {_TABLE}").fetchone()
    return int(row[0] or 0) if row else 0


def runs_after(conn: StoreConnection, cursor: int, limit: int) -> list[RunRow]:
    """Every agent's runs (of every source) with an id above ``cursor``, oldest first."""
    if not _has_runs(conn):
        return []
    rows = conn.execute(
        f"SELECT id, source, success, duration_ms, extra FROM {_TABLE} "
        "WHERE id > ? ORDER BY id LIMIT ?",
        (cursor, limit),
    ).fetchall()
    return [RunRow(int(i), str(s), bool(ok), float(d), extra) for i, s, ok, d, extra in rows]


def recent_runs(
    conn: StoreConnection, agent: str, limit: int, *, source: str = RUN
) -> list[tuple[bool, float]]:
    """(success, duration in ms) of ``agent``'s newest ``limit`` runs, newest first."""
    if not _has_runs(conn):
        return []
    rows = conn.execute(
        f"SELECT success, duration_ms FROM {_TABLE} WHERE agent = ? AND source = ? "
        "ORDER BY id DESC LIMIT ?",
        (agent, source, limit),
    ).fetchall()
    return [(bool(ok), float(duration)) for ok, duration in rows]


def production_runs(conn: StoreConnection) -> list[tuple[str, bool, float, float]]:
    """(agent, success, duration in ms, time) of every production run, oldest first: a small
    store's chart drawn from the runs themselves."""
    if not _has_runs(conn):
        return []
    rows = conn.execute(
        f"SELECT agent, success, duration_ms, ts FROM {_TABLE} WHERE source = ? ORDER BY id",
        (RUN,),
    ).fetchall()
    return [(str(a), bool(ok), float(d), float(ts)) for a, ok, d, ts in rows]


def outcomes_after(conn: StoreConnection, agent: str, after_id: int, limit: int) -> list[bool]:
    """Success of ``agent``'s first ``limit`` production runs with an id above ``after_id``,
    oldest first.

    What a watch on a live change reads: the runs are in the store, so a process that takes
    over the watch after a crash reads the same ones. Runs recorded apart (verification,
    a requested reproduction) are not live traffic and do not count.
    """
    if not _has_runs(conn):
        return []
    rows = conn.execute(
        f"SELECT success FROM {_TABLE} WHERE agent = ? AND source = ? AND id > ?"
        " ORDER BY id LIMIT ?",
        (agent, RUN, after_id, limit),
    ).fetchall()
    return [bool(ok) for (ok,) in rows]


def recent_outcomes(conn: StoreConnection, agent: str, limit: int) -> list[bool]:
    """Success of ``agent``'s newest ``limit`` production runs, oldest first (what a watched
    change is compared with: the agent as it ran just before the change)."""
    return [ok for ok, _ in reversed(recent_runs(conn, agent, limit))]


def run_ids(
    conn: StoreConnection, agent: str, source: str, *, after: int, through: int | None, limit: int
) -> list[int]:
    """Ids of ``agent``'s runs of ``source`` with ``after < id <= through`` (no upper bound for
    None), oldest first: the runs of a baseline segment retention keeps."""
    if not _has_runs(conn):
        return []
    bound = "" if through is None else " AND id <= ?"
    params: tuple[Any, ...] = (agent, source, after) + (() if through is None else (through,))
    rows = conn.execute(
        f"SELECT id FROM {_TABLE} WHERE agent = ? AND source = ? AND id > ?{bound}"
        " ORDER BY id LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [int(i) for (i,) in rows]


def run_times(
    conn: StoreConnection, agent: str, source: str, *, after: int, before: int, limit: int
) -> list[tuple[int, float]]:
    """(id, time) of ``agent``'s runs of ``source`` with ``after < id < before``, oldest first:
    the pages retention walks."""
    if not _has_runs(conn):
        return []
    rows = conn.execute(
        f"SELECT id, ts FROM {_TABLE} WHERE agent = ? AND source = ? AND id > ? AND id < ?"
        " ORDER BY id LIMIT ?",
        (agent, source, after, before, limit),
    ).fetchall()
    return [(int(i), float(ts)) for i, ts in rows]


def nth_newest_run_id(conn: StoreConnection, agent: str, source: str, n: int) -> int | None:
    """The id of the agent's ``n``-th newest run of ``source`` (None if it has fewer)."""
    if not _has_runs(conn):
        return None
    row = conn.execute(
        f"SELECT id FROM {_TABLE} WHERE agent = ? AND source = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
        (agent, source, n - 1),
    ).fetchone()
    return None if row is None else int(row[0])
