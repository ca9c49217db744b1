"""Sequential verification on an eval suite: before/after pairs in rounds, stopped when clear.

Each round runs every case once on the definition before the change and once on the one after
it (a pair per case), feeds the pairs to :class:`~infrastructure.evaluation.sequential.
PairedTest` and stops as soon as it decides, or when the budget (the fixed design's count: every
case ``suite.repeats`` times) is spent; so it never costs more model calls than the fixed design,
and less whenever the answer is clear early. The no-regression guard of the fixed design holds
here too: a case that passed in every run before and fails in most runs after rejects the change
whatever the test says, and a pass -> fail pair always counts against it.

Both definitions are plain ``AgentSpec`` objects, so the "before" side can run after the change
is applied on disk; nothing here reads or writes files or the store (``on_result`` receives
every run, to be recorded apart from production runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from infrastructure.evaluation.evals import EvalSuite
from infrastructure.evaluation.sequential import PairedDecision, PairedTest
from infrastructure.evaluation.verification import OnResult, run_suite
from infrastructure.llm.base import AgentRuntime, ToolSpec

if TYPE_CHECKING:
    from infrastructure.spec import AgentSpec

__all__ = ["SequentialVerdict", "judge_rounds", "verify_sequentially"]


@dataclass(frozen=True, slots=True)
class SequentialVerdict:
    """How a sequential verification ended and what it cost."""

    accepted: bool
    decision: PairedDecision | Literal["regression"]
    rounds: int
    model_calls: int
    fixed: int  # fail -> pass pairs
    broken: int  # pass -> fail pairs
    evidence: float  # the test's wealth against "does not help"
    regressions: tuple[str, ...]  # cases that always passed before and fail by majority after


def judge_rounds(
    before: Sequence[Sequence[bool]],
    after: Sequence[Sequence[bool]],
    *,
    repeats: int,
    alpha: float = 0.05,
) -> SequentialVerdict:
    """Replay rounds of outcomes (``before[r][i]``: case ``i`` in round ``r``) through the test.

    Stops at the first round whose pairs let the test decide, as :func:`verify_sequentially`
    does; pure, so the benchmark and the tests use the same rule on simulated outcomes.
    """
    cases = len(before[0]) if before else 0
    test = PairedTest(budget=max(1, cases * repeats), alpha=alpha)
    passes_before = [0] * cases
    passes_after = [0] * cases
    rounds = 0
    decision: PairedDecision | Literal["regression"] = "continue"
    for b_round, a_round in zip(before, after, strict=True):
        rounds += 1
        for i, (b, a) in enumerate(zip(b_round, a_round, strict=True)):
            test.add(b, a)
            passes_before[i] += b
            passes_after[i] += a
        regressions = _regressions(passes_before, passes_after, rounds)
        if regressions:
            decision = "regression"
            break
        decision = test.decision()
        if decision != "continue" or rounds >= repeats:
            break
    regressions = _regressions(passes_before, passes_after, rounds)
    return SequentialVerdict(
        accepted=decision == "helps" and not regressions,
        decision=decision,
        rounds=rounds,
        model_calls=2 * rounds * cases,
        fixed=test.fixed,
        broken=test.broken,
        evidence=test.evidence,
        regressions=tuple(str(i) for i in regressions),
    )


def _regressions(before: list[int], after: list[int], rounds: int) -> list[int]:
    # judged once a case has at least two runs on each side (one run is too noisy to call)
    if rounds < 2:
        return []
    return [
        i
        for i, (b, a) in enumerate(zip(before, after, strict=True))
        if b == rounds and 2 * a < rounds
    ]


async def verify_sequentially(
    runtime: AgentRuntime,
    old_spec: AgentSpec,
    new_spec: AgentSpec,
    suite: EvalSuite,
    *,
    alpha: float = 0.05,
    tools: Sequence[ToolSpec] = (),
    on_result: OnResult | None = None,
) -> SequentialVerdict:
    """Run ``suite`` in rounds of pairs (one run per case per side) until the test decides."""
    once = suite.model_copy(update={"repeats": 1})
    before_rounds: list[list[bool]] = []
    after_rounds: list[list[bool]] = []
    verdict = judge_rounds([], [], repeats=suite.repeats, alpha=alpha)
    for _ in range(suite.repeats):
        b = await run_suite(runtime, old_spec, once, tools=tools, on_result=on_result)
        a = await run_suite(runtime, new_spec, once, tools=tools, on_result=on_result)
        before_rounds.append([case.runs[0].passed for case in b.cases])
        after_rounds.append([case.runs[0].passed for case in a.cases])
        verdict = judge_rounds(before_rounds, after_rounds, repeats=suite.repeats, alpha=alpha)
        if verdict.decision != "continue":
            break
    return verdict
