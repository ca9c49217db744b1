"""The monitor's writer against the cheapest way to put the same rows in the same table.

Each figure is a ratio to a baseline measured in the same run on the same server, so a busy
machine moves both (the load average is printed before and after; quote it with the figures).
The PostgreSQL server is a throwaway one (Debian's PostgreSQL 15 binaries, ``tests/pg_server.py``)
with its durable defaults (``fsync`` and ``synchronous_commit`` on), on the same cores as the
benchmark. Every measurement gets a fresh database with the executions table made by
``ExecutionStore`` (so the same columns and indexes), and counts the rows afterwards.

- **batches**: W processes (1, 4, 8), each writing its runs in batches of ``--batch`` through
  ``ExecutionStore.insert`` (rows, their rollups and series in one transaction per batch), vs
  the same processes appending the same rows with a bare ``COPY`` per batch (no rollups, no
  lock): runs/s and the ratio; and 8 writers' runs/s over 4 writers'. Each process records its
  own agent (``--shared-agents``: every process records the same 4 agents, so their rollup rows
  are the same rows).
- **one-run batches**: 16 processes each writing ``--single`` batches of one run, vs the same
  processes each sending one autocommitted ``INSERT`` per run (one round trip, its commit
  included, no lock, no rollups).
Each PostgreSQL figure is the median of ``--rounds`` paired rounds (the store and its baseline
measured back to back, in alternating order), as the machine's load moves between rounds.

- **SQLite**: one process writing batches through ``ExecutionStore.insert`` vs
  ``executemany`` of the same rows into the same table in one transaction per batch; and the
  whole path, ``PerformanceMonitor.record()`` of ``--runs`` runs then ``flush()`` (the
  background writer's batches of up to 1,000), vs ``executemany`` of the same runs in
  transactions of 1,000.

Run: ``.venv/bin/python benchmarks/bench_writer.py [--runs 40000] [--batch 5000]``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_store import release_together
from pg_server import PgServer

from agentmend.infrastructure.monitoring.agent_window import RUN
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.store.api import Store

_COLUMNS = (
    "agent",
    "source",
    "success",
    "duration_ms",
    "error",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "ts",
    "extra",
    "writer",
    "writer_seq",
)


def _rows(worker: int, count: int, shared: bool) -> list[tuple[Any, ...]]:
    now = time.time()
    return [
        (
            f"agent-{i % 4}" if shared else f"agent-{worker}",
            RUN,
            i % 9 != 0,
            float(i % 100) + 0.5,
            None if i % 9 else "timeout after 30s",
            120 + i % 50,
            40 + i % 30,
            0.0012,
            now + i * 0.01,
            None,
        )
        for i in range(count)
    ]


def _child(argv: list[str]) -> None:
    mode, url, files_dir, worker, count, batch, shared = argv[:7]
    rows = _rows(int(worker), int(count), shared == "1")
    size = int(batch)
    batches = [rows[i : i + size] for i in range(0, len(rows), size)]
    writer = uuid.uuid4().hex
    run: Any
    if mode == "store":
        store = Store(url, files_dir=files_dir)
        table = ExecutionStore(store, writer)
        run = table.insert
    elif mode == "copy":
        import psycopg

        conn = psycopg.connect(url, autocommit=True)
        seq = iter(range(1, len(rows) + 1))

        def run(part: list[tuple[Any, ...]]) -> None:
            with (
                conn.transaction(),
                conn.cursor().copy(f"COPY executions ({', '.join(_COLUMNS)}) FROM STDIN") as copy,
            ):
                for row in part:
                    copy.write_row((*row[:2], int(row[2]), *row[3:], writer, next(seq)))

    else:  # "insert": one autocommitted INSERT per batch (of one run)
        import psycopg

        conn = psycopg.connect(url, autocommit=True)
        seq = iter(range(1, len(rows) + 1))
        one = (
            f"INSERT INTO executions ({', '.join(_COLUMNS)}) VALUES "
            f"({', '.join(['%s'] * len(_COLUMNS))})"
        )

        def run(part: list[tuple[Any, ...]]) -> None:
            for row in part:
                conn.execute(one, (*row[:2], int(row[2]), *row[3:], writer, next(seq)))

    sys.stdout.write("READY\n")
    sys.stdout.flush()
    sys.stdin.readline()
    for part in batches:
        run(part)
    if mode == "store":  # its last runs folded into the rollups: part of the time measured
        table.fold_quietly(wait=True)  # as close() does
    sys.stdout.write("DONE\n")
    sys.stdout.flush()


def _fresh(server: PgServer, files_dir: Path) -> str:
    url = server.create_database()
    with Store(url, files_dir=files_dir) as store:
        ExecutionStore(store, uuid.uuid4().hex)  # the table, its indexes and rollups
    return url


def _rate(
    server: PgServer, files_dir: Path, mode: str, workers: int, runs: int, batch: int, shared: bool
) -> float:
    url = _fresh(server, files_dir)
    args = [mode, url, str(files_dir), str(runs), str(batch), "1" if shared else "0"]
    elapsed = release_together(__file__, args, workers)
    with Store(url, files_dir=files_dir) as store:
        stored = int(store.connection().execute("SELECT COUNT(*) FROM executions").fetchone()[0])
    if stored != workers * runs:
        raise SystemExit(f"{mode}: {stored} rows stored of {workers * runs}")
    return workers * runs / elapsed


def _paired(
    server: PgServer,
    files_dir: Path,
    base: str,
    workers: int,
    runs: int,
    batch: int,
    rounds: int,
    shared: bool,
) -> tuple[float, float, float]:
    """(median runs/s through the store, median of the baseline, median of the per-round
    ratios): each round measures both, in alternating order, so a change in the machine's
    load moves both sides of a ratio alike."""
    stores, bases, ratios = [], [], []
    for r in range(rounds):
        order = ("store", base) if r % 2 else (base, "store")
        rate = {
            mode: _rate(server, files_dir, mode, workers, runs, batch, shared and mode == "store")
            for mode in order
        }
        stores.append(rate["store"])
        bases.append(rate[base])
        ratios.append(rate["store"] / rate[base])
    return statistics.median(stores), statistics.median(bases), statistics.median(ratios)


def postgres(args: argparse.Namespace, files_dir: Path) -> None:
    server = PgServer(fsync=True)
    try:
        by_workers: dict[int, tuple[float, float]] = {}
        for workers in () if args.only == "one-run" else (1, 4, 8):
            store, copy, ratio = _paired(
                server,
                files_dir,
                "copy",
                workers,
                args.runs,
                args.batch,
                args.rounds,
                args.shared_agents,
            )
            by_workers[workers] = (store, copy)
            print(
                f"PostgreSQL, {workers} writer(s), batches of {args.batch:,}: "
                f"{store:,.0f} runs/s vs bare COPY {copy:,.0f} runs/s = {ratio:.2f}x"
                f" (median of {args.rounds} paired rounds)",
                flush=True,
            )
        if by_workers:
            print(
                f"PostgreSQL, 8 writers over 4 writers: {by_workers[8][0] / by_workers[4][0]:.2f}x"
                f" (bare COPY: {by_workers[8][1] / by_workers[4][1]:.2f}x)"
            )
        store, single, ratio = _paired(
            server, files_dir, "insert", 16, args.single, 1, args.rounds, False
        )
        print(
            f"PostgreSQL, 16 processes, one-run batches: {store:,.0f} runs/s vs one autocommitted"
            f" INSERT per run {single:,.0f} runs/s = {ratio:.2f}x"
            f" (median of {args.rounds} paired rounds)",
            flush=True,
        )
    finally:
        server.stop()


def _plain_sqlite(path: Path) -> tuple[sqlite3.Connection, str]:
    """A fresh SQLite file with the executions table ``ExecutionStore`` makes, opened as the
    store opens it (WAL, ``synchronous=NORMAL``), and the bare INSERT of one run."""
    with Store(path) as store:
        ExecutionStore(store, uuid.uuid4().hex)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    columns = ", ".join(_COLUMNS)
    return conn, f"INSERT INTO executions ({columns}) VALUES ({', '.join('?' * len(_COLUMNS))})"


def sqlite(args: argparse.Namespace, base: Path) -> None:
    rows = _rows(0, args.runs, False)
    batches = [rows[i : i + args.batch] for i in range(0, len(rows), args.batch)]
    best: dict[str, float] = {}
    for attempt in range(3):  # interleaved, best of three each
        conn, insert = _plain_sqlite(base / f"plain-{attempt}.db")
        writer, seq = uuid.uuid4().hex, 0
        start = time.perf_counter()
        for part in batches:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(insert, [(*r, writer, seq + i) for i, r in enumerate(part, 1)])
            conn.execute("COMMIT")
            seq += len(part)
        best["plain"] = max(best.get("plain", 0.0), args.runs / (time.perf_counter() - start))
        conn.close()
        with Store(base / f"store-{attempt}.db") as store:
            table = ExecutionStore(store, uuid.uuid4().hex)
            start = time.perf_counter()
            for part in batches:
                table.insert(part)
            rate = args.runs / (time.perf_counter() - start)
            best["store"] = max(best.get("store", 0.0), rate)
    print(
        f"SQLite, batches of {args.batch:,}: {best['store']:,.0f} runs/s vs executemany "
        f"{best['plain']:,.0f} runs/s = {best['store'] / best['plain']:.2f}x",
        flush=True,
    )
    monitors, plains, ratios = [], [], []
    for attempt in range(args.rounds * 2 + 1):  # paired rounds, alternating order
        rates = {}
        for side in ("monitor", "plain") if attempt % 2 else ("plain", "monitor"):
            path = base / f"{side}-m{attempt}.db"
            rates[side] = (_monitor_rate if side == "monitor" else _executemany_rate)(
                path, args.runs
            )
        monitors.append(rates["monitor"])
        plains.append(rates["plain"])
        ratios.append(rates["monitor"] / rates["plain"])
    print(
        f"SQLite, PerformanceMonitor record() + flush: {statistics.median(monitors):,.0f} runs/s"
        f" vs executemany in transactions of 1,000 {statistics.median(plains):,.0f} runs/s"
        f" = {statistics.median(ratios):.2f}x (median of {len(ratios)} paired rounds)",
        flush=True,
    )


def _monitor_rate(path: Path, runs: int) -> float:
    """Runs/s from the first ``record()`` to the last run committed, the production batching."""
    from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor

    with Store(path) as store:
        monitor = PerformanceMonitor(store)
        start = time.perf_counter()
        for i in range(runs):
            monitor.record("agent-0", success=i % 9 != 0, duration_ms=float(i % 100) + 0.5)
        monitor.flush()
        rate = runs / (time.perf_counter() - start)
        monitor.close()
    return rate


def _executemany_rate(path: Path, runs: int) -> float:
    """The same runs by ``executemany``, 1,000 per transaction (the monitor's batch)."""
    conn, insert = _plain_sqlite(path)
    rows = [(*r[:2], int(r[2]), *r[3:], "w", i) for i, r in enumerate(_rows(0, runs, False))]
    start = time.perf_counter()
    for i in range(0, runs, 1000):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, rows[i : i + 1000])
        conn.execute("COMMIT")
    rate = runs / (time.perf_counter() - start)
    conn.close()
    return rate


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=40_000, help="runs per writer process")
    parser.add_argument("--batch", type=int, default=5_000, help="runs per batch")
    parser.add_argument("--single", type=int, default=300, help="one-run batches per process")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds per figure")
    parser.add_argument("--shared-agents", action="store_true")
    parser.add_argument(
        "--only",
        choices=("sqlite", "postgresql", "one-run"),
        help="one backend's figures, or only PostgreSQL's one-run batches",
    )
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-writer-") as scratch:
        base = Path(scratch)
        if args.only in (None, "sqlite"):
            sqlite(args, base)
        if args.only != "sqlite":
            postgres(args, base)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
