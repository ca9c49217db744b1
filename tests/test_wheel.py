"""The built wheel carries everything the package reads at run time.

CI installs the project in editable mode, which reads data files from the source tree and would
hide one missing from the wheel. So: build a wheel (offline, with the setuptools already
installed), install it without dependencies into a fresh venv that borrows the dependencies
from this interpreter's site-packages (not the editable install's finder), and from outside the
repository load the roles' definitions and the simulated team, and run the console scripts.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from user_project import UserVenv, user_venv

__all__ = ["user_venv"]  # the session fixture, used here by name

_PROBE = """
import json, agents
from agents.roles.team import DEFINITIONS_DIR, load_role_spec
from infrastructure.simulation import copy_team
import tempfile, pathlib
roles = [load_role_spec(n).name for n in ("socratic-mediator", "self-improver", "supervisor")]
team = pathlib.Path(tempfile.mkdtemp()) / "team"
copy_team(team)
print(json.dumps({
    "package": agents.__file__,
    "definitions": str(DEFINITIONS_DIR),
    "roles": roles,
    "team": sorted(p.name for p in team.iterdir()),
    "version": agents.__version__,
}))
"""


@pytest.fixture
def wheel(user_venv: UserVenv) -> Path:
    """The wheel built from this tree once per test run (``tests/user_project.py``)."""
    return user_venv.wheel


@pytest.fixture
def wheel_venv(user_venv: UserVenv) -> Path:
    """The venv that wheel is installed in, with this interpreter's dependencies."""
    return user_venv.path


def test_the_wheel_lists_the_role_definitions_and_the_simulated_team(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for role in ("socratic-mediator", "self-improver", "supervisor"):
        assert f"agents/roles/definitions/{role}.md" in names
    assert "agents/py.typed" in names
    assert "infrastructure/simulated_team/research-agent.md" in names
    assert "infrastructure/simulated_team/research-agent.evals.yaml" in names


def test_the_installed_wheel_loads_its_roles_and_team_from_itself(
    wheel_venv: Path, tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(wheel_venv / "bin" / "python"), "-c", _PROBE],
        cwd=tmp_path,  # not the repository: nothing may come from the source tree
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(report["package"]).is_relative_to(wheel_venv)
    assert Path(report["definitions"]).is_relative_to(wheel_venv)
    assert report["roles"] == ["socratic-mediator", "self-improver", "supervisor"]
    assert "research-agent.md" in report["team"]
    assert "research-agent.evals.yaml" in report["team"]
    assert report["version"] == "0.1.0"


def test_the_installed_wheel_has_both_console_scripts(wheel_venv: Path, tmp_path: Path) -> None:
    agentmend = wheel_venv / "bin" / "agentmend"
    version = subprocess.run(
        [str(agentmend), "--version"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == "agentmend 0.1.0"
    help_text = subprocess.run(
        [str(wheel_venv / "bin" / "agentmend-mcp"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert help_text.returncode == 0, help_text.stderr
    assert "--workspace" in help_text.stdout
