"""A newcomer's first hour, on the user's own path: agentmend installed from a wheel into a venv
of its own, run in a project folder outside the repository, through a pipe or a terminal."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest
from user_project import ROOT, UserVenv, make_unwritable, restore_writable, user_venv

__all__ = ["user_venv"]  # the session fixture, used here by name

FAST = {"AGENTMEND_AUTO_DECISION_TIMEOUT": "20"}


def _team_bytes(team: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(team.glob("*.md"))}


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


# -- 1. the end of input ends the session -----------------------------------------------------


def test_input_that_ends_during_a_question_ends_the_session(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    script = "/traffic 35\n/inject research-agent truncation\n/traffic 3\n"
    started = time.monotonic()
    done = user_venv.run(["python", "-m", "agentmend", "--workspace", "W"], tmp_path, stdin=script)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert time.monotonic() - started < 60  # it once hung until killed
    assert "Run self-improvement cycle?" in done.stdout
    assert "end of input: counted as no" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_a_script_with_fewer_answers_than_questions_ends(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    user_venv.run(["agentmend", "session", "--workspace", "W"], tmp_path, stdin="/quit\n")
    team = tmp_path / "W" / "agents"
    before = _team_bytes(team)
    script = "/inject research-agent truncation\n/improve research-agent\n"  # no answer given
    done = user_venv.run(["agentmend", "session", "--workspace", "W"], tmp_path, stdin=script)
    assert done.returncode == 0, done.stderr
    assert "Apply this change to research-agent? (y/n)" in done.stdout
    assert "end of input: counted as no" in done.stdout
    assert "on research-agent: refused" in done.stdout
    assert _team_bytes(team) == before


class _Terminal:
    """A command on a pseudo-terminal, as a person at a keyboard runs it."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True
        )
        os.close(slave)
        self.output = ""

    def read_until(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} not seen; output:\n{self.output[-3000:]}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    self.output += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:  # the other side closed
                    raise AssertionError(f"{text!r} not seen before exit:\n{self.output}") from None

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                with contextlib.suppress(OSError):  # the other side closed
                    self.output += os.read(self.master, 65536).decode("utf-8", "replace")
        return self.proc.wait(timeout=1)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.master)


def test_ctrl_d_at_a_yes_no_prompt_answers_no_and_ends_the_session(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    argv = [str(user_venv.bin / "agentmend"), "session", "--workspace", "W"]
    terminal = _Terminal(argv, tmp_path, user_venv.env(**FAST))
    try:
        terminal.read_until("agentmend> ")
        terminal.type("/inject research-agent truncation\r/improve research-agent\r")
        terminal.read_until("Apply this change to research-agent? (y/n)")
        before = _team_bytes(tmp_path / "W" / "agents")
        started = time.monotonic()
        terminal.type("\x04")  # Ctrl-D
        code = terminal.wait(timeout=15)
        took = time.monotonic() - started
    finally:
        terminal.close()
    assert code == 0, terminal.output[-3000:]
    assert took < 10, took  # not the 30 s of every later prompt
    assert "end of input: counted as no" in terminal.output
    assert _team_bytes(tmp_path / "W" / "agents") == before


# -- 5. "no" holds until the issue changes or a cycle is asked for ----------------------------


def test_a_declined_issue_is_not_offered_again_until_it_changes(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    script = (
        "/traffic 35\n/inject research-agent truncation\n/traffic 40\nn\nn\nn\n/improve\ny\n/quit\n"
    )
    done = user_venv.run(
        ["agentmend", "session", "--workspace", "W"], tmp_path, stdin=script, env=FAST
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    asked = out.count("Run self-improvement cycle?")
    # offered once per kind (slow runs, failures) and once more when clearly worse; it was
    # asked on almost every question of the 40
    assert 1 <= asked <= 3, out
    assert "ran 40 question(s) through the team" in out
    assert "agentmend> /improve" in out  # the extra "n"s found no question, /improve ran
    assert "on research-agent: kept" in out.split("agentmend> /improve", 1)[1]


# -- 2. the whole loop applies a fix with a plain callback; nobody to approve is said at once --

LOOP = """
import asyncio
from agentmend import Workspace

async def main():
    async with Workspace.open("ws") as ws:
        try:
            ws.orchestrator(auto_improve=True)
        except Exception as exc:
            print("REFUSED:", type(exc).__name__, exc)
        asked = []
        orchestrator = ws.orchestrator(
            auto_improve=True, approval_callback=lambda change: asked.append(change) or True
        )
        for n in range(35):
            await orchestrator.execute_task(f"question {n}")
        orchestrator.team.runtime.inject("research-agent", "truncation")
        for n in range(30):
            task = await orchestrator.execute_task(f"question after {n}")
            if task.cycles:
                break
        print("STATUS:", [cycle.status for cycle in task.cycles])
        print("ASKED:", [change.action.target_agent for change in asked])

asyncio.run(main())
"""


def test_a_plain_approval_callback_gets_a_fix_kept(user_venv: UserVenv, tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(LOOP)
    done = user_venv.run(["python", "loop.py"], tmp_path, env={"AGENTMEND_BASELINE_N": "30"})
    assert done.returncode == 0, done.stderr
    assert "REFUSED: ConfigurationError auto_improve=True but nobody can approve" in done.stdout
    assert "STATUS: ['kept']" in done.stdout
    assert "ASKED: ['research-agent']" in done.stdout
    assert done.stderr == ""


# -- 4. the library is quiet unless the application configures logging ------------------------

APP = """
import logging, sys
from agentmend import MetaOrchestrator
import asyncio

logging.basicConfig(level=getattr(logging, sys.argv[1]), stream=sys.stderr)
if len(sys.argv) > 2:
    logging.getLogger("agentmend").setLevel(logging.INFO)

async def main():
    with MetaOrchestrator.offline_simulated("team") as orchestrator:
        for n in range(60):
            await orchestrator.execute_task(f"q {n}")
        orchestrator.team.runtime.inject("research-agent", "truncation")
        for n in range(30):
            if (await orchestrator.execute_task(f"f {n}")).cycles:
                break
    print("done")

asyncio.run(main())
"""


@pytest.mark.slow
def test_the_library_prints_nothing_unless_logging_is_configured(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    (tmp_path / "app.py").write_text(APP)
    env = {"AGENTMEND_BASELINE_N": "50"}
    quiet = user_venv.run(["python", "app.py", "WARNING"], tmp_path, env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "done\n"
    assert quiet.stderr == ""
    loud = user_venv.run(["python", "app.py", "INFO", "agentmend"], tmp_path, env=env)
    assert loud.returncode == 0, loud.stderr
    assert loud.stdout == "done\n"
    assert "INFO:agentmend.loop.cycle:cycle_started" in loud.stderr
    assert "INFO:agentmend.loop.cycle:cycle_finished" in loud.stderr


# -- 6. an error a user can cause is one line, and the session goes on ------------------------


def test_an_unwritable_agents_folder_is_one_line_and_the_session_goes_on(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    user_venv.run(["agentmend", "session", "--workspace", "W"], tmp_path, stdin="/quit\n")
    team = tmp_path / "W" / "agents"
    before = _team_bytes(team)
    script = "/inject research-agent truncation\n/improve research-agent\ny\n/status\n/quit\n"
    make_unwritable(team)
    try:
        done = user_venv.run(
            ["agentmend", "session", "--workspace", "W"], tmp_path, stdin=script, env=FAST
        )
    finally:
        restore_writable(team)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    # the write is refused by the confined file layer: the cycle ends as an error whose
    # message names the folder and the cause
    (finished,) = [line for line in done.stdout.splitlines() if line.startswith("■ cycle")]
    assert "could not apply" in finished
    said = " ".join(done.stdout.split())  # the console wraps long lines at spaces
    assert f"could not apply: cannot create the directory {team}/.agent" in said
    assert "(EPERM)" in said or "(EACCES)" in said
    assert "agentmend> /status" in done.stdout  # the session went on
    assert _team_bytes(team) == before


def test_a_bad_command_argument_is_one_line(user_venv: UserVenv, tmp_path: Path) -> None:
    script = "/inject nobody truncation\n/rollback nope\n/improve nobody\n/quit\n"
    done = user_venv.run(["agentmend", "session", "--workspace", "W"], tmp_path, stdin=script)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "unknown change id 'nope'" in done.stdout
    assert done.stdout.count("error: ") == 2  # the two unknown agents, one line each


# -- 7. offline does not judge a user's own agents by the simulated team's rules --------------


def test_offline_with_your_own_agents_is_refused_with_what_to_do(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    mine = tmp_path / "my-agents"
    mine.mkdir()
    (mine / "helper.md").write_text("---\nname: helper\ndescription: Helps.\n---\nHelp.\n")
    done = user_venv.run(["agentmend", "session", "--agents", str(mine)], tmp_path)
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert "--agents runs your own agents, which needs a model provider" in line
    assert "--provider anthropic" in line
    assert not (tmp_path / ".agentmend").exists()


# -- 8. a pip install user has the session, the version and a clean public surface ------------


def test_an_installed_package_starts_the_session_and_shows_a_clean_surface(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    probe = (
        "import agentmend, json; print(json.dumps({'file': agentmend.__file__, "
        "'version': agentmend.__version__, 'dir': dir(agentmend)}))"
    )
    import json

    shown = json.loads(user_venv.run(["python", "-c", probe], tmp_path).stdout)
    assert str(user_venv.path) in shown["file"]  # the installed wheel, not this checkout
    assert re.fullmatch(r"\d+\.\d+\.\d+", shown["version"])
    assert not {"Any", "TYPE_CHECKING", "importlib", "annotations"} & set(shown["dir"])
    assert {"TurnInfo", "FunctionRuntime", "Workspace", "ProposedChange"} <= set(shown["dir"])
    version = user_venv.run(["agentmend", "--version"], tmp_path)
    assert version.stdout.strip() == f"agentmend {shown['version']}"
    for command in (["agentmend", "session"], ["python", "-m", "agentmend"]):
        done = user_venv.run([*command, "--workspace", "W"], tmp_path, stdin="/help\n/quit\n")
        assert done.returncode == 0, done.stderr
        assert "/rollback [ID] [force|cascade]" in done.stdout


# -- 9. a bad AGENTMEND_* value: one line naming it, exit 2, from every face ------------------


@pytest.mark.parametrize(
    "command",
    [
        ["python", str(ROOT / "main.py")],
        ["agentmend", "session"],
        ["agentmend", "history"],
        ["agentmend-mcp"],
    ],
    ids=["main.py", "agentmend session", "agentmend history", "agentmend-mcp"],
)
def test_a_bad_setting_is_one_line_naming_the_variable(
    user_venv: UserVenv, tmp_path: Path, command: list[str]
) -> None:
    env = {"AGENTMEND_BASELINE_N": "abc"}
    if command[0] == "python":  # main.py is the checkout's: it runs the installed package
        env["PYTHONSAFEPATH"] = "1"
    done = user_venv.run(command, tmp_path, env=env, stdin="/quit\n")
    assert done.returncode == 2, done.stdout + done.stderr
    line = _one_line(done.stderr)
    assert "AGENTMEND_BASELINE_N='abc' is not allowed: should be a valid integer" in line
    assert done.stdout == ""


# -- 10 and the smaller ones: whole text, plain diffs, labelled figures, clear rollbacks -------


def test_a_cycle_is_shown_whole_with_plain_diff_lines_and_labelled_latencies(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    script = (
        "What is a limit?\n/inject research-agent truncation\n/improve research-agent\ny\n"
        "/rollback\n/history\n/quit\n"
    )
    done = user_venv.run(
        ["agentmend", "session", "--workspace", "W"], tmp_path, stdin=script, env=FAST
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "sim. ms" in out
    assert "simulated: latencies are the simulation's" in out
    cycle = out.split("cycle started", 1)[1].split("agentmend> /rollback", 1)[0]
    assert "…" not in cycle  # verdicts, questions, answers and headlines are whole
    diff = out.split("--- a/research-agent.md", 1)[1].split("Apply this change", 1)[0]
    assert diff.strip()
    assert all(line == line.rstrip() for line in diff.splitlines())
    assert "on research-agent: kept" in out
    (change_id,) = re.findall(r"rolled back (\w+): files restored byte for byte", out)
    again = user_venv.run(
        ["agentmend", "session", "--workspace", "W"],
        tmp_path,
        stdin=f"/rollback {change_id} force\n/quit\n",
    )
    assert f"change {change_id} is already rolled back: nothing to roll back" in again.stdout


def test_a_second_session_on_a_workspace_is_told_of_the_first(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    argv = [str(user_venv.bin / "agentmend"), "session", "--workspace", "W"]
    first = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=user_venv.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert first.stdout is not None
        while "Type /help" not in first.stdout.readline():
            assert first.poll() is None
        second = user_venv.run(["agentmend", *argv[1:]], tmp_path, stdin="/quit\n")
        assert second.returncode == 0, second.stderr
        assert f"another agentmend session (pid {first.pid}) is open" in second.stdout
    finally:
        first.communicate("/quit\n", timeout=60)
    alone = user_venv.run(["agentmend", *argv[1:]], tmp_path, stdin="/quit\n")
    assert "another agentmend session" not in alone.stdout
