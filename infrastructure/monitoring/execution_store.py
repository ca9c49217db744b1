"""The monitor's SQL: the executions table, the baseline epoch tables, their writes and reads.

Runs are appended in batches and never updated or deleted, so a reader catches up by a
cursor (see :mod:`~agentmend.infrastructure.monitoring.run_reader`). ``id`` is the rowid: SQLite
gives each row max(id) + 1 under its write lock, so there ids grow in commit order and are the
cursor (no AUTOINCREMENT: its bookkeeping costs ~15 % of an insert for a guarantee not needed
here). On PostgreSQL batches are appended concurrently, without the store-wide lock
(:mod:`~agentmend.infrastructure.monitoring.run_append`), so an identity id may commit after a
higher one; there the cursor is the row's transaction id (``tx``), read below the oldest
transaction still running. A monitor's refresh also reads the runs committed at or above that
horizon (so nothing waits for an old transaction) and remembers their transactions, so it
never reads them twice.

A baseline lives here as an *epoch*: one baseline of one agent, whose runs are the agent's rows
inside the epoch's row-id segments. Starting a baseline closes the active epoch's open segment
at the last row and opens a child epoch; restoring one marks the child rolled back and gives the
parent a new open segment. So every process derives the same baseline from the same rows, and
a restart or another process rebuilds it exactly.

Each handle writes its rows tagged with its own ``writer`` id, which is how it reads back only
the rows *other* handles wrote (:meth:`ExecutionStore.read_foreign`): its own were counted when
they were recorded. It also numbers them (``writer_seq``), once per row: a batch whose commit
failed without an answer (a server restarted mid-commit) is sent again with the same numbers,
and the rows the store already holds are skipped, so a retry never counts a run twice.

A row whose ``source`` is not one of ``SOURCES`` (written by another version, say) is skipped by
both readers, :meth:`ExecutionStore.load` and :meth:`ExecutionStore.read_foreign`: it may be a
run kept apart on purpose, as verification runs are, and counting it as a normal run would let
it feed detection and baselines. So a restart and a live refresh see the same runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from agentmend.infrastructure.monitoring import execution_rollup, run_append, run_fold, run_series
from agentmend.infrastructure.monitoring.agent_window import (
    RECENT_ERRORS,
    RUN,
    SOURCES,
    AgentStats,
    Baseline,
    Row,
)
from agentmend.infrastructure.monitoring.run_reader import (
    POSITION_DEFAULT,
    position_column,
    read_horizon,
)
from agentmend.infrastructure.store import quarantine
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.quarantine import append_isolating, is_row_error
from agentmend.infrastructure.store.sql import Backend, StoreConnection, append_rows
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["ExecutionStore", "LoadedState", "delete_runs"]

log = get_logger(__name__)

_COMPONENT = "executions"
_ROWS_PER_INSERT = 100  # 1,000 bound parameters per statement, far below SQLite's limit
_COLUMNS = (
    "agent, source, success, duration_ms, error, input_tokens, output_tokens, cost_usd, ts, extra"
)
_INSERTED = (*_COLUMNS.split(", "), "writer", "writer_seq")

_MIGRATIONS: list[str | dict[Backend, str]] = [
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
    # each writer numbers its rows, so a batch sent again (its commit was not acknowledged)
    # is not written twice
    """
    ALTER TABLE executions ADD COLUMN writer_seq INTEGER;
    CREATE UNIQUE INDEX executions_by_writer ON executions (writer, writer_seq)
    """,
    # PostgreSQL writers append concurrently, so readers follow each run's transaction id
    # (its position, see run_reader); the rows from before have their id as their position
    {
        "sqlite": "",
        "postgresql": f"""
        ALTER TABLE executions ADD COLUMN tx BIGINT;
        UPDATE executions SET tx = id;
        ALTER TABLE executions ALTER COLUMN tx SET DEFAULT {POSITION_DEFAULT};
        ALTER TABLE executions ALTER COLUMN tx SET NOT NULL;
        CREATE INDEX executions_by_position ON executions (tx)
        """,
    },
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

    def __init__(
        self, store: Store, writer: str, *, fold_interval_s: float = run_fold.FOLD_INTERVAL_S
    ) -> None:
        store.migrate(_COMPONENT, _MIGRATIONS)
        store.migrate(run_series.COMPONENT, run_series.MIGRATIONS)  # after: it reads executions
        store.migrate(execution_rollup.COMPONENT, execution_rollup.MIGRATIONS)
        store.migrate(quarantine.COMPONENT, quarantine.MIGRATIONS)
        store.migrate(run_fold.COMPONENT, run_fold.MIGRATIONS)
        self.store = store
        # on PostgreSQL small batches' rollups are folded in later (run_fold): at most this
        # long after this handle's last fold, an append folds
        self.fold_interval_s = fold_interval_s
        self._last_fold = time.monotonic()
        self._unfolded: int | None = None  # the position of this handle's last unrolled append
        # the refresh cursor (run_reader's positions): every foreign row below ``horizon``
        # has been ingested, and of those at or above it, the ones in transactions
        # ``ingested_above`` (read early: they committed while an older one still ran)
        self.horizon = 0
        self.ingested_above: set[int] = set()
        self._own: tuple[str, ...] = ()  # every writer id this handle's runs were written as
        # numbers given to the rows of a batch that failed, by the rows' identity: the caller
        # sends those same row objects again first (and nothing else holds them meanwhile)
        self._numbered: dict[int, int] = {}
        self._use_writer(writer)

    def insert(self, rows: list[Row]) -> None:
        """One transaction; rows appended by ``COPY`` on PostgreSQL, by multi-row INSERTs on
        SQLite. The rollups' additions are tallied before the transaction begins; on
        PostgreSQL the transaction takes no store-wide lock
        (:mod:`~agentmend.infrastructure.monitoring.run_append`), and a batch of at most
        ``run_fold.DEFERRED_ROWS`` runs is one autocommitted ``INSERT`` without its rollups,
        which a fold adds later (after this append if this handle's last fold is older than
        ``fold_interval_s``; :mod:`~agentmend.infrastructure.monitoring.run_fold`).

        Rows sent again after a failed call keep their numbers; those the store already holds
        (the failed call's commit did land) are skipped, runs and series alike.
        """
        numbers: Sequence[int]
        if self._numbered:  # a batch sent again: its rows keep their numbers
            numbers = [self._number(row) for row in rows]
        else:
            numbers = range(self._last_seq + 1, self._last_seq + 1 + len(rows))
            self._last_seq += len(rows)
        writer = self.writer
        numbered = [(*row, writer, n) for row, n in zip(rows, numbers, strict=True)]
        try:
            try:
                written = rows
                if self._numbered:  # only this writer writes its rows: asked before writing
                    numbered = self._not_landed(self.store.connection(), numbered)
                    written = [row[:-2] for row in numbered]
                if numbered:
                    self._write(numbered, written)
            except Exception as exc:
                if not is_row_error(exc):
                    raise
                # a row the store refuses: the others are written, it is set apart
                with self.store.transaction() as conn:
                    refused = append_isolating(
                        conn, _COMPONENT, numbered, lambda part: _append(conn, part)
                    )
                log.error(
                    "runs_quarantined",
                    runs=len(refused),
                    reason=f"{type(exc).__name__}: {exc}"[:500],
                )
        except BaseException:
            self._numbered = {id(row): n for row, n in zip(rows, numbers, strict=True)}
            raise
        self._numbered = {}

    def _write(self, numbered: list[Any], rows: list[Row]) -> None:
        if self.store.backend == "postgresql" and len(numbered) <= run_fold.DEFERRED_ROWS:
            self._unfolded = run_append.append_deferred(
                self.store.connection(), "executions", _INSERTED, numbered
            )
            if run_fold.due(self._last_fold, self.fold_interval_s):
                self.fold_quietly(wait=False)
            return
        rollup = execution_rollup.tally(rows)
        series = run_series.tally(rows)
        if self.store.backend == "postgresql":
            run_append.append(
                self.store.connection(), "executions", _INSERTED, numbered, rollup, series
            )
            return
        with self.store.transaction() as conn:
            append_rows(conn, "executions", _INSERTED, numbered, per_statement=_ROWS_PER_INSERT)
            run_series.write(conn, series)
            execution_rollup.write(conn, rollup)

    def fold_quietly(self, *, wait: bool) -> None:
        """A writer's fold of its appends not rolled up yet (none: nothing to do). ``wait``
        false: skipped if another is folding; true: once it returns, they are folded (unless
        it failed). A failure is logged, not raised: the runs are committed, and the next fold
        by anyone takes them."""
        self._last_fold = time.monotonic()
        covering = self._unfolded
        if covering is None:
            return
        try:
            folded = run_fold.fold(self.store.connection(), wait=wait, covering=covering)
            if folded is not None and folded.position > covering:
                self._unfolded = None
        except Exception as exc:  # the store's errors: the runs stay for the next fold
            log.warning("fold_failed", reason=f"{type(exc).__name__}: {exc}"[:500])

    def ingest_fold(self) -> None:
        """A reader's fold before it reads the rollups with their tail: skipped if another is
        folding (the tail then holds the runs); a failure is logged, not raised (the tail
        holds them too)."""
        try:
            run_fold.fold(self.store.connection(), wait=False)
        except Exception as exc:  # the store's errors: read on, the tail is exact
            log.warning("fold_failed", reason=f"{type(exc).__name__}: {exc}"[:500])

    def fold(self) -> run_fold.Folded | None:
        """Fold every run not yet rolled up (PostgreSQL), waiting for a fold running elsewhere:
        the rollups then count every run committed before it began, unless a transaction
        older than them still ran (see run_reader's horizon). None on SQLite, where rollups
        are written with their runs."""
        self._last_fold = time.monotonic()
        folded = run_fold.fold(self.store.connection(), wait=True)
        if folded is not None and self._unfolded is not None and folded.position > self._unfolded:
            self._unfolded = None
        return folded

    def _not_landed(self, conn: StoreConnection, numbered: list[Any]) -> list[Any]:
        """The rows of a batch sent again that the store does not hold yet (a failed call's
        commit may have landed); every row of a first sending."""
        if not self._numbered:
            return numbered
        landed = conn.execute(
            "SELECT COALESCE(MAX(writer_seq), 0) FROM executions WHERE writer = ?",
            (self.writer,),
        ).fetchone()[0]
        return [row for row in numbered if row[-1] > int(landed)]

    def _use_writer(self, writer: str) -> None:
        """Write from now on as ``writer`` (hex, safe to inline), numbering rows from 1."""
        self.writer = writer
        self._own = (*self._own, writer)
        self._last_seq = 0
        self._numbered = {}

    def fork_writer(self, writer: str) -> None:
        """In a forked child: write as ``writer``, still counting the parent's rows as its own.

        Parent and child must not number rows under one writer id; the child's state already
        holds every run the parent recorded before the fork, so those are not read back.
        """
        self._use_writer(writer)

    def _own_clause(self) -> str:
        return ",".join(f"'{w}'" for w in self._own)

    def _number(self, row: Row) -> int:
        number = self._numbered.get(id(row))
        if number is None:
            self._last_seq += 1
            number = self._last_seq
        return number

    def read_foreign(
        self, active_epoch: Callable[[str], int | None], capacity: int
    ) -> tuple[list[Row], dict[str, Baseline]]:
        """Rows other writers committed since the last call, and the baselines to adopt.

        ``active_epoch(agent)`` is the epoch the caller holds active (None if none); every
        agent whose active epoch in the table differs gets its baseline rebuilt, from the rows
        ingested before this call (the returned rows then extend it), all in one snapshot.
        Rows of an unknown source are skipped, as :meth:`load` skips them.
        """
        adopted: dict[str, Baseline] = {}
        # the horizon outside the snapshot: it then waits only for this database's writes
        # (run_reader.read_horizon), and every run below it is in the snapshot taken after
        horizon = read_horizon(self.store.connection())
        with self.store.snapshot() as conn:  # one snapshot for rows and epochs
            position = position_column(conn)
            rows = conn.execute(
                f"SELECT {position}, {_COLUMNS} FROM executions WHERE {position} >= ?"
                f" AND writer NOT IN ({self._own_clause()}) ORDER BY {position}, id",
                (self.horizon,),
            ).fetchall()
            for agent, epoch in conn.execute(
                "SELECT agent, epoch FROM baseline_epochs WHERE status = 'active'"
            ).fetchall():
                if active_epoch(agent) != epoch:
                    adopted[agent] = self.load_baseline(agent, epoch, capacity)
        seen = self.ingested_above
        if seen:  # rows read early by the last call are not read twice
            rows = [row for row in rows if row[0] not in seen]
        self.ingested_above = {p for p in seen if p >= horizon}
        self.ingested_above.update(row[0] for row in rows if row[0] >= horizon)
        self.horizon = max(self.horizon, horizon)
        return [
            (a, src, bool(ok), d, err, ti, to, c, ts, ex)
            for _, a, src, ok, d, err, ti, to, c, ts, ex in rows
            if src in SOURCES
        ], adopted

    def load(self, window: int, capacity: int) -> LoadedState:
        """Rebuild a monitor's state from the tables (one snapshot; unknown sources skipped)."""
        stats: dict[str, dict[str, AgentStats]] = {source: {} for source in SOURCES}
        baselines: dict[str, Baseline] = {}
        self.ingest_fold()  # keeps the tail read below short; exact without it
        horizon = read_horizon(self.store.connection())  # outside the snapshot, as above
        with self.store.snapshot() as conn:
            # the runs no fold has added to the rollups yet, in this snapshot: added here
            tail = run_fold.unfolded(conn)
            tail_baselines = run_fold.baseline_tail(conn, tail)
            upto = _last_id(conn)
            # the totals count every run in the snapshot: those at or above the horizon
            # (committed while an older write still ran) are ingested already
            self.horizon = horizon
            position = position_column(conn)
            self.ingested_above = {
                int(p)
                for (p,) in conn.execute(
                    f"SELECT DISTINCT {position} FROM executions WHERE {position} >= ?",
                    (self.horizon,),
                )
            }
            totals = execution_rollup.read_totals(conn)
            for total in run_fold.add_tail(totals, [row for _, row in tail]):
                if total[1] in SOURCES:
                    stats[total[1]][total[0]] = _load_stats(conn, total, upto, window)
            agents = {
                str(agent)
                for (agent,) in conn.execute(
                    "SELECT agent FROM execution_totals WHERE source = ?"
                    " UNION SELECT agent FROM baseline_epochs",
                    (RUN,),
                ).fetchall()
            }
            agents.update(agent for agent, _ in tail_baselines)
            for agent in sorted(agents):
                row = conn.execute(
                    "SELECT epoch FROM baseline_epochs WHERE agent = ? AND status = 'active'",
                    (agent,),
                ).fetchone()
                epoch = int(row[0]) if row else 0
                baselines[agent] = self.load_baseline(agent, epoch, capacity, counted=True)
                baselines[agent].runs += tail_baselines.get((agent, epoch), 0)
                if epoch and agent in stats[RUN]:
                    _split_errors(conn, stats[RUN][agent], agent, epoch, upto)
        return LoadedState(stats, baselines)

    def load_baseline(
        self, agent: str, epoch: int, capacity: int, *, counted: bool = False
    ) -> Baseline:
        """Rebuild a baseline from its segments, from the runs the caller has ingested
        (foreign rows the refresh cursor has passed and every row of its own).

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
        position = position_column(conn)
        above = "".join(f" OR {position} = {int(p)}" for p in sorted(self.ingested_above))
        for start, end in segments:
            where = (
                f"agent = ? AND source = ? AND id > ? AND ({position} < ?{above}"
                f" OR writer IN ({self._own_clause()}))"
            )
            params: list[Any] = [agent, RUN, start, self.horizon]
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
            # the runs before the boundary are counted in the epoch that holds them, by a fold
            # that cannot run while the segments change (it waits for the fold cursor)
            run_fold.fold(conn, wait=True)
            boundary = _last_id(conn)
            row = conn.execute(
                "SELECT epoch FROM baseline_epochs WHERE agent = ? AND status = 'active'", (agent,)
            ).fetchone()
            current = 0 if row is None else int(row[0])
            if row is None:  # the implicit first epoch: every run so far
                conn.execute(
                    "INSERT INTO baseline_epochs (agent, epoch, parent, status,"
                    " created_ts) VALUES (?, 0, NULL, 'active', ?) ON CONFLICT DO NOTHING",
                    (agent, time.time()),
                )
                conn.execute(
                    "INSERT INTO baseline_segments VALUES (?, 0, 0, NULL) ON CONFLICT DO NOTHING",
                    (agent,),
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
            run_fold.fold(conn, wait=True)  # as in start_epoch
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
                "INSERT INTO baseline_segments VALUES (?, ?, ?, NULL) ON CONFLICT"
                " (agent, epoch, start_id) DO UPDATE SET end_id = excluded.end_id",
                (agent, parent, boundary),
            )
        return parent


def _append(conn: StoreConnection, numbered: Sequence[Any]) -> None:
    """Rows (numbered, with their writer) into the table, its series and its totals."""
    append_rows(conn, "executions", _INSERTED, numbered, per_statement=_ROWS_PER_INSERT)
    rows = [row[:-2] for row in numbered]
    run_series.add_runs(conn, rows)  # same transaction: the series never drifts
    execution_rollup.add_runs(conn, rows)  # nor the totals opening reads


def _load_stats(
    conn: StoreConnection, total: tuple[Any, ...], upto: int, window: int
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


def _split_errors(conn: StoreConnection, st: AgentStats, agent: str, epoch: int, upto: int) -> None:
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


def _last_id(conn: StoreConnection) -> int:
    return int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM executions").fetchone()[0])


def _close_segment(
    conn: StoreConnection, agent: str, epoch: int, boundary: int, status: str
) -> None:
    conn.execute(
        "UPDATE baseline_segments SET end_id = ? WHERE agent = ? AND epoch = ? AND end_id IS NULL",
        (boundary, agent, epoch),
    )
    conn.execute(
        "UPDATE baseline_epochs SET status = ? WHERE agent = ? AND epoch = ?",
        (status, agent, epoch),
    )


def delete_runs(conn: StoreConnection, ids: list[int]) -> None:
    """Delete the runs ``ids`` (retention's prune, inside the caller's transaction), those
    already in the rollups: on PostgreSQL it folds first, and a run no fold could take yet
    (committed since the fold's horizon) is left for the next prune."""
    kept = ""
    if run_fold.fold(conn, wait=True) is not None:
        kept = " AND (rolled OR tx < (SELECT position FROM run_fold))"
    conn.execute(f"DELETE FROM executions WHERE id IN ({','.join('?' * len(ids))}){kept}", ids)
