"""A tiny Python project with its own passing test, for the code-update and MCP tests.

``make_project(dir)`` writes a package ``calc`` (``add``) and ``tests/test_calc.py``;
``PYTEST`` is a test command that runs that suite with this interpreter; ``snapshot`` reads a
tree's files (minus caches and agentmend's own ``.agent/``) to compare before and after.
"""

from __future__ import annotations

import sys
from pathlib import Path

CALC = "def add(a, b):\n    return a + b\n"
CALC_BROKEN = "def add(a, b):\n    return a - b\n"
CALC_EXTENDED = CALC + "\n\ndef mul(a, b):\n    return a * b\n"
TEST_CALC = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
README = "# calc\n\nAdds numbers.\n"

PYTEST: tuple[str, ...] = (sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider")
"""Runs the project's tests with this interpreter (cwd = the project, so ``calc`` imports)."""

_SKIPPED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".agent"})


def make_project(directory: Path) -> Path:
    """Write the project into ``directory`` (created) and return it."""
    (directory / "calc").mkdir(parents=True, exist_ok=True)
    (directory / "tests").mkdir(exist_ok=True)
    (directory / "calc" / "__init__.py").write_text(CALC)
    (directory / "tests" / "test_calc.py").write_text(TEST_CALC)
    (directory / "README.md").write_text(README)
    return directory


def snapshot(root: Path, *, skip: tuple[Path, ...] = ()) -> dict[str, bytes]:
    """Every file under ``root`` by relative path (caches, ``.agent/`` and ``skip`` left out)."""
    skipped = tuple(p.resolve() for p in skip)
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or _SKIPPED_DIRS & set(path.relative_to(root).parts):
            continue
        resolved = path.resolve()
        if any(resolved == s or s in resolved.parents for s in skipped):
            continue
        files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


# A process that executes one plan breaking calc on the project (its arguments as JSON): what
# the crash tests kill while it validates.
CODE_UPDATE_CHILD = """
import asyncio, json, sys
from pathlib import Path
from agentmend.roles.code_review import CodeReviewer
from agentmend.infrastructure.code_update.updater import CodeUpdater, FileOperation
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.store.api import Store

args = json.loads(sys.argv[1])
manager = ImprovementManager(store=Store(args["db"]))
settings = Settings(test_command=tuple(args["command"]), test_timeout_s=120)
updater = CodeUpdater(args["root"], manager=manager, reviewer=CodeReviewer(None), settings=settings)
plan = updater.create_plan("break it", [FileOperation(path="calc/__init__.py",
                           operation="modify", content=args["content"])])
updater.approve(plan.plan_id)
asyncio.run(updater.execute(plan.plan_id))
"""
