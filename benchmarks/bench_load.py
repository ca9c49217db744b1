"""The monitor under load: the writer's sustained rate, overload, close(), open, bytes per run.

Each figure comes with a baseline run in the same process (or by the same script, in a fresh
process where memory is measured):

1. the writer's sustained rate with 1, 4 and 8 processes recording into one store as fast as
   they can (each ``record()`` waits for its writer when the backlog is full), against raw
   ``executemany`` inserts of the same rows in one process;
2. backlog and RSS with ``record()`` paced at 2x the one-process rate for ``--seconds``: the
   bounded monitor (``wait`` and ``drop``) against an unbounded one (a backlog limit of 10^9,
   which is how the monitor behaved before it had one), each in a fresh process;
3. ``close()`` with a full default backlog (100,000 runs) and with a 1,000,000-run backlog and a
   2 s deadline, against writing the same million runs in one transaction (the old close);
4. opening a monitor on stores of 10k / 1M / 10M runs (built through a fast path), against
   the queries the open ran before the rollups (a full-table ``GROUP BY`` and ``DISTINCT``);
5. store bytes per run recorded, 60 days of runs with and without retention of 30 days.

Run: ``.venv/bin/python benchmarks/bench_load.py [--seconds 30] [--sizes 10000,1000000,10000000]
[--sections 1,2,3,4,5]``.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.retention import RetentionPolicy, prune
from agentmend.infrastructure.store.usage import store_usage

_PAGE = os.sysconf("SC_PAGE_SIZE")
_ROW = ("solver", "run", True, 1234.0, None, 10, 5, 0.001, 1.7e9, None)


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


# ------------------------------------------------------------------ 1. the writer's sustained rate


def _record_child(db: str, runs: int, start: Any) -> None:
    monitor = PerformanceMonitor(Store(db), backlog_wait_s=60.0, close_timeout_s=None)
    start.wait()  # every process imported and opened: the clock starts
    record = monitor.record
    for _ in range(runs):
        record("solver", success=True, duration_ms=1234.0)
    monitor.close()


def writer_rate(processes: int, runs_per_process: int) -> float:
    """Runs stored per second by ``processes`` processes recording as fast as they can."""
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "w.db")
        PerformanceMonitor(Store(db)).close()  # tables made before the clock starts
        start = ctx.Barrier(processes + 1)
        children = [
            ctx.Process(target=_record_child, args=(db, runs_per_process, start))
            for _ in range(processes)
        ]
        for child in children:
            child.start()
        start.wait()
        began = time.perf_counter()
        for child in children:
            child.join()
        elapsed = time.perf_counter() - began
        with sqlite3.connect(db) as conn:
            stored = int(conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0])
    assert stored == processes * runs_per_process, stored
    return stored / elapsed


def raw_insert_rate(runs: int) -> float:
    """Baseline: the same rows by plain ``executemany`` in transactions of 10,000."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "r.db")
        PerformanceMonitor(store).close()
        rows = [(*_ROW, "raw")] * runs
        sql = (
            "INSERT INTO executions (agent, source, success, duration_ms, error, input_tokens,"
            " output_tokens, cost_usd, ts, extra, writer) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
        )
        began = time.perf_counter()
        for i in range(0, runs, 10_000):
            with store.transaction() as conn:
                conn.executemany(sql, rows[i : i + 10_000])
        elapsed = time.perf_counter() - began
        store.close()
    return runs / elapsed


# ------------------------------------------------------------------ 2. overload at 2x the rate


def _overload_child(rate: float, seconds: float, max_backlog: int, policy: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "o.db"
        monitor = PerformanceMonitor(
            Store(db), max_backlog=max_backlog, backlog_policy=policy, close_timeout_s=None
        )
        before = _rss()
        peak = {"pending": 0, "rss": 0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.25):
                peak["pending"] = max(peak["pending"], monitor.backlog_status().pending)
                peak["rss"] = max(peak["rss"], _rss() - before)

        sampler = threading.Thread(target=sample)
        sampler.start()
        record = monitor.record
        tick = 0.01
        per_tick = max(1, int(rate * tick))
        began = time.perf_counter()
        calls = 0
        while True:
            elapsed = time.perf_counter() - began
            if elapsed >= seconds:
                break
            due = int(elapsed / tick) + 1
            while calls < due * per_tick:
                record("solver", success=True, duration_ms=1234.0)
                calls += 1
            pause = due * tick - (time.perf_counter() - began)
            if pause > 0:
                time.sleep(pause)
        recorded_in = time.perf_counter() - began
        stop.set()
        sampler.join()
        status = monitor.backlog_status()
        close_began = time.perf_counter()
        monitor.close()
        close_s = time.perf_counter() - close_began
        with sqlite3.connect(db) as conn:
            stored = int(conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0])
    return {
        "recorded": calls,
        "achieved_rate": calls / recorded_in,
        "peak_backlog": peak["pending"],
        "peak_rss_mb": peak["rss"] / 2**20,
        "refused": status.refused,
        "stored": stored,
        "close_s": close_s,
    }


def overload(rate: float, seconds: float, max_backlog: int, policy: str) -> dict[str, Any]:
    """Paced recording in a fresh process, so its RSS is the monitor's alone."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result: dict[str, Any] = pool.apply(_overload_child, (rate, seconds, max_backlog, policy))
    return result


# ------------------------------------------------------------------ 3. close()


def close_time(
    backlog: int, timeout_s: float | None, one_transaction: bool = False
) -> tuple[float, int, int]:
    """(seconds close() took with ``backlog`` runs waiting, runs it left unwritten, the WAL's
    size after it: a WAL file never shrinks by itself, so this is the most it held)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "c.db")
        monitor = PerformanceMonitor(
            store, max_backlog=backlog + 1, flush_interval_s=3600, flush_max_batch=10**9
        )
        record = monitor.record
        for _ in range(backlog):
            record("solver", success=True, duration_ms=1234.0)
        began = time.perf_counter()
        if one_transaction:  # the old close: everything in one transaction
            with monitor._state_lock:
                monitor._drain()
                rows, monitor._unwritten = monitor._unwritten, []
            assert monitor._table is not None
            monitor._table.insert(rows)
            left = 0
        else:
            left = monitor.close(timeout_s=timeout_s)
        elapsed = time.perf_counter() - began
        wal = store.path.with_name(store.path.name + "-wal").stat().st_size
        monitor._unwritten.clear()  # what a deadline left is not part of the figure
        monitor._closing.clear()
        store.close()
    return elapsed, left, wal


# ------------------------------------------------------------------ 4. open time


def build_store(db: Path, runs: int) -> None:
    """``runs`` runs of 8 agents (one failure in 1,000 with an error) through one INSERT."""
    PerformanceMonitor(Store(db)).close()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
            " INSERT INTO executions (agent, source, success, duration_ms, error, input_tokens,"
            " output_tokens, cost_usd, ts, extra, writer)"
            " SELECT 'agent-' || (i % 8), 'run', CASE WHEN i % 1000 = 0 THEN 0 ELSE 1 END,"
            " 100.0 + i % 50, CASE WHEN i % 1000 = 0 THEN 'boom' END, 10, 5, 0.001,"
            " 1.7e9 + i, NULL, 'fast-path' FROM n",
            (runs,),
        )
        for table in ("execution_totals", "baseline_runs"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("DROP INDEX executions_errors")
        conn.execute("DELETE FROM schema_versions WHERE component = 'execution_rollup'")
    conn.close()
    PerformanceMonitor(Store(db)).close()  # the migration rebuilds the rollups


def open_ms(db: Path, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        store = Store(db)
        monitor = PerformanceMonitor(store)
        times.append(time.perf_counter() - began)
        monitor.close()
        store.close()
    return min(times) * 1000  # the best of 7: the machine is shared, and noise only adds


def workspace_open_ms(folder: Path, repeats: int = 7) -> float:
    """Opening a whole workspace (store, change manager, recovery, monitor, issue ledger)."""
    from agentmend.faces.workspace import Workspace
    from agentmend.infrastructure.settings import load_settings

    settings = load_settings(workspace=folder)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        workspace = Workspace.open(folder, settings=settings, create=True)
        times.append(time.perf_counter() - began)
        workspace.close()
    return min(times) * 1000


def old_open_queries_ms(db: Path) -> float:
    """Baseline: the two history-wide queries the open ran before (totals, agent list)."""
    conn = sqlite3.connect(db)
    began = time.perf_counter()
    conn.execute(
        "SELECT agent, source, COUNT(*), SUM(1 - success), SUM(input_tokens),"
        " SUM(output_tokens), SUM(cost_usd) FROM executions GROUP BY agent, source"
    ).fetchall()
    conn.execute(
        "SELECT DISTINCT agent FROM executions WHERE source = 'run'"
        " UNION SELECT agent FROM baseline_epochs"
    ).fetchall()
    elapsed = time.perf_counter() - began
    conn.close()
    return elapsed * 1000


# ------------------------------------------------------------------ 5. bytes per run


def bytes_per_run(runs: int, retention_days: float | None) -> tuple[float, int]:
    """(executions bytes per run recorded, runs kept) for ``runs`` spread over 60 days."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "b.db")
        with PerformanceMonitor(
            store, baseline_n=500, backlog_wait_s=60.0, close_timeout_s=None
        ) as monitor:
            for i in range(runs):
                monitor.record(
                    f"agent-{i % 4}", success=i % 50 != 0, duration_ms=100.0 + i % 50,
                    error="TimeoutError: no answer in 30 s" if i % 50 == 0 else None,
                    input_tokens=1200, output_tokens=300, cost_usd=0.004,
                )  # fmt: skip
        span = 60 * 86_400.0
        now = time.time()
        with store.transaction() as conn:  # spread the runs evenly over the last 60 days
            conn.execute("UPDATE executions SET ts = ? + (id * ?)", (now - span, span / (runs + 1)))
        if retention_days is not None:
            prune(store, RetentionPolicy(run_days=retention_days, baseline_n=500))
        usage = store_usage(store)
        runs_kind = next(k for k in usage.kinds if k.kind == "runs")
        store.close()
    assert runs_kind.bytes is not None
    return runs_kind.bytes / runs, runs_kind.rows


# ------------------------------------------------------------------ report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="overload duration")
    parser.add_argument("--runs", type=int, default=200_000, help="runs per writer process")
    parser.add_argument("--sizes", default="10000,1000000,10000000", help="open-time stores")
    parser.add_argument("--sections", default="1,2,3,4,5", help="which figures (1-5) to measure")
    parser.add_argument("--rate", type=float, help="section 2's writer rate without section 1")
    args = parser.parse_args()
    sections = {int(s) for s in args.sections.split(",")}
    rate = args.rate or 50_000.0
    if 1 in sections:
        rate = _section_rates(args.runs)[1]
    if 2 in sections:
        _section_overload(2 * rate, args.seconds)
    if 3 in sections:
        _section_close()
    if 4 in sections:
        _section_open([int(s) for s in args.sizes.split(",") if s])
    if 5 in sections:
        _section_bytes()


def _section_rates(runs: int) -> dict[int, float]:
    print("1. writer's sustained rate (runs stored per second, all processes together)")
    raw = raw_insert_rate(runs)
    print(f"   baseline: raw executemany, 1 process        {raw:>10,.0f} /s")
    rates = {}
    for processes in (1, 4, 8):
        per = max(10_000, runs // processes)
        rates[processes] = writer_rate(processes, per)
        print(
            f"   monitor, {processes} process(es) x {per:>7,} runs      "
            f"{rates[processes]:>10,.0f} /s  ({rates[processes] / raw:.2f}x raw)"
        )
    return rates


def _section_overload(target: float, seconds: float) -> None:
    print(f"\n2. record() paced at 2x the 1-process rate ({target:,.0f}/s) for {seconds:.0f} s")
    print(
        "   policy (max backlog)        recorded   rate/s   peak backlog  peak RSS"
        "   refused   stored  close"
    )
    runs_of = {}
    for label, limit, policy in (
        ("unbounded (baseline)", 10**9, "wait"),
        ("wait (100,000)", 100_000, "wait"),
        ("drop (100,000)", 100_000, "drop"),
    ):
        r = overload(target, seconds, limit, policy)
        runs_of[label] = r
        print(
            f"   {label:<24} {r['recorded']:>11,} {r['achieved_rate']:>8,.0f}"
            f" {r['peak_backlog']:>14,} {r['peak_rss_mb']:>7.0f} MB {r['refused']:>9,}"
            f" {r['stored']:>8,} {r['close_s']:>5.1f} s"
        )
        assert r["stored"] + r["refused"] == r["recorded"], r
    base = runs_of["unbounded (baseline)"]
    for label in ("wait (100,000)", "drop (100,000)"):
        r = runs_of[label]
        print(
            f"   {label}: peak backlog {r['peak_backlog'] / max(1, base['peak_backlog']):.3f}x,"
            f" peak RSS {r['peak_rss_mb'] / max(1e-9, base['peak_rss_mb']):.3f}x the unbounded"
        )


def _section_close() -> None:
    print("\n3. close() (and the most the WAL held)")
    full, left_full, wal_full = close_time(100_000, math.inf)
    print(
        f"   a full default backlog (100,000 runs)        {full:6.2f} s, {left_full} left,"
        f" WAL {wal_full / 2**20:6.1f} MB"
    )
    old, _, wal_old = close_time(1_000_000, None, one_transaction=True)
    print(
        f"   baseline: 1,000,000 runs in one transaction  {old:6.2f} s (the old close),"
        f" WAL {wal_old / 2**20:6.1f} MB"
    )
    everything, _, wal_all = close_time(1_000_000, math.inf)
    print(
        f"   1,000,000 runs, no deadline                {everything:6.2f} s"
        f" ({everything / old:.2f}x), WAL {wal_all / 2**20:6.1f} MB ({wal_all / wal_old:.3f}x)"
    )
    bounded, left, _ = close_time(1_000_000, 2.0)
    print(
        f"   1,000,000 runs, deadline 2 s               {bounded:6.2f} s, {left:,} reported"
        f" unwritten ({bounded / old:.2f}x the old close)"
    )


def _section_open(sizes: list[int]) -> None:
    print("\n4. opening a monitor (best of 7)")
    opened: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            folder = Path(tmp) / f"ws-{size}"
            folder.mkdir()
            db = folder / "agentmend.db"
            began = time.perf_counter()
            build_store(db, size)
            built = time.perf_counter() - began
            opened[size] = open_ms(db)
            whole = workspace_open_ms(folder)
            old_ms = old_open_queries_ms(db)
            print(
                f"   {size:>12,} runs: open {opened[size]:8.2f} ms"
                f" ({opened[size] / opened[sizes[0]]:.2f}x the {sizes[0]:,}-run open);"
                f" baseline, the old history-wide queries alone {old_ms:9.1f} ms"
                f" ({old_ms / opened[size]:.0f}x); a whole workspace {whole:8.2f} ms;"
                f" built in {built:.0f} s"
            )
            shutil.rmtree(folder)


def _section_bytes() -> None:
    print("\n5. store bytes per run recorded (executions table and its indexes)")
    runs = 200_000
    keep_all, kept_all = bytes_per_run(runs, None)
    pruned, kept = bytes_per_run(runs, 30.0)
    print(
        f"   baseline: no retention, 60 days of runs    {keep_all:6.1f} B/run ({kept_all:,} rows)"
    )
    print(
        f"   retention 30 days                          {pruned:6.1f} B/run ({kept:,} rows,"
        f" {pruned / keep_all:.2f}x)"
    )


if __name__ == "__main__":
    main()
