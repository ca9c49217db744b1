"""main.py as a user runs it: a subprocess with piped input, the demo, Ctrl-C, a missing key."""

from __future__ import annotations

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
from fake_messages_api import FakeMessagesAPI, Reply

from agentmend.infrastructure.definitions.spec import AgentSpec

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "main.py")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMEND_")}
    env.pop("ANTHROPIC_API_KEY", None)
    env.update({"PYTHONPATH": str(ROOT), "AGENTMEND_AUTO_DECISION_TIMEOUT": "20", **extra})
    return env


def _run(args: list[str], stdin: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, MAIN, *args],
        input=stdin,
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_a_scripted_session_detects_asks_fixes_and_shows_status(tmp_path: Path) -> None:
    script = "\n".join(
        [
            "What is a limit?",
            "/inject research-agent truncation",
            "/improve research-agent",
            "y",
            "/status",
            "/history",
            "/audit",
            "/quit",
        ]
    )
    done = _run(["--workspace", "ws"], script + "\n", tmp_path)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert "Q: What is a limit?" in out
    assert "injected truncation into research-agent" in out
    assert "? ask research-agent:" in out  # the mediator's questions are shown
    assert "analysis completed: truncation" in out
    assert "Apply this change to research-agent? (y/n) y" in out
    assert "gate human_approval: passed: approved by a human" in out
    assert "on research-agent: kept" in out
    for agent in ("research-agent", "quality-agent", "socratic-planner"):
        assert agent in out.split("/status", 1)[1]
    assert "audit chain verified" in out
    spec = AgentSpec.from_file(tmp_path / "ws" / "agents" / "research-agent.md")
    assert spec.max_tokens is not None
    assert spec.max_tokens > 2048


def test_a_detected_issue_asks_before_the_cycle_and_then_for_the_change(tmp_path: Path) -> None:
    script = "/traffic 35\n/inject research-agent truncation\n/traffic 10\ny\ny\n/quit\n"
    done = _run(["--workspace", "ws"], script, tmp_path)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())  # rich wraps long lines at the console width
    assert "detection starts after a baseline of 30 runs per agent" in out
    assert "⚠ Performance issue in research-agent" in out
    assert "Run self-improvement cycle?" in out
    assert out.index("Run self-improvement cycle?") < out.index("cycle started")
    assert "Apply this change to research-agent? (y/n) y" in out
    assert "on research-agent: kept" in out


def test_no_answer_to_the_approval_prompt_means_reject(tmp_path: Path) -> None:
    team = tmp_path / "ws" / "agents"
    script = "/inject research-agent truncation\n/improve research-agent\n"
    with _Interactive(["--workspace", "ws"], tmp_path, AGENTMEND_AUTO_DECISION_TIMEOUT="1") as s:
        s.send(script)
        s.wait_for("Apply this change to research-agent?")
        original = (team / "research-agent.md").read_bytes()
        s.wait_for("no answer within 1s means reject")
        s.wait_for("on research-agent: refused")
        s.send("/history\n/quit\n")
        assert s.finish() == 0
    assert (team / "research-agent.md").read_bytes() == original
    assert "no changes yet" in s.output


def test_ctrl_c_during_a_cycle_aborts_it_with_nothing_applied(tmp_path: Path) -> None:
    team = tmp_path / "ws" / "agents"
    with _Interactive(["--workspace", "ws"], tmp_path) as s:
        s.send("/inject research-agent truncation\n/improve research-agent\n")
        s.wait_for("Apply this change to research-agent?")
        before = {p.name: p.read_bytes() for p in team.glob("*.md")}
        s.interrupt()
        s.wait_for("Interrupted: the cycle was aborted")
        s.send("/history\n/status\n/quit\n")
        assert s.finish() == 0
    assert "CancelledError" not in s.output
    assert "cycle error: interrupted (cancelled before it finished)" in s.output
    assert {p.name: p.read_bytes() for p in team.glob("*.md")} == before
    assert "no changes yet" in s.output


def test_the_demo_runs_the_whole_loop_and_exits_0(tmp_path: Path) -> None:
    done = _run(["--demo"], "", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "demo finished as designed" in out
    assert "audit chain: verified" in out
    assert "definition files byte-identical after rollback" in out
    summary = out.split("Summary", 1)[1]
    assert summary.count("kept") >= 2
    assert "rolled_back" in summary


@pytest.mark.parametrize("provider", ["anthropic", "claude-agent-sdk"])
def test_a_provider_without_its_key_says_so_in_one_line(tmp_path: Path, provider: str) -> None:
    done = _run(["--provider", provider], "", tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "ANTHROPIC_API_KEY" in lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing was created


class _Interactive:
    """main.py with a pipe kept open, so the test can answer (or not) when asked."""

    def __init__(self, args: list[str], cwd: Path, **env: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, MAIN, *args],
            cwd=cwd,
            env=_env(**env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._chunks: queue.Queue[str] = queue.Queue()
        self.output = ""
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for chunk in iter(lambda: self._proc.stdout.read(1) if self._proc.stdout else "", ""):
            self._chunks.put(chunk)

    def send(self, text: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(text)
        self._proc.stdin.flush()

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} not seen; output so far:\n{self.output[-3000:]}")
            try:
                self.output += self._chunks.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue

    def interrupt(self) -> None:
        self._proc.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 60.0) -> int:
        code = self._proc.wait(timeout=timeout)
        time.sleep(0.1)
        while not self._chunks.empty():
            self.output += self._chunks.get_nowait()
        return code

    def __enter__(self) -> _Interactive:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait(timeout=10)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()


def _run_own_agent(
    provider: str, front_matter: str, stdin: str, tmp_path: Path, fake_api: FakeMessagesAPI
) -> subprocess.CompletedProcess[str]:
    """main.py on ``provider`` with one agent definition of the user's, against the fake API."""
    agents_dir = tmp_path / "my-agents"
    agents_dir.mkdir()
    (agents_dir / "arithmetic.md").write_text(
        "---\nname: arithmetic\ndescription: Adds numbers.\nmodel: claude-haiku-4-5\n"
        f"{front_matter}---\nYou add numbers and answer with the sum only.\n"
    )
    return _run(
        ["--provider", provider, "--agents", str(agents_dir), "--workspace", "ws"],
        stdin,
        tmp_path,
        ANTHROPIC_API_KEY="test-key",
        ANTHROPIC_BASE_URL=fake_api.base_url,
    )


@pytest.mark.slow
def test_the_anthropic_provider_runs_your_own_agents_for_real(
    tmp_path: Path, fake_api: FakeMessagesAPI
) -> None:
    fake_api.enqueue(Reply.text("2 + 2 = 4, the sum asked for."))
    done = _run_own_agent(
        "anthropic",
        "agentmend:\n  max_tokens: 256\n",
        "What is 2+2?\n/status\n/quit\n",
        tmp_path,
        fake_api,
    )
    assert done.returncode == 0, done.stderr
    assert "provider anthropic" in " ".join(done.stdout.split())
    assert "2 + 2 = 4" in done.stdout
    (request,) = fake_api.message_requests()
    assert request.model == "claude-haiku-4-5"
    assert "You add numbers" in str(request.json["system"])
    assert request.json["max_tokens"] == 256
    assert "arithmetic" in done.stdout.split("/status", 1)[1]


def test_a_late_yes_is_not_sent_to_the_team_as_a_question(tmp_path: Path) -> None:
    with _Interactive(["--workspace", "ws"], tmp_path, AGENTMEND_AUTO_DECISION_TIMEOUT="1") as s:
        s.send("/inject research-agent truncation\n/improve research-agent\n")
        s.wait_for("no answer within 1s means reject")
        s.send("y\n/quit\n")
        assert s.finish() == 0
    assert "no answer in time: counted as no" in s.output
    assert "no question is waiting for a yes/no answer" in s.output
    assert "Q: y" not in s.output


@pytest.mark.slow
def test_the_claude_agent_sdk_provider_runs_your_agents_through_the_cli(
    tmp_path: Path, fake_api: FakeMessagesAPI
) -> None:
    fake_api.set_fallback(Reply.text("2 + 2 = 4, said the CLI."))
    done = _run_own_agent(
        "claude-agent-sdk", "tools: []\n", "What is 2+2?\n/quit\n", tmp_path, fake_api
    )
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "1 agent from" in out
    assert "provider claude-agent-sdk" in out
    assert "2 + 2 = 4, said the CLI." in out
    requests = fake_api.message_requests()
    assert requests  # the bundled CLI really called the Messages API
    assert any("You add numbers" in str(r.json.get("system")) for r in requests)


@pytest.mark.slow
def test_ctrl_c_during_traffic_stops_it_says_how_many_ran_and_a_second_one_quits(
    tmp_path: Path,
) -> None:
    """Stopped between questions or inside one, the session stays up; at the prompt it ends."""
    with _Interactive(["--workspace", "ws"], tmp_path) as s:
        for _ in range(4):  # at random moments: inside a question or between two
            s.send("/traffic 1000\n")
            # the command echoed: its traffic runs (it starts before the session reads again)
            s.wait_for("agentmend> /traffic 1000")
            time.sleep(0.3)
            s.interrupt()
            s.wait_for("Interrupted: stopped the traffic: ran ")
            assert "the cycle was aborted" not in s.output
            s.output = s.output.replace("Interrupted: stopped the traffic", "(seen)").replace(
                "agentmend> /traffic 1000", "(sent)"
            )
        s.send("/status\n")
        s.wait_for("research-agent")
        time.sleep(0.3)
        s.interrupt()  # nothing running: the session ends
        assert s.finish() == 130
    assert "bye" in s.output
    ran = re.findall(r"ran (\d+) of 1000 question\(s\) through the team", s.output)
    assert len(ran) == 4
    assert all(int(n) < 1000 for n in ran)


@pytest.mark.slow
def test_agentmend_improve_sees_the_sessions_fault_and_takes_the_issue_it_held(
    tmp_path: Path,
) -> None:
    """A fault injected in the session stays in the workspace until /heal: `agentmend improve`
    (no agent named) takes the issue the session declined and proves a fix against that fault."""
    script = "/traffic 40\n/inject research-agent truncation\n/traffic 60\nn\nn\n/quit\n"
    session = _run(["--workspace", "ws"], script, tmp_path)
    assert session.returncode == 0, session.stdout[-3000:] + session.stderr[-3000:]
    assert "Run self-improvement cycle?" in session.stdout

    def improve() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentmend.faces.cli", "improve", "--workspace", "ws"],
            cwd=tmp_path,
            env=_env(AGENTMEND_YOLO_MODE="true"),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    improved = improve()
    assert improved.returncode == 0, improved.stdout[-3000:] + improved.stderr[-3000:]
    assert "no open issue" not in improved.stdout
    assert re.search(r"cycle \w+ on research-agent: kept", improved.stdout), improved.stdout[-2000:]
    # a new session says the fault is still there, and /heal ends it for every face
    again = _run(["--workspace", "ws"], "/heal\n/quit\n", tmp_path)
    assert "injected faults still active: research-agent truncation" in again.stdout
    assert "healed every agent" in again.stdout
    assert "research-agent" not in (tmp_path / "ws" / "simulated-faults.json").read_text()
