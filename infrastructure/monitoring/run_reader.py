"""The one reader of recorded runs: everything outside the monitor's writer reads them here.

The report and ``status`` (an agent's recent runs), rollouts (every run after a cursor), watches
on live changes (an agent's runs before and after a change) and retention (the runs a policy
may prune) all ask these functions; none of them names the ``executions`` table. So the table's
layout, its indexes and the cursor a reader keeps can change in one place
(``tests/project/test_layering.py`` holds every other module to it).

Each function takes a connection (a store's, a transaction's or a read-only snapshot's) and
answers for a store no monitor has written to yet as for one with no runs.

**The run cursor.** A reader that follows the runs (rollouts, watches, every monitor's refresh)
keeps a *position*: every run at or below it has been read, and none above it. On SQLite a
run's position is its id: one writer at a time gives ids in commit order. On PostgreSQL writers
append concurrently (no store-wide lock), so a run with a lower id may commit after one with a
higher id, and a reader at the higher id would skip it for good. There a run's position is its
*transaction's* id (``tx``: ``pg_current_xact_id()`` plus :data:`POSITION_OFFSET`), and a reader
reads only below the *horizon* (:func:`read_horizon`): no transaction that can still
commit has an id below it, so no run can appear there later, and a cursor is exact whatever
order writers commit in and whatever else their transactions did first. It is still one
integer (a rollout's and a watch's stored cursor did not change type).

Outside a transaction the horizon is the oldest id among the transactions running in the
store's database (the sessions' ``backend_xid``, and prepared transactions), or the next id if
none runs, read in a statement before the one that reads below it: a transaction running
elsewhere on the server cannot write this database's runs, so it holds no reader back. Inside
a transaction it is the oldest transaction running on the whole server when the snapshot was
taken (``pg_snapshot_xmin``): exact for a snapshot, which a listing of sessions taken after it
is not. The price is latency, not loss: a run is read once every write transaction in the
database older than its own has ended. agentmend's own are short, and each of its sessions is
bounded by ``store_idle_transaction_timeout_s``. A monitor's refresh does not wait at all (see
``ExecutionStore``). The offset keeps positions above every id: a store's rows from before
positions existed have ``tx = id``, so a cursor kept then still reads on.

Two other horizons were tried. The oldest holder of a lock on the runs' table is exact only if
every transaction takes that lock before it has an id, which a savepoint rolled back (it
releases its locks, not its id) breaks: a cursor passed such a transaction and missed its runs.
``pg_snapshot_xmin`` alone is exact everywhere but waits for every write on the server, in
every database. A cursor per writer (the ``(writer, writer_seq)`` every run carries) would be a
map that grows with every process that ever recorded, which an integer column cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentmend.infrastructure.monitoring.agent_window import RUN
from agentmend.infrastructure.store.sql import StoreConnection, backend_of, has_table

__all__ = [
    "POSITION_DEFAULT",
    "POSITION_OFFSET",
    "RunRow",
    "last_run_id",
    "nth_newest_run_id",
    "outcomes_after",
    "position_column",
    "production_runs",
    "read_horizon",
    "recent_outcomes",
    "recent_runs",
    "run_ids",
    "run_times",
    "runs_after",
]

_TABLE = "executions"

POSITION_OFFSET = 1 << 48
"""Added to PostgreSQL transaction ids to make run positions, so they sit above every id a
store held before (a position below it is such an id)."""
POSITION_DEFAULT = f"CAST(CAST(pg_current_xact_id() AS TEXT) AS BIGINT) + {POSITION_OFFSET}"
"""The SQL that gives a PostgreSQL run its position: its transaction's id, offset."""
_HORIZON = (
    f"(CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS TEXT) AS BIGINT) + {POSITION_OFFSET})"
)


@dataclass(frozen=True, slots=True)
class RunRow:
    """One recorded run as a cursor reads it: enough to attribute and judge it."""

    id: int
    """The run's position (see the module's note): the cursor to keep once it is read."""
    source: str
    success: bool
    duration_ms: float
    extra: Any
    """The run's extra fields as stored (JSON text, or already decoded on PostgreSQL)."""


def _has_runs(conn: StoreConnection) -> bool:
    # no monitor may have written to this store yet (a failed statement would also end a
    # PostgreSQL transaction, so the catalogue is asked instead)
    return has_table(conn, _TABLE)


def position_column(conn: StoreConnection) -> str:
    """The column that holds a run's position: ``id`` on SQLite, ``tx`` on PostgreSQL."""
    return "id" if backend_of(conn) == "sqlite" else "tx"


# the next transaction id as of this statement's snapshot, then the ids of the transactions
# running in this database (read after the snapshot: one running at it is listed, or has ended)
_RUNNING_HERE = (
    "SELECT CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS TEXT) AS BIGINT),"
    " ARRAY(SELECT CAST(CAST(backend_xid AS TEXT) AS BIGINT) FROM pg_stat_activity"
    " WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND backend_xid IS NOT NULL UNION ALL SELECT CAST(CAST(transaction AS TEXT) AS BIGINT)"
    " FROM pg_prepared_xacts WHERE database = current_database())"
)
_XID_SPAN = 1 << 32


def read_horizon(conn: StoreConnection) -> int:
    """The lowest position a run committed later could still take: every run below it is in
    ``conn``'s view for good (inside a transaction, in its snapshot; outside one, in every
    statement after this one)."""
    if backend_of(conn) == "sqlite":
        row = conn.execute(f"SELECT COALESCE(MAX(id), 0) + 1 FROM {_TABLE}").fetchone()
        return int(row[0])
    if conn.in_transaction:
        return int(conn.execute(f"SELECT {_HORIZON}").fetchone()[0])
    upcoming, running = conn.execute(_RUNNING_HERE).fetchone()
    upcoming = int(upcoming)
    oldest = upcoming
    for xid in running or ():
        # a 32-bit id as the 64-bit one it is: running ids lie within 2**31 of the next id, and
        # one at or past it cannot hold the horizon below it
        behind = (upcoming - int(xid)) % _XID_SPAN
        if 0 < behind < _XID_SPAN // 2:
            oldest = min(oldest, upcoming - behind)
    return oldest + POSITION_OFFSET


def last_run_id(conn: StoreConnection) -> int:
    """A cursor past every run in the store (0 if none): runs after it are "from now on".

    On PostgreSQL a run still being written may land after it, as it commits after now, and
    so may a run committed just now while an older transaction of the database still runs.
    """
    if not _has_runs(conn):
        return 0
    return read_horizon(conn) - 1


def runs_after(conn: StoreConnection, cursor: int, limit: int) -> list[RunRow]:
    """Every agent's runs (of every source) past ``cursor``, oldest first: about ``limit``
    (a transaction's runs are never split, so the last one's may add a batch)."""
    if not _has_runs(conn):
        return []
    if backend_of(conn) == "sqlite":
        query = (
            f"SELECT id, source, success, duration_ms, extra FROM {_TABLE} "
            "WHERE id > ? ORDER BY id LIMIT ?"
        )
        params: tuple[Any, ...] = (cursor, limit)
    else:
        top = read_horizon(conn)  # in a statement before the one that reads below it
        query = (
            f"WITH b AS (SELECT COALESCE((SELECT e.tx FROM {_TABLE} e WHERE e.tx > ?"
            " AND e.tx < ? ORDER BY e.tx LIMIT 1 OFFSET ?), ?) AS last)"
            f" SELECT e.tx, e.source, e.success, e.duration_ms, e.extra FROM {_TABLE} e, b"
            " WHERE e.tx > ? AND e.tx <= b.last ORDER BY e.tx, e.id"
        )
        params = (cursor, top, max(limit - 1, 0), top - 1, cursor)
    rows = conn.execute(query, params).fetchall()
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
    """Success of ``agent``'s first ``limit`` production runs past the cursor ``after_id``
    (from :func:`last_run_id`), oldest first.

    What a watch on a live change reads: the runs are in the store, so a process that takes
    over the watch after a crash reads the same ones. Runs recorded apart (verification,
    a requested reproduction) are not live traffic and do not count.
    """
    if not _has_runs(conn):
        return []
    position = position_column(conn)
    # on PostgreSQL, below a horizon read in a statement before this one
    below = "" if position == "id" else f" AND tx < {read_horizon(conn)}"
    rows = conn.execute(
        f"SELECT success FROM {_TABLE} WHERE agent = ? AND source = ? AND {position} > ?"
        f"{below} ORDER BY {position}, id LIMIT ?",
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
