"""Deferred rollups on PostgreSQL: small batches of runs are appended alone and *folded* later.

A batch of one run used to be nine statements in one transaction: its ``INSERT`` and eight
rollup upserts (totals, baseline counts, minute series, series totals, four coarser series).
With many writers each recording a run at a time, the upserts were most of the server's work
and of its WAL (5 times a bare ``INSERT``'s), and a run cost 2.3 to 3.3 times a bare
``INSERT`` (``benchmarks/bench_writer.py``, one-run batches). So on PostgreSQL a batch of at most
:data:`DEFERRED_ROWS` runs is appended alone (``rolled`` false; one round trip, the commit
included), and a *fold* adds such runs to the rollups later, many at a time:

* one transaction takes the single row of ``run_fold`` (its *cursor*) ``FOR UPDATE``: one
  folder at a time (a writer's periodic fold skips if another holds it, ``SKIP LOCKED``; a
  fold that must happen waits for it), reads the unrolled runs whose position is at or above
  the cursor and below the read horizon
  (:func:`~agentmend.infrastructure.monitoring.run_reader.read_horizon`), tallies them with the
  tallies a batch uses, upserts the rollups in the writers' fixed order, and moves the cursor
  to the horizon; all of it commits together. No run can commit below a horizon once it is
  read, so every run is folded exactly once, whatever order writers commit in, across a
  writer killed before it folded (the next fold by anyone takes its runs) and a server
  restart (a fold that did not commit moved nothing).
* A run's baseline epoch is the one whose id segment holds it (what
  ``ExecutionStore.load_baseline`` counts), not the epoch active when it is folded, so
  starting or restoring a baseline between a run's append and its fold does not move it;
  those also take the cursor, so no fold reads the segments while they change.
* Readers that need exact figures (a monitor opening, ``status`` and the report's agent
  figures) add the *tail*, the runs not folded yet in their snapshot (:func:`unfolded`), to
  what the rollups say; retention folds before it deletes and never deletes a run not yet
  folded; a store copy adds its source's tail to the copied rollups.

So while writers keep appending, the rollups lag the runs by about the fold interval
(:data:`FOLD_INTERVAL_S`; longer while a transaction older than the runs still runs, as any
reader of runs waits for it), a writer's ``flush()`` and ``close()`` fold its runs (those
below the horizon), and the figures a reader needs exact are exact either way; charts read
the series as folded.

A flag per run is cheaper than a table of pending runs (one row written, not two) and, with a
default of true, marks rows written by an older version (which roll up inline) as rolled.
Per-writer rollup rows summed at read were the other way offered: every reader would then sum
a row per process that ever wrote. Large batches keep their rollups inline (``COPY`` then the
upserts, already near a bare ``COPY``). SQLite keeps them inline too: one writer at a time
there, no lock to spare.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, NamedTuple

from agentmend.infrastructure.monitoring import execution_rollup, run_series
from agentmend.infrastructure.monitoring.agent_window import RUN, Row
from agentmend.infrastructure.monitoring.run_reader import POSITION_OFFSET, read_horizon
from agentmend.infrastructure.store.sql import Backend, StoreConnection, backend_of, has_table

__all__ = [
    "COMPONENT",
    "DEFERRED_ROWS",
    "FOLD_INTERVAL_S",
    "MIGRATIONS",
    "Folded",
    "add_run_totals",
    "add_runs",
    "add_tail",
    "baseline_tail",
    "fold",
    "unfolded",
]

COMPONENT = "run_fold"

DEFERRED_ROWS = 64
"""Up to this many runs a PostgreSQL batch is appended without its rollups (and folded later)."""

FOLD_INTERVAL_S = 1.0
"""A writer folds after an append once its last fold is older than this."""

MIGRATIONS: list[str | dict[Backend, str]] = [
    {
        "sqlite": "",
        # instant on PostgreSQL 11+ (a constant default); the cursor starts at the horizon,
        # below which no run can be unrolled (only this version writes such runs)
        "postgresql": f"""
        ALTER TABLE executions ADD COLUMN rolled BOOLEAN NOT NULL DEFAULT TRUE;
        CREATE TABLE run_fold (position BIGINT NOT NULL);
        INSERT INTO run_fold (position) VALUES (CAST(CAST(pg_snapshot_xmin(
            pg_current_snapshot()) AS TEXT) AS BIGINT) + {POSITION_OFFSET})
        """,
    }
]

# what the tallies read of a run: its error and extra fields are not sent (None in their place)
_COLUMNS = "agent, source, success, duration_ms, input_tokens, output_tokens, cost_usd, ts"
_BASELINE_ADD = (
    "INSERT INTO baseline_runs (agent, epoch, runs) VALUES (?, ?, ?)"
    " ON CONFLICT (agent, epoch) DO UPDATE SET runs = baseline_runs.runs + excluded.runs"
)


class Folded(NamedTuple):
    """What a fold did: the runs it added, and the cursor after it (every unrolled run below
    it is folded)."""

    runs: int
    position: int


def fold(conn: StoreConnection, *, wait: bool, covering: int | None = None) -> Folded | None:
    """Add every run not yet rolled up and below the read horizon to the rollups.

    In the caller's transaction if one is open (it then commits the fold), else in one of its
    own (rolled back, so not flushed to disk, when it changed nothing). ``wait``: wait for a
    fold running elsewhere instead of skipping (None: skipped, and None on SQLite).
    ``covering``: a position the caller needs folded (its last append's); if the cursor is
    past it already, nothing is done.
    """
    if backend_of(conn) == "sqlite" or not has_table(conn, "run_fold"):
        return None  # (a store no writer of this version has opened has nothing to fold)
    horizon = read_horizon(conn)  # outside a transaction: before the snapshot that reads
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        folded, moved = _fold_locked(conn, horizon, wait, covering)
    except BaseException:
        if own:
            with suppress(Exception):  # the connection may be gone, and its transaction then
                conn.execute("ROLLBACK")
        raise
    if own:
        conn.execute("COMMIT" if moved else "ROLLBACK")
    return folded


def _fold_locked(
    conn: StoreConnection, horizon: int, wait: bool, covering: int | None
) -> tuple[Folded | None, bool]:
    """The fold inside its transaction, and whether it moved the cursor."""
    row = conn.execute(
        "SELECT position FROM run_fold FOR UPDATE" + ("" if wait else " SKIP LOCKED")
    ).fetchone()
    if row is None:
        return None, False
    cursor = int(row[0])
    if horizon <= cursor or (covering is not None and covering < cursor):
        return Folded(0, cursor), False
    runs = _read(conn, f"tx >= {cursor} AND tx < {horizon}")
    if runs:
        add_runs(conn, runs)
    conn.execute("UPDATE run_fold SET position = ?", (horizon,))
    return Folded(len(runs), horizon), True


def _read(conn: StoreConnection, where: str) -> list[tuple[int, Row]]:
    rows = conn.execute(
        f"SELECT id, {_COLUMNS} FROM executions WHERE NOT rolled AND {where} ORDER BY tx, id"
    ).fetchall()
    return [
        (int(i), (a, s, bool(ok), d, None, ti, to, c, ts, None))
        for i, a, s, ok, d, ti, to, c, ts in rows
    ]


def unfolded(conn: StoreConnection) -> list[tuple[int, Row]]:
    """(id, run) of the runs not yet folded in ``conn``'s snapshot, in position order (none on
    SQLite), without their error and extra fields: what a reader adds to the rollups it reads
    in the same snapshot."""
    if backend_of(conn) == "sqlite" or not has_table(conn, "run_fold"):
        return []
    return _read(conn, "tx >= (SELECT position FROM run_fold)")


def add_runs(conn: StoreConnection, runs: list[tuple[int, Row]]) -> None:
    """Add (id, run) pairs to the rollups, in the caller's transaction: the runs' tallies
    upserted in the writers' fixed order of tables (totals, baselines, series), each
    table's rows in key order."""
    rows = [row for _, row in runs]
    rollup = execution_rollup.tally(rows)
    if rollup.totals:
        conn.executemany(execution_rollup.TOTALS, rollup.totals)
    baselines = baseline_tail(conn, runs)
    if baselines:
        conn.executemany(_BASELINE_ADD, [(*key, n) for key, n in sorted(baselines.items())])
    series = run_series.tally(rows)
    if series is not None:
        for sql, params in run_series.upserts(series):
            conn.executemany(sql, params)


def baseline_tail(
    conn: StoreConnection, runs: Sequence[tuple[int, Row]]
) -> dict[tuple[str, int], int]:
    """Production runs per (agent, epoch) of ``runs``: each in the epoch whose id segment holds
    it; an agent without segments in its implicit epoch 0, a run past every segment (none
    should be) in the agent's open one."""
    agents = sorted({row[0] for _, row in runs if row[1] == RUN})
    if not agents:
        return {}
    segments: dict[str, list[tuple[int, int, int | None]]] = {}
    for agent, epoch, start, end in conn.execute(
        "SELECT agent, epoch, start_id, end_id FROM baseline_segments WHERE agent IN"
        f" ({', '.join('?' * len(agents))})",
        agents,
    ).fetchall():
        segments.setdefault(agent, []).append(
            (int(epoch), int(start), None if end is None else int(end))
        )
    counts: dict[tuple[str, int], int] = {}
    for run_id, row in runs:
        if row[1] != RUN:
            continue
        agent = row[0]
        epoch = _epoch_of(segments.get(agent, []), run_id)
        counts[(agent, epoch)] = counts.get((agent, epoch), 0) + 1
    return counts


def _epoch_of(segments: list[tuple[int, int, int | None]], run_id: int) -> int:
    open_epoch = 0
    for epoch, start, end in segments:
        if end is None:
            open_epoch = epoch
        if run_id > start and (end is None or run_id <= end):
            return epoch
    return open_epoch


def add_tail(totals: list[tuple[Any, ...]], tail: list[Row]) -> list[tuple[Any, ...]]:
    """``execution_totals`` rows (agent, source, executions, failures, input, output, cost,
    streak) with the tail's runs added, as its upsert would add them."""
    if not tail:
        return totals
    merged = {(t[0], t[1]): list(t) for t in totals}
    for agent, source, n, failures, tin, tout, cost, streak in execution_rollup.tally(tail).totals:
        old = merged.get((agent, source))
        if old is None:
            merged[(agent, source)] = [agent, source, n, failures, tin, tout, cost, streak]
            continue
        old[2] += n
        old[3] += failures
        old[4] += tin
        old[5] += tout
        old[6] += cost
        old[7] = streak if failures < n else old[7] + streak
    return [tuple(t) for t in merged.values()]


def due(last_fold: float, interval_s: float) -> bool:
    """Whether a writer whose last fold was at ``last_fold`` (``time.monotonic()``) folds now."""
    return time.monotonic() - last_fold >= interval_s


def add_run_totals(totals: list[tuple[Any, ...]], tail: list[Row]) -> list[tuple[Any, ...]]:
    """``run_totals`` rows (agent, runs, failures, last time) with the tail's production runs
    added, by agent."""
    merged = {str(t[0]): list(t) for t in totals}
    for agent, source, success, *_, ts, _extra in tail:
        if source != RUN:
            continue
        row = merged.setdefault(agent, [agent, 0, 0, None])
        row[1] += 1
        row[2] += 0 if success else 1
        row[3] = ts if row[3] is None else max(row[3], ts)
    return [tuple(merged[agent]) for agent in sorted(merged)]
