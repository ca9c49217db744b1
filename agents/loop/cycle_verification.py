"""How a cycle proves its change: the agent's eval suite before and after, or the weaker check.

``CycleVerifier`` holds what the orchestrator needs between "the actions are planned" and
"keep or roll back": it loads each target agent's suite before anything changes (so a change can
never pick its own exam), runs it before the change, and after the change runs the same cases
again and compares. By default (``design="sequential"``, the ``verification_design`` setting)
the suite runs before the change only until the issue is shown to reproduce
(``sequential_verification.run_reproduction``), and after it as before/after pairs that stop
as soon as an always-valid test decides (``verify_sequentially``; a suite too small for any
valid test is judged by the fixed design's rule on all its runs); ``design="fixed"`` runs every
case every repeat on both sides and judges
(``agentmend.infrastructure.evaluation.verification.compare``).

An agent without a suite normally has its change watched on its live runs instead (see
``agentmend.loop.change_pipeline``: nothing here runs for it). Where there is too little traffic to
watch, or the change creates the agent, it gets the weaker check, built the same way: one
sample query runs on the definition *before* the change (``run_before``) and again after it,
and the change is kept only if the query failed before and passes after
(``agentmend.infrastructure.evaluation.verification.judge_sample_query``). A sample query that
passes before the change does not reproduce the issue, so the orchestrator applies nothing, exactly
as when a suite passes before the change. Latency is compared with the run before the change, and
only when that run finished: a timeout or a retired model is no baseline for speed. The
detector's own baseline is never used here: the fault being fixed is what moved it. (An agent
created by the change has no "before": it counts as a failed one, so the new agent must answer.)
A keep that only the weaker check supports starts no new detection baseline
(``fresh_baselines`` says why), and a rollback restores only the baselines a keep started
(``baseline_agents``).

Every run is recorded in the monitor apart from production runs (``source="verification"``),
so proving a fix never feeds detection.

Each eval run, as it finishes, is counted against the runs its phase will make
(``CycleVerifier.on_eval_run``, an ``EvalProgress``), so a face can show "7 of 12" while a
suite runs: a suite is cases times repeats, the sample query one run; a sequential phase counts
against the most it could make, and may end early.

Runs that fail transiently (rate limit, overload, server error, connection) are run again
(``RetryTransient``): the weather of the API is not what a change is judged on, and counting it
would roll back good fixes at random. Configuration faults are never retried: they are what is
measured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.errors import InvalidArgument
from agentmend.infrastructure.evaluation.evals import EvalSuite, find_eval_suite
from agentmend.infrastructure.evaluation.sequential_verification import (
    run_reproduction,
    verify_sequentially,
)
from agentmend.infrastructure.evaluation.verification import (
    SAMPLE_QUERY,
    CaseRun,
    SampleRun,
    SuiteRun,
    VerificationVerdict,
    compare,
    run_sample_query,
    run_suite,
    sample_query_check,
)
from agentmend.infrastructure.llm.base import (
    AgentResult,
    AgentRuntime,
    OutputT,
    RuntimeBase,
    ToolSpec,
)
from agentmend.infrastructure.models import ChangeRecord, ChangeStatus
from agentmend.infrastructure.monitoring.performance_monitor import VERIFICATION
from agentmend.roles.team import AgentTeam

__all__ = [
    "NEW_BASELINE",
    "BeforeRun",
    "CycleVerifier",
    "EvalProgress",
    "OnEvalRun",
    "RetryTransient",
    "baseline_agents",
    "fresh_baselines",
    "not_reproduced_reason",
    "passes_everything",
]

NEW_BASELINE = "new_baseline"
"""Key of a kept change's verification result: the agents whose detection baseline it restarted."""

BeforeRun = SuiteRun | SampleRun
"""What ran on a target's definition before the change: its suite, or the sample query."""


class RetryTransient(RuntimeBase):
    """A runtime that runs a transiently failed run again (``attempts`` runs in all)."""

    def __init__(self, runtime: AgentRuntime, attempts: int = 3) -> None:
        if attempts < 1:
            raise InvalidArgument("attempts", attempts, "must be at least 1")
        self.runtime = runtime
        self.attempts = attempts

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[Any]:
        runtime: Any = self.runtime  # one call site for both overloads
        result: AgentResult[Any] = await runtime.run(
            spec, prompt, tools=tools, output_type=output_type
        )
        for _ in range(self.attempts - 1):
            if result.error is None or not result.error.kind.transient:
                break
            result = await runtime.run(spec, prompt, tools=tools, output_type=output_type)
        return result


@dataclass(frozen=True, slots=True)
class EvalProgress:
    """The eval runs of one phase of a verification, as one of them finishes.

    ``phase`` is ``reproduce`` (the agent as it is, to gather evidence), ``before`` (the
    targets' definitions before the change) or ``after`` (one target after it); ``agents``
    are the agents the phase runs. ``total`` counts every run the phase makes (a retried
    transient failure is still one run).
    """

    phase: Literal["reproduce", "before", "after"]
    agents: tuple[str, ...]
    done: int
    total: int


OnEvalRun = Callable[[EvalProgress], object]
"""Called with an ``EvalProgress`` after each eval run, before the next one is counted."""


def _runs_of(suite: EvalSuite | None) -> int:
    """How many runs a suite makes (every case, every repeat); the sample query makes one."""
    return len(suite.cases) * suite.repeats if suite is not None else 1


def passes_everything(run: BeforeRun) -> bool:
    """Whether a run before the change passes everything (a change has nothing to fix): every
    case of a suite by majority, or the sample query."""
    if isinstance(run, SampleRun):
        return run.passed
    return all(case.majority_pass for case in run.cases)


class CycleVerifier:
    """Suites loaded before the change, run before and after it, judged.

    Args:
        team: the team whose runtime runs the cases and whose monitor records them.
        attempts: runs per case run when the runtime fails transiently.
    """

    def __init__(
        self,
        team: AgentTeam,
        *,
        attempts: int = 3,
        design: Literal["sequential", "fixed"] = "sequential",
    ) -> None:
        self.team = team
        self.runtime = RetryTransient(team.runtime, attempts)
        self.design = design
        """``sequential``: pairs until the test decides (``sequential_verification``)."""
        self._old_specs: dict[str, AgentSpec] = {}
        self.on_eval_run: OnEvalRun | None = None
        """Told of each eval run as it finishes (a face's progress display); None: nobody."""

    def load_suites(self, names: Sequence[str]) -> dict[str, EvalSuite | None]:
        """The suites of the agents ``names`` (None: no suite), read now, before any change.

        Raises:
            SpecError: a suite exists but is malformed (never silently skipped).
        """
        specs = self.team.specs
        suites: dict[str, EvalSuite | None] = {}
        for name in names:
            spec = specs.get(name)
            if spec is not None and name not in suites:
                suites[name] = find_eval_suite(spec)
        return suites

    def _record(self, run: CaseRun) -> None:
        self.team.record(run.result, source=VERIFICATION)

    def _counting(
        self, phase: Literal["reproduce", "before", "after"], agents: Sequence[str], total: int
    ) -> Callable[[CaseRun], None]:
        """A recorder of the phase's runs that also reports each as done of ``total``."""
        done = 0
        names = tuple(agents)

        def record(run: CaseRun) -> None:
            nonlocal done
            self._record(run)
            done += 1
            if self.on_eval_run is not None:
                self.on_eval_run(EvalProgress(phase, names, done, total))

        return record

    async def reproduce(self, name: str) -> list[str]:
        """Run agent ``name`` as it is now on its eval suite (else the sample query), once.

        Used when someone asks for a diagnosis the detector has not called for: the runs are
        recorded apart (they never feed detection), and they are part of the agent's own record,
        so the mediator's questions get answers about fresh evidence. Returns the failures seen.
        """
        spec = self.team.spec(name)
        suite = find_eval_suite(spec)
        failures: list[str] = []
        record = self._counting("reproduce", [name], _runs_of(suite))

        def collect(run: CaseRun) -> None:
            record(run)
            error = run.result.error
            if error is not None:
                failures.append(f"{error.kind.value}: {error.message}")
            elif not run.outcome.passed:
                failures.append(f"{run.case_id}: {run.outcome.detail}")

        if suite is not None:
            await run_suite(self.runtime, spec, suite, on_result=collect)
        else:
            await run_sample_query(self.runtime, spec, on_result=collect)
        return failures

    async def run_before(
        self,
        targets: Mapping[str, AgentSpec | None],
        suites: Mapping[str, EvalSuite | None],
    ) -> dict[str, BeforeRun]:
        """Each target's suite (else the sample query) on its definition before the change.

        A target with no definition before the change (one the change creates) has no run.
        """
        before: dict[str, BeforeRun] = {}
        existing = [name for name, old_spec in targets.items() if old_spec is not None]
        record = self._counting(
            "before", existing, sum(_runs_of(suites.get(name)) for name in existing)
        )
        for name, old_spec in targets.items():
            if old_spec is None:
                continue
            suite = suites.get(name)
            self._old_specs[name] = old_spec
            if suite is not None and self.design == "sequential":
                before[name] = await run_reproduction(
                    self.runtime, old_spec, suite, on_result=record
                )
            elif suite is not None:
                before[name] = await run_suite(self.runtime, old_spec, suite, on_result=record)
            else:
                before[name] = await run_sample_query(self.runtime, old_spec, on_result=record)
        return before

    async def verify(
        self,
        name: str,
        spec: AgentSpec | None,
        suite: EvalSuite | None,
        before: BeforeRun | None,
    ) -> VerificationVerdict:
        """The verdict on agent ``name`` as it is after the change (``spec``; None: deleted).

        ``before`` is what ``run_before`` ran on the old definition: a suite run is compared
        case by case, a sample run by the weaker check; None (the change created the agent)
        counts as a sample query that failed.
        """
        if spec is None:
            return VerificationVerdict(
                accepted=False,
                reason=f"Rejected: agent {name!r} no longer exists, so nothing can show the "
                "change helped.",
                rule="sample_query",
                failures=("sample_query",),
                after_score=0.0,
                weaker=True,
            )
        if suite is not None and isinstance(before, SuiteRun):
            old_spec = self._old_specs.get(name)
            if self.design == "sequential" and old_spec is not None:
                # at most the runs the fixed design makes on both sides, less those made
                made = sum(len(case.runs) for case in before.cases)
                record = self._counting("after", [name], 2 * _runs_of(suite) - made)
                verdict, _ = await verify_sequentially(
                    self.runtime, old_spec, spec, suite, before=before, on_result=record
                )
                return verdict
            record = self._counting("after", [name], _runs_of(suite))
            after = await run_suite(self.runtime, spec, suite, on_result=record)
            return compare(before, after)
        if not isinstance(before, SampleRun):
            before = SampleRun(
                agent_name=name,
                query=SAMPLE_QUERY,
                passed=False,
                detail=f"agent {name!r} did not exist before the change",
                duration_ms=0.0,
            )
        record = self._counting("after", [name], 1)
        return await sample_query_check(self.runtime, spec, before=before, on_result=record)


def not_reproduced_reason(before: Mapping[str, BeforeRun]) -> str:
    """Why nothing was applied when every run before the change passed."""
    checks = ", ".join(
        f"the {'eval suite' if isinstance(run, SuiteRun) else 'sample query (no eval suite)'} "
        f"of {name}"
        for name, run in sorted(before.items())
    )
    return (
        f"{checks} passes before any change: the issue does not reproduce, so nothing was applied"
    )


def fresh_baselines(verdicts: Mapping[str, VerificationVerdict], team: AgentTeam) -> list[str]:
    """The agents whose detection baseline restarts when the change is kept.

    A new baseline is learnt from the agent's next runs, and detection waits until it is full.
    That is right after a suite showed the fix: the agent's behaviour has changed for good and
    should be the new normal. After the weaker check it is not: one sample query that failed
    before and passed after can miss a fault that persists, and a new baseline would then
    learn the faulty behaviour as normal and silence the detector for good. So an agent kept on
    the weaker check keeps its baseline from before the fault; if the fix works nothing fires,
    and if it does not, detection still sees it. The cost: a fix that legitimately changes the
    agent's speed (a slower model, a longer timeout) may raise duration issues against the old
    baseline; their cycles find the sample query passing and apply nothing, and an eval suite
    for the agent ends this.
    """
    return [name for name, verdict in verdicts.items() if not verdict.weaker and name in team]


def baseline_agents(members: Sequence[ChangeRecord]) -> list[str]:
    """The agents whose baseline a kept group started (so a rollback restores those)."""
    names: list[str] = []
    for member in members:
        if member.status is not ChangeStatus.KEPT:
            continue
        result: Mapping[str, Any] = member.verification_result or {}
        started = result.get(NEW_BASELINE)
        # records kept before NEW_BASELINE was recorded started one for each target
        chosen = started if isinstance(started, list | tuple) else [member.action.target_agent]
        for name in map(str, chosen):
            if name not in names:
                names.append(name)
    return names
