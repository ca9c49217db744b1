"""A worker of the fleet tests: many processes on one PostgreSQL store and one team.

``record URL FILES_DIR WORKER COUNT`` records COUNT runs of agent ``agent-WORKER`` and prints
``FLUSHED n`` each time a flush returned (n runs are then acknowledged as stored). A flush that
fails (the server restarting) is retried until it succeeds; nothing is printed for it.

``apply URL FILES_DIR ROOT WORKER COUNT`` applies COUNT changes to its agent's file in the shared
team folder ROOT and rolls back every other one, printing ``ACK id`` after an apply returned
and ``RBK id`` after a rollback returned. A store error (a restart) skips the step.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from crash_child import _action, make_content, quiet_logs  # noqa: E402

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager  # noqa: E402
from agentmend.infrastructure.errors import AgentmendError, StoreError  # noqa: E402
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor  # noqa: E402
from agentmend.infrastructure.store.api import Store  # noqa: E402

_DEADLINE_S = 120.0


def _record(url: str, files_dir: Path, worker: int, count: int) -> None:
    store = Store(url, files_dir=files_dir)
    monitor = PerformanceMonitor(store, flush_interval_s=0.05)
    deadline = time.monotonic() + _DEADLINE_S
    for i in range(count):
        monitor.record(f"agent-{worker}", success=i % 7 != 0, duration_ms=float(i % 50))
        if (i + 1) % 250 == 0 or i + 1 == count:
            while True:
                try:
                    monitor.flush()
                    break
                except StoreError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            print(f"FLUSHED {i + 1}", flush=True)
    monitor.close()
    store.close()


def _apply(url: str, files_dir: Path, root: Path, worker: int, count: int) -> None:
    rng = random.Random(worker)
    store = Store(url, files_dir=files_dir)
    manager = ImprovementManager(store=store)
    for i in range(count):
        try:
            record = manager.apply(
                _action(f"agent-{worker}"),
                path=f"worker{worker}.md",
                new_content=make_content(f"w{worker} {i}", rng),
                root=root,
            )
        except AgentmendError:
            time.sleep(0.1)
            continue
        print(f"ACK {record.change_id}", flush=True)
        if i % 2:
            try:
                manager.rollback_by_id(record.change_id)
            except AgentmendError:
                time.sleep(0.1)
                continue
            print(f"RBK {record.change_id}", flush=True)
    manager.close()
    store.close()


if __name__ == "__main__":
    quiet_logs()
    mode = sys.argv[1]
    if mode == "record":
        _record(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif mode == "apply":
        _apply(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]),
               int(sys.argv[6]))  # fmt: skip
    else:
        raise SystemExit(f"unknown mode {mode!r}")
