"""``agentmend watch`` as a fleet runs it: two checker processes on one store, runs recorded by
a worker elsewhere judged by the one that holds the seat, and the standby taking over when the
holder is SIGKILLed. On SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_run import run_cli

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.detection.checker_seat import read_checkers
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.store.api import Store

ROOT = Path(__file__).resolve().parents[2]
TERM_S, INTERVAL_S = 2.0, 0.2
SETTINGS = {"AGENTMEND_BASELINE_N": "60", "AGENTMEND_MIN_BASELINE_N": "30", "NO_COLOR": "1"}

pytestmark = pytest.mark.usefixtures("restore_logging")


class Checker:
    """A ``agentmend watch`` child; its stdout lines as they come."""

    def __init__(self, workspace: Path, store: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentmend.faces.cli",
                "watch",
                "--workspace",
                str(workspace),
                "--store",
                store,
                "--interval",
                str(INTERVAL_S),
                "--term",
                str(TERM_S),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **SETTINGS},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if text in line:
                return line
        pytest.fail(f"no line with {text!r} from checker pid {self.process.pid} in {timeout} s")

    def stop(self) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        self._reader.join(timeout=20)  # to the end of its output, the child being gone
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.process.stdout.close()
        err = self.process.stderr.read()
        self.process.stderr.close()
        return self.process.returncode, err


def _record(store: Store, agent: str, runs: int, success: float, rng: random.Random) -> None:
    """A worker elsewhere in the fleet records ``runs`` of ``agent`` into the store."""
    with PerformanceMonitor(store, baseline_n=60) as worker:
        for _ in range(runs):
            worker.record(agent, success=rng.random() < success, duration_ms=100.0)


@pytest.mark.slow
def test_a_standby_checker_takes_over_from_a_killed_one_and_judges_the_fleets_runs(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    Workspace.open(workspace, settings=Settings(store_url=store_url), create=True).close()
    rng = random.Random(11)
    first = Checker(workspace, store_url)
    first.wait_for("checking team")
    second = Checker(workspace, store_url)
    checkers = [first, second]
    try:
        second.wait_for("standing by")
        with Store(store_url, files_dir=workspace) as store:
            _record(store, "writer", 80, 0.97, rng)
            _record(store, "writer", 150, 0.5, rng)  # the fault
            issue = first.wait_for("issue ")
            assert "writer low_success_rate" in issue

            first.process.kill()  # SIGKILL: the seat is never given back
            first.process.wait(timeout=20)
            killed = time.monotonic()
            second.wait_for("checking team", timeout=TERM_S + 20)
            takeover_s = time.monotonic() - killed
            assert takeover_s < 10

            _record(store, "planner", 80, 0.97, rng)
            _record(store, "planner", 150, 0.4, rng)
            assert "planner low_success_rate" in second.wait_for("issue ")
            (seat,) = read_checkers(store)
            assert seat.pid == second.process.pid
            assert seat.issues_opened == 1  # the writer's issue was the first checker's

        code, out, _ = run_cli(
            capsys, "status", "--json", "--workspace", str(workspace), "--store", store_url
        )
        assert code == 0
        status = json.loads(out)
        assert [c["pid"] for c in status["checkers"]] == [second.process.pid]
        issues = {a["agent"]: a["open_issues"] for a in status["agents"]}
        assert issues["writer"]
        assert issues["planner"]
    finally:
        results = [checker.stop() for checker in checkers]
    code, err = results[1]
    assert code == 0, err  # SIGTERM: a clean stop
    assert "Traceback" not in err
    with Store(store_url, files_dir=workspace) as store:
        assert read_checkers(store) == []  # and the seat left for the next checker
    with capsys.disabled():
        print(f"takeover after SIGKILL: {takeover_s:.2f} s (term {TERM_S} s)")


def test_bad_arguments_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    Workspace.open(workspace, create=True).close()
    for argv in (["--interval", "0"], ["--interval", "5", "--term", "5"], ["--max-checks", "0"]):
        code, _, err = run_cli(capsys, "watch", "--workspace", str(workspace), *argv)
        assert code == 2
        assert len(err.strip().splitlines()) == 1
