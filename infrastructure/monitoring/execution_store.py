"""The monitor's SQL: the executions table, the baseline epoch tables, their writes and reads.

Runs are appended in batches (multi-row INSERTs in one transaction) and never updated or
deleted, so a reader catches up incrementally by row id. ``id`` is the rowid: SQLite gives each
row max(id) + 1 under the write lock, so ids only grow in commit order (no AUTOINCREMENT: its
bookkeeping costs ~15 % of an insert for a guarantee not needed here).

A baseline lives here as an *epoch*: one baseline of one agent, whose runs are the agent's rows
inside the epoch's row-id segments. Starting a baseline closes the active epoch's open segment
at the last row and opens a child epoch; restoring one marks the child rolled back and gives the
parent a new open segment. So every process derives the same baseline from the same rows, and
a restart or another process rebuilds it exactly.

Each handle writes its rows tagged with its own ``writer`` id, which is how it reads back only
the rows *other* handles wrote (:meth:`ExecutionStore.read_foreign`): its own were counted when
they were recorded.

A row whose ``source`` is not one of ``SOURCES`` (written by another version, say) is skipped by
both readers, :meth:`ExecutionStore.load` and :meth:`ExecutionStore.read_foreign`: it may be a
run kept apart on purpose, as verification runs are, and counting it as a normal run would let
it feed detection and baselines. So a restart and a live refresh see the same runs.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from itertools import chain
from typing import Any, NamedTuple

from infrastructure.monitoring import execution_rollup, run_series
from infrastructure.monitoring.agent_window import (
    RECENT_ERRORS,
    RUN,
    SOURCES,
    AgentStats,
    Baseline,
    Row,
)
from infrastructure.store import Store

__all__ = ["ExecutionStore", "LoadedState", "last_run_id", "outcomes_after"]

_COMPONENT = "executions"
_ROWS_PER_INSERT = 100  # 1,000 bound parameters per statement, far below SQLite's limit
_COLUMNS = (
    "agent, source, success, duration_ms, error, input_tokens, output_tokens, cost_usd, ts, extra"
)

_MIGRATIONS = [
    """
    CREATE TABLE executions (
        id INTEGER PRIMARY KEY,
        agent TEXT NOT NULL,
        source TEXT NOT NULL,
        success INTEGER NOT NULL,
        duration_ms REAL NOT NULL,
        error TEXT,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_usd REAL NOT NULL,
        ts REAL NOT NULL,
        extra TEXT,
        writer TEXT NOT NULL
    );
    CREATE INDEX executions_by_agent ON executions (agent, source, id);
    CREATE TABLE baseline_epochs (
        agent TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        parent INTEGER,
        status TEXT NOT NULL,
        created_ts REAL NOT NULL,
        PRIMARY KEY (agent, epoch)
    );
    CREATE TABLE baseline_segments (
        agent TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        start_id INTEGER NOT NULL,
        end_id INTEGER,
        PRIMARY KEY (agent, epoch, start_id)
    )
    """,
    # the kept change that started an epoch, so errors from before it can be labelled with it
    "ALTER TABLE baseline_epochs ADD COLUMN label TEXT",
]


class LoadedState(NamedTuple):
    """A monitor's state as rebuilt from the tables: counters by source then agent, and each
    agent's active baseline (whose ``epoch`` is the agent's highest epoch in use)."""

    stats: dict[str, dict[str, AgentStats]]
    baselines: dict[str, Baseline]


class ExecutionStore:
    """One monitor's handle on the executions and baseline tables of a :class:`Store`.

    Not synchronised: the monitor serialises writes under its write lock and reads under its
    state lock. Errors are the store's (``sqlite3`` errors, ``StoreError``).
    """

    def __init__(self, store: Store, writer: str) -> None:
        store.migrate(_COMPONENT, _MIGRATIONS)
        store.migrate(run_series.COMPONENT, run_series.MIGRATIONS)  # after: it reads executions
        store.migrate(execution_rollup.COMPONENT, execution_rollup.MIGRATIONS)
        self.store = store
        self.writer = writer  # hex, safe to inline: own rows are told apart by it
        self.seen_id = 0  # every foreign row with id <= seen_id has been ingested
        values = f"(?,?,?,?,?,?,?,?,?,?,'{writer}')"
        head = f"INSERT INTO executions ({_COLUMNS}, writer) VALUES "
        self._insert_one = head + values
        self._insert_many = head + ",".join([values] * _ROWS_PER_INSERT)

    def insert(self, rows: list[Row]) -> None:
        """One transaction; multi-row INSERTs, about a third cheaper per row than executemany."""
        full = len(rows) - len(rows) % _ROWS_PER_INSERT
        with self.store.transaction() as conn:
            for i in range(0, full, _ROWS_PER_INSERT):
                conn.execute(
                    self._insert_many, list(chain.from_iterable(rows[i : i + _ROWS_PER_INSERT]))
                )
            if full < len(rows):
                conn.executemany(self._insert_one, rows[full:])
            run_series.add_runs(conn, rows)  # same transaction: the series never drifts
            execution_rollup.add_runs(conn, rows)  # nor the totals opening reads

    def read_foreign(
        self, active_epoch: Callable[[str], int | None], capacity: int
    ) -> tuple[list[Row], dict[str, Baseline]]:
        """Rows other writers committed since the last call, and the baselines to adopt.

        ``active_epoch(agent)`` is the epoch the caller holds active (None if none); every
        agent whose active epoch in the table differs gets its baseline rebuilt, from the rows
        ingested before this call (the returned rows then extend it), all in one snapshot.
        Rows of an unknown source are skipped, as :meth:`load` skips them.
        """
        conn = self.store.connection()
        conn.execute("BEGIN")  # one snapshot for rows and epochs
        adopted: dict[str, Baseline] = {}
        try:
            rows = conn.execute(
                f"SELECT id, {_COLUMNS} FROM executions WHERE id > ? AND writer != ? ORDER BY id",
                (self.seen_id, self.writer),
            ).fetchall()
            for agent, epoch in conn.execute(
                "SELECT agent, epoch FROM baseline_epochs WHERE status = 'active'"
            ).fetchall():
                if active_epoch(agent) != epoch:
                    adopted[agent] = self.load_baseline(agent, epoch, capacity)
        finally:
            conn.execute("COMMIT")
        if rows:
            self.seen_id = max(self.seen_id, rows[-1][0])
        return [
            (a, src, bool(ok), d, err, ti, to, c, ts, ex)
            for _, a, src, ok, d, err, ti, to, c, ts, ex in rows
            if src in SOURCES
        ], adopted

    def load(self, window: int, capacity: int) -> LoadedState:
        """Rebuild a monitor's state from the tables (one snapshot; unknown sources skipped)."""
        conn = self.store.connection()
        conn.execute("BEGIN")
        stats: dict[str, dict[str, AgentStats]] = {source: {} for source in SOURCES}
        baselines: dict[str, Baseline] = {}
        try:
            self.seen_id = upto = int(
                conn.execute("SELECT COALESCE(MAX(id), 0) FROM executions").fetchone()[0]
            )
            for total in execution_rollup.read_totals(conn):
                if total[1] in SOURCES:
                    stats[total[1]][total[0]] = _load_stats(conn, total, upto, window)
            for (agent,) in conn.execute(
                "SELECT agent FROM execution_totals WHERE source = ?"
                " UNION SELECT agent FROM baseline_epochs",
                (RUN,),
            ).fetchall():
                row = conn.execute(
                    "SELECT epoch FROM baseline_epochs WHERE agent = ? AND status = 'active'",
                    (agent,),
                ).fetchone()
                epoch = int(row[0]) if row else 0
                baselines[agent] = self.load_baseline(agent, epoch, capacity, counted=True)
                if epoch and agent in stats[RUN]:
                    _split_errors(conn, stats[RUN][agent], agent, epoch, upto)
        finally:
            conn.execute("COMMIT")
        return LoadedState(stats, baselines)

    def load_baseline(
        self, agent: str, epoch: int, capacity: int, *, counted: bool = False
    ) -> Baseline:
        """Rebuild a baseline from its segments, from the runs the caller has ingested
        (foreign rows up to ``seen_id`` and every row of its own).

        Each segment is read as an id range of the ``(agent, source, id)`` index, so the
        sample costs O(capacity) wherever the epoch starts. ``counted``: every row is ingested
        (a monitor opening), so the epoch's run count is read from its rollup instead of
        counted over all its rows.
        """
        conn = self.store.connection()
        segments = sorted(
            conn.execute(
                "SELECT start_id, end_id FROM baseline_segments WHERE agent = ? AND epoch = ?",
                (agent, epoch),
            ).fetchall()
            or [(0, None)]
        )
        base = Baseline(agent, epoch, capacity)
        runs = 0
        for start, end in segments:
            where = "agent = ? AND source = ? AND id > ? AND (id <= ? OR writer = ?)"
            params: list[Any] = [agent, RUN, start, self.seen_id, self.writer]
            if end is not None:
                where += " AND id <= ?"
                params.append(end)
            room = capacity - base.n
            if room > 0:
                sample = conn.execute(
                    f"SELECT success, duration_ms FROM executions WHERE {where}"
                    " ORDER BY id LIMIT ?",
                    (*params, room),
                ).fetchall()
                base._extend([bool(ok) for ok, _ in sample], [float(d) for _, d in sample])
            if not counted:
                runs += int(
                    conn.execute(
                        f"SELECT COUNT(*) FROM executions WHERE {where}", params
                    ).fetchone()[0]
                )
        base.runs = execution_rollup.baseline_runs(conn, agent, epoch) if counted else runs
        return base

    def start_epoch(self, agent: str, label: str | None = None) -> int:
        """Close the active epoch at the current last row and open a new child epoch.

        ``label`` names what started it (the kept change), shown with the errors before it.
        """
        with self.store.transaction() as conn:
            boundary = _last_id(conn)
            row = conn.execute(
                "SELECT epoch FROM baseline_epochs WHERE agent = ? AND status = 'active'", (agent,)
            ).fetchone()
            current = 0 if row is None else int(row[0])
            if row is None:  # the implicit first epoch: every run so far
                conn.execute(
                    "INSERT OR IGNORE INTO baseline_epochs (agent, epoch, parent, status,"
                    " created_ts) VALUES (?, 0, NULL, 'active', ?)",
                    (agent, time.time()),
                )
                conn.execute(
                    "INSERT OR IGNORE INTO baseline_segments VALUES (?, 0, 0, NULL)", (agent,)
                )
            epoch = int(
                conn.execute(
                    "SELECT COALESCE(MAX(epoch), 0) + 1 FROM baseline_epochs WHERE agent = ?",
                    (agent,),
                ).fetchone()[0]
            )
            _close_segment(conn, agent, current, boundary, "superseded")
            conn.execute(
                "INSERT INTO baseline_epochs (agent, epoch, parent, status, created_ts, label)"
                " VALUES (?, ?, ?, 'active', ?, ?)",
                (agent, epoch, current, time.time(), label),
            )
            conn.execute(
                "INSERT INTO baseline_segments VALUES (?, ?, ?, NULL)", (agent, epoch, boundary)
            )
        return epoch

    def restore_epoch(self, agent: str) -> int | None:
        """Mark the active epoch rolled back and reopen its parent; None if it has none."""
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT epoch, parent FROM baseline_epochs WHERE agent = ? AND status = 'active'",
                (agent,),
            ).fetchone()
            if row is None or row[1] is None:
                return None
            current, parent = int(row[0]), int(row[1])
            boundary = _last_id(conn)
            _close_segment(conn, agent, current, boundary, "rolled_back")
            conn.execute(
                "UPDATE baseline_epochs SET status = 'active' WHERE agent = ? AND epoch = ?",
                (agent, parent),
            )
            conn.execute(
                "INSERT OR REPLACE INTO baseline_segments VALUES (?, ?, ?, NULL)",
                (agent, parent, boundary),
            )
        return parent


def _load_stats(
    conn: sqlite3.Connection, total: tuple[Any, ...], upto: int, window: int
) -> AgentStats:
    """One agent's counters for one source from its rollup row, as of row ``upto``."""
    agent, source, count, failures, tin, tout, cost, streak = total
    key = (agent, source, upto)
    st = AgentStats(window)
    st.executions, st.failures = int(count), int(failures)
    st.input_tokens, st.output_tokens, st.cost_usd = int(tin), int(tout), float(cost)
    st.consecutive_failures = int(streak)
    recent = conn.execute(
        "SELECT success, duration_ms FROM executions WHERE agent = ? AND source = ?"
        " AND id <= ? ORDER BY id DESC LIMIT ?",
        (*key, window),
    ).fetchall()
    st.window.extend((bool(ok), float(d)) for ok, d in reversed(recent))
    errors = conn.execute(
        "SELECT error FROM executions WHERE agent = ? AND source = ? AND id <= ?"
        " AND error IS NOT NULL AND error != '' ORDER BY id DESC LIMIT ?",
        (*key, RECENT_ERRORS),
    ).fetchall()
    st.recent_errors.extend(e for (e,) in reversed(errors))
    return st


def _split_errors(
    conn: sqlite3.Connection, st: AgentStats, agent: str, epoch: int, upto: int
) -> None:
    """Errors since the epoch's kept change are recent; the ones before it are history."""
    since, label = conn.execute(
        "SELECT MIN(s.start_id), MAX(e.label) FROM baseline_segments s JOIN baseline_epochs e"
        " ON e.agent = s.agent AND e.epoch = s.epoch WHERE s.agent = ? AND s.epoch = ?",
        (agent, epoch),
    ).fetchone()
    if since is None:
        return
    query = (
        "SELECT error FROM executions WHERE agent = ? AND source = ? AND error IS NOT NULL"
        " AND error != '' AND id <= ? AND {} ORDER BY id DESC LIMIT ?"
    )
    after = conn.execute(query.format("id > ?"), (agent, RUN, upto, since, RECENT_ERRORS))
    before = conn.execute(query.format("id <= ?"), (agent, RUN, upto, since, RECENT_ERRORS))
    st.recent_errors.clear()
    st.recent_errors.extend(e for (e,) in reversed(after.fetchall()))
    st.errors_before_change.clear()
    st.errors_before_change.extend(e for (e,) in reversed(before.fetchall()))
    st.change_label = label or f"the change that started baseline {epoch}"


def _last_id(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM executions").fetchone()[0])


def _close_segment(
    conn: sqlite3.Connection, agent: str, epoch: int, boundary: int, status: str
) -> None:
    conn.execute(
        "UPDATE baseline_segments SET end_id = ? WHERE agent = ? AND epoch = ? AND end_id IS NULL",
        (boundary, agent, epoch),
    )
    conn.execute(
        "UPDATE baseline_epochs SET status = ? WHERE agent = ? AND epoch = ?",
        (status, agent, epoch),
    )


def last_run_id(store: Store) -> int:
    """The id of the newest run in the store (0 if none): runs after it are "from now on"."""
    store.migrate(_COMPONENT, _MIGRATIONS)
    return _last_id(store.connection())


def outcomes_after(store: Store, agent: str, after_id: int, limit: int) -> list[bool]:
    """Success of ``agent``'s first ``limit`` runs with an id above ``after_id``, oldest first.

    What a watch on a live change reads: the runs are in the store, so a process that takes
    over the watch after a crash reads the same ones.
    """
    store.migrate(_COMPONENT, _MIGRATIONS)
    rows = store.connection().execute(
        "SELECT success FROM executions WHERE agent = ? AND id > ? ORDER BY id LIMIT ?",
        (agent, after_id, limit),
    )
    return [bool(ok) for (ok,) in rows]
