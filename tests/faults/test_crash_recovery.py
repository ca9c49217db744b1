"""SIGKILL at a random moment: no acknowledged change lost, no file half-written or stray.

Each trial starts ``tests/crash_child.py``, which applies up to 1,000 changes (single files,
groups, rollbacks) and prints each acknowledged id; it is killed after a random short delay,
and the store is reopened (recovery runs) and checked against a replay of the history.
``benchmarks/bench_crash.py`` runs 100 trials.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from crash_child import run_crash_trial

TRIALS = 20


@pytest.mark.slow
def test_a_killed_writer_loses_nothing_acknowledged_and_leaves_files_whole(
    tmp_path: Path,
) -> None:
    trials = [run_crash_trial(tmp_path / f"trial{seed}", seed) for seed in range(TRIALS)]
    failures = [f"seed {t.seed}: {f}" for t in trials for f in t.failures]
    assert failures == []
    assert sum(len(t.acked) for t in trials) > 0  # the children got to work before the kill
    assert any(t.recovered for t in trials)  # and some kills landed mid-change
