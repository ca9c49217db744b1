"""``agentmend watch --on-issue report|ask|improve`` on a real checker process and the offline
simulated team, on SQLite and on a real PostgreSQL server.

A worker (this test) records research-agent's runs into the store, healthy and then under a
truncation fault; the checker (a child process whose simulated world has the same fault, see
``checker_child.py``) judges them. ``report`` opens the issue and does nothing else; ``ask``
asks, keeps judging, and runs one cycle once ``agentmend issue approve`` answers; ``improve``
refuses to start without yolo mode or a published release, and publishes what it keeps as a
canary, never as stable.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_run import run_cli

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.cycle_requests import read_requests
from agentmend.infrastructure.detection.checker_seat import read_checkers
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime
from agentmend.infrastructure.store.api import Store
from agentmend.loop.cycle import list_cycle_ids
from agentmend.roles.team import AgentTeam

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "checker_child.py"
AGENT = "research-agent"
INTERVAL_S, TERM_S = 0.2, 5.0
ENV = {"AGENTMEND_BASELINE_N": "30", "AGENTMEND_MIN_BASELINE_N": "30", "NO_COLOR": "1"}

pytestmark = pytest.mark.usefixtures("restore_logging")


class Checker:
    """``agentmend watch`` in a child whose simulated research-agent truncates its answers."""

    def __init__(self, workspace: Path, store: str, policy: str, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                AGENT,
                FaultKind.TRUNCATION.value,
                "watch",
                "--on-issue",
                policy,
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
            env={**os.environ, **ENV, **env},
        )
        self.seen: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            found = re.search(pattern, line)
            if found is not None:
                return found
        pytest.fail(f"no line matching {pattern!r} in {timeout} s; seen: {self.seen}")

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        self._reader.join(timeout=20)
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.process.stdout.close()
        err = self.process.stderr.read()
        self.process.stderr.close()
        assert self.process.returncode == 0, err
        assert "Traceback" not in err, err
        return err


def _workspace(tmp_path: Path, store_url: str) -> Path:
    folder = tmp_path / "ws"
    Workspace.open(folder, settings=Settings(store_url=store_url), create=True).close()
    return folder


def _record_fault(folder: Path, store_url: str) -> None:
    """A worker runs research-agent healthy for a baseline, then under the truncation fault."""

    async def drive() -> None:
        settings = Settings(store_url=store_url, baseline_n=30, min_baseline_n=30)
        with Workspace.open(folder, settings=settings, create=False) as ws:
            runtime = SimulatedRuntime(5)
            team = AgentTeam(ws.team_dir, runtime, monitor=ws.monitor)
            for n in range(35):
                await team.run(AGENT, f"healthy question {n}")
            runtime.inject(AGENT, FaultKind.TRUNCATION)
            for n in range(40):
                await team.run(AGENT, f"question {n} under the fault")

    asyncio.run(drive())


def _checks(store_url: str, folder: Path) -> int:
    with Store(store_url, files_dir=folder) as store:
        (seat,) = read_checkers(store)
        return seat.checks


def _cycles(store_url: str, folder: Path) -> list[str]:
    with Store(store_url, files_dir=folder) as store:
        return list_cycle_ids(store)


@pytest.mark.slow
def test_report_opens_the_issue_and_runs_no_cycle(store_url: str, tmp_path: Path) -> None:
    folder = _workspace(tmp_path, store_url)
    checker = Checker(folder, store_url, "report", {})
    try:
        checker.wait_for(r"checking team .* \(on an issue: report\)")
        _record_fault(folder, store_url)
        checker.wait_for(rf"issue \w+: {AGENT} ")
        time.sleep(5 * INTERVAL_S)  # a few more checks: a report policy never acts
    finally:
        checker.stop()
    assert _cycles(store_url, folder) == []
    with Store(store_url, files_dir=folder) as store:
        assert read_requests(store) == []


@pytest.mark.slow
def test_ask_runs_one_cycle_once_a_person_approves(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _workspace(tmp_path, store_url)
    where = ("--workspace", str(folder), "--store", store_url)
    code, _, err = run_cli(capsys, "issue", "approve", "nope", *where)
    assert code == 2  # nothing was asked: one line, nothing written
    assert "no question about issue with id 'nope'" in err
    checker = Checker(folder, store_url, "ask", {})
    try:
        team = checker.wait_for(r"checking team (\S+)'s runs .* \(on an issue: ask\)").group(1)
        _record_fault(folder, store_url)
        issue_id = checker.wait_for(rf"issue (\w+): run a cycle for {AGENT}\? ").group(1)
        checks = _checks(store_url, folder)
        time.sleep(5 * INTERVAL_S)  # asked, not waiting: the checker judges on, runs nothing
        assert _checks(store_url, folder) > checks
        assert _cycles(store_url, folder) == []
        code, out, _ = run_cli(capsys, "issue", "list", "--json", *where)
        assert code == 0
        requests = json.loads(out)["requests"]
        assert {r["issue_id"]: r["state"] for r in requests}[issue_id] == "asked", requests
        assert {r["state"] for r in requests} == {"asked"}
        code, out, _ = run_cli(capsys, "status", "--json", *where)
        assert code == 0
        status = json.loads(out)
        assert [c["principal"] for c in status["checkers"]] == [f"fleet-checker:{team}"]
        assert issue_id in {q["issue_id"] for q in status["checker_questions"]}

        code, out, err = run_cli(capsys, "issue", "approve", issue_id, *where)
        assert code == 0, err
        assert "approved" in out
        code, _, err = run_cli(capsys, "issue", "decline", issue_id, *where)
        assert code == 1  # answered once
        assert f"answered already by {getpass.getuser()}" in err

        who = getpass.getuser()
        checker.wait_for(rf"issue {issue_id}: cycle for {AGENT} started \(approved by {who}\)")
        ended = checker.wait_for(rf"issue {issue_id}: cycle for {AGENT} ended: (.*)")
        time.sleep(5 * INTERVAL_S)  # later checks start no second cycle for the approval
    finally:
        checker.stop()
    assert len(_cycles(store_url, folder)) == 1
    assert "kept" in ended.group(1)
    with Store(store_url, files_dir=folder) as store:
        requests = {r.issue_id: r for r in read_requests(store)}
        request = requests.pop(issue_id)
        assert (request.state, request.answered_by, request.outcome) == ("done", who, "kept")
        assert {r.state for r in requests.values()} <= {"asked"}  # never approved: never run
        (row,) = (
            store.connection()
            .execute("SELECT user_id FROM audit_log WHERE edit_type = 'issue_cycle_approved'")
            .fetchall()
        )
        assert row[0] == who


def test_improve_without_unattended_approval_or_a_release_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _workspace(tmp_path, str(tmp_path / "agentmend.db"))
    where = ("--workspace", str(folder), "--store", str(tmp_path / "agentmend.db"))
    monkeypatch.delenv("AGENTMEND_YOLO_MODE", raising=False)
    code, out, err = run_cli(capsys, "watch", "--on-issue", "improve", *where)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1
    assert "AGENTMEND_YOLO_MODE=true" in err
    monkeypatch.setenv("AGENTMEND_YOLO_MODE", "true")
    code, out, err = run_cli(capsys, "watch", "--on-issue", "improve", *where)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1
    assert "no published release" in err


@pytest.mark.slow
def test_improve_publishes_what_it_keeps_as_a_canary_never_stable(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _workspace(tmp_path, store_url)
    where = ("--workspace", str(folder), "--store", store_url)
    code, out, err = run_cli(capsys, "release", "publish", "--json", *where)
    assert code == 0, err
    assert json.loads(out)["version"] == 1
    checker = Checker(folder, store_url, "improve", {"AGENTMEND_YOLO_MODE": "true"})
    try:
        checker.wait_for(r"checking team .* \(on an issue: improve\)")
        _record_fault(folder, store_url)
        issue_id = checker.wait_for(rf"issue (\w+): a cycle for {AGENT} will run unattended")[1]
        checker.wait_for(rf"issue {issue_id}: cycle for {AGENT} started \(approved by unattended")
        ended = checker.wait_for(rf"issue {issue_id}: cycle for {AGENT} ended: (.*)")
    finally:
        checker.stop()
    assert "kept" in ended.group(1)
    code, out, err = run_cli(capsys, "release", "list", "--json", *where)
    assert code == 0, err
    listed = json.loads(out)
    assert (listed["heads"]["stable"], listed["heads"]["canary"]) == (1, 2)
    code, out, err = run_cli(capsys, "release", "show", "2", "--json", *where)
    assert code == 0, err
    shown = json.loads(out)["release"]
    assert shown["published_by"].startswith("fleet-checker:")
    assert shown["change_ids"]
