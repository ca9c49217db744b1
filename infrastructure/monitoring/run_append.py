"""A batch of runs appended to PostgreSQL by many writers at once, without a store-wide lock.

Every write transaction of the store takes its store-wide lock, and with it every writer waits
for every other's whole transaction, commit included. Runs need none of that: a batch's rows
collide with no other writer's (each writer numbers its own, ``(writer, writer_seq)`` is
unique), and the readers that follow them go by transaction id below a horizon
(:mod:`~agentmend.infrastructure.monitoring.run_reader`), not by id in commit order. So a batch
is written by a plain transaction, and everything that can happen before it does:

* the rows are formatted as ``COPY`` text and the rollups' additions tallied
  (:func:`~agentmend.infrastructure.monitoring.execution_rollup.tally`,
  :func:`~agentmend.infrastructure.monitoring.run_series.tally`) before ``BEGIN``;
* the rollups (totals, baseline counts, minute series, coarser series, series totals) are
  upserted in one fixed order of tables, each table's rows in its key's order, so two writers
  adding to the same rows take their locks in one order and cannot deadlock (taking them in
  batch order did: that is why the lock was there). The upserts and the ``COMMIT`` are sent
  pipelined, one round trip for them all; each is a one-row upsert the server plans once per
  session (every time through a transaction pooler, which keeps no prepared statement), where
  one statement carrying every table's rows as arrays cost 14 ms of planning per batch, ten
  times its execution, and was never planned generically;
* the rows go in by ``COPY`` after ``BEGIN`` (two round trips), then that pipeline.

A batch of at most :data:`~agentmend.infrastructure.monitoring.run_fold.DEFERRED_ROWS` runs is
appended without its rollups instead, by one autocommitted ``INSERT`` (:func:`append_deferred`):
they are folded in later, many batches at a time
(:mod:`~agentmend.infrastructure.monitoring.run_fold`); the upserts were most of a one-run
batch's cost.

The store's other writes keep the lock, and the audit chain its own sequencer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.monitoring.execution_rollup import BASELINE_RUNS, TOTALS, RollupTally
from agentmend.infrastructure.monitoring.run_series import SeriesTally, upserts
from agentmend.infrastructure.store.sql import StoreConnection

__all__ = ["append", "append_deferred", "copy_text", "rollup_statements"]

_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})

Statement = tuple[str, Sequence[Sequence[Any]]]
"""A statement and the parameters of each time it runs."""


def _text(value: str | None) -> str:
    if value is None:
        return "\\N"
    return value.translate(_ESCAPES)


def copy_text(rows: Sequence[Sequence[Any]]) -> str:
    """Numbered run rows (ExecutionStore's columns) as ``COPY ... FROM STDIN`` text:
    tab-separated, ``\\N`` for NULL, text escaped. Each column's type is known (storable rows),
    so each is written its own way instead of asking every value what it is."""
    return "".join(
        [
            f"{_text(agent)}\t{source}\t{1 if ok else 0}\t{duration!r}\t{_text(error)}\t"
            f"{tin}\t{tout}\t{cost!r}\t{ts!r}\t{_text(extra)}\t{writer}\t{seq}\n"
            for agent, source, ok, duration, error, tin, tout, cost, ts, extra, writer, seq in rows
        ]
    )


def rollup_statements(rollup: RollupTally, series: SeriesTally | None) -> list[Statement]:
    """The upserts that add a batch to every rollup, tables in their fixed order, each
    table's rows in key order (as the tallies give them)."""
    statements: list[Statement] = []
    if rollup.totals:
        statements.append((TOTALS, rollup.totals))
    if rollup.baseline:
        statements.append((BASELINE_RUNS, [(agent, agent, n) for agent, n in rollup.baseline]))
    if series is not None:
        statements.extend(upserts(series))
    return statements


def append(
    conn: StoreConnection,
    table: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    rollup: RollupTally,
    series: SeriesTally | None,
) -> None:
    """Append a batch to ``table`` (the runs' table, named by its one writer: rows with
    their writer and number, in ``columns``' order) and its tallies, as one transaction that
    takes no store-wide lock."""
    data = copy_text(rows)
    statements = rollup_statements(rollup, series)
    conn.append_unlocked((table, columns, data), statements)  # type: ignore[attr-defined]


def append_deferred(
    conn: StoreConnection, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> int:
    """Append a small batch to ``table`` marked not yet rolled up, as one autocommitted
    multi-row ``INSERT`` that takes no store-wide lock: one statement, one round trip, as
    cheap as a bare ``INSERT`` (a pipeline of ``BEGIN``, ``INSERT``, ``COMMIT`` cost the
    client 70 % more per run). A fold adds the rows to the rollups later. Returns the rows'
    position (``tx``)."""
    if conn.in_transaction:
        raise StoreError("an unlocked append cannot join an open transaction")
    one = f"({', '.join('?' * len(columns))}, FALSE)"
    return int(
        conn.execute(
            f"INSERT INTO {table} ({', '.join(columns)}, rolled)"
            f" VALUES {', '.join([one] * len(rows))} RETURNING tx",
            [value for row in rows for value in row],
        ).fetchone()[0]
    )
