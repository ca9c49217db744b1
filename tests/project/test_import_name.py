"""agentmend is imported as ``agentmend`` only: the repository's folders never leak as names.

The repository keeps ``agents/`` and ``infrastructure/``; they are installed as ``agentmend`` and
``agentmend.infrastructure`` (pyproject.toml). These tests hold the rest of the tree to that:
mypy checks the package under its installed name, no file names a module by its old path, and
no module of ours is ever imported under a folder's name.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import agentmend

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / ".typing" / "agentmend"
FOLDERS = {"agents": "agentmend", "infrastructure": "agentmend.infrastructure"}


def _entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name != "__pycache__"}


def test_the_typecheck_tree_shows_every_entry_of_both_folders_under_the_installed_name() -> None:
    assert _entries(TREE) == _entries(ROOT / "agents") | {"infrastructure"}
    for entry in TREE.iterdir():
        if entry.name == "__pycache__":  # what an import through the tree compiled (ignored)
            continue
        expected = ROOT / "agents" / entry.name
        if entry.name == "infrastructure":
            expected = ROOT / "infrastructure"
        assert entry.is_symlink(), entry
        assert not Path(os.readlink(entry)).is_absolute(), f"{entry} must be a relative link"
        assert entry.resolve() == expected.resolve()


def _mypy(tmp_path: Path, injected: str) -> subprocess.CompletedProcess[str]:
    cache = tmp_path / "cache"
    if not cache.exists() and (ROOT / ".mypy_cache").is_dir():
        # start from the checkout's cache (CI type-checks first), in a copy this test may change
        shutil.copytree(ROOT / ".mypy_cache", cache)
    target = TREE / "infrastructure" / "principal.py"
    shadow = tmp_path / "principal.py"
    shadow.write_text(target.read_text(encoding="utf-8") + injected, encoding="utf-8")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(cache),
            "--shadow-file",
            str(target),
            str(shadow),
            str(target),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_mypy_checks_the_package_under_its_installed_name(tmp_path: Path) -> None:
    clean = _mypy(tmp_path, "")
    assert clean.returncode == 0, clean.stdout
    # resolvable only if mypy knows the module as ``agentmend.infrastructure.errors``
    injected = _mypy(
        tmp_path,
        "\nfrom agentmend.infrastructure.errors import NoSuch  # noqa: F401\n",
    )
    assert injected.returncode == 1, injected.stdout
    assert 'Module "agentmend.infrastructure.errors" has no attribute "NoSuch"' in injected.stdout
    assert ".typing/agentmend/infrastructure/principal.py" in injected.stdout


def _old_names() -> re.Pattern[str]:
    """Dotted names under a folder's name that would resolve to one of our modules."""
    found: set[str] = set()
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts and parts[0] != "__init__":
                found.add(f"{folder}\\.{re.escape(parts[0])}")
    exported = "|".join(sorted(agentmend.__all__))
    return re.compile(
        rf"(?<![\w./-])(?:{'|'.join(sorted(found))})\b"
        rf"|(?:\bimport|(?<!\S)-m)\s+(?:agents|infrastructure)\b"
        rf"|\bfrom\s+(?:agents|infrastructure)\s+import\s+\(?\s*(?:{exported})\b"
        rf"|\"-m\",\s*\"(?:agents|infrastructure)[\".]"
    )


def _project_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    suffixes = (".py", ".md", ".toml", ".yaml", ".txt", ".json", ".cfg")
    return [
        ROOT / name
        for name in listed
        if (name.endswith(suffixes) or name in ("Makefile", ".ci/run"))
        and not name.startswith(".typing/")  # links to the folders, read there
        and (ROOT / name).is_file()
    ]


def test_no_file_names_a_module_by_its_folder() -> None:
    pattern = _old_names()
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _project_files()
        if path != Path(__file__).resolve()  # its examples of each form, below
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_the_old_name_check_finds_each_form() -> None:
    pattern = _old_names()
    for line in (
        "from agents.loop.cycle import CycleResult",
        'monkeypatch.setattr("infrastructure.store.Store", fake)',
        "python -m agents",
        '[sys.executable, "-m", "agents.mcp_server"]',
        "from agents import MetaOrchestrator",
        "import infrastructure",
    ):
        assert pattern.search(line), line
    for line in (
        "from agents import Agent",  # openai-agents' own package
        "agents = team.names",
        "python -m agentmend",
        "from agentmend.infrastructure.store.api import Store",
        "agents.append(entry)",
        ".claude/agents/writer.md",
    ):
        assert not pattern.search(line), line


_IMPORT_EVERYTHING = """
import sys
sys.path.insert(0, "tests")
from package_modules import import_all_modules, modules_under_folder_names
modules = import_all_modules()
print(len(modules), modules_under_folder_names())
"""

_IMPORT_BY_FOLDER = """
import sys
sys.path.insert(0, "tests")
sys.path.insert(0, ".")
import infrastructure.principal
from package_modules import modules_under_folder_names
print(modules_under_folder_names())
"""


def test_importing_every_module_loads_nothing_under_a_folder_name() -> None:
    # run from the checkout, where the folders themselves are importable by their own names
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EVERYTHING],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    count, leaked = done.stdout.split(" ", 1)
    assert int(count) > 150
    assert leaked.strip() == "[]"


def test_a_module_imported_under_its_folder_name_is_caught() -> None:
    # what the suite's session check (conftest.py) would report after such an import
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_BY_FOLDER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['infrastructure', 'infrastructure.principal']"
