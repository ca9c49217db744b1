"""Many worker processes on one PostgreSQL store: 8 recording and 2 applying and rolling back
changes on one team, at once; then the same with an applier killed by SIGKILL mid-run, and with
the server restarted (``pg_ctl restart -m immediate``) mid-run.

Afterwards every run is counted (a recorder retries a flush the restart broke, and the runs of a
flush that returned are never lost), in the rollups too once folded (each run once), every
change is whole (applied, kept or rolled back, its file equal to a replay of the history,
nothing half-written), and the audit chain verifies.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from crash_child import check_history, child_env, make_content, read_lines
from pg_server import PgServer

from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.store.api import Store

RECORDERS = 8
APPLIERS = 2
RUNS = 3000  # per recorder
CHANGES = 16  # per applier
CHILD = str(Path(__file__).parents[2].joinpath("fleet_child.py"))


def _wait_for(lines: list[str], prefix: str, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(1 for line in lines if line.startswith(prefix)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {count} {prefix!r} lines in time: {lines[-5:]}")
        time.sleep(0.02)


def _fleet(
    pg_server: PgServer, tmp_path: Path, *, kill: bool = False, restart: bool = False
) -> None:
    url = pg_server.create_database()
    files_dir = tmp_path / ".agentmend"  # the cwd's default, which check_history opens with
    root = tmp_path / "team"
    root.mkdir()
    rng = random.Random(7)
    initial: dict[str, bytes | None] = {}
    for worker in range(APPLIERS):
        content = make_content(f"initial {worker}", rng)
        (root / f"worker{worker}.md").write_bytes(content)
        initial[f"worker{worker}.md"] = content
    Store(url, files_dir=files_dir).close()
    commands = [["record", url, files_dir, worker, RUNS] for worker in range(RECORDERS)] + [
        ["apply", url, files_dir, root, worker, CHANGES] for worker in range(APPLIERS)
    ]
    processes: list[subprocess.Popen[str]] = []
    outputs: list[list[str]] = []
    readers: list[threading.Thread] = []
    try:
        for command in commands:
            process = subprocess.Popen(
                [sys.executable, CHILD, *map(str, command)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
                env=child_env(),
            )  # fmt: skip
            processes.append(process)
            lines: list[str] = []
            outputs.append(lines)
            assert process.stdout is not None
            readers.append(read_lines(process.stdout, lines))
        killed = processes[RECORDERS]
        if kill:
            _wait_for(outputs[RECORDERS], "ACK", 3)
            time.sleep(random.Random(1).uniform(0.0, 0.05))
            os.kill(killed.pid, signal.SIGKILL)
        if restart:  # once every worker is at work (a worker that cannot open just fails)
            for worker in range(RECORDERS):
                _wait_for(outputs[worker], "FLUSHED", 1)
            for worker in range(RECORDERS, RECORDERS + APPLIERS):
                _wait_for(outputs[worker], "ACK", 1)
            pg_server.restart_immediate()
        for process in processes:
            process.wait(timeout=240)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for reader in readers:
            reader.join(timeout=30)
        for process in processes:
            if process.stdout is not None:
                process.stdout.close()
    for worker, process in enumerate(processes):
        expected = -signal.SIGKILL if kill and process is processes[RECORDERS] else 0
        assert process.returncode == expected, (worker, outputs[worker][-5:])
    with Store(url, files_dir=files_dir) as store:
        conn = store.connection()
        # small batches are folded into the rollups later: by their writer's close, or (its
        # fold broken by the restart) by the next fold of anyone, as here, each run once
        ExecutionStore(store, "checker").fold()
        for worker in range(RECORDERS):
            flushed = max(int(line.split()[1]) for line in outputs[worker])
            assert flushed == RUNS
            stored = conn.execute(
                "SELECT COUNT(*) FROM executions WHERE agent = ?", (f"agent-{worker}",)
            ).fetchone()[0]
            assert stored == RUNS  # every acknowledged run, and none twice
            totals = conn.execute(
                "SELECT runs FROM run_totals WHERE agent = ?", (f"agent-{worker}",)
            ).fetchone()[0]
            assert totals == RUNS
            rollup = conn.execute(
                "SELECT executions FROM execution_totals WHERE agent = ? AND source = 'run'",
                (f"agent-{worker}",),
            ).fetchone()[0]
            baseline = conn.execute(
                "SELECT SUM(runs) FROM baseline_runs WHERE agent = ?", (f"agent-{worker}",)
            ).fetchone()[0]
            assert rollup == baseline == RUNS
    acked = [
        line.split()[1] for lines in outputs[RECORDERS:] for line in lines if line[:3] == "ACK"
    ]
    rolled = [
        line.split()[1] for lines in outputs[RECORDERS:] for line in lines if line[:3] == "RBK"
    ]
    assert acked
    failures, _ = check_history(url, root, initial, acked, rolled)
    assert failures == []


@pytest.mark.slow
def test_eight_recorders_and_two_appliers_on_one_team(
    pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _fleet(pg_server, tmp_path)


@pytest.mark.slow
def test_an_applier_killed_mid_run_leaves_nothing_half_done(
    pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _fleet(pg_server, tmp_path, kill=True)


@pytest.mark.slow
def test_a_server_restart_mid_run_loses_no_acknowledged_run(
    own_pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _fleet(own_pg_server, tmp_path, restart=True)  # restarted: not the run's shared server
