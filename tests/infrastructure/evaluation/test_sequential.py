"""The always-valid sequential tests (pure) and the sequential verification that uses them."""

from __future__ import annotations

import random

import pytest
from fake_runtimes import ScriptedRuns

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.evaluation.evals import EvalCase, EvalCheck, EvalSuite
from agentmend.infrastructure.evaluation.sequential import PairedTest, TwoSampleTest
from agentmend.infrastructure.evaluation.sequential_verification import (
    judge_rounds,
    run_reproduction,
    verify_sequentially,
)


def _spec(version: str) -> AgentSpec:
    return AgentSpec(
        name="solver",
        description="answers maths questions",
        system_prompt=version,
        model="claude-sonnet-4-6",
        max_tokens=1024,
    )


def _runtime() -> ScriptedRuns:
    """The version "before" answers wrongly, "after" rightly; every call is recorded."""
    return ScriptedRuns(
        lambda call: "OK" if call.spec.system_prompt == "after" else "no idea", duration_ms=10.0
    )


def _paired_run(rng: random.Random, p_fixed: float, p_broken: float, budget: int) -> str:
    test = PairedTest(budget=budget)
    decision = "continue"
    for _ in range(budget):
        u = rng.random()
        if u < p_fixed:
            test.add(False, True)
        elif u < p_fixed + p_broken:
            test.add(True, False)
        else:
            test.add(True, True)
        decision = test.decision()
        if decision != "continue":
            break
    return decision


def test_a_change_that_does_not_help_is_accepted_at_most_alpha_of_the_time() -> None:
    # looking after every pair, 1,000 times over: Ville's inequality bounds the error anyway
    rng = random.Random(1)
    accepted = sum(_paired_run(rng, 0.3, 0.3, 200) == "helps" for _ in range(1000))
    assert accepted / 1000 <= 0.05


def test_a_clear_fix_stops_early_and_a_harmful_change_is_rejected() -> None:
    rng = random.Random(2)
    test = PairedTest(budget=200)
    pairs = 0
    while test.decision() == "continue":
        test.add(False, rng.random() < 0.95)
        pairs += 1
    assert test.decision() == "helps"
    assert pairs < 30
    assert _paired_run(random.Random(3), 0.05, 0.6, 200) == "does_not_help"


def test_a_pass_to_fail_pair_is_never_ignored() -> None:
    with_broken = PairedTest(budget=50)
    without = PairedTest(budget=50)
    for test in (with_broken, without):
        for _ in range(4):
            test.add(False, True)
    with_broken.add(True, False)
    assert with_broken.evidence < without.evidence
    assert with_broken.broken == 1


def test_curtailment_says_underpowered_once_the_budget_cannot_show_a_help() -> None:
    test = PairedTest(budget=6)
    for _ in range(5):
        test.add(True, True)
    assert test.decision() == "underpowered"
    assert PairedTest(budget=3).decision() == "underpowered"  # 3 pairs can never reach 1/alpha


def test_futility_stops_a_round_that_fixed_no_more_than_it_broke() -> None:
    test = PairedTest(budget=30, round_size=10)
    for i in range(9):
        test.add(True, True)
        assert test.decision() == "continue", i
    test.add(True, True)  # a whole round, nothing fixed
    assert test.decision() == "does_not_help"
    # without rounds there is no futility stop: the same pairs go on
    plain = PairedTest(budget=30)
    for _ in range(10):
        plain.add(True, True)
    assert plain.decision() == "continue"


def test_two_sample_says_hurts_better_and_stays_valid_when_equal() -> None:
    rng = random.Random(4)
    hurt = TwoSampleTest(budget=500)
    while hurt.decision() == "continue":
        hurt.add(rng.random() < 0.5, rng.random() < 0.95)
    assert hurt.decision() == "hurts"
    assert hurt.pairs < 100
    better = TwoSampleTest(budget=500)
    while better.decision() == "continue":
        better.add(rng.random() < 0.95, rng.random() < 0.5)
    assert better.decision() == "better"
    false_better = 0
    for _ in range(300):
        same = TwoSampleTest(budget=200)
        while same.decision() == "continue":
            same.add(rng.random() < 0.8, rng.random() < 0.8)
        false_better += same.decision() == "better"
    assert false_better / 300 <= 0.05
    close = TwoSampleTest(budget=2000, margin=0.1)
    for _ in range(2000):
        close.add(rng.random() < 0.8, rng.random() < 0.8)
    assert close.shown_no_worse


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="budget"):
        PairedTest(budget=0)
    with pytest.raises(ValueError, match="margin"):
        TwoSampleTest(budget=10, margin=1.5)


def test_the_regression_guard_rejects_whatever_the_test_says() -> None:
    before = [[True, False, False, False, False, False, False, False]] * 3
    after = [[False, True, True, True, True, True, True, True]] * 3
    verdict = judge_rounds(before, after, repeats=3)
    assert not verdict.accepted
    assert verdict.decision == "regression"
    assert verdict.regressions == ("0",)


def _suite(cases: int) -> EvalSuite:
    check = EvalCheck(contains=("OK",))
    return EvalSuite(
        cases=tuple(EvalCase(id=f"c{i}", prompt=f"q{i}", check=check) for i in range(cases)),
        repeats=3,
    )


async def test_verify_sequentially_runs_pairs_until_clear_and_counts_calls() -> None:
    cases = 12
    runtime = _runtime()
    verdict, run = await verify_sequentially(runtime, _spec("before"), _spec("after"), _suite(12))
    assert verdict.accepted
    assert verdict.rule == "sequential"
    assert run.decision == "helps"
    assert run.rounds == 1  # fixed cases of the first round are enough
    assert run.model_calls == len(runtime.calls) < 2 * cases
    assert run.fixed == verdict.c == len(runtime.calls) // 2
    assert sum(row.after_runs for row in verdict.cases) == len(runtime.calls) // 2


async def test_a_suite_too_small_for_the_test_is_judged_by_the_fixed_design() -> None:
    runtime = _runtime()
    verdict, run = await verify_sequentially(runtime, _spec("before"), _spec("after"), _suite(1))
    assert run.decision == "fixed_design"
    assert verdict.rule == "all_failures_fixed"  # the fixed design's rule, on all its runs
    assert verdict.accepted
    assert len(runtime.calls) == run.model_calls == 6


async def test_a_change_that_changes_nothing_stops_after_one_round() -> None:
    runtime = _runtime()
    verdict, run = await verify_sequentially(runtime, _spec("before"), _spec("before"), _suite(8))
    assert not verdict.accepted
    assert run.decision == "does_not_help"
    assert len(runtime.calls) == 16  # one round of pairs, then futility
    assert verdict.failures == ("no_improvement",)


async def test_the_reproduction_rounds_are_the_first_pairs_before_halves() -> None:
    runtime = _runtime()
    before = await run_reproduction(runtime, _spec("before"), _suite(12))
    # a round, then the first case again: two failures of three, it fails by majority
    assert len(runtime.calls) == 13
    assert [len(case.runs) for case in before.cases] == [2] + [1] * 11
    assert not any(run.passed for case in before.cases for run in case.runs)
    verdict, run = await verify_sequentially(
        runtime, _spec("before"), _spec("after"), _suite(12), before=before
    )
    assert verdict.accepted
    assert len(runtime.calls) == run.model_calls  # the reproduction's runs counted once, not rerun
    passing = _runtime()
    full = await run_reproduction(passing, _spec("after"), _suite(4))
    assert len(passing.calls) == 12  # every round passed: it does not reproduce
    assert all(case.passes == 3 for case in full.cases)
