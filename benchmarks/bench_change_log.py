"""What one change costs: durable ``log_change`` and ``apply`` against seed 003's JSON rewrite.

Measures, in one process, the median cost of one ``log_change`` (one INSERT plus its audit row,
committed with ``synchronous=FULL`` and the audit head synced) and of one ``apply`` (snapshot,
intent, backup, atomic file write, APPLIED with its audit row) with 10 and with 10,000 changes
already in the history, beside the seed's ``_save_history`` (``json.dump`` of every record on
every change, not even synced) at 10, 1,000 and 10,000 entries. Both of ours should stay flat as
the history grows. A durable commit cannot be cheaper than the disk's ``fdatasync``, so that is
printed too: on a loaded host it dominates everything else.

    python benchmarks/bench_change_log.py [--reps 300]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
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


if __name__ == "__main__":
    main()
