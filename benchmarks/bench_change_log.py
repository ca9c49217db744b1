"""What one change costs: ``apply`` on both backends, and ``log_change`` against seed 003's JSON.

First, on SQLite and on a real PostgreSQL server (started as the tests start it,
``tests/pg_server.py``, with ``fsync`` and ``synchronous_commit`` on, on the same cores as this
process): the median and p95 of one ``apply`` of one file (its team settled: measured from a
second after the team's first change), each sample taken right after a bare durable transaction
(one INSERT, committed and synced) on the same store, so both see the same load and the ratio of
their medians says what an apply costs beside the cheapest durable write; beside them, the floor:
an apply's durable steps with nothing else (a row committed durably, the old file linked, a new
file written, synced and renamed over it, its folder synced, a second durable commit, a head
file written and synced: the five syncs an apply waits for, with none of its reads, checks or
records), so apply / floor is what agentmend adds and floor / bare what the syncs alone cost;
the CPU time this process spent in an apply (what waiting for disks and the server leaves out).
Then the round trips one apply makes (PostgreSQL: the client waiting for the server, from
libpq's trace; SQLite: the statements run), and the load average before and after.

Then, on SQLite alone: the median cost of one ``log_change`` (one INSERT plus its audit row,
committed with ``synchronous=FULL`` and the audit head synced) and of one ``apply`` (snapshot,
intent, backup, atomic file write, APPLIED with its audit row) with 10 and with 10,000 changes
already in the history, beside the seed's ``_save_history`` (``json.dump`` of every record on
every change, not even synced) at 10, 1,000 and 10,000 entries. Both of ours should stay flat as
the history grows. A durable commit cannot be cheaper than the disk's ``fdatasync``, so that is
printed too: on a loaded host it dominates everything else.

    python benchmarks/bench_change_log.py [--reps 300] [--apply-reps 200] [--backends-only]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from pg_server import PgServer
from round_trips import PgRoundTrips, Seen, SqliteStatements

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.change_log import ChangeLog
from agentmend.infrastructure.models import (
    ChangeRecord,
    ChangeStatus,
    ChangeType,
    ImprovementAction,
    utc_now,
)
from agentmend.infrastructure.store.api import Store

ACTION = ImprovementAction(
    target_agent="writer",
    action_type=ChangeType.PROMPT_MODIFICATION,
    old_value="You are a careful writer. " * 8,
    new_value="You are a careful writer who cites sources. " * 8,
    rationale="answers lacked sources",
    confidence_score=0.85,
)
PROMPT = ("---\nname: writer\nmodel: claude-sonnet-4-6\n---\n" + "Write clearly. " * 140).encode()


def median_us(fn: Callable[[int], object], reps: int) -> tuple[float, float]:
    """Median wall and CPU microseconds per call (CPU time leaves out waiting for the disk)."""
    wall, cpu = [], []
    for i in range(reps):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(i)
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    return statistics.median(wall) * 1e6, statistics.median(cpu) * 1e6


def prefill(db: Path, n: int) -> None:
    """Put ``n`` changes and their audit rows in the store in one transaction (fast setup)."""
    with Store(db) as store:
        changes, audit = ChangeLog(store), AuditLog(store)
        with audit.transaction() as txn:
            for _ in range(n):
                cid = ChangeLog.new_id()
                changes.insert(
                    txn.conn,
                    change_id=cid,
                    action=ACTION,
                    status=ChangeStatus.APPLIED,
                    applied_by="bench",
                    session_id="prefill",
                    created=utc_now(),
                )
                txn.append(
                    agent_name="writer",
                    edit_type="prompt_modification",
                    old_value=ACTION.old_value,
                    new_value=ACTION.new_value,
                    user_id="bench",
                    change_id=cid,
                )


def ours(tmp: Path, logged: int, reps: int) -> dict[str, tuple[float, float]]:
    db = tmp / f"ours{logged}.db"
    prefill(db, logged)
    root = tmp / f"root{logged}"
    (root / "agents").mkdir(parents=True)
    for k in range(10):
        (root / "agents" / f"a{k}.md").write_bytes(PROMPT)
    with ImprovementManager(db) as manager:
        for _ in range(20):  # warm the WAL and the page cache
            manager.log_change(ACTION)
        log_us = median_us(lambda i: manager.log_change(ACTION), reps)
        apply_us = median_us(
            lambda i: manager.apply(
                ACTION, path=f"agents/a{i % 10}.md", new_content=PROMPT + b"%d" % i, root=root
            ),
            reps,
        )
    return {"log_change (durable)": log_us, "apply (file + history)": apply_us}


_PROBE = ["CREATE TABLE bench_probe (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)"]


def median_p95(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


class DurableFloor:
    """An apply's durable steps with nothing else, on the apply's store and disk: a row
    committed durably (the intent), the old file hard-linked (the backup), a new file written,
    synced and renamed over it, its folder synced, a second durable commit (APPLIED), and a
    head file rewritten and synced (the audit head). The five syncs, none of the reads, checks,
    hashes or records around them: no apply with the same guarantees can cost less."""

    def __init__(self, store: Store, folder: Path) -> None:
        self.store = store
        self.folder = folder
        (folder / "backups").mkdir(parents=True)
        for k in range(10):
            (folder / f"a{k}.md").write_bytes(PROMPT)
        self.head = os.open(folder / "head", os.O_RDWR | os.O_CREAT, 0o644)

    def steps(self, i: int) -> None:
        with self.store.transaction(durable=True) as conn:
            conn.execute("INSERT INTO bench_probe (v) VALUES (?)", (-i,))
        name = f"a{i % 10}.md"
        os.link(self.folder / name, self.folder / "backups" / f"{name}.{i}.{time.time_ns()}")
        temp = self.folder / f".{name}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, PROMPT + b"%d" % i)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, self.folder / name)
        folder = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        with self.store.transaction(durable=True) as conn:  # (an INSERT: no scan, like the first)
            conn.execute("INSERT INTO bench_probe (v) VALUES (?)", (-i,))
        record = b"%064x\n" % i
        os.pwrite(self.head, record, 0)
        os.fdatasync(self.head)

    def close(self) -> None:
        os.close(self.head)


def apply_beside_bare(
    url: str, files_dir: Path, root: Path, reps: int, counter: PgRoundTrips | None
) -> dict[str, float]:
    """Median and p95 ms of ``apply`` and of a bare durable transaction, sampled in turn, and
    the round trips (statements on SQLite) of one apply and of one bare transaction."""
    (root / "agents").mkdir(parents=True)
    for k in range(10):
        (root / "agents" / f"a{k}.md").write_bytes(PROMPT)
    with Store(url, files_dir=files_dir) as store:
        store.migrate("bench_probe", _PROBE)
        manager = ImprovementManager(store=store, max_improvements_per_session=10**9)

        def bare(i: int) -> None:
            with store.transaction(durable=True) as conn:
                conn.execute("INSERT INTO bench_probe (v) VALUES (?)", (i,))

        def apply(i: int) -> None:
            manager.apply(
                ACTION, path=f"agents/a{i % 10}.md", new_content=PROMPT + b"%d" % i, root=root
            )

        floor = DurableFloor(store, root.parent / f"{root.name}-floor")

        # a team's first change writes its id file, which is read again at every use for a
        # second (a rewrite may keep its timestamps): measure the team as it runs
        apply(0)
        time.sleep(1.1)
        for i in range(20):  # warm the connections, the page cache and the WAL
            bare(i)
            floor.steps(i)
            apply(i)
        bare_ms: list[float] = []
        floor_ms: list[float] = []
        apply_ms: list[float] = []
        apply_cpu_ms: list[float] = []
        for i in range(reps):
            start = time.perf_counter()
            bare(i)
            floor_start = time.perf_counter()
            floor.steps(i)
            middle, middle_cpu = time.perf_counter(), time.process_time()
            apply(i)
            end, end_cpu = time.perf_counter(), time.process_time()
            bare_ms.append((floor_start - start) * 1000)
            floor_ms.append((middle - floor_start) * 1000)
            apply_ms.append((end - middle) * 1000)
            apply_cpu_ms.append((end_cpu - middle_cpu) * 1000)
        floor.close()
        windows: list[Seen] = []
        for fn in (apply, bare):
            if counter is not None:
                with counter.window() as seen:
                    fn(reps)
            else:
                sqlite_conn = store.connection()
                assert isinstance(sqlite_conn, sqlite3.Connection)
                with SqliteStatements(sqlite_conn).window() as seen:
                    fn(reps)
            windows.append(seen)
        manager.close()
    (a50, a95), (b50, b95) = median_p95(apply_ms), median_p95(bare_ms)
    f50, f95 = median_p95(floor_ms)
    return {
        "apply_median": a50, "apply_p95": a95, "bare_median": b50, "bare_p95": b95,
        "floor_median": f50, "floor_p95": f95,
        "apply_trips": windows[0].count, "bare_trips": windows[1].count,
        "apply_cpu": statistics.median(apply_cpu_ms),
    }  # fmt: skip


def backends(tmp: Path, reps: int) -> None:
    """The apply section: SQLite, then a PostgreSQL server started for it."""
    results = {
        "SQLite": apply_beside_bare(str(tmp / "apply.db"), tmp, tmp / "team-sqlite", reps, None)
    }
    counter = PgRoundTrips.install()
    server = PgServer(fsync=True)
    try:
        results["PostgreSQL"] = apply_beside_bare(
            server.create_database(), tmp, tmp / "team-pg", reps, counter
        )
    finally:
        server.stop()
        counter.uninstall()
    goals = {"SQLite": 1.5, "PostgreSQL": 3.0}
    print(f"apply of one file, {reps} samples each, ms      SQLite          PostgreSQL")
    rows = (
        ("apply, median (p95)", "apply_median", "apply_p95"),
        ("bare durable transaction, median (p95)", "bare_median", "bare_p95"),
        ("the floor: an apply's five syncs alone", "floor_median", "floor_p95"),
    )
    for label, mid, tail in rows:
        cells = [f"{results[b][mid]:6.2f} ({results[b][tail]:5.2f})" for b in results]
        print(f"{label:<44}" + "  ".join(f"{c:>16}" for c in cells))
    ratios = {b: r["apply_median"] / r["bare_median"] for b, r in results.items()}
    for label, above, below in (
        ("apply / bare durable transaction (medians)", "apply_median", "bare_median"),
        ("floor / bare durable transaction", "floor_median", "bare_median"),
        ("apply / floor (what agentmend adds)", "apply_median", "floor_median"),
    ):
        print(f"{label:<44}"
              + "  ".join(f"{r[above] / r[below]:>16.2f}" for r in results.values()))  # fmt: skip
    print(f"{'apply, this process CPU ms (median)':<44}"
          + "  ".join(f"{r['apply_cpu']:>16.2f}" for r in results.values()))  # fmt: skip
    trips = [f"{int(r['apply_trips'])} / {int(r['bare_trips'])}" for r in results.values()]
    print(f"{'per apply / per bare transaction':<44}"
          + "  ".join(f"{t:>16}" for t in trips)
          + "   (SQLite: statements; PostgreSQL: round trips)")  # fmt: skip
    verdicts = [
        f"{b}: median <= {goals[b]} ms {'yes' if r['apply_median'] <= goals[b] else 'NO'},"
        f" <= 4x bare {'yes' if ratios[b] <= 4 else 'NO'}"
        f" (the floor alone: {r['floor_median'] / r['bare_median']:.1f}x)"
        for b, r in results.items()
    ]
    print("goals: " + "; ".join(verdicts))


def seed_rewrite(tmp: Path, entries: int, reps: int) -> float:
    """Seed 003's ``_save_history``: append, then json.dump every record with indent=2."""
    path = tmp / f"seed{entries}.json"
    history = [
        ChangeRecord(
            change_id=f"{i:08x}",
            timestamp=utc_now(),
            action=ACTION,
            status=ChangeStatus.APPLIED,
            applied_by="self-improver",
        )
        for i in range(entries - 1)
    ]

    def one_change(i: int) -> None:
        history.append(
            ChangeRecord(
                change_id=f"n{i:07x}",
                timestamp=utc_now(),
                action=ACTION,
                status=ChangeStatus.APPLIED,
                applied_by="self-improver",
            )
        )
        with open(path, "w") as f:
            json.dump([rec.to_dict() for rec in history], f, indent=2)
        history.pop()  # keep the size at ``entries``

    return median_us(one_change, reps)[0]


def fdatasync_us(tmp: Path, reps: int) -> float:
    fd = os.open(tmp / "probe", os.O_RDWR | os.O_CREAT)

    def one(i: int) -> None:
        os.pwrite(fd, b"%256d" % i, 0)
        os.fdatasync(fd)

    try:
        return median_us(one, reps)[0]
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--apply-reps", type=int, default=200)
    parser.add_argument("--backends-only", action="store_true", help="only the apply section")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parents[1]) as name:
        backends(Path(name), args.apply_reps)
    if args.backends_only:
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parents[1]) as name:
        tmp = Path(name)
        sync = fdatasync_us(tmp, 200)
        small = ours(tmp, 10, args.reps)
        large = ours(tmp, 10_000, args.reps)
        seed = {n: seed_rewrite(tmp, n, r) for n, r in ((10, 300), (1_000, 60), (10_000, 12))}
        sync_after = fdatasync_us(tmp, 200)
    print(
        f"disk fdatasync (the floor of one durable commit): {sync:.0f} µs before, "
        f"{sync_after:.0f} µs after"
    )
    print("median µs per change, wall (cpu)      10 logged     10,000 logged   10,000 / 10")
    flat = True
    for name in small:
        (w10, c10), (wbig, cbig) = small[name], large[name]
        flat = flat and wbig / w10 < 1.5
        print(
            f"{name:<34} {w10:7.0f} ({c10:4.0f}) {wbig:9.0f} ({cbig:4.0f}) "
            f"{wbig / w10:7.2f} ({cbig / c10:.2f})"
        )
    log_us = large["log_change (durable)"][0]
    apply_us = large["apply (file + history)"][0]
    print("seed 003 _save_history (json.dump of every record per change, not synced):")
    for n, us in seed.items():
        print(f"  {n:>6,} entries: {us:9.0f} µs = {us / log_us:7.1f}x one durable log_change")
    print(
        f"goals: log_change < 500 µs: {'yes' if log_us < 500 else 'NO'}; "
        f"apply < 2000 µs: {'yes' if apply_us < 2000 else 'NO'}; "
        f"flat (10,000 / 10 < 1.5): {'yes' if flat else 'NO'}"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
