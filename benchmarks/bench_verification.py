"""Verification cost: the fixed before/after design against the sequential paired test.

Simulated eval suites with noisy checks (no model is called): each case passes before the change
with its own probability, drawn uniformly from 0.3 .. 0.9, and after it with that probability
plus the change's true effect (0, +5, +10 or +20 points, capped at 1). The fixed design runs
every case ``repeats`` (3) times on each side and judges with ``verification.compare`` (majority
per case, exact McNemar or the all-fixed fallback, the no-regression guard); the sequential
design (``sequential_verification.judge_rounds``, the rule ``verify_sequentially`` runs) sees the
same outcomes as before/after pairs, one at a time, and stops as soon as its always-valid test
decides (or, on a suite too small for any valid test, makes every run and judges as the fixed
design). Reported per suite size and effect: model calls per verification (mean), and the share
of changes kept. Goals: the share of useless changes (effect 0) kept at most alpha (0.05); at
most 0.6x the calls of the fixed design at the same error rates. The 54 simulated fault
scenarios are measured by ``bench_cycle.py``, which runs them with either design
(``--verification fixed``) and reports the eval runs per verification.

Run: ``.venv/bin/python benchmarks/bench_verification.py [--trials 400]``; seeded, a few seconds.
"""

from __future__ import annotations

import argparse
import random
import statistics

from agentmend.infrastructure.evaluation.sequential_verification import judge_rounds
from agentmend.infrastructure.evaluation.verification import (
    CaseResult,
    RunOutcome,
    SuiteRun,
    compare,
)

SEED = 20241125
REPEATS = 3
SIZES = (5, 10, 20)
EFFECTS = (0.0, 0.05, 0.10, 0.20)


def _suite_run(outcomes: list[list[bool]]) -> SuiteRun:
    """``outcomes[r][i]``: case ``i`` in repeat ``r``, as the fixed design's ``SuiteRun``."""
    cases = tuple(
        CaseResult(
            case_id=f"case{i}",
            runs=tuple(
                RunOutcome(repeat=r, passed=outcomes[r][i], detail="", duration_ms=1000.0)
                for r in range(len(outcomes))
            ),
        )
        for i in range(len(outcomes[0]))
    )
    return SuiteRun(agent_name="agent", repeats=len(outcomes), cases=cases)


def trial(rng: random.Random, cases: int, effect: float) -> tuple[bool, int, bool, int]:
    """(fixed kept, fixed calls, sequential kept, sequential calls) for one simulated change."""
    before_p = [rng.uniform(0.3, 0.9) for _ in range(cases)]
    after_p = [min(1.0, p + effect) for p in before_p]
    before = [[rng.random() < p for p in before_p] for _ in range(REPEATS)]
    after = [[rng.random() < p for p in after_p] for _ in range(REPEATS)]
    fixed = compare(_suite_run(before), _suite_run(after))
    sequential = judge_rounds(before, after, repeats=REPEATS)
    return fixed.accepted, 2 * cases * REPEATS, sequential.accepted, sequential.model_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400, help="changes per cell")
    args = parser.parse_args()
    rng = random.Random(SEED)
    print(
        f"Verification cost ({args.trials} simulated changes per cell, {REPEATS} repeats,"
        " noisy checks)"
    )
    print(
        f"  {'cases':>5} {'effect':>6} {'fixed calls':>11} {'seq calls':>9} {'ratio':>6}"
        f" {'fixed kept':>10} {'seq kept':>8}"
    )
    ratios = []
    for cases in SIZES:
        for effect in EFFECTS:
            results = [trial(rng, cases, effect) for _ in range(args.trials)]
            fixed_calls = statistics.fmean(r[1] for r in results)
            seq_calls = statistics.fmean(r[3] for r in results)
            fixed_kept = statistics.fmean(r[0] for r in results)
            seq_kept = statistics.fmean(r[2] for r in results)
            ratios.append(seq_calls / fixed_calls)
            print(
                f"  {cases:>5} {effect:>+6.2f} {fixed_calls:>11.1f} {seq_calls:>9.1f}"
                f" {seq_calls / fixed_calls:>6.2f} {fixed_kept:>10.3f} {seq_kept:>8.3f}"
            )
    print(
        f"  calls, sequential / fixed: mean {statistics.fmean(ratios):.2f} over the cells,"
        f" {min(ratios):.2f} to {max(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
