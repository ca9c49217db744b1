"""agentmend as a user installs it: a wheel built from this tree, in a venv of its own.

``user_venv`` (one per test run, shared by its workers: building takes seconds) builds a wheel from
a copy of the tree (``pip wheel --no-deps --no-build-isolation``, so nothing is downloaded), makes a
venv outside the repository and installs the wheel there with ``--no-deps``. The dependencies are
the running interpreter's, reached through a path file: a directory named there is put on
``sys.path`` without its own path files being run, so this checkout's editable install is not
seen, and ``import agentmend`` finds the installed wheel. ``UserVenv.run`` runs a command of that
venv in a user's project folder (outside the repository) with an environment holding no
``AGENTMEND_*`` variable, no ``PYTHONPATH`` and no API key.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from session_shared import shared_folder

__all__ = [
    "ROOT",
    "UserVenv",
    "borrow_dependencies",
    "make_unwritable",
    "restore_writable",
    "user_venv",
]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class UserVenv:
    """A venv with agentmend installed from a wheel, as ``pip install agentmend`` leaves it."""

    path: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @property
    def python(self) -> str:
        return str(self.bin / "python")

    def env(self, **extra: str) -> dict[str, str]:
        """A user's environment: this venv first on PATH, nothing of the test run's settings."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("AGENTMEND_", "ANTHROPIC_", "PYTEST_", "PYTHON", "VIRTUAL_ENV"))
        }
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.path)
        env["COLUMNS"] = "120"
        env.update(extra)
        return env

    def run(
        self,
        command: Sequence[str],
        cwd: Path,
        *,
        stdin: str = "",
        timeout: float = 120,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` (``python`` and console scripts are this venv's) in ``cwd``."""
        program = command[0]
        if (self.bin / program).exists():
            program = str(self.bin / program)
        return subprocess.run(
            [program, *command[1:]],
            input=stdin,
            cwd=cwd,
            env=self.env(**(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _source_copy(target: Path) -> Path:
    """What a source distribution holds, copied so the build writes nothing in the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("agents", "infrastructure"):
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    return target


@pytest.fixture(scope="session")
def user_venv() -> UserVenv:
    """One venv per test run with agentmend installed from a wheel of this tree, built by the
    first worker that needs it and shared by all (``session_shared``)."""
    base = shared_folder("user-install", _build_user_venv)
    (wheel,) = (base / "wheels").glob("agentmend-*.whl")
    return UserVenv(base / "venv", wheel)


def _build_user_venv(base: Path) -> None:
    source, wheels, venv = base / "source", base / "wheels", base / "venv"
    _source_copy(source)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(wheels)]
    subprocess.run(
        [*pip, *build, str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("agentmend-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    borrow_dependencies(python)
    subprocess.run(
        [*pip, "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
        check=True,
        capture_output=True,
    )


def borrow_dependencies(python: Path) -> None:
    """Let the venv of ``python`` import this test run's dependencies, not its editable install."""
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the dependencies this test run already has, without this checkout's editable install
    ours = sorted({sysconfig.get_paths()["purelib"], *site.getsitepackages()})
    (Path(purelib) / "_test_run_dependencies.pth").write_text("\n".join(ours) + "\n")


def make_unwritable(folder: Path) -> None:
    """Make ``folder`` refuse new files, even to root (``chattr +i`` where it runs as root)."""
    folder.chmod(0o555)
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("running as root without chattr: cannot make a folder unwritable")
        subprocess.run(["chattr", "+i", folder], check=True)


def restore_writable(folder: Path) -> None:
    if os.geteuid() == 0 and shutil.which("chattr") is not None:
        subprocess.run(["chattr", "-i", folder], check=False)
    folder.chmod(0o755)
