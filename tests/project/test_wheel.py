"""The built wheel carries everything the package reads at run time.

CI installs the project in editable mode, which reads data files from the source tree and would
hide one missing from the wheel. So: build a wheel (offline, with the setuptools already
installed), install it without dependencies into a fresh venv that borrows the dependencies
from this interpreter's site-packages (not the editable install's finder), and from outside the
repository load the roles' definitions and the simulated team, and run the console scripts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from services import unavailable
from user_project import ROOT, UserVenv, borrow_dependencies, user_venv

__all__ = ["user_venv"]  # the session fixture, used here by name

_PROBE = """
import json, agentmend
from agentmend.roles.team import DEFINITIONS_DIR, load_role_spec
from agentmend.infrastructure.simulation import copy_team
import tempfile, pathlib
roles = [load_role_spec(n).name for n in ("socratic-mediator", "self-improver", "supervisor")]
team = pathlib.Path(tempfile.mkdtemp()) / "team"
copy_team(team)
print(json.dumps({
    "package": agentmend.__file__,
    "definitions": str(DEFINITIONS_DIR),
    "roles": roles,
    "team": sorted(p.name for p in team.iterdir()),
    "version": agentmend.__version__,
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
        assert f"agentmend/roles/definitions/{role}.md" in names
    assert "agentmend/py.typed" in names
    assert "agentmend/infrastructure/simulated_team/research-agent.md" in names
    assert "agentmend/infrastructure/simulated_team/research-agent.evals.yaml" in names


def _source_files() -> set[str]:
    """Every file of the two source folders, named as the wheel should hold it."""
    found: set[str] = set()
    for folder, installed in (
        ("agents", "agentmend"),
        ("infrastructure", "agentmend/infrastructure"),
    ):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found.add(f"{installed}/{path.relative_to(ROOT / folder).as_posix()}")
    return found


def test_the_wheel_holds_exactly_the_source_tree_under_one_top_level_name(wheel: Path) -> None:
    # built from a clean copy of the tree (tests/user_project.py), so no stale build/ folder can
    # supply a module the package list forgot
    names = zipfile.ZipFile(wheel).namelist()
    contents = {name for name in names if ".dist-info/" not in name}
    assert contents == _source_files()
    assert {name.split("/")[0] for name in contents} == {"agentmend"}
    top_level = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    if top_level:  # newer setuptools no longer writes it
        assert zipfile.ZipFile(wheel).read(top_level[0]).decode().split() == ["agentmend"]


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


# The wheelhouse `make` fills (Makefile: WHEELHOUSE) so that this test installs openai-agents
# without reaching a registry.
WHEELHOUSE = Path(os.environ.get("AGENTMEND_TEST_WHEELHOUSE") or ROOT / ".venv" / "wheelhouse")

_APP_AGENTS = '"""The app\'s own agents package."""\nWHO = "app agents"\n'
_APP_INFRA = '"""The app\'s own infrastructure package."""\nWHO = "app infrastructure"\n'

_BOTH_LIBRARIES = """
import json, agents, agentmend
from agents import Agent
from agentmend import MetaOrchestrator, PerformanceMonitor, Store
from agentmend.infrastructure.models import ExecutionRecord
agent = Agent(name="writer", instructions="write")
store = Store(":memory:")
monitor = PerformanceMonitor(store=store)
monitor.record(ExecutionRecord(agent_name="writer", success=True, duration_ms=5.0))
monitor.flush()
print(json.dumps({
    "openai_agents": agents.__file__,
    "agent": agent.name,
    "agentmend": agentmend.__file__,
    "runs": monitor.get_metrics()["writer"].executions,
    "orchestrator": MetaOrchestrator.__module__,
}))
"""

_APP = """
import json, agents, infrastructure, agentmend
from agentmend import Workspace
from agentmend.infrastructure.simulation import copy_team
import pathlib
team = pathlib.Path("team")
copy_team(team)
import asyncio
with Workspace.open(pathlib.Path("ws"), team_dir=team) as workspace:
    orchestrator = workspace.orchestrator()
    names = sorted(orchestrator.team.names)
    task = asyncio.run(orchestrator.execute_task("What is a CUSUM chart?"))
print(json.dumps({
    "agents": agents.WHO,
    "infrastructure": infrastructure.WHO,
    "agentmend": agentmend.__file__,
    "team": names,
    "answered": sorted(task.results),
    "recorded": sum(m.executions for m in workspace.monitor.get_metrics().values()),
}))
"""


@pytest.mark.slow
def test_the_wheel_installs_beside_openai_agents_and_an_app_with_the_same_folder_names(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    wheels = sorted(WHEELHOUSE.glob("openai_agents-*.whl"))
    if not wheels:
        unavailable(f"no openai-agents wheel in {WHEELHOUSE} (`make` downloads it)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    borrow_dependencies(python)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    install = [*pip, "--python", str(python), "install", "--no-index", "-q"]
    # pip resolves both: agentmend's declared ranges must accept what openai-agents needs
    done = subprocess.run(
        [
            *install,
            "--find-links",
            str(WHEELHOUSE),
            str(user_venv.wheel),
            wheels[-1].name.split("-")[0].replace("_", "-"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    env = user_venv.env(
        VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    )

    neutral = tmp_path / "elsewhere"
    neutral.mkdir()
    both = subprocess.run(
        [str(python), "-c", _BOTH_LIBRARIES],
        cwd=neutral,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert both.returncode == 0, both.stderr
    report = json.loads(both.stdout.strip().splitlines()[-1])
    assert Path(report["openai_agents"]).is_relative_to(venv)  # openai-agents' `agents`, intact
    assert report["agent"] == "writer"
    assert Path(report["agentmend"]).is_relative_to(venv)
    assert report["runs"] == 1
    assert report["orchestrator"] == "agentmend.loop.meta_orchestrator"

    app = tmp_path / "app"
    for package, text in (("agents", _APP_AGENTS), ("infrastructure", _APP_INFRA)):
        (app / package).mkdir(parents=True)
        (app / package / "__init__.py").write_text(text)
    (app / "main.py").write_text(_APP)
    ran = subprocess.run(
        [str(python), "main.py"], cwd=app, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    assert report["agents"] == "app agents"
    assert report["infrastructure"] == "app infrastructure"
    assert Path(report["agentmend"]).is_relative_to(venv)
    assert "research-agent" in report["team"]
    assert report["answered"] == report["team"]  # every agent of the team ran
    assert report["recorded"] == len(report["team"])
