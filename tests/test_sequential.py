"""The always-valid sequential tests (pure) and the sequential verification that uses them."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from infrastructure.evaluation.evals import EvalCase, EvalCheck, EvalSuite
from infrastructure.evaluation.sequential import PairedTest, TwoSampleTest
from infrastructure.evaluation.sequential_verification import judge_rounds, verify_sequentially
from infrastructure.llm.base import AgentResult, OutputT, ToolSpec
from infrastructure.spec import AgentSpec


def _spec(version: str) -> AgentSpec:
    return AgentSpec(
        name="solver",
        description="answers maths questions",
        system_prompt=version,
        model="claude-sonnet-4-6",
        max_tokens=1024,
    )


class _Runtime:
    """The version "before" answers wrongly, "after" rightly; every call is counted."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        self.calls += 1
        text = "OK" if spec.system_prompt == "after" else "no idea"
        return AgentResult(agent_name=spec.name, text=text, duration_ms=10.0)


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


def test_curtailment_stops_once_the_budget_cannot_show_a_help() -> None:
    test = PairedTest(budget=6)
    for _ in range(5):
        test.add(True, True)
    assert test.decision() == "does_not_help"


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


async def test_verify_sequentially_runs_pairs_until_clear_and_counts_calls() -> None:
    cases = 12
    runtime = _Runtime()
    check = EvalCheck(contains=("OK",))
    suite = EvalSuite(
        cases=tuple(EvalCase(id=f"c{i}", prompt=f"q{i}", check=check) for i in range(cases)),
        repeats=3,
    )
    verdict = await verify_sequentially(runtime, _spec("before"), _spec("after"), suite)
    assert verdict.accepted
    assert verdict.decision == "helps"
    assert verdict.rounds == 1  # twelve fixed cases in the first round are enough
    assert verdict.model_calls == runtime.calls == 2 * cases
