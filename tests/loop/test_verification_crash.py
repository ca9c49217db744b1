"""A process verifying a change, killed with SIGKILL at each stage: nothing unproven stays live.

Each trial starts ``tests/verify_child.py`` (a real process), kills it at a random moment inside
one stage (after the apply, during the eval runs, between the verdict and its record, during
the rollback, while a code plan is executed, while its tests run), reopens the store as every
face does and checks that every file holds its bytes from before the change or those of a kept
change, that nothing is left applied, pending or executing, and that the audit chain verifies.
One trial per stage here; ``benchmarks/bench_crash.py`` runs the stage x 100 matrix.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verify_child import STAGES, run_stage_trial, run_stopped_owner_trial

FILES = 40

_SETTLED_WHEN_IN_STAGE = ("applied", "evals", "verdict")
"""Stages where the lease holds every change of the group: a kill inside them leaves all of
it to recovery (during a rollback, the rollback's own intent may finish it instead). A plan's
validation runs in a copy before anything is applied: a kill there leaves no change, only the
plan, which the reopen settles (``check_settled`` fails on a plan left executing)."""


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_a_verifier_killed_inside_a_stage_leaves_no_unproven_change_live(
    tmp_path: Path, stage: str
) -> None:
    trial = run_stage_trial(tmp_path, stage, seed=7, files=FILES)
    assert trial.violations == []
    if trial.in_stage and stage in _SETTLED_WHEN_IN_STAGE:
        assert trial.interrupted == FILES  # restored and FAILED "interrupted", every one


@pytest.mark.slow
def test_an_owner_stopped_past_its_lease_finds_it_lost_and_writes_nothing(
    tmp_path: Path,
) -> None:
    trial = run_stopped_owner_trial(tmp_path, seed=3, files=8, ttl_s=1.0)
    assert trial.violations == []
    assert trial.settled_while_stopped == 8  # the reopen settled the stopped owner's change
    assert trial.interrupted == 8  # and the resumed owner overwrote none of it
    assert trial.owner_lines[-1].startswith("LOST ")
    assert trial.owner_exit == 3
