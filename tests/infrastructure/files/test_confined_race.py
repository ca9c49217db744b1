"""Swapping files and folders for symlinks to an outside folder, for real, while changes run.

A thread keeps replacing team files, ``docs/``, ``.agent/`` and a project's subfolders by
symlinks to a folder outside the roots while apply, rollback, recovery and code-plan execution
run on them. Whatever the interleaving, no file outside the roots changes, and every operation
either completes inside the root or fails with a named error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from race_tree import run_race

RACE_SECONDS = 4.0


@pytest.mark.slow
def test_no_write_leaves_the_root_while_the_tree_is_swapped_underneath(tmp_path: Path) -> None:
    result = run_race(tmp_path, RACE_SECONDS)
    assert result.outside_changed == []
    assert result.unexpected == []
    assert result.swaps > 100  # the race really ran
    assert result.completed["apply"] > 0  # and operations got through between the swaps
    assert sum(result.refused.values()) > 0  # and some met a swap and were refused by name
