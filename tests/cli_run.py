"""Running the ``agentmend`` command in a test: in-process through ``main()``, and the demo's
workspace (changes kept and rolled back, an audit trail) made by the real command.

Test modules import these as ``from cli_run import run_cli, demo_workspace`` (tests/ is on
sys.path). ``main()`` configures logging onto the captured stderr, so a module that calls it
also uses the ``restore_logging`` fixture of ``conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from session_shared import shared_folder

from agentmend.faces.cli.app import main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``agentmend ARGV`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def demo_workspace(target: Path) -> Path:
    """The demo's workspace at ``target``: on the simulated team, a truncation fault fixed and
    kept, a wrong fix rolled back, and a timeout fixed and kept.

    The demo runs once per test run (``session_shared``); each caller gets a copy of its own,
    to read and to record into. The copy's change log still names the files of the original, so
    a test that rolls back (or improves) the demo's changes uses ``fresh_demo_workspace``.
    """
    built = shared_folder("demo-workspace", lambda folder: fresh_demo_workspace(folder / "ws"))
    shutil.copytree(built / "ws", target)
    return target


def fresh_demo_workspace(target: Path) -> Path:
    """The demo run at ``target`` itself: a workspace whose changes name its own files."""
    result = subprocess.run(
        [sys.executable, "-m", "agentmend.faces.cli", "demo", "--workspace", str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert result.returncode == 0, result.stderr
    return target
