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
  written by **one** statement per batch, each table's rows in its key's order and the tables
  always in the same order, so two writers adding to the same rows take their locks in one
  order and cannot deadlock (taking them in batch order did: that is why the lock was there);
* a batch of at most :data:`ONE_STATEMENT_ROWS` runs is that same statement with the rows in it,
  sent outside a transaction (one statement is atomic): one round trip, commit included. A
  larger one is ``BEGIN``, ``COPY``, the rollup statement, ``COMMIT``.

The store's other writes keep the lock, and the audit chain its own sequencer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentmend.infrastructure.monitoring.execution_rollup import BASELINE_RUNS, TOTALS, RollupTally
from agentmend.infrastructure.monitoring.run_series import (
    DURATION_BINS,
    UPSERT_MINUTES,
    UPSERT_ROLLUP,
    UPSERT_TOTALS,
    SeriesTally,
)
from agentmend.infrastructure.store.sql import StoreConnection

__all__ = ["ONE_STATEMENT_ROWS", "append", "copy_text", "rollup_statement"]

ONE_STATEMENT_ROWS = 64
"""Up to this many rows a batch is one statement with its rollups (a round trip in all);
beyond it ``COPY`` is cheaper per row than parameters."""

_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})

# (column, array type) of the executions columns a batch writes, in ExecutionStore's order
_ROW_TYPES = (
    "TEXT",  # agent
    "TEXT",  # source
    "BIGINT",  # success
    "DOUBLE PRECISION",  # duration_ms
    "TEXT",  # error
    "BIGINT",  # input_tokens
    "BIGINT",  # output_tokens
    "DOUBLE PRECISION",  # cost_usd
    "DOUBLE PRECISION",  # ts
    "TEXT",  # extra
    "TEXT",  # writer
    "BIGINT",  # writer_seq
)


_TOTALS_TYPES = (
    "TEXT",
    "TEXT",
    "BIGINT",
    "BIGINT",
    "BIGINT",
    "BIGINT",
    "DOUBLE PRECISION",
    "BIGINT",
)
_SERIES_TOTALS_TYPES = ("TEXT", "BIGINT", "BIGINT", "DOUBLE PRECISION", "DOUBLE PRECISION")


def _field(value: Any) -> str:
    if value is None:
        return "\\N"
    if value is True or value is False:
        return "1" if value else "0"
    if isinstance(value, str):
        return value.translate(_ESCAPES)
    return repr(value) if isinstance(value, float) else str(value)


def copy_text(rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` as ``COPY ... FROM STDIN`` text: tab-separated, ``\\N`` for NULL, escaped."""
    return "".join("\t".join(map(_field, row)) + "\n" for row in rows)


def _unnest(types: Sequence[str], names: str) -> str:
    arrays = ", ".join(f"CAST(? AS {t}[])" for t in types)
    return f"unnest({arrays}) WITH ORDINALITY AS u({names}, o)"


def _columns(rows: Sequence[Sequence[Any]], count: int) -> list[list[Any]]:
    return [[row[i] for row in rows] for i in range(count)]


def _from_arrays(
    upsert: str, types: Sequence[str], rows: Sequence[Sequence[Any]]
) -> tuple[str, list[Any]]:
    """A one-row ``INSERT ... VALUES (?, ...) ON CONFLICT ...`` made to take every row of a
    batch as one array per column, inserted in the rows' order."""
    insert = upsert[: upsert.index(" VALUES ")]
    conflict = upsert[upsert.index(" ON CONFLICT") :]
    names = ", ".join(f"c{i}" for i in range(len(types)))
    sql = f"{insert} SELECT {names} FROM {_unnest(types, names)} ORDER BY o{conflict}"
    return sql, _columns(rows, len(types))


def _baseline(added: RollupTally) -> tuple[str, list[Any]]:
    conflict = BASELINE_RUNS[BASELINE_RUNS.index(" ON CONFLICT") :]
    sql = (
        "INSERT INTO baseline_runs (agent, epoch, runs) SELECT c0, COALESCE((SELECT epoch FROM"
        " baseline_epochs WHERE agent = u.c0 AND status = 'active'), 0), c1 FROM "
        + _unnest(["TEXT", "BIGINT"], "c0, c1")
        + f" ORDER BY o{conflict}"
    )
    return sql, _columns(added.baseline, 2)


def _histograms(
    upsert: str, keys: Sequence[str], rows: Sequence[Sequence[Any]]
) -> tuple[str, list[Any]]:
    """A series table's upsert from a batch's rows (keys, runs, failures, duration sum, the
    histogram's bins): each row's bins a slice of one flat array, not 97 arrays."""
    head = len(keys) + 3
    types = ["TEXT" if k == "agent" else "BIGINT" for k in keys]
    types += ["BIGINT", "BIGINT", "DOUBLE PRECISION"]
    names = ", ".join(f"c{i}" for i in range(head))
    last = DURATION_BINS - 1
    bins = ", ".join(
        f"h.b[CAST(o AS INTEGER) * {DURATION_BINS} - {last - i}]" for i in range(DURATION_BINS)
    )
    insert = upsert[: upsert.index(" VALUES ")]
    conflict = upsert[upsert.index(" ON CONFLICT") :]
    sql = (
        f"{insert} SELECT {names}, {bins} FROM {_unnest(types, names)},"
        f" (SELECT CAST(? AS BIGINT[]) AS b) AS h ORDER BY o{conflict}"
    )
    params = _columns(rows, head)
    params.append([count for row in rows for count in row[head:]])
    return sql, params


def rollup_statement(
    rollup: RollupTally,
    series: SeriesTally | None,
    rows: tuple[Sequence[str], Sequence[Sequence[Any]]] | None = None,
) -> tuple[str, list[Any]]:
    """The one statement that adds a batch to every rollup (and appends ``rows``, given as
    (columns, rows)): each table a data-changing ``WITH`` part, run in the order listed."""
    parts: list[tuple[str, list[Any]]] = []
    if rows is not None:
        columns, values = rows
        names = ", ".join(f"c{i}" for i in range(len(columns)))
        parts.append(
            (
                f"INSERT INTO executions ({', '.join(columns)}) SELECT {names} FROM "
                f"{_unnest(_ROW_TYPES, names)} ORDER BY o",
                _columns(values, len(columns)),
            )
        )
    if rollup.totals:
        parts.append(_from_arrays(TOTALS, _TOTALS_TYPES, rollup.totals))
    if rollup.baseline:
        parts.append(_baseline(rollup))
    if series is not None:
        parts.append(_histograms(UPSERT_MINUTES, ("agent", "bucket"), series.minutes))
        parts.append(_from_arrays(UPSERT_TOTALS, _SERIES_TOTALS_TYPES, series.totals))
        parts.append(_histograms(UPSERT_ROLLUP, ("width", "agent", "bucket"), series.rollups))
    ctes = ", ".join(f"w{i} AS ({sql} RETURNING 1)" for i, (sql, _) in enumerate(parts))
    # each part is pulled to its end in turn, so every writer locks the tables in this order
    pulls = ", ".join(f"(SELECT COUNT(*) FROM w{i})" for i in range(len(parts)))
    params = [p for _, ps in parts for p in ps]
    return f"WITH {ctes} SELECT {pulls}", params


def append(
    conn: StoreConnection,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    rollup: RollupTally,
    series: SeriesTally | None,
) -> None:
    """Append a batch (rows with their writer and number, in ``columns``' order) and its
    tallies, as one transaction that takes no store-wide lock."""
    if len(rows) <= ONE_STATEMENT_ROWS:
        sql, params = rollup_statement(rollup, series, (columns, rows))
        conn.execute(sql, params)  # outside a transaction: atomic by itself
        return
    data = copy_text(rows)
    sql, params = rollup_statement(rollup, series)
    with conn.unlocked_transaction():  # type: ignore[attr-defined]
        conn.copy_text("executions", columns, data)  # type: ignore[attr-defined]
        conn.execute(sql, params)
