"""Stored names and texts reach a terminal escaped, never obeyed: an agent named
``\\x1b[2J...`` cannot clear the screen (and the red audit warning on it) from `agentmend status`
or the session. The real CLI in process and the real session as a child process."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_cli
from rich.table import Table
from rich.text import Text

from agentmend.faces.cli.common import EXIT_OK
from agentmend.faces.terminal import safe_console, terminal_text
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.structured_logger import LOGGER_ROOT, configure_logging, get_logger

HOSTILE = "\x1b[2J\x1b[Hfake\rnews\u202eevil\x9b31m"
ROOT = Path(__file__).resolve().parents[2]


def _record(workspace: Path, name: str) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    with Store(workspace / "agentmend.db") as store, PerformanceMonitor(store) as monitor:
        monitor.record(name, success=False, duration_ms=5.0, error="boom\x1b]0;owned\x07")


def test_every_character_a_terminal_acts_on_is_shown_as_its_escape() -> None:
    assert terminal_text(HOSTILE) == ("\\x1b[2J\\x1b[Hfake\\x0dnews\\u202eevil\\x9b31m")
    assert terminal_text("two\nlines\tok") == "two\nlines\tok"
    assert terminal_text("two\nlines", newlines=False) == "two\\x0alines"
    assert terminal_text("agent-é 日本") == "agent-é 日本"
    assert terminal_text(terminal_text(HOSTILE)) == terminal_text(HOSTILE)


def test_the_faces_console_escapes_strings_tables_and_styled_text() -> None:
    out = io.StringIO()
    console = safe_console(file=out, markup=False, highlight=False, force_terminal=True)
    table = Table()
    table.add_column("agent")
    table.add_row(HOSTILE)
    console.print(table)
    console.print(f"agent {HOSTILE}", style="red")
    console.print(Text(f"styled {HOSTILE}", style="bold"))
    shown = out.getvalue()
    assert "\x1b[2J" not in shown
    assert "\r" not in shown
    assert "\u202e" not in shown
    assert "\x9b" not in shown
    assert shown.count("\\x1b[2J") == 3
    assert "\x1b[31m" in shown  # the console's own styling still reaches the terminal


def test_status_shows_a_hostile_agent_name_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _record(tmp_path, HOSTILE)
    code, out, err = run_cli(capsys, "status", "--workspace", str(tmp_path))
    assert code == EXIT_OK, err
    assert "\x1b" not in out
    assert "\r" not in out
    assert "\\x1b[2J" in out


@pytest.mark.slow
def test_the_session_shows_a_hostile_agent_name_escaped(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    first = subprocess.run(
        [sys.executable, "-m", "agentmend", "--workspace", str(workspace)],
        input="/quit\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert first.returncode == 0, first.stderr
    _record(workspace, "researcher" + HOSTILE)
    session = subprocess.run(
        [sys.executable, "-m", "agentmend", "--workspace", str(workspace)],
        input="/status\n/quit\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert session.returncode == 0, session.stderr
    assert "\\x1b[2J" in session.stdout
    assert "\x1b" not in session.stdout
    assert "\r" not in session.stdout


def test_log_lines_show_a_hostile_name_escaped() -> None:
    logger = logging.getLogger(LOGGER_ROOT)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    stream = io.StringIO()
    try:
        configure_logging("WARNING", stream=stream)
        get_logger("agentmend.tests").warning("agent_failed", agent=HOSTILE)
    finally:
        logger.handlers[:] = saved[0]
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
    line = stream.getvalue()
    assert "agent_failed" in line
    assert "\\x1b[2J" in line
    assert "\x1b" not in line
