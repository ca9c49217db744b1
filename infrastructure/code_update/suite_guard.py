"""A change may not switch off its own validation: what counts as changing the tests.

A plan's tests decide whether the plan is kept, so a plan that edits what selects or
configures them could pass by deselecting the failures (a new ``conftest.py`` with
``collect_ignore_glob``, an ``addopts = -k 'not slow'``, a deleted test file). Such a plan is
*flagged*: every path below is listed in the plan (``test_files``), and it executes only with a
second approval, ``CodeUpdater.approve_test_changes``, which the MCP server never calls. That
approval is given on a terminal (``agentmend code approve-tests``) or in the interactive session;
``auto`` and ``yolo_mode`` never give it.

Also flagged at execution: the number of tests collected or passed drops against a baseline run
of the unchanged copy (read from pytest's JUnit XML report), or the test command is not pytest,
so no counts can be compared.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

from agentmend.infrastructure.code_update.sandbox import SuiteCounts

__all__ = ["TEST_CONFIG_FILES", "TEST_DIRS", "count_drop", "flagged_test_files"]

TEST_CONFIG_FILES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
     "noxfile.py", "setup.py", ".coveragerc", "Makefile", "sitecustomize.py",
     "usercustomize.py"}
)  # fmt: skip
"""Files that configure or select tests (``setup.cfg`` and ``pyproject.toml`` hold
``[tool:pytest]``/``[tool.pytest.ini_options]``; ``sitecustomize.py`` runs in every process)."""

TEST_DIRS = frozenset({"tests", "test", "testing"})
"""Folders whose files are the tests."""


def _is_test_path(path: str) -> bool:
    pure = PurePosixPath(path)
    name = pure.name
    if name in TEST_CONFIG_FILES or name.endswith(".pth"):
        return True
    if name.startswith("test_") or name.endswith("_test.py"):
        return True
    return any(part in TEST_DIRS for part in pure.parts[:-1])


def flagged_test_files(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths (root-relative) that configure, select or are tests; sorted."""
    return tuple(sorted({p for p in paths if _is_test_path(p)}))


def count_drop(baseline: SuiteCounts | None, after: SuiteCounts | None) -> str | None:
    """Why the counts need the test approval (None: they do not drop)."""
    if baseline is None or after is None:
        return "the test counts cannot be compared (not pytest, or no JUnit report)"
    if after.collected < baseline.collected:
        return f"tests collected dropped from {baseline.collected} to {after.collected}"
    if after.passed < baseline.passed:
        return f"tests passed dropped from {baseline.passed} to {after.passed}"
    return None
