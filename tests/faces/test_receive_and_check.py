"""``agentmend otel receive --check``: runs a fleet exports only through OpenTelemetry are
judged where they arrive. 80 healthy runs, then 150 at half failures, sent over OTLP/HTTP to a
real receiver process: the receiver's checker opens the issue and ``status`` shows it."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_run import run_cli
from otel_helpers import SpanFactory, auth, post

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "receive-and-check"

pytestmark = pytest.mark.usefixtures("restore_logging")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _CheckingReceiver:
    """A real ``agentmend otel receive --check`` process on a free port, its stderr read line by
    line; stopped with SIGTERM (it must exit 0) when the block ends."""

    def __init__(self, where: tuple[str, ...], *extra: str) -> None:
        self.port = _free_port()
        command = [sys.executable, "-m", "agentmend.faces.cli", "otel", "receive", *where]
        command += ["--port", str(self.port), "--token", TOKEN, "--check"]
        self.process = subprocess.Popen(
            [*command, "--check-interval", "0.2", *extra],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "AGENTMEND_BASELINE_N": "60", "AGENTMEND_MIN_BASELINE_N": "30"},
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._lines.put(line)

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """The first line holding ``text`` from here on."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if text in line:
                return line
        pytest.fail(f"the receiver said no line with {text!r} in {timeout} s")

    def __enter__(self) -> _CheckingReceiver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        self._reader.join(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()
        if exc_info[0] is None:
            assert self.process.returncode == 0


def _send_a_degradation(receiver: _CheckingReceiver, agent: str) -> None:
    """80 healthy runs, then 150 at half failures, as an instrumented app exports them."""
    rng = random.Random(5)
    spans = SpanFactory(service="fleet-app")
    try:
        for n, rate in ((80, 0.97), (150, 0.5)):
            for _ in range(n):
                fail = None if rng.random() < rate else "the tool returned 503"
                spans.agent_run(agent, fail=fail)
            assert post(receiver.endpoint, spans.body(), headers=auth(TOKEN))[0] == 200
    finally:
        spans.close()


@pytest.mark.slow
def test_runs_received_over_otlp_are_judged_and_the_issue_opened(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    Workspace.open(workspace, settings=Settings(store_url=store_url), create=True).close()
    with _CheckingReceiver(("--workspace", str(workspace), "--store", store_url)) as receiver:
        receiver.wait_for("checking team", timeout=30.0)
        _send_a_degradation(receiver, "otel-writer")
        issue = receiver.wait_for("issue ", timeout=30.0)
        assert "otel-writer low_success_rate" in issue
    code, out, _ = run_cli(
        capsys, "status", "--json", "--workspace", str(workspace), "--store", store_url
    )
    assert code == 0
    agents = {a["agent"]: a for a in json.loads(out)["agents"]}
    assert agents["otel-writer"]["runs"] == 230
    assert agents["otel-writer"]["open_issues"]


def test_check_without_a_team_is_one_line_and_exit_2(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "agentmend.faces.cli", "otel", "receive", "--port", "0"]
    done = subprocess.run(
        [*command, "--workspace", str(tmp_path / "ws"), "--token", TOKEN, "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--check needs the team whose runs it judges" in done.stderr


@pytest.mark.slow
def test_the_receivers_checker_asks_and_runs_the_cycle_a_person_approved(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    Workspace.open(workspace, settings=Settings(store_url=store_url), create=True).close()
    where = ("--workspace", str(workspace), "--store", store_url)
    with _CheckingReceiver(where, "--on-issue", "ask") as receiver:
        receiver.wait_for("(on an issue: ask)")
        _send_a_degradation(receiver, "research-agent")
        asked = receiver.wait_for("run a cycle for research-agent?")
        issue_id = asked.split("issue ", 1)[1].split(":", 1)[0]
        code, _, err = run_cli(capsys, "issue", "approve", issue_id, *where)
        assert code == 0, err
        receiver.wait_for(f"issue {issue_id}: cycle for research-agent started")
        ended = receiver.wait_for(f"issue {issue_id}: cycle for research-agent ended")
    assert "cycle" in ended
    code, out, _ = run_cli(capsys, "issue", "list", "--json", *where)
    assert code == 0
    states = {r["issue_id"]: (r["state"], r["outcome"]) for r in json.loads(out)["requests"]}
    assert states[issue_id][0] == "done"


def test_a_policy_the_receiver_cannot_follow_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "ws"
    Workspace.open(workspace, create=True).close()
    monkeypatch.delenv("AGENTMEND_YOLO_MODE", raising=False)
    for extra, said in (
        (["--on-issue", "ask"], "--on-issue ask needs --check"),
        (["--check", "--on-issue", "improve"], "AGENTMEND_YOLO_MODE=true"),
    ):
        code, out, err = run_cli(
            capsys, "otel", "receive", "--port", "0", "--workspace", str(workspace),
            "--token", TOKEN, *extra,
        )  # fmt: skip
        assert (code, out) == (2, "")
        # one line, the receiver's own (its log lines aside), naming what to do
        (said_line,) = [line for line in err.splitlines() if line.startswith("agentmend:")]
        assert said in said_line
        assert "Traceback" not in err
