"""What a recorded run costs on a PostgreSQL server's disk: table and indexes, rollups, WAL.

One throwaway server (Debian's PostgreSQL 15, ``tests/pg_server.py``, ``fsync`` on, default
``full_page_writes``), a fresh database per measurement, runs of ``--agents`` agents spread
over about ten minutes of timestamps:

- **batches**: ``--runs`` runs through ``ExecutionStore.insert`` in batches of 5,000 (the
  background writer's large batches);
- **one-run batches**: ``--single`` runs through ``ExecutionStore.insert`` one at a time (a
  lightly loaded worker), then a fold of the rollups not folded yet (PostgreSQL folds small
  batches into the rollups later, ``run_fold``; its folds are counted);
- the baselines: the same rows by a bare ``COPY`` per 5,000 into the same table (for the
  batches), and by one autocommitted ``INSERT`` each (for the one-run batches), nothing else.

For each: WAL bytes written per run (``pg_wal_lsn_diff`` of the server's WAL position before
and after; a checkpoint in between adds full-page images, as it would in production), the
executions table with its indexes per run, and the rollup tables per run
(``pg_total_relation_size``), with ratios to the baseline. Sizes are after the writes
(no ``VACUUM``), so updated rollup rows still hold their dead versions, as a live server's
would until autovacuum.

Run: ``.venv/bin/python benchmarks/bench_disk_per_run.py [--runs 100000] [--single 3000]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from pg_server import PgServer

from agentmend.infrastructure.monitoring.agent_window import RUN
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.store.api import Store

_COLUMNS = (
    "agent, source, success, duration_ms, error, input_tokens, output_tokens, cost_usd, ts,"
    " extra, writer, writer_seq"
)


def _rows(count: int, agents: int) -> list[tuple[Any, ...]]:
    start = time.time() - 600.0
    step = 600.0 / max(count, 1)
    return [
        (
            f"agent-{i % agents}",
            RUN,
            i % 9 != 0,
            float(i % 100) + 0.5,
            None if i % 9 else "timeout after 30s",
            120 + i % 50,
            40 + i % 30,
            0.0012,
            start + i * step,
            None,
        )
        for i in range(count)
    ]


_ROLLUPS = frozenset(
    {"execution_totals", "baseline_runs", "run_series", "run_rollups", "run_totals"}
)
"""The tables a run adds to besides its own row: lifetime totals, baseline counts, the minute
series, its coarser rollups and the series totals."""


def _wal_position(conn: Any) -> str:
    return str(conn.execute("SELECT CAST(pg_current_wal_lsn() AS TEXT)").fetchone()[0])


def _sizes(conn: Any) -> tuple[int, int]:
    """(bytes of the executions table with its indexes and toast, bytes of the rollups)."""
    rows = conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_catalog.pg_class c"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind = 'r' AND n.nspname = current_schema()"
    ).fetchall()
    runs = sum(int(size) for name, size in rows if name == "executions")
    rollups = sum(int(size) for name, size in rows if name in _ROLLUPS)
    return runs, rollups


def _measure(
    server: PgServer, files_dir: Path, mode: str, rows: list[tuple[Any, ...]]
) -> dict[str, float]:
    url = server.create_database()
    with Store(url, files_dir=files_dir) as store:
        table = ExecutionStore(store, uuid.uuid4().hex)
        conn = store.connection()
        empty_runs, empty_rollups = _sizes(conn)
        before = _wal_position(conn)
        if mode == "batches":
            for i in range(0, len(rows), 5_000):
                table.insert(rows[i : i + 5_000])
        elif mode == "one-run batches":
            for row in rows:
                table.insert([row])
            table.fold()  # the rollups of the runs not folded yet: part of what they cost
        elif mode == "bare INSERT":
            import psycopg

            insert = f"INSERT INTO executions ({_COLUMNS}) VALUES ({', '.join(['%s'] * 12)})"
            writer = uuid.uuid4().hex
            with psycopg.connect(url, autocommit=True) as bare:
                for seq, row in enumerate(rows, 1):
                    bare.execute(insert, (*row[:2], int(row[2]), *row[3:], writer, seq))
        else:
            import psycopg

            writer = uuid.uuid4().hex
            with psycopg.connect(url, autocommit=True) as bare:
                for i in range(0, len(rows), 5_000):
                    with (
                        bare.transaction(),
                        bare.cursor().copy(f"COPY executions ({_COLUMNS}) FROM STDIN") as copy,
                    ):
                        for seq, row in enumerate(rows[i : i + 5_000], i + 1):
                            copy.write_row((*row[:2], int(row[2]), *row[3:], writer, seq))
        after = _wal_position(conn)
        wal = int(
            conn.execute(
                f"SELECT pg_wal_lsn_diff(CAST('{after}' AS pg_lsn), CAST('{before}' AS pg_lsn))"
            ).fetchone()[0]
        )
        stored = int(conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0])
        if stored != len(rows):
            raise SystemExit(f"{mode}: {stored} runs stored of {len(rows)}")
        runs_bytes, rollup_bytes = _sizes(conn)
    n = len(rows)
    return {
        "wal": wal / n,
        "table": (runs_bytes - empty_runs) / n,
        "rollups": (rollup_bytes - empty_rollups) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100_000, help="runs written in batches")
    parser.add_argument("--single", type=int, default=3_000, help="runs written one at a time")
    parser.add_argument("--agents", type=int, default=20)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    server = PgServer(fsync=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-disk-") as scratch:
            files_dir = Path(scratch)
            for mode, base, count in (
                ("batches", "bare COPY", args.runs),
                ("one-run batches", "bare INSERT", args.single),
            ):
                rows = _rows(count, args.agents)
                store = _measure(server, files_dir, mode, rows)
                bare = _measure(server, files_dir, base, rows)
                print(
                    f"{mode} ({count:,} runs of {args.agents} agents): per run "
                    f"WAL {store['wal']:,.0f} B ({base} {bare['wal']:,.0f} B, "
                    f"{store['wal'] / bare['wal']:.2f}x), executions table and indexes "
                    f"{store['table']:,.0f} B ({base} {bare['table']:,.0f} B), "
                    f"rollups {store['rollups']:,.0f} B",
                    flush=True,
                )
    finally:
        server.stop()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
