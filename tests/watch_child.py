"""A process that starts a watched change, records live runs, and waits to be killed.

As a script it is the child: it applies ``NEW`` to ``a.md`` under a watch (before: ``BEFORE``),
prints ``STARTED <watch id>``, then records ``runs`` runs of the agent that all fail (the change
hurts), advancing the watch after none of them, prints ``RAN``, flushed, and sleeps until the
parent kills it with SIGKILL. The parent then reopens the store as every face does.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from crash_child import quiet_logs  # noqa: E402

from agentmend.infrastructure.changes.improvement_manager import (  # noqa: E402
    ChangeType,
    ImprovementAction,
    ImprovementManager,
)
from agentmend.infrastructure.changes.watch import ChangeWatcher  # noqa: E402
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor  # noqa: E402

OLD = b"old prompt\n"
NEW = "new prompt\n"
BEFORE = (True,) * 200
"""The agent's runs before the change: all succeeded."""


def action() -> ImprovementAction:
    return ImprovementAction(
        target_agent="a", action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
    )


def main(db: Path, root: Path, runs: int) -> None:
    quiet_logs()
    manager = ImprovementManager(db)
    watch = ChangeWatcher(manager).start(
        action(), path="a.md", new_content=NEW, root=root, before=BEFORE
    )
    print(f"STARTED {watch.watch_id}", flush=True)
    with PerformanceMonitor(manager.store, baseline_n=30) as monitor:
        for _ in range(runs):
            monitor.record("a", success=False, duration_ms=100.0)
        monitor.flush()
    print("RAN", flush=True)
    time.sleep(600)  # the parent kills this process


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
