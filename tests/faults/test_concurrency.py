"""Four processes recording executions and applying changes to one store and one root at once.

Nothing acknowledged is lost, no ``database is locked`` escapes, the shared files equal a replay
of the history (every change saw the write before it), and the audit chain has no gap.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest
from crash_child import check_history, child_command, child_env

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store

WORKERS = 4
CHANGES = 30


@pytest.mark.slow
def test_four_processes_record_and_apply_at_once_and_lose_nothing(tmp_path: Path) -> None:
    db, root = tmp_path / "agentmend.db", tmp_path / "team"
    root.mkdir()
    procs = [
        subprocess.Popen(
            child_command("concurrent", db, root, worker, CHANGES),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for worker in range(WORKERS)
    ]
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "READY":
            for other in procs:
                other.kill()
            errors = [other.communicate(timeout=30)[1] for other in procs]  # closes the pipes
            pytest.fail(f"a worker died while opening the store:\n{errors[procs.index(proc)]}")
    for proc in procs:  # all four are open; let them go together
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert "database is locked" not in err
        assert proc.returncode == 0, err[-3000:]
    lines = [line for out, _ in outputs for line in out.splitlines()]
    acked = [line.split()[1] for line in lines if line.startswith("ACK ")]
    assert len(acked) == WORKERS * CHANGES
    paths = ["shared/x.md", "shared/y.md"] + [f"worker{w}/own.md" for w in range(WORKERS)]
    failures, recovered = check_history(db, root, dict.fromkeys(paths), acked, [])
    assert failures == []
    assert recovered == 0  # nobody crashed: nothing to settle, no head to repair
    executed = Counter(line.split()[1] for line in lines if line.startswith("EXE "))
    assert sum(executed.values()) == WORKERS * CHANGES
    with Store(db) as store, PerformanceMonitor(store=store) as monitor:
        for agent, count in executed.items():
            metrics = monitor.get_agent_metrics(agent)
            assert metrics is not None
            assert metrics.executions == count
