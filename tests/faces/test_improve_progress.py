"""`agentmend improve` counts the eval runs that prove a change: each run as it finishes,
against the runs its phase makes (before the change, after it), in a live line on a terminal
and as plain lines in a pipe."""

from __future__ import annotations

import contextlib
import io
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import fresh_demo_workspace
from loop_scenarios import BASELINE, Build, build, drive_until_cycle, warm_up
from rich.console import Console

from agentmend.faces.cli.improve_progress import ImproveProgress, eval_line
from agentmend.infrastructure.definitions.spec import load_agent_specs
from agentmend.infrastructure.evaluation.evals import find_eval_suite
from agentmend.infrastructure.monitoring.performance_monitor import VERIFICATION
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import Fault, FaultKind, SimulatedRuntime
from agentmend.loop.cycle_verification import EvalProgress
from agentmend.loop.meta_orchestrator import MetaOrchestrator

__all__ = ["build"]  # the orchestrator fixture of the failure cycles, used here as is

ROOT = Path(__file__).resolve().parents[2]


def _suite_runs(team: Path, agent: str) -> int:
    suite = find_eval_suite(load_agent_specs(team)[agent])
    assert suite is not None
    return len(suite.cases) * suite.repeats


@pytest.mark.slow
async def test_a_kept_fix_counts_every_run_before_and_after_the_change(build: Build) -> None:
    orchestrator = build(
        settings=Settings(baseline_n=BASELINE, false_alarm_rate=1e-4, verification_design="fixed")
    )
    seen = await _fix_truncation(orchestrator)
    runs = _suite_runs(orchestrator.team.directory, "research-agent")
    assert runs > 1
    for phase in ("before", "after"):
        counted = [p for p in seen if p.phase == phase]
        assert [p.done for p in counted] == list(range(1, runs + 1))
        assert {(p.total, p.agents) for p in counted} == {(runs, ("research-agent",))}
    assert [p.phase for p in seen] == ["before"] * runs + ["after"] * runs


async def test_a_sequential_verification_counts_against_the_most_it_could_make(
    build: Build,
) -> None:
    orchestrator = build()  # the default design
    seen = await _fix_truncation(orchestrator)
    runs = _suite_runs(orchestrator.team.directory, "research-agent")
    before = [p for p in seen if p.phase == "before"]
    after = [p for p in seen if p.phase == "after"]
    assert [p.phase for p in seen] == ["before"] * len(before) + ["after"] * len(after)
    # each phase counts every run it made, against the most it could make, and ends early
    assert [p.done for p in before] == list(range(1, len(before) + 1))
    assert {p.total for p in before} == {runs}
    assert [p.done for p in after] == list(range(1, len(after) + 1))
    assert {p.total for p in after} == {2 * runs - len(before)}
    assert len(before) < runs
    assert len(before) + len(after) < 2 * runs
    verification = orchestrator.monitor.get_agent_metrics("research-agent", source=VERIFICATION)
    assert verification is not None
    assert verification.executions == len(before) + len(after)


async def _fix_truncation(orchestrator: MetaOrchestrator) -> list[EvalProgress]:
    seen: list[EvalProgress] = []
    orchestrator.verifier.on_eval_run = seen.append
    await warm_up(orchestrator)
    runtime = orchestrator.team.runtime
    assert isinstance(runtime, SimulatedRuntime)
    runtime.inject("research-agent", Fault(FaultKind.TRUNCATION))
    cycle = await drive_until_cycle(orchestrator, "research-agent")
    assert cycle.status == "kept"
    return seen


def _progress(phase: str, done: int, total: int) -> EvalProgress:
    return EvalProgress(phase, ("research-agent",), done, total)  # type: ignore[arg-type]


def test_off_a_terminal_a_plain_line_at_each_quarter_and_at_the_end() -> None:
    out = io.StringIO()
    progress = ImproveProgress(Console(file=out, width=200), live=False)
    with progress:
        for done in range(1, 13):
            progress.on_eval_run(_progress("after", done, 12))
    lines = out.getvalue().splitlines()
    assert lines == [
        f"   · eval runs after the change (research-agent): {n} of 12" for n in (3, 6, 9, 12)
    ]
    assert "\x1b[" not in out.getvalue()


def test_on_a_terminal_the_live_line_counts_each_run() -> None:
    out = io.StringIO()
    progress = ImproveProgress(Console(file=out, width=200, force_terminal=True), live=True)
    with progress:
        for done in range(1, 6):
            progress.on_eval_run(_progress("before", done, 5))
            assert f"eval runs before the change (research-agent): {done} of 5" in (
                progress.status_line()
            )
        shown = out.getvalue()
    assert "eval runs before the change (research-agent): 5 of 5" in shown  # drawn, not kept
    assert eval_line(_progress("reproduce", 2, 9)) == (
        "eval runs on the agent as it is (research-agent): 2 of 9"
    )


def _improve(workspace: Path) -> list[str]:
    command = [sys.executable, "-m", "agentmend.faces.cli", "improve", "research-agent"]
    return [*command, "--workspace", str(workspace)]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fresh_demo_workspace(tmp_path_factory.mktemp("improve") / "ws")  # it improves it


def test_improve_in_a_pipe_prints_the_eval_runs_as_plain_lines(workspace: Path) -> None:
    result = subprocess.run(
        _improve(workspace),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NO_COLOR": "1"},
    )
    runs = _suite_runs(workspace / "agents", "research-agent")
    assert f"eval runs on the agent as it is (research-agent): {runs} of {runs}" in result.stdout
    assert "\x1b[" not in result.stdout


def test_improve_on_a_terminal_draws_the_count_in_a_live_line(workspace: Path) -> None:
    master, slave = pty.openpty()
    process = subprocess.Popen(
        _improve(workspace),
        cwd=ROOT,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "COLUMNS": "240", "LINES": "50", "TERM": "xterm"},
        close_fds=True,
    )
    os.close(slave)
    output = b""
    try:
        deadline = time.monotonic() + 180
        while process.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                with contextlib.suppress(OSError):  # the other side closed
                    output += os.read(master, 65536)
        with contextlib.suppress(OSError):
            while select.select([master], [], [], 0.2)[0]:
                chunk = os.read(master, 65536)
                if not chunk:
                    break
                output += chunk
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode("utf-8", "replace"))
    runs = _suite_runs(workspace / "agents", "research-agent")
    assert b"\x1b[" in output  # a terminal: the live line is drawn and redrawn
    assert f"eval runs on the agent as it is (research-agent): {runs} of {runs}" in text
    assert "questions" in text  # the live line's counts


def test_the_live_line_counts_in_words_that_agree_with_the_number() -> None:
    progress = ImproveProgress(Console(file=io.StringIO(), width=200), live=False)
    assert progress.status_line().endswith("0 questions · 0 verifications")
    progress.questions, progress.verifications = 1, 1
    assert "1 question · " in progress.status_line()
    assert progress.status_line().endswith("1 verification")
    progress.questions = 2
    assert "2 questions · " in progress.status_line()
