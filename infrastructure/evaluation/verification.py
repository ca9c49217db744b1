"""Verification: does a change really help? Run the same cases before and after, then judge.

``run_suite`` runs every case of an ``EvalSuite`` ``repeats`` times; ``compare`` turns the two
runs into a ``VerificationVerdict``. The acceptance rule (each part is needed):

1. **It fixes.** A case's outcome is the majority over its repeats (strictly more than half
   pass; a tie is a fail), because repeats of one case are not independent pairs. Over the cases,
   ``b`` counts pass->fail and ``c`` fail->pass. With ``n = b + c`` discordant cases:

   - if even a perfect result (``c = n``) could reach ``alpha`` (``0.5**n <= alpha``; at
     0.05 that is ``n >= 5``), the exact one-sided McNemar test decides:
     ``P(X >= c | X ~ Binomial(n, 0.5)) <= alpha`` (rule ``"mcnemar"``);
   - otherwise the test has no power and the fallback decides: every case that failed before
     passes after **and** no case that passed before fails after (rule
     ``"all_failures_fixed"``). With so little evidence a single pass->fail outweighs it;
   - if no case failed before, there is nothing the change can be shown to fix, so it is not
     accepted (rule ``"nothing_to_fix"``).

2. **It does not regress.** No case that passed in *every* repeat before fails after (does not
   pass by majority: for odd repeats, fails in most of them), and the median latency after is
   at most ``max_latency_ratio`` (2x) the median before. Latency counts only runs that finished
   without error and were not truncated: a run that errors at once or is cut off at its token
   limit says nothing about speed, and counting it would punish exactly the fixes for those
   faults. With no such run on either side the latency criterion cannot be judged and is not
   held against the change (the reason says so).

Without a suite, the weaker check (marked ``weaker``) runs a single sample query
before the change (``run_sample_query`` on the old definition) and after it, and accepts only
when it failed before and passes after; latency is compared with the run before, and only when
that run finished (``judge_sample_query``). Verification runs reach the caller through
``on_result`` so it can record them apart from production executions; nothing here feeds
detection.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from agentmend.infrastructure.errors import AgentmendError, AgentRunError, InvalidArgument
from agentmend.infrastructure.evaluation.evals import CheckOutcome, EvalCase, EvalSuite
from agentmend.infrastructure.llm.base import AgentResult, AgentRuntime, ToolSpec
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "SAMPLE_MIN_CHARS",
    "SAMPLE_QUERY",
    "CaseComparison",
    "CaseResult",
    "CaseRun",
    "RunOutcome",
    "SampleRun",
    "SuiteMismatch",
    "SuiteRun",
    "VerificationVerdict",
    "compare",
    "judge_sample_query",
    "latency_ratio",
    "mcnemar_has_power",
    "mcnemar_one_sided_p",
    "run_sample_query",
    "run_suite",
    "sample_query_check",
]

log = get_logger(__name__)

Rule = Literal["mcnemar", "all_failures_fixed", "nothing_to_fix", "sample_query", "sequential"]
Failure = Literal["nothing_to_fix", "no_improvement", "regression", "latency", "sample_query"]

SAMPLE_QUERY = "What is the Pythagorean theorem?"
SAMPLE_MIN_CHARS = 50


class SuiteMismatch(AgentmendError):
    """Before and after runs that are not over the same cases cannot be compared."""


# --- statistics ---------------------------------------------------------------------------


def mcnemar_one_sided_p(b: int, c: int) -> float:
    """Exact one-sided McNemar p-value for improvement: ``P(X >= c)``, ``X ~ Bin(b + c, 1/2)``.

    ``b`` counts pass->fail cases and ``c`` fail->pass; under "no effect" each discordant case
    is equally likely to go either way. Integer arithmetic keeps it exact until the one final
    division. With no discordant case the p-value is 1.
    """
    if b < 0 or c < 0:
        raise InvalidArgument("counts (b, c)", (b, c), "must be non-negative")
    n = b + c
    return sum(math.comb(n, k) for k in range(c, n + 1)) / (1 << n)


def mcnemar_has_power(n: int, alpha: float) -> bool:
    """Whether ``n`` discordant cases could reach ``alpha`` at all (all of them improving)."""
    return n > 0 and 0.5**n <= alpha


def _majority(passes: int, runs: int) -> bool:
    return runs > 0 and 2 * passes > runs


# --- running a suite ----------------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RunOutcome(_Frozen):
    """One run of one case."""

    repeat: int
    passed: bool
    detail: str
    duration_ms: float
    error: str | None = None
    counts_for_latency: bool = True


class CaseResult(_Frozen):
    """All runs of one case, in repeat order."""

    case_id: str
    runs: tuple[RunOutcome, ...]

    @property
    def passes(self) -> int:
        return sum(run.passed for run in self.runs)

    @property
    def majority_pass(self) -> bool:
        return _majority(self.passes, len(self.runs))

    @property
    def always_passed(self) -> bool:
        return bool(self.runs) and self.passes == len(self.runs)


class SuiteRun(_Frozen):
    """One side (before or after) of a verification."""

    agent_name: str
    repeats: int
    cases: tuple[CaseResult, ...]

    @property
    def score(self) -> float:
        """Fraction of cases passing by majority."""
        return (
            sum(case.majority_pass for case in self.cases) / len(self.cases) if self.cases else 0.0
        )

    @property
    def errors(self) -> int:
        return sum(run.error is not None for case in self.cases for run in case.runs)

    def latency_median_ms(self) -> float | None:
        durations = [r.duration_ms for c in self.cases for r in c.runs if r.counts_for_latency]
        return statistics.median(durations) if durations else None


@dataclass(frozen=True, slots=True)
class CaseRun:
    """What ``on_result`` receives: one verification run, for the caller to record apart."""

    agent_name: str
    case_id: str
    repeat: int
    prompt: str
    result: AgentResult[Any]
    outcome: CheckOutcome


OnResult = Callable[[CaseRun], Awaitable[None] | None]


async def _run_once(
    runtime: AgentRuntime, spec: AgentSpec, prompt: str, tools: Sequence[ToolSpec]
) -> AgentResult[Any]:
    try:
        result: AgentResult[Any] = await runtime.run(spec, prompt, tools=tools)
    except AgentRunError as exc:  # a runtime may raise what it could have returned
        return AgentResult(agent_name=spec.name, error=exc)
    return result


async def run_suite(
    runtime: AgentRuntime,
    spec: AgentSpec,
    suite: EvalSuite,
    *,
    concurrency: int = 4,
    tools: Sequence[ToolSpec] = (),
    on_result: OnResult | None = None,
) -> SuiteRun:
    """Run every case ``suite.repeats`` times and record each run's outcome.

    Results are kept in case and repeat order whatever order runs finish in; ``on_result`` is
    called (and awaited, if async) as each run finishes, so its order follows completion. An
    exception from ``on_result`` or a non-``AgentRunError`` from the runtime (misuse, outage)
    cancels the remaining runs and propagates.
    """
    if concurrency < 1:
        raise InvalidArgument("concurrency", concurrency, "must be at least 1")
    gate = asyncio.Semaphore(concurrency)
    slots: list[list[RunOutcome | None]] = [[None] * suite.repeats for _ in suite.cases]

    async def one(index: int, case: EvalCase, repeat: int) -> None:
        async with gate:
            result = await _run_once(runtime, spec, case.prompt, tools)
        outcome = case.check.evaluate(result)
        slots[index][repeat] = RunOutcome(
            repeat=repeat,
            passed=outcome.passed,
            detail=outcome.detail,
            duration_ms=result.duration_ms,
            error=str(result.error) if result.error is not None else None,
            counts_for_latency=result.success and not result.truncated,
        )
        if on_result is not None:
            recorded = on_result(CaseRun(spec.name, case.id, repeat, case.prompt, result, outcome))
            if inspect.isawaitable(recorded):
                await recorded

    try:
        async with asyncio.TaskGroup() as group:
            for index, case in enumerate(suite.cases):
                for repeat in range(suite.repeats):
                    group.create_task(one(index, case, repeat))
    except BaseExceptionGroup as group_error:
        # callers match the error they caused (a recorder's, a runtime's), not a group of it
        raise group_error.exceptions[0] from None

    cases = tuple(
        CaseResult(case_id=case.id, runs=tuple(run for run in runs if run is not None))
        for case, runs in zip(suite.cases, slots, strict=True)
    )
    run = SuiteRun(agent_name=spec.name, repeats=suite.repeats, cases=cases)
    log.info(
        "ran_eval_suite", agent=spec.name, cases=len(cases), score=run.score, errors=run.errors
    )
    return run


# --- the verdict --------------------------------------------------------------------------


class CaseComparison(_Frozen):
    """One row of the verdict's table."""

    case_id: str
    before_passes: int
    before_runs: int
    after_passes: int
    after_runs: int
    before_pass: bool
    after_pass: bool
    regression: bool

    @classmethod
    def of(cls, old: CaseResult, new: CaseResult, *, regression: bool) -> CaseComparison:
        """One case's row from its runs before and after the change."""
        return cls(
            case_id=old.case_id,
            before_passes=old.passes,
            before_runs=len(old.runs),
            after_passes=new.passes,
            after_runs=len(new.runs),
            before_pass=old.majority_pass,
            after_pass=new.majority_pass,
            regression=regression,
        )

    @property
    def change(self) -> Literal["fixed", "broken", "still_passing", "still_failing"]:
        if self.before_pass != self.after_pass:
            return "fixed" if self.after_pass else "broken"
        return "still_passing" if self.after_pass else "still_failing"


class VerificationVerdict(_Frozen):
    """Whether to keep a change, why, and the evidence (scores, counts, p-value, per case)."""

    accepted: bool
    reason: str
    rule: Rule
    failures: tuple[Failure, ...] = ()
    before_score: float | None = None
    after_score: float
    b: int = 0
    c: int = 0
    mcnemar_p: float | None = None
    alpha: float = 0.05
    regressions: tuple[str, ...] = ()
    latency_ratio: float | None = None
    max_latency_ratio: float = 2.0
    weaker: bool = False
    cases: tuple[CaseComparison, ...] = ()

    def table(self) -> str:
        """The per-case comparison as aligned plain text (for reports and the CLI)."""
        width = max([len("case"), *(len(row.case_id) for row in self.cases)])
        lines = [f"{'case':<{width}}  before  after  change"]
        for row in self.cases:
            before = f"{row.before_passes}/{row.before_runs}"
            after = f"{row.after_passes}/{row.after_runs}"
            mark = " REGRESSION" if row.regression else ""
            lines.append(f"{row.case_id:<{width}}  {before:>6}  {after:>5}  {row.change}{mark}")
        return "\n".join(lines)


def _fmt_ratio(ratio: float | None) -> str:
    return "not measurable" if ratio is None else f"{ratio:.2f}x"


def compare(
    before: SuiteRun,
    after: SuiteRun,
    *,
    alpha: float = 0.05,
    max_latency_ratio: float = 2.0,
) -> VerificationVerdict:
    """Judge a change by its before and after runs over the same cases (see the module doc).

    Raises:
        SuiteMismatch: the two runs are not over the same case ids.
        InvalidArgument: ``alpha`` not in (0, 1) or ``max_latency_ratio`` not positive.
    """
    if not 0 < alpha < 1:
        raise InvalidArgument("alpha", alpha, "must be in (0, 1)")
    if max_latency_ratio <= 0:
        raise InvalidArgument("max_latency_ratio", max_latency_ratio, "must be positive")
    after_by_id = {case.case_id: case for case in after.cases}
    before_ids = [case.case_id for case in before.cases]
    if sorted(before_ids) != sorted(after_by_id) or len(set(before_ids)) != len(before_ids):
        raise SuiteMismatch(
            f"before and after runs of {before.agent_name!r} are over different cases: "
            f"{sorted(before_ids)} vs {sorted(after_by_id)}"
        )

    rows = []
    for old in before.cases:
        new = after_by_id[old.case_id]
        rows.append(
            CaseComparison.of(old, new, regression=old.always_passed and not new.majority_pass)
        )
    b = sum(row.change == "broken" for row in rows)
    c = sum(row.change == "fixed" for row in rows)
    failed_before = sum(not row.before_pass for row in rows)
    p = mcnemar_one_sided_p(b, c)
    regressions = tuple(row.case_id for row in rows if row.regression)
    ratio = latency_ratio(before, after)

    failures: list[Failure] = []
    rule: Rule
    if failed_before == 0:
        rule = "nothing_to_fix"
        failures.append("nothing_to_fix")
        fix_text = "no case failed before the change, so there is nothing it can be shown to fix"
    elif mcnemar_has_power(b + c, alpha):
        rule = "mcnemar"
        verb = "shows" if p <= alpha else "does not show"
        fix_text = (
            f"the exact one-sided McNemar test {verb} improvement "
            f"(b={b} pass->fail, c={c} fail->pass, p={p:.4g}, alpha={alpha})"
        )
        if p > alpha:
            failures.append("no_improvement")
    else:
        rule = "all_failures_fixed"
        fixed_all = c == failed_before and b == 0
        fix_text = (
            f"with {b + c} discordant case(s) the McNemar test cannot reach alpha={alpha}, so "
            f"every failing case must pass and none may break: {c} of {failed_before} "
            f"failing case(s) fixed, {b} passing case(s) broken"
        )
        if not fixed_all:
            failures.append("no_improvement")
    if regressions:
        failures.append("regression")
    if ratio is not None and ratio > max_latency_ratio:
        failures.append("latency")

    accepted = not failures
    parts = [
        f"{'Accepted' if accepted else 'Rejected'}: score {before.score:.2f} -> {after.score:.2f}",
        fix_text,
        f"regressions: {', '.join(regressions)}" if regressions else "no regressions",
        f"latency {_fmt_ratio(ratio)} of baseline (limit {max_latency_ratio:g}x)",
    ]
    if after.errors or before.errors:
        parts.append(f"errored runs {before.errors} before, {after.errors} after")
    verdict = VerificationVerdict(
        accepted=accepted,
        reason="; ".join(parts) + ".",
        rule=rule,
        failures=tuple(failures),
        before_score=before.score,
        after_score=after.score,
        b=b,
        c=c,
        mcnemar_p=p,
        alpha=alpha,
        regressions=regressions,
        latency_ratio=ratio,
        max_latency_ratio=max_latency_ratio,
        cases=tuple(rows),
    )
    log.info(
        "compared_verification_runs",
        agent=before.agent_name,
        accepted=accepted,
        rule=rule,
        failures=list(failures),
        b=b,
        c=c,
        p=p,
    )
    return verdict


def latency_ratio(before: SuiteRun, after: SuiteRun) -> float | None:
    old, new = before.latency_median_ms(), after.latency_median_ms()
    if old is None or new is None or old <= 0:
        return None
    return new / old


# --- the fallback without a suite ---------------------------------------------------------


class SampleRun(_Frozen):
    """One run of the sample query (one side of the weaker check)."""

    agent_name: str
    query: str
    passed: bool
    detail: str
    duration_ms: float
    error: str | None = None
    counts_for_latency: bool = False

    @property
    def score(self) -> float:
        return 1.0 if self.passed else 0.0


async def run_sample_query(
    runtime: AgentRuntime,
    spec: AgentSpec,
    *,
    query: str = SAMPLE_QUERY,
    on_result: OnResult | None = None,
) -> SampleRun:
    """Run ``query`` once on ``spec`` and judge the answer (the single-query check).

    It passes when the run finished without error and untruncated (a cut-off answer is the
    commonest fault a change fixes) and the answer has at least ``SAMPLE_MIN_CHARS``
    characters. Only a run that finished without error and untruncated says anything about
    speed (``counts_for_latency``), as in ``run_suite``.
    """
    result = await _run_once(runtime, spec, query, ())
    text = result.text
    if not text and result.output is not None:
        text = result.output.model_dump_json()
    problems: list[str] = []
    if result.error is not None:
        problems.append(f"the run failed ({result.error})")
    elif result.truncated:
        problems.append("the answer was truncated")
    if len(text) < SAMPLE_MIN_CHARS:
        problems.append(f"the answer has {len(text)} characters (< {SAMPLE_MIN_CHARS})")
    passed = not problems
    detail = "; ".join(problems) or "the sample query was answered in full"
    if on_result is not None:
        outcome = CheckOutcome(passed, detail)
        recorded = on_result(CaseRun(spec.name, "sample-query", 0, query, result, outcome))
        if inspect.isawaitable(recorded):
            await recorded
    return SampleRun(
        agent_name=spec.name,
        query=query,
        passed=passed,
        detail=detail,
        duration_ms=result.duration_ms,
        error=str(result.error) if result.error is not None else None,
        counts_for_latency=result.success and not result.truncated,
    )


def judge_sample_query(
    before: SampleRun, after: SampleRun, *, max_latency_ratio: float = 2.0
) -> VerificationVerdict:
    """The weaker verdict: the sample query failed on the old definition and passes on the new.

    Accepted only when (a) the query failed before the change (else nothing shows the change
    fixed anything: failure ``nothing_to_fix``), (b) it passes after, and (c) when the run before
    finished without error and untruncated, the run after took at most ``max_latency_ratio``
    times as long. A run before that timed out, errored or was cut off is no baseline for
    speed: a fix for exactly those faults must not be judged against it, so latency is then
    not judged (the reason says so). One query is thin evidence, hence ``weaker``.

    Raises:
        InvalidArgument: ``max_latency_ratio`` not positive.
    """
    if max_latency_ratio <= 0:
        raise InvalidArgument("max_latency_ratio", max_latency_ratio, "must be positive")
    failures: list[Failure] = []
    problems: list[str] = []
    if before.passed:
        failures.append("nothing_to_fix")
        problems.append(
            "the sample query already passed before the change, so nothing shows it fixed anything"
        )
    if not after.passed:
        failures.append("sample_query")
        problems.append(f"after the change {after.detail}")
    ratio = None
    if before.counts_for_latency and after.counts_for_latency and before.duration_ms > 0:
        ratio = after.duration_ms / before.duration_ms
        if ratio > max_latency_ratio:
            failures.append("latency")
            problems.append(
                f"it took {ratio:.2f}x as long as before the change (> {max_latency_ratio:g}x)"
            )
    latency = (
        f"latency {ratio:.2f}x of the run before the change"
        if ratio is not None
        else "latency not judged (no complete run before the change to compare with)"
    )
    accepted = not failures
    summary = (
        "; ".join(problems)
        if problems
        else f"the sample query failed before the change ({before.detail}) and passes after it"
    )
    reason = (
        f"{'Accepted' if accepted else 'Rejected'} (weaker check, no eval suite): {summary}; "
        f"{latency}."
    )
    log.info("checked_sample_query", agent=after.agent_name, accepted=accepted)
    return VerificationVerdict(
        accepted=accepted,
        reason=reason,
        rule="sample_query",
        failures=tuple(failures),
        before_score=before.score,
        after_score=after.score,
        b=int(before.passed and not after.passed),
        c=int(not before.passed and after.passed),
        latency_ratio=ratio,
        max_latency_ratio=max_latency_ratio,
        weaker=True,
    )


async def sample_query_check(
    runtime: AgentRuntime,
    spec: AgentSpec,
    *,
    before: SampleRun,
    max_latency_ratio: float = 2.0,
    on_result: OnResult | None = None,
) -> VerificationVerdict:
    """The single-query check for an agent without a suite, made a before/after comparison.

    ``before`` is ``run_sample_query`` on the definition before the change; this runs the same
    query on ``spec`` (the definition after it) and judges the pair (``judge_sample_query``).
    The verdict is marked ``weaker``: one query is not an eval suite.
    """
    after = await run_sample_query(runtime, spec, query=before.query, on_result=on_result)
    return judge_sample_query(before, after, max_latency_ratio=max_latency_ratio)
