"""The store on SQLite and on PostgreSQL, in one run on this machine.

The PostgreSQL server is a throwaway one the benchmark starts itself (Debian's PostgreSQL 15
binaries, ``tests/pg_server.py``) with its durable defaults (``fsync`` and
``synchronous_commit`` on), on the same cores as the benchmark: every figure for PostgreSQL
includes the server's own CPU. SQLite runs WAL with ``synchronous=NORMAL`` (commits survive a
process crash), as the store always does. Measured per backend:

- recorded runs per second with 1, 4 and 8 writer processes, each a ``PerformanceMonitor`` with
  the production batching (the background writer every ``flush_interval_s`` = 0.2 s or at
  ``flush_max_batch`` runs; the rows appended by ``COPY`` on PostgreSQL, by INSERTs of 100 rows
  on SQLite; one transaction per batch), from the first ``record()`` to the last run committed;
  every run is counted afterwards;
- the caller's ``record()`` cost (ns, median of 3 runs of 100,000 calls, flusher running);
- apply alone and apply + rollback latency of one file change (ms, median and p95 of 40), beside
  the disk's ``fdatasync`` of an 8 kB write measured just before (median of 100): an apply
  waits for five syncs (its intent's commit, the new file, its directory, the APPLIED commit,
  the audit head), so five of them are its floor on this disk;
  measured from a second after the team's first change (its id file written then is read
  again at every use for a second, as a rewrite may keep its timestamps);
- audit append throughput with 4 processes appending at once (rows/s), then the chain verified
  (a fork would fail it);
- a fleet-wide detector check: a fresh checker loads 100 agents x 10,000 runs from the store
  (``PerformanceMonitor`` rebuilding its state) and runs ``IssueDetector.check`` (s).

Run: ``.venv/bin/python benchmarks/bench_store.py [--runs 20000] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from pg_server import PgServer

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store

_ACTION = ImprovementAction(
    target_agent="writer",
    action_type=ChangeType.PROMPT_MODIFICATION,
    old_value="a",
    new_value="b",
    confidence_score=0.9,
)


def _child(argv: list[str]) -> None:
    mode, url, files_dir, worker, count = argv[:5]
    store = Store(url, files_dir=files_dir)
    monitor = PerformanceMonitor(store) if mode == "record" else None
    audit = AuditLog(store)
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    sys.stdin.readline()
    if monitor is not None:
        for i in range(int(count)):
            monitor.record(f"agent-{worker}", success=i % 9 != 0, duration_ms=float(i % 100))
        monitor.close()  # the last batch committed
    else:
        for i in range(int(count)):
            with audit.transaction() as txn:
                txn.append(
                    agent_name="writer",
                    edit_type="bench",
                    old_value=i,
                    new_value=i + 1,
                    user_id=f"w{worker}",
                )
    store.close()


def release_together(script: str, args: Sequence[str], workers: int) -> float:
    """Start ``workers`` children of ``script`` (``--child``, then ``args`` with the worker's
    number after the third), release them together once each has said ``READY``; seconds
    until the last is done."""
    children = [
        subprocess.Popen(
            [sys.executable, script, "--child", *args[:3], str(w), *args[3:]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    for child in children:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "READY":
            raise SystemExit(f"a {args[0]} worker did not start")
    start = time.perf_counter()
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        child.wait(timeout=900)
        if child.returncode != 0:
            raise SystemExit(f"a {args[0]} worker failed ({child.returncode})")
    elapsed = time.perf_counter() - start
    for child in children:
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
    return elapsed


def _count(url: str, files_dir: Path, table: str) -> int:
    with Store(url, files_dir=files_dir) as store:
        return int(store.connection().execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def recording(url: str, files_dir: Path, workers: int, runs: int) -> tuple[float, bool]:
    before = _count(url, files_dir, "executions") if workers > 1 else None
    elapsed = release_together(__file__, ["record", url, str(files_dir), str(runs)], workers)
    after = _count(url, files_dir, "executions")
    whole = before is None or after - before == workers * runs
    return workers * runs / elapsed, whole


def record_cost(url: str, files_dir: Path, n: int = 100_000) -> float:
    costs = []
    with Store(url, files_dir=files_dir) as store:
        for _ in range(3):
            monitor = PerformanceMonitor(store)
            start = time.perf_counter()
            for i in range(n):
                monitor.record("solo", success=True, duration_ms=float(i % 100))
            costs.append((time.perf_counter() - start) / n * 1e9)
            monitor.close()
    return statistics.median(costs)


def fdatasync_ms(where: Path, n: int = 100) -> float:
    """The median time of one durable 8 kB write in ``where`` (what pg_test_fsync measures)."""
    fd = os.open(where / "sync-probe", os.O_RDWR | os.O_CREAT)
    times = []
    try:
        for i in range(n):
            start = time.perf_counter()
            os.pwrite(fd, b"%8192d" % i, 0)
            os.fdatasync(fd)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        os.close(fd)
        os.unlink(where / "sync-probe")
    return statistics.median(times)


def apply_latency(url: str, files_dir: Path, team: Path, n: int = 40) -> tuple[float, ...]:
    (team / "agents").mkdir(parents=True, exist_ok=True)
    (team / "agents" / "writer.md").write_text("---\nname: writer\n---\nstart\n")
    alone: list[float] = []
    both: list[float] = []
    with Store(url, files_dir=files_dir) as store:
        manager = ImprovementManager(store=store, max_improvements_per_session=10**6)
        # a team's first change makes its id file; within a second of a write the id is read
        # again at every use (a rewrite may keep its timestamps), which a team in service
        # does not pay: measure the team as it runs, not as it is born
        first = manager.apply(_ACTION, path="agents/writer.md", new_content="v\n", root=team)
        manager.rollback_by_id(first.change_id)
        time.sleep(1.1)
        for i in range(n):
            start = time.perf_counter()
            record = manager.apply(
                _ACTION, path="agents/writer.md", new_content=f"v{i}\n", root=team
            )
            applied = time.perf_counter()
            manager.rollback_by_id(record.change_id)
            done = time.perf_counter()
            alone.append((applied - start) * 1000)
            both.append((done - start) * 1000)
        manager.close()
    return _median_p95(alone) + _median_p95(both)


def _median_p95(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def audit_throughput(url: str, files_dir: Path, rows: int) -> tuple[float, bool]:
    elapsed = release_together(__file__, ["audit", url, str(files_dir), str(rows)], 4)
    with Store(url, files_dir=files_dir) as store:
        verified = bool(AuditLog(store).verify_chain(repair=False))
    return 4 * rows / elapsed, verified


def detector_check(url: str, files_dir: Path, agents: int, runs: int) -> float:
    with Store(url, files_dir=files_dir) as store:
        table = ExecutionStore(store, "fill0000")
        batch: list[tuple[str, str, bool, float, str | None, int, int, float, float, None]] = []
        ts = 1_700_000_000.0
        for i in range(runs):
            for a in range(agents):
                batch.append((f"fleet-{a}", "run", i % 11 != 0, 10.0 + i % 7, None, 0, 0, 0.0,
                              ts + i, None))  # fmt: skip
            if len(batch) >= 20_000:
                table.insert(batch)  # type: ignore[arg-type]
                batch = []
        if batch:
            table.insert(batch)  # type: ignore[arg-type]
        start = time.perf_counter()
        monitor = PerformanceMonitor(store, baseline_n=500)
        IssueDetector().check(monitor)
        elapsed = time.perf_counter() - start
        monitor.close()
    return elapsed


def measure(name: str, url: str, files_dir: Path, args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    for workers in (1, 4, 8):
        rate, whole = recording(url, files_dir, workers, args.runs)
        out[f"runs/s, {workers} writer(s)"] = f"{rate:,.0f}" + ("" if whole else " (LOST RUNS)")
    out["record() caller cost, ns"] = f"{record_cost(url, files_dir):,.0f}"
    sync = fdatasync_ms(files_dir)
    a50, a95, b50, b95 = apply_latency(url, files_dir, files_dir / f"team-{name}")
    out["disk fdatasync 8 kB, ms median"] = f"{sync:.2f} (x6 = {6 * sync:.1f})"
    out["apply, ms median / p95"] = f"{a50:.2f} / {a95:.2f}"
    out["apply+rollback, ms median / p95"] = f"{b50:.2f} / {b95:.2f}"
    rate, verified = audit_throughput(url, files_dir, args.audit_rows)
    out["audit appends/s, 4 appenders"] = f"{rate:,.0f}" + (
        " (chain verified)" if verified else " (CHAIN BROKEN)"
    )
    seconds = detector_check(url, files_dir, args.agents, args.agent_runs)
    out[f"detector check, {args.agents} agents x {args.agent_runs:,} runs, s"] = f"{seconds:.2f}"
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20_000, help="runs per writer process")
    parser.add_argument("--audit-rows", type=int, default=250, help="rows per appender")
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--agent-runs", type=int, default=10_000)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as scratch:
        base = Path(scratch)
        results = {"SQLite": measure("sqlite", str(base / "agentmend.db"), base, args)}
        server = PgServer(fsync=True)
        try:
            results["PostgreSQL"] = measure("pg", server.create_database(), base, args)
        finally:
            server.stop()
    rows = list(results["SQLite"])
    width = max(len(r) for r in rows)
    print(f"{'':{width}}  {'SQLite':>24}  {'PostgreSQL':>24}")
    for row in rows:
        print(f"{row:{width}}  {results['SQLite'][row]:>24}  {results['PostgreSQL'][row]:>24}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
