"""Sequential verification on an eval suite: before/after pairs, one at a time, stopped when clear.

The fixed design runs every case ``suite.repeats`` times on the definition before the change and
as many after it, then judges (``verification.compare``). This one runs *pairs*: case ``i`` once
before and once after, in rounds over the cases, and after every pair asks
:class:`~agentmend.infrastructure.evaluation.sequential.PairedTest` whether the answer is clear:

* ``helps``: the change is accepted (an always-valid test at ``alpha``);
* ``does_not_help``: shown to hurt, or futile (see ``PairedTest``): rejected;
* ``underpowered``: the suite is too small for any valid test to show a help within its budget
  (three cases that all fail before give at most nine discordant pairs): the remaining runs are
  made and the fixed design's rule judges, exactly as without this module, so a small suite's
  clear fix is still kept;
* the budget (the fixed design's count) spent without a decision: rejected.

So it never costs more model calls than the fixed design, and less whenever the answer is clear
early. The no-regression guard holds as in the fixed design: a case that passed every run before
and fails most runs after (judged once it has two runs on each side) rejects the change whatever
the test says, and a pass -> fail pair always counts against it; so does the latency limit.

The "before" side can start early: :func:`run_reproduction` runs the suite on the definition
before the change a run at a time until some case fails by majority whatever its remaining runs
(the issue reproduces) or every run was made (the same finding as the fixed design's full run),
and those runs are the first pairs' "before" halves. Runs go one at a time, not four at once as
``run_suite`` makes them: fewer calls for more wall-clock time. Both definitions are plain
``AgentSpec`` objects, so the "before" side of later pairs runs while the change is applied on
disk; nothing here reads or writes files or the store (``on_result`` receives every run, to be
recorded apart from production runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from agentmend.infrastructure.evaluation.evals import EvalSuite
from agentmend.infrastructure.evaluation.sequential import PairedDecision, PairedTest
from agentmend.infrastructure.evaluation.verification import (
    CaseComparison,
    CaseResult,
    OnResult,
    RunOutcome,
    SuiteRun,
    VerificationVerdict,
    compare,
    latency_ratio,
    run_suite,
)
from agentmend.infrastructure.llm.base import AgentRuntime, ToolSpec

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "PairedRuns",
    "SequentialVerdict",
    "judge_rounds",
    "run_reproduction",
    "verify_sequentially",
]

Decision = PairedDecision | Literal["regression", "fixed_design"]


@dataclass(frozen=True, slots=True)
class SequentialVerdict:
    """How a sequential verification ended and what it cost."""

    accepted: bool
    decision: Decision
    rounds: int  # rounds begun
    model_calls: int  # runs made on both sides (including the reproduction's)
    fixed: int  # fail -> pass pairs
    broken: int  # pass -> fail pairs
    evidence: float  # the test's wealth against "does not help"
    regressions: tuple[str, ...]  # cases that always passed before and fail by majority after


@dataclass(slots=True)
class PairedRuns:
    """The runs of both sides so far, per case, and the test they feed.

    ``add`` takes one run of one side; a pair is complete (and reaches the test) once both sides
    of a case have as many runs as its round needs. Pure: the async flow and the replay of
    simulated outcomes (the benchmark, the tests) share it, and so share the stopping rule.
    """

    case_ids: tuple[str, ...]
    repeats: int
    alpha: float = 0.05
    before: list[list[RunOutcome]] = field(init=False)
    after: list[list[RunOutcome]] = field(init=False)
    test: PairedTest = field(init=False)
    _paired: list[int] = field(init=False)

    def __post_init__(self) -> None:
        cases = len(self.case_ids)
        self.before = [[] for _ in range(cases)]
        self.after = [[] for _ in range(cases)]
        self._paired = [0] * cases
        self.test = PairedTest(
            budget=max(1, cases * self.repeats), alpha=self.alpha, round_size=cases
        )

    def add(self, index: int, side: Literal["before", "after"], run: RunOutcome) -> None:
        (self.before if side == "before" else self.after)[index].append(run)
        while self._paired[index] < min(len(self.before[index]), len(self.after[index])):
            k = self._paired[index]
            self.test.add(self.before[index][k].passed, self.after[index][k].passed)
            self._paired[index] += 1

    @property
    def model_calls(self) -> int:
        return sum(map(len, self.before)) + sum(map(len, self.after))

    @property
    def rounds(self) -> int:
        return max((len(runs) for runs in (*self.before, *self.after)), default=0)

    def regressions(self) -> tuple[str, ...]:
        """Cases that passed every run before and fail most runs after (two or more each)."""
        return tuple(
            case_id
            for case_id, old, new in zip(self.case_ids, self.before, self.after, strict=True)
            if len(old) >= 2
            and len(new) >= 2
            and all(r.passed for r in old)
            and 2 * sum(r.passed for r in new) < len(new)
        )

    def decision(self) -> Decision:
        if self.regressions():
            return "regression"
        return self.test.decision()

    def side(self, name: str, which: Literal["before", "after"]) -> SuiteRun:
        runs = self.before if which == "before" else self.after
        return SuiteRun(
            agent_name=name,
            repeats=self.repeats,
            cases=tuple(
                CaseResult(case_id=case_id, runs=tuple(case_runs))
                for case_id, case_runs in zip(self.case_ids, runs, strict=True)
            ),
        )

    def verdict(self, decision: Decision) -> SequentialVerdict:
        return SequentialVerdict(
            accepted=decision == "helps",
            decision=decision,
            rounds=self.rounds,
            model_calls=self.model_calls,
            fixed=self.test.fixed,
            broken=self.test.broken,
            evidence=self.test.evidence,
            regressions=self.regressions(),
        )


def _outcome(passed: bool, repeat: int) -> RunOutcome:
    return RunOutcome(repeat=repeat, passed=passed, detail="", duration_ms=1.0)


def judge_rounds(
    before: Sequence[Sequence[bool]],
    after: Sequence[Sequence[bool]],
    *,
    repeats: int,
    alpha: float = 0.05,
) -> SequentialVerdict:
    """Replay outcomes (``before[r][i]``: case ``i`` in round ``r``) pair by pair, as
    :func:`verify_sequentially` runs them, and stop where it would; pure, so the benchmark and
    the tests judge simulated outcomes by the very rule the real flow uses."""
    cases = len(before[0]) if before else 0
    runs = PairedRuns(tuple(str(i) for i in range(cases)), repeats, alpha)
    decision: Decision = "continue"
    for r, (b_round, a_round) in enumerate(zip(before, after, strict=True)):
        for i, (b, a) in enumerate(zip(b_round, a_round, strict=True)):
            runs.add(i, "before", _outcome(b, r))
            runs.add(i, "after", _outcome(a, r))
            decision = runs.decision()
            if decision != "continue":
                break
        if decision != "continue":
            break
    if decision == "underpowered":
        fixed = compare(
            _replayed("before", before, repeats), _replayed("after", after, repeats), alpha=alpha
        )
        verdict = runs.verdict("fixed_design")
        return SequentialVerdict(
            accepted=fixed.accepted,
            decision="fixed_design",
            rounds=repeats,
            model_calls=2 * cases * repeats,
            fixed=verdict.fixed,
            broken=verdict.broken,
            evidence=verdict.evidence,
            regressions=fixed.regressions,
        )
    return runs.verdict(decision)


def _replayed(name: str, rounds: Sequence[Sequence[bool]], repeats: int) -> SuiteRun:
    cases = len(rounds[0]) if rounds else 0
    return SuiteRun(
        agent_name=name,
        repeats=repeats,
        cases=tuple(
            CaseResult(
                case_id=str(i), runs=tuple(_outcome(rounds[r][i], r) for r in range(repeats))
            )
            for i in range(cases)
        ),
    )


async def _run_case(
    runtime: AgentRuntime,
    spec: AgentSpec,
    suite: EvalSuite,
    index: int,
    repeat: int,
    tools: Sequence[ToolSpec],
    on_result: OnResult | None,
) -> RunOutcome:
    """One run of case ``index`` (numbered ``repeat``), through ``run_suite``'s own path."""
    one = suite.model_copy(update={"cases": (suite.cases[index],), "repeats": 1})
    run = await run_suite(runtime, spec, one, tools=tools, on_result=on_result)
    return run.cases[0].runs[0].model_copy(update={"repeat": repeat})


async def run_reproduction(
    runtime: AgentRuntime,
    spec: AgentSpec,
    suite: EvalSuite,
    *,
    tools: Sequence[ToolSpec] = (),
    on_result: OnResult | None = None,
) -> SuiteRun:
    """Run ``suite`` on the definition before the change, a run at a time, until some case
    fails by majority whatever its remaining runs (the issue reproduces) or every run was made.

    The finding is the fixed design's (a suite run "passes everything" when every case passes by
    majority), reached with fewer runs: each round runs the cases that failed most first, and
    stops at the first case whose failures already outnumber the passes it could still have.
    """
    runs: list[list[RunOutcome]] = [[] for _ in suite.cases]
    decided = False
    for repeat in range(suite.repeats):
        order = sorted(range(len(suite.cases)), key=lambda i: -sum(not r.passed for r in runs[i]))
        for index in order:
            runs[index].append(
                await _run_case(runtime, spec, suite, index, repeat, tools, on_result)
            )
            if 2 * sum(not r.passed for r in runs[index]) > suite.repeats:
                decided = True
                break
        if decided:
            break
    return SuiteRun(
        agent_name=spec.name,
        repeats=suite.repeats,
        cases=tuple(
            CaseResult(case_id=case.id, runs=tuple(case_runs))
            for case, case_runs in zip(suite.cases, runs, strict=True)
        ),
    )


async def verify_sequentially(
    runtime: AgentRuntime,
    old_spec: AgentSpec,
    new_spec: AgentSpec,
    suite: EvalSuite,
    *,
    before: SuiteRun | None = None,
    alpha: float = 0.05,
    max_latency_ratio: float = 2.0,
    tools: Sequence[ToolSpec] = (),
    on_result: OnResult | None = None,
) -> tuple[VerificationVerdict, SequentialVerdict]:
    """Run ``suite`` as pairs (see the module doc) until the test decides; the verdict as the
    fixed design gives it (``rule="sequential"``, or the fixed design's own when the suite is too
    small), and how the sequential run ended. ``before``: runs already made on ``old_spec``
    (:func:`run_reproduction`), used as the first pairs' "before" halves."""
    ids = tuple(case.id for case in suite.cases)
    runs = PairedRuns(ids, suite.repeats, alpha)
    if before is not None:
        for index, case in enumerate(before.cases):
            for run in case.runs:
                runs.add(index, "before", run)
    decision: Decision = "continue"
    for repeat in range(suite.repeats):
        for index in range(len(ids)):
            if len(runs.before[index]) <= repeat:
                outcome = await _run_case(runtime, old_spec, suite, index, repeat, tools, on_result)
                runs.add(index, "before", outcome)
            outcome = await _run_case(runtime, new_spec, suite, index, repeat, tools, on_result)
            runs.add(index, "after", outcome)
            decision = runs.decision()
            if decision != "continue":
                break
        if decision != "continue":
            break
    if decision == "underpowered":
        return await _fixed_design(
            runtime, (old_spec, new_spec), suite, runs, tools, on_result, alpha, max_latency_ratio
        )
    result = runs.verdict(decision)
    return _verdict(runs, result, old_spec.name, alpha, max_latency_ratio), result


async def _fixed_design(
    runtime: AgentRuntime,
    specs: tuple[AgentSpec, AgentSpec],
    suite: EvalSuite,
    runs: PairedRuns,
    tools: Sequence[ToolSpec],
    on_result: OnResult | None,
    alpha: float,
    max_latency_ratio: float,
) -> tuple[VerificationVerdict, SequentialVerdict]:
    """Too few cases for a valid test: make every remaining run and judge as the fixed design."""
    old_spec, new_spec = specs
    sides: tuple[tuple[AgentSpec, Literal["before", "after"]], ...] = (
        (old_spec, "before"),
        (new_spec, "after"),
    )
    for index in range(len(runs.case_ids)):
        for spec, side in sides:
            made = runs.before if side == "before" else runs.after
            while len(made[index]) < suite.repeats:
                outcome = await _run_case(
                    runtime, spec, suite, index, len(made[index]), tools, on_result
                )
                runs.add(index, side, outcome)
    verdict = compare(
        runs.side(old_spec.name, "before"),
        runs.side(old_spec.name, "after"),
        alpha=alpha,
        max_latency_ratio=max_latency_ratio,
    )
    result = runs.verdict("fixed_design")
    return verdict, SequentialVerdict(
        accepted=verdict.accepted,
        decision="fixed_design",
        rounds=result.rounds,
        model_calls=result.model_calls,
        fixed=result.fixed,
        broken=result.broken,
        evidence=result.evidence,
        regressions=verdict.regressions,
    )


def _verdict(
    runs: PairedRuns,
    result: SequentialVerdict,
    name: str,
    alpha: float,
    max_latency_ratio: float,
) -> VerificationVerdict:
    """The sequential run's verdict in the fixed design's form: per case, before and after."""
    before, after = runs.side(name, "before"), runs.side(name, "after")
    rows = tuple(
        CaseComparison.of(old, new, regression=old.case_id in result.regressions)
        for old, new in zip(before.cases, after.cases, strict=True)
    )
    ratio = latency_ratio(before, after)
    failures: list[Literal["no_improvement", "regression", "latency"]] = []
    if result.decision == "regression":
        failures.append("regression")
    elif not result.accepted:
        failures.append("no_improvement")
    if ratio is not None and ratio > max_latency_ratio:
        failures.append("latency")
    accepted = not failures
    why = {
        "helps": "shows the change helps",
        "does_not_help": "shows it does not help (it hurts, or a round fixed no more than it "
        "broke, or two rounds gave no evidence)",
        "budget_spent": "spent the fixed design's budget without showing a help",
        "regression": "was overruled by a regression",
    }.get(result.decision, result.decision)
    parts = [
        f"{'Accepted' if accepted else 'Rejected'}: score {before.score:.2f} -> {after.score:.2f}",
        f"the sequential paired test {why} after {result.model_calls} of "
        f"{2 * len(rows) * runs.repeats} runs ({result.fixed} fail->pass, {result.broken} "
        f"pass->fail pairs, evidence {result.evidence:.3g} against 1/alpha = {1 / alpha:g})",
        f"regressions: {', '.join(result.regressions)}" if result.regressions else "no regressions",
        f"latency {'not measurable' if ratio is None else f'{ratio:.2f}x'} of baseline "
        f"(limit {max_latency_ratio:g}x)",
    ]
    return VerificationVerdict(
        accepted=accepted,
        reason="; ".join(parts) + ".",
        rule="sequential",
        failures=tuple(failures),
        before_score=before.score,
        after_score=after.score,
        b=result.broken,
        c=result.fixed,
        alpha=alpha,
        regressions=result.regressions,
        latency_ratio=ratio,
        max_latency_ratio=max_latency_ratio,
        cases=rows,
    )
