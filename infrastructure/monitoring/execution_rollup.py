"""Per-agent rollups of the executions table, so opening a monitor costs the same at any size.

A monitor rebuilds its state when it opens: lifetime totals per agent, the current failure
streak, the latest errors, each agent's baseline and how many runs it has seen. Computed from
the runs themselves, every one of these is a scan that grows with history (a ``GROUP BY`` over
every row, a walk back to the last success, a walk back to the tenth error when errors are
rare, a count over the baseline's runs), and every session start, MCP server start and
``PerformanceMonitor(store)`` pays it. So the writer keeps them up to date instead, in the same
transaction as the runs (a rollup is never ahead of or behind its rows), except on PostgreSQL
for a small batch, which a fold adds later (:mod:`~agentmend.infrastructure.monitoring.run_fold`:
readers that need exact figures add the runs not folded yet):

* ``execution_totals``: per agent and source, the lifetime counters and the failure streak;
* ``baseline_runs``: per agent and baseline epoch, the runs the epoch has counted (every new
  run of an agent belongs to its active epoch, so a batch adds to that one);
* ``executions_errors``: a partial index of the rows that carry an error, so the latest errors
  are found in O(errors asked for) however rare errors are.

Totals are lifetime figures: retention deletes old rows but never subtracts from them.
"""

from __future__ import annotations

from functools import reduce
from itertools import compress, repeat
from operator import add, eq, itemgetter, truth
from typing import Any, NamedTuple

from agentmend.infrastructure.monitoring.agent_window import RUN, Row
from agentmend.infrastructure.store.sql import StoreConnection

__all__ = [
    "BASELINE_RUNS",
    "COMPONENT",
    "MIGRATIONS",
    "TOTALS",
    "RollupTally",
    "add_runs",
    "baseline_runs",
    "read_totals",
    "tally",
    "write",
]

COMPONENT = "execution_rollup"

MIGRATIONS = [
    f"""
    CREATE TABLE execution_totals (
        agent TEXT NOT NULL,
        source TEXT NOT NULL,
        executions INTEGER NOT NULL,
        failures INTEGER NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_usd REAL NOT NULL,
        streak INTEGER NOT NULL,
        PRIMARY KEY (agent, source)
    );
    INSERT INTO execution_totals (agent, source, executions, failures, input_tokens,
        output_tokens, cost_usd, streak)
    SELECT agent, source, COUNT(*), SUM(1 - success), SUM(input_tokens), SUM(output_tokens),
        SUM(cost_usd), 0
    FROM executions GROUP BY agent, source;
    UPDATE execution_totals SET streak = (
        SELECT COUNT(*) FROM executions e
        WHERE e.agent = execution_totals.agent AND e.source = execution_totals.source
        AND e.id > COALESCE((
            SELECT MAX(s.id) FROM executions s
            WHERE s.agent = execution_totals.agent AND s.source = execution_totals.source
            AND s.success = 1), 0));
    CREATE TABLE baseline_runs (
        agent TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        runs INTEGER NOT NULL,
        PRIMARY KEY (agent, epoch)
    );
    INSERT INTO baseline_runs (agent, epoch, runs)
    SELECT s.agent, s.epoch, COUNT(e.id)
    FROM baseline_segments s JOIN executions e
        ON e.agent = s.agent AND e.source = '{RUN}' AND e.id > s.start_id
        AND (s.end_id IS NULL OR e.id <= s.end_id)
    GROUP BY s.agent, s.epoch;
    INSERT INTO baseline_runs (agent, epoch, runs)
    SELECT agent, 0, COUNT(*) FROM executions
    WHERE source = '{RUN}' AND agent NOT IN (SELECT agent FROM baseline_epochs)
    GROUP BY agent;
    CREATE INDEX executions_errors ON executions (agent, source, id)
        WHERE error IS NOT NULL AND error != ''
    """,
]

TOTALS = (
    "INSERT INTO execution_totals (agent, source, executions, failures, input_tokens,"
    " output_tokens, cost_usd, streak) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (agent, source) DO UPDATE SET"
    " executions = execution_totals.executions + excluded.executions,"
    " failures = execution_totals.failures + excluded.failures,"
    " input_tokens = execution_totals.input_tokens + excluded.input_tokens,"
    " output_tokens = execution_totals.output_tokens + excluded.output_tokens,"
    " cost_usd = execution_totals.cost_usd + excluded.cost_usd,"
    # a batch with a success (fewer failures than runs) sets the streak to the failures after
    # its last success; a batch of failures only extends it
    " streak = CASE WHEN excluded.failures < excluded.executions THEN excluded.streak"
    " ELSE execution_totals.streak + excluded.streak END"
)
BASELINE_RUNS = (
    "INSERT INTO baseline_runs (agent, epoch, runs) VALUES (?, COALESCE((SELECT epoch FROM"
    " baseline_epochs WHERE agent = ? AND status = 'active'), 0), ?)"
    " ON CONFLICT (agent, epoch) DO UPDATE SET runs = baseline_runs.runs + excluded.runs"
)


class RollupTally(NamedTuple):
    """A batch's additions to the rollups, each table's rows sorted by its key (so writers
    take the rows' locks in one order and cannot deadlock on them)."""

    totals: list[tuple[Any, ...]]
    """(agent, source, executions, failures, input, output, cost, streak) per agent, source."""
    baseline: list[tuple[str, int]]
    """(agent, production runs) per agent: added to the agent's active epoch."""


def tally(rows: list[Row]) -> RollupTally:
    """What a batch of rows (in order) adds to the rollups, computed before its transaction.

    A batch of a few agents and sources (the usual) is summed a column at a time with C-level
    builtins, each sum taken in run order as one run at a time would; a batch of many, or one
    whose values the column steps refuse, a run at a time (the same figures and errors).
    """
    try:
        totals = _column_totals(rows)
    except (TypeError, ValueError, OverflowError):
        totals = None  # a bad value: the run-at-a-time tally meets it as it always has
    if totals is None:
        totals = _row_totals(rows)
    keys = sorted(totals)
    return RollupTally(
        [(agent, source, *totals[(agent, source)]) for agent, source in keys],
        [(agent, totals[(agent, source)][0]) for agent, source in keys if source == RUN],
    )


_agent, _source = itemgetter(0), itemgetter(1)
_columns = tuple(itemgetter(i) for i in (2, 5, 6, 7))  # success, input, output, cost
_COLUMN_KEYS = 8
"""Up to this many (agent, source) pairs a batch is summed a column at a time."""


def _column_totals(rows: list[Row]) -> dict[tuple[str, str], list[Any]] | None:
    """Each (agent, source)'s additions, column by column (None: too many pairs for it)."""
    if not rows:
        return {}
    agents, sources = list(map(_agent, rows)), list(map(_source, rows))
    columns = [list(map(column, rows)) for column in _columns]
    n = len(rows)
    if agents.count(agents[0]) == n and sources.count(sources[0]) == n:
        return {(agents[0], sources[0]): _total(*columns)}
    keys = list(zip(agents, sources, strict=True))
    distinct = dict.fromkeys(keys)
    if len(distinct) > _COLUMN_KEYS:
        return None
    totals: dict[tuple[str, str], list[Any]] = {}
    for key in distinct:
        mask = list(map(eq, keys, repeat(key)))
        totals[key] = _total(*(list(compress(column, mask)) for column in columns))
    return totals


def _total(successes: list[Any], tin: list[Any], tout: list[Any], cost: list[Any]) -> list[Any]:
    """executions, failures, input, output, cost, streak of one pair's runs, in run order."""
    n = len(successes)
    ok = successes.count(True)  # == True: True, 1 and 1.0, each of them true
    if ok + successes.count(False) != n:  # another kind of value: by its truth
        successes = list(map(truth, successes))
        ok = successes.count(True)
    # the streak: the failures after the last success, or every run if none succeeded
    streak = n if ok == 0 else 0 if successes[-1] else successes[::-1].index(True)
    return [n, n - ok, _int_sum(tin), _int_sum(tout), reduce(add, cost, 0.0), streak]


def _int_sum(values: list[Any]) -> Any:
    """The sum of whole counts; of anything else added in order, as a run at a time would."""
    total = sum(values)
    return total if type(total) is int else reduce(add, values, 0)


def _row_totals(rows: list[Row]) -> dict[tuple[str, str], list[Any]]:
    """Each (agent, source)'s additions, a run at a time."""
    totals: dict[tuple[str, str], list[Any]] = {}
    for agent, source, success, _, _, tin, tout, cost, _, _ in rows:
        total = totals.get((agent, source))
        if total is None:
            # executions, failures, input, output, cost, streak
            total = totals[(agent, source)] = [0, 0, 0, 0, 0.0, 0]
        total[0] += 1
        total[2] += tin
        total[3] += tout
        total[4] += cost
        if success:
            total[5] = 0
        else:
            total[1] += 1
            total[5] += 1
    return totals


def write(conn: StoreConnection, added: RollupTally) -> None:
    """Add a batch's tally to the rollups, inside the caller's transaction."""
    if added.totals:
        conn.executemany(TOTALS, added.totals)
    if added.baseline:
        conn.executemany(BASELINE_RUNS, [(agent, agent, n) for agent, n in added.baseline])


def add_runs(conn: StoreConnection, rows: list[Row]) -> None:
    """Add a batch of rows (in id order) to the rollups, inside the caller's transaction."""
    write(conn, tally(rows))


def read_totals(conn: StoreConnection) -> list[tuple[Any, ...]]:
    """(agent, source, executions, failures, input tokens, output tokens, cost, streak) rows."""
    return conn.execute(
        "SELECT agent, source, executions, failures, input_tokens, output_tokens, cost_usd,"
        " streak FROM execution_totals"
    ).fetchall()


def baseline_runs(conn: StoreConnection, agent: str, epoch: int) -> int:
    """The runs ``agent``'s baseline ``epoch`` has counted, however many rows were pruned."""
    row = conn.execute(
        "SELECT runs FROM baseline_runs WHERE agent = ? AND epoch = ?", (agent, epoch)
    ).fetchone()
    return int(row[0]) if row else 0
