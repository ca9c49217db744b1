"""Verification: the exact McNemar statistics, running suites, and the keep-or-roll-back verdict.

The agent under test is a tiny fake runtime: for each version of the agent (told apart by its
system prompt) and each prompt, a pattern such as ``"PPF"`` says how its successive runs go
(``P`` passes the check, ``F`` gives a wrong answer, ``E`` fails the run, ``T`` is truncated).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import pytest
from fake_runtimes import Call, ScriptedRuns
from pydantic import BaseModel, ValidationError

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.errors import AgentRunError, ErrorKind
from agentmend.infrastructure.evaluation.evals import EvalCase, EvalCheck, EvalSuite
from agentmend.infrastructure.evaluation.verification import (
    SAMPLE_QUERY,
    CaseRun,
    SuiteMismatch,
    SuiteRun,
    VerificationVerdict,
    compare,
    mcnemar_has_power,
    mcnemar_one_sided_p,
    run_sample_query,
    run_suite,
    sample_query_check,
)
from agentmend.infrastructure.llm.base import AgentResult

GOOD = "The answer is OK: a^2 + b^2 = c^2 for the two legs a, b and the hypotenuse c."


def spec(version: str) -> AgentSpec:
    return AgentSpec(
        name="solver",
        description="answers maths questions",
        system_prompt=version,
        model="claude-sonnet-4-6",
        max_tokens=1024,
    )


BEFORE, AFTER = spec("before"), spec("after")


def plays(
    patterns: dict[str, dict[str, str]],
    *,
    duration_ms: dict[str, float] | None = None,
    raise_on: str | None = None,
) -> ScriptedRuns:
    """Plays ``patterns[system_prompt][prompt]`` run by run; records every call."""
    durations = duration_ms or {}

    async def answer(call: Call) -> AgentResult[Any]:
        spec, prompt = call.spec, call.prompt
        # later prompts finish first, so completion order differs from suite order
        for _ in range(10 - int(prompt.removeprefix("q") or 0) % 10):
            await asyncio.sleep(0)
        if prompt == raise_on:
            raise AgentRunError(ErrorKind.RATE_LIMIT, "slow down")
        step = patterns[spec.system_prompt][prompt][call.repeat]
        duration = durations.get(spec.system_prompt, 100.0)
        if step == "P":
            return AgentResult(agent_name=spec.name, text=GOOD, duration_ms=duration)
        if step == "F":
            return AgentResult(agent_name=spec.name, text="no idea", duration_ms=duration)
        if step == "T":
            return AgentResult(
                agent_name=spec.name, text=GOOD, duration_ms=1.0, stop_reason="max_tokens"
            )
        assert step == "E"
        error = AgentRunError(ErrorKind.MODEL_NOT_FOUND, "no such model")
        return AgentResult(agent_name=spec.name, text=GOOD, error=error, duration_ms=1.0)

    return ScriptedRuns(answer)


def asked(runtime: ScriptedRuns) -> list[tuple[str, str]]:
    """The (system prompt, prompt) of every run ``runtime`` was asked for, in order."""
    return [(call.spec.system_prompt, call.prompt) for call in runtime.calls]


def suite_of(count: int, repeats: int = 1) -> EvalSuite:
    check = EvalCheck(contains=("OK",))
    cases = tuple(EvalCase(id=f"c{i}", prompt=f"q{i}", check=check) for i in range(count))
    return EvalSuite(cases=cases, repeats=repeats)


async def verify(
    before: Sequence[str],
    after: Sequence[str],
    *,
    duration_ms: dict[str, float] | None = None,
    **options: Any,
) -> VerificationVerdict:
    """Run the same suite on both versions (case ``i`` plays ``before[i]``/``after[i]``)."""
    repeats = len(before[0])
    runtime = plays(
        {
            "before": {f"q{i}": pattern for i, pattern in enumerate(before)},
            "after": {f"q{i}": pattern for i, pattern in enumerate(after)},
        },
        duration_ms=duration_ms,
    )
    suite = suite_of(len(before), repeats)
    old = await run_suite(runtime, BEFORE, suite)
    new = await run_suite(runtime, AFTER, suite)
    assert len(runtime.calls) == 2 * len(before) * repeats
    return compare(old, new, **options)


# --- statistics ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (0, 5, 0.03125),  # 1/32
        (1, 6, 0.0625),  # (C(7,6) + C(7,7)) / 128 = 8/128
        (0, 4, 0.0625),  # 1/16: above 0.05 even though every discordant case improved
        (1, 8, 10 / 512),
        (2, 10, 79 / 4096),  # (66 + 12 + 1) / 4096
        (3, 3, 42 / 64),
        (5, 0, 1.0),
        (0, 0, 1.0),
        (1, 0, 1.0),
        (0, 1, 0.5),
    ],
)
def test_mcnemar_exact_one_sided_p_values(b: int, c: int, p: float) -> None:
    assert mcnemar_one_sided_p(b, c) == p


def test_mcnemar_stays_exact_for_large_counts() -> None:
    assert mcnemar_one_sided_p(0, 2000) == 0.5**2000
    assert 0 < mcnemar_one_sided_p(900, 1100) < 1e-5


def test_mcnemar_tails_add_up() -> None:
    # P(X >= c) + P(X >= b) = 1 + P(X = c) for X ~ Bin(b + c, 1/2), by symmetry
    for b in range(40):
        for c in range(40):
            point = math.comb(b + c, c) / 2 ** (b + c)
            total = mcnemar_one_sided_p(b, c) + mcnemar_one_sided_p(c, b)
            assert total == pytest.approx(1 + point, abs=1e-12), (b, c)


def test_mcnemar_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        mcnemar_one_sided_p(-1, 3)


def test_the_test_has_power_only_when_a_perfect_result_could_reach_alpha() -> None:
    assert [n for n in range(10) if mcnemar_has_power(n, 0.05)] == [5, 6, 7, 8, 9]
    assert [n for n in range(10) if mcnemar_has_power(n, 0.1)] == [4, 5, 6, 7, 8, 9]


# --- acceptance ---------------------------------------------------------------------------


async def test_a_real_fix_is_accepted_by_the_mcnemar_test() -> None:
    verdict = await verify(["F"] * 6 + ["P"] * 2, ["P"] * 8)
    assert verdict.accepted
    assert verdict.rule == "mcnemar"
    assert (verdict.b, verdict.c) == (0, 6)
    assert verdict.mcnemar_p == 1 / 64
    assert (verdict.before_score, verdict.after_score) == (0.25, 1.0)
    assert verdict.failures == ()
    assert not verdict.weaker
    assert "Accepted" in verdict.reason
    assert "p=0.01562" in verdict.reason


async def test_a_fix_that_helps_nothing_is_rejected() -> None:
    verdict = await verify(["F", "F", "P", "P", "P", "F"], ["F", "F", "P", "P", "P", "F"])
    assert not verdict.accepted
    assert verdict.failures == ("no_improvement",)
    assert (verdict.b, verdict.c) == (0, 0)
    assert verdict.before_score == verdict.after_score == 0.5
    assert "Rejected" in verdict.reason


async def test_four_fixes_against_one_break_are_rejected_by_mcnemar() -> None:
    # five discordant cases give the test power, but 4 fixed against 1 broken is p = 6/32
    verdict = await verify(["F"] * 4 + ["P", "P"], ["P"] * 4 + ["F", "P"])
    assert not verdict.accepted
    assert verdict.rule == "mcnemar"
    assert verdict.mcnemar_p == 6 / 32
    assert verdict.failures == ("no_improvement", "regression")


async def test_with_few_discordant_cases_fixing_every_failure_is_accepted() -> None:
    verdict = await verify(["F"] * 4 + ["P"] * 3, ["P"] * 7)
    assert (verdict.b, verdict.c) == (0, 4)
    assert verdict.mcnemar_p == 0.0625  # the test alone could never accept this
    assert verdict.rule == "all_failures_fixed"
    assert verdict.accepted


async def test_with_few_discordant_cases_leaving_a_failure_is_rejected() -> None:
    verdict = await verify(["F"] * 5 + ["P"], ["P"] * 4 + ["F", "P"])
    assert (verdict.b, verdict.c) == (0, 4)
    assert verdict.rule == "all_failures_fixed"
    assert not verdict.accepted
    assert verdict.failures == ("no_improvement",)
    assert "4 of 5 failing case(s) fixed" in verdict.reason


async def test_with_few_discordant_cases_breaking_any_passing_case_is_rejected() -> None:
    # c1 passed only 2 of 3 before, so its failure after is no regression; it still breaks
    before = ["FFF", "PPF", "PPP"]
    after = ["PPP", "FFF", "PPP"]
    verdict = await verify(before, after)
    assert (verdict.b, verdict.c) == (1, 1)
    assert verdict.regressions == ()
    assert verdict.rule == "all_failures_fixed"
    assert not verdict.accepted
    assert verdict.failures == ("no_improvement",)


async def test_a_fix_that_regresses_an_always_passing_case_is_rejected() -> None:
    # eight fixes against one break pass the McNemar test (p = 10/512), but c8 always passed
    before = ["FFF"] * 8 + ["PPP", "PPF"]
    after = ["PPP"] * 8 + ["FFP", "PPP"]
    verdict = await verify(before, after)
    assert verdict.rule == "mcnemar"
    assert verdict.mcnemar_p == 10 / 512
    assert not verdict.accepted
    assert verdict.failures == ("regression",)
    assert verdict.regressions == ("c8",)
    assert "regressions: c8" in verdict.reason
    assert "c8       3/3    1/3  broken REGRESSION" in verdict.table().splitlines()


async def test_a_fix_three_times_slower_is_rejected() -> None:
    verdict = await verify(["F"] * 6, ["P"] * 6, duration_ms={"before": 100.0, "after": 300.0})
    assert verdict.latency_ratio == 3.0
    assert not verdict.accepted
    assert verdict.failures == ("latency",)
    assert "3.00x of baseline (limit 2x)" in verdict.reason


async def test_exactly_twice_as_slow_is_still_accepted() -> None:
    verdict = await verify(["F"] * 6, ["P"] * 6, duration_ms={"before": 100.0, "after": 200.0})
    assert verdict.latency_ratio == 2.0
    assert verdict.accepted


async def test_errored_and_truncated_runs_do_not_set_the_latency_baseline() -> None:
    # the failures took 1 ms; judging the fix against them would call it 100x slower
    before = ["EEE", "TTT", "PPP", "PPP", "EEE", "TTT"]
    verdict = await verify(before, ["PPP"] * 6, duration_ms={"before": 100.0, "after": 150.0})
    assert verdict.latency_ratio == 1.5
    assert verdict.rule == "all_failures_fixed"
    assert verdict.accepted
    assert "errored runs 6 before, 0 after" in verdict.reason


async def test_latency_without_any_clean_baseline_run_is_not_held_against_the_fix() -> None:
    verdict = await verify(["E"] * 5, ["P"] * 5)
    assert verdict.latency_ratio is None
    assert verdict.accepted
    assert "latency not measurable" in verdict.reason


async def test_a_case_passing_two_of_three_counts_as_passing() -> None:
    verdict = await verify(["FFP"] * 5 + ["PPF"], ["PFP"] * 5 + ["PFF"])
    rows = {row.case_id: row for row in verdict.cases}
    assert not rows["c0"].before_pass
    assert rows["c0"].after_pass
    assert rows["c0"].change == "fixed"
    assert rows["c5"].change == "broken"
    assert not rows["c5"].regression  # it did not pass every run before
    assert (verdict.b, verdict.c) == (1, 5)
    assert (verdict.before_score, verdict.after_score) == (1 / 6, 5 / 6)


async def test_with_an_even_repeat_count_a_tie_is_not_a_pass() -> None:
    verdict = await verify(["FF"] * 5 + ["PP", "PF"], ["PP"] * 5 + ["FP", "PF"])
    rows = {row.case_id: row for row in verdict.cases}
    assert not rows["c6"].before_pass
    assert rows["c5"].regression
    assert verdict.regressions == ("c5",)
    assert not verdict.accepted


async def test_nothing_failing_before_means_nothing_to_fix() -> None:
    verdict = await verify(["PPP"] * 3, ["PPP"] * 3)
    assert not verdict.accepted
    assert verdict.rule == "nothing_to_fix"
    assert verdict.failures == ("nothing_to_fix",)
    assert "nothing it can be shown to fix" in verdict.reason


async def test_comparing_runs_over_different_cases_is_refused() -> None:
    runtime = plays({"before": {"q0": "P", "q1": "P"}, "after": {"q0": "P"}})
    old = await run_suite(runtime, BEFORE, suite_of(2))
    new = await run_suite(runtime, AFTER, suite_of(1))
    with pytest.raises(SuiteMismatch, match="different cases"):
        compare(old, new)


async def test_compare_refuses_meaningless_thresholds() -> None:
    run = await run_suite(plays({"before": {"q0": "P"}}), BEFORE, suite_of(1))
    with pytest.raises(ValueError, match="alpha"):
        compare(run, run, alpha=1.0)
    with pytest.raises(ValueError, match="max_latency_ratio"):
        compare(run, run, max_latency_ratio=0)


async def test_a_verdict_is_frozen() -> None:
    verdict = await verify(["F"] * 5, ["P"] * 5)
    with pytest.raises(ValidationError):
        verdict.accepted = False  # type: ignore[misc]


# --- running a suite ----------------------------------------------------------------------


async def test_run_suite_runs_every_case_every_repeat_and_keeps_suite_order() -> None:
    patterns = {"before": {f"q{i}": "PFP" for i in range(5)}}
    runtime = plays(patterns)
    run = await run_suite(runtime, BEFORE, suite_of(5, repeats=3), concurrency=8)
    assert sorted(asked(runtime)) == sorted(("before", f"q{i}") for i in range(5) for _ in "abc")
    assert [case.case_id for case in run.cases] == [f"c{i}" for i in range(5)]
    assert [[r.repeat for r in case.runs] for case in run.cases] == [[0, 1, 2]] * 5
    assert [case.passes for case in run.cases] == [2] * 5
    assert run.score == 1.0
    assert run.repeats == 3


@pytest.mark.parametrize("limit", [1, 3])
async def test_run_suite_never_exceeds_its_concurrency(limit: int) -> None:
    runtime = plays({"before": {f"q{i}": "PP" for i in range(6)}})
    await run_suite(runtime, BEFORE, suite_of(6, repeats=2), concurrency=limit)
    assert runtime.peak == limit


async def test_run_suite_refuses_zero_concurrency() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        await run_suite(plays({}), BEFORE, suite_of(1), concurrency=0)


async def test_every_run_reaches_the_recorder_marked_with_its_case() -> None:
    recorded: list[CaseRun] = []
    runtime = plays({"before": {"q0": "PF", "q1": "EP"}})
    await run_suite(runtime, BEFORE, suite_of(2, repeats=2), on_result=recorded.append)
    summary = sorted((r.case_id, r.repeat, r.outcome.passed, r.result.success) for r in recorded)
    assert summary == [
        ("c0", 0, True, True),
        ("c0", 1, False, True),
        ("c1", 0, False, False),
        ("c1", 1, True, True),
    ]
    assert {r.agent_name for r in recorded} == {"solver"}
    assert {r.prompt for r in recorded} == {"q0", "q1"}


async def test_an_async_recorder_is_awaited() -> None:
    recorded: list[str] = []

    async def record(run: CaseRun) -> None:
        await asyncio.sleep(0)
        recorded.append(run.case_id)

    runtime = plays({"before": {"q0": "PPP"}})
    await run_suite(runtime, BEFORE, suite_of(1, repeats=3), on_result=record)
    assert recorded == ["c0"] * 3


async def test_a_failed_run_fails_its_case_even_with_the_right_text() -> None:
    runtime = plays({"before": {"q0": "E"}})
    run = await run_suite(runtime, BEFORE, suite_of(1))
    (only,) = run.cases[0].runs
    assert not only.passed
    assert only.error is not None
    assert "model_not_found" in only.error
    assert not only.counts_for_latency
    assert run.errors == 1


async def test_a_raised_run_error_is_a_failed_run_not_a_crash() -> None:
    runtime = plays({"before": {"q0": "P", "q1": "P"}}, raise_on="q1")
    run = await run_suite(runtime, BEFORE, suite_of(2))
    assert [case.passes for case in run.cases] == [1, 0]
    assert run.cases[1].runs[0].error == "rate_limit: slow down"


async def test_a_recorder_that_raises_stops_the_suite() -> None:
    def broken(run: CaseRun) -> None:
        raise RuntimeError("store is gone")

    runtime = plays({"before": {f"q{i}": "P" for i in range(4)}})
    with pytest.raises(RuntimeError, match="store is gone"):
        await run_suite(runtime, BEFORE, suite_of(4), on_result=broken)


def test_a_suite_run_without_cases_scores_zero() -> None:
    assert SuiteRun(agent_name="solver", repeats=1, cases=()).score == 0


# --- without a suite ----------------------------------------------------------------------


def two_versions(before: AgentResult[Any], after: AgentResult[Any]) -> ScriptedRuns:
    """Answers the sample query with ``results[system_prompt]``: one result per definition."""
    results = {"before": before, "after": after}
    return ScriptedRuns(lambda call: results[call.spec.system_prompt])


class Theorem(BaseModel):
    statement: str


def answer(text: str = GOOD, ms: float = 100.0, **fields: Any) -> AgentResult[Any]:
    return AgentResult(agent_name="solver", text=text, duration_ms=ms, **fields)


TIMED_OUT = answer(ms=30_000.0, error=AgentRunError(ErrorKind.TIMEOUT, "took too long"))
RETIRED = answer("", ms=5.0, error=AgentRunError(ErrorKind.MODEL_NOT_FOUND, "model not found"))
SHORT = answer("a^2+b^2", ms=100.0)


@pytest.mark.parametrize(
    ("before", "after", "accepted", "failures", "ratio", "why"),
    [
        # the fix for a timeout runs long: the run that timed out is no baseline for speed
        (TIMED_OUT, answer(ms=240_000.0), True, (), None, "latency not judged"),
        # a model switch after a retired model: the instant 404 says nothing about speed either
        (RETIRED, answer(ms=900.0), True, (), None, "failed before the change"),
        (
            RETIRED,
            AgentResult(
                agent_name="solver",
                output=Theorem(statement="In a right triangle a^2 + b^2 = c^2, c the hypotenuse."),
            ),
            True,
            (),
            None,
            "passes after it",
        ),
        # a complete run before is the baseline: 1.5x is fine, 2.5x is not
        (SHORT, answer(ms=150.0), True, (), 1.5, "latency 1.50x of the run before"),
        (SHORT, answer(ms=250.0), False, ("latency",), 2.5, "2.50x as long as before"),
        # nothing failed before: nothing is shown fixed, whatever happens after
        (answer(), answer(), False, ("nothing_to_fix",), 1.0, "already passed before"),
        # still failing after
        (TIMED_OUT, SHORT, False, ("sample_query",), None, "7 characters"),
        (TIMED_OUT, answer(stop_reason="max_tokens"), False, ("sample_query",), None, "truncated"),
        (RETIRED, RETIRED, False, ("sample_query",), None, "the run failed"),
    ],
)
async def test_without_a_suite_the_sample_query_runs_before_and_after_the_change(
    before: AgentResult[Any],
    after: AgentResult[Any],
    accepted: bool,
    failures: tuple[str, ...],
    ratio: float | None,
    why: str,
) -> None:
    runtime = two_versions(before, after)
    recorded: list[CaseRun] = []
    old = await run_sample_query(runtime, BEFORE, on_result=recorded.append)
    verdict = await sample_query_check(runtime, AFTER, before=old, on_result=recorded.append)
    assert asked(runtime) == [("before", SAMPLE_QUERY), ("after", SAMPLE_QUERY)]
    assert verdict.weaker
    assert verdict.rule == "sample_query"
    assert verdict.accepted is accepted
    assert verdict.failures == failures
    assert verdict.latency_ratio == ratio
    assert why in verdict.reason
    assert "weaker check" in verdict.reason
    assert verdict.before_score == old.score
    assert verdict.after_score == (1.0 if "sample_query" not in failures else 0.0)
    assert [r.case_id for r in recorded] == ["sample-query", "sample-query"]
    assert [r.result for r in recorded] == [before, after]
