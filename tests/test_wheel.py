"""The built wheel carries everything the package reads at run time.

CI installs the project in editable mode, which reads data files from the source tree and would
hide one missing from the wheel. So: build a wheel (offline, with the setuptools already
installed), install it without dependencies into a fresh venv that borrows the dependencies
from this interpreter's site-packages (not the editable install's finder), and from outside the
repository load the roles' definitions and the simulated team, and run the console scripts.
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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


def _source_copy(target: Path) -> Path:
    """What a source distribution holds, copied so the build writes nothing in the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("agents", "infrastructure"):
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    return target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = _source_copy(out / "src")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = (out / "dist").glob("agentmend-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # the dependencies come from this interpreter's site-packages, as a plain path: the .pth
    # files there (the editable install's finder among them) are not run for it
    ours = sorted({sysconfig.get_paths()["purelib"], *site.getsitepackages()})
    (Path(purelib) / "borrowed_dependencies.pth").write_text("\n".join(ours) + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return venv


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
