"""How a cycle proves its change: the agent's eval suite before and after, or the weaker check.

``CycleVerifier`` holds what the orchestrator needs between "the actions are planned" and
"keep or roll back": it loads each target agent's suite before anything changes (so a change can
never pick its own exam), runs it before the change, and after the change runs the same cases
again and compares (``infrastructure.evaluation.verification.compare``); an agent without a suite
gets
seed 003's sample-query check, marked weaker. Every run is recorded in the monitor apart from
production runs (``source="verification"``), so proving a fix never feeds detection.

Runs that fail transiently (rate limit, overload, server error, connection) are run again
(``RetryTransient``): the weather of the API is not what a change is judged on, and counting it
would roll back good fixes at random. Configuration faults are never retried: they are what is
measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

from agents.team import AgentTeam
from infrastructure.evaluation.evals import EvalSuite, find_eval_suite
from infrastructure.evaluation.verification import (
    CaseRun,
    SuiteRun,
    VerificationVerdict,
    compare,
    run_suite,
    sample_query_check,
)
from infrastructure.llm.base import AgentResult, AgentRuntime, OutputT, ToolSpec
from infrastructure.monitoring.performance_monitor import VERIFICATION
from infrastructure.spec import AgentSpec

__all__ = ["CycleVerifier", "RetryTransient", "passes_everything"]


class RetryTransient:
    """A runtime that runs a transiently failed run again (``attempts`` runs in all)."""

    def __init__(self, runtime: AgentRuntime, attempts: int = 3) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self.runtime = runtime
        self.attempts = attempts

    @overload
    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: None = None,
    ) -> AgentResult[Any]: ...

    @overload
    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT],
    ) -> AgentResult[OutputT]: ...

    async def run(
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


def passes_everything(run: SuiteRun) -> bool:
    """Whether every case of a suite run passes by majority (a change has nothing to fix)."""
    return all(case.majority_pass for case in run.cases)


class CycleVerifier:
    """Suites loaded before the change, run before and after it, judged.

    Args:
        team: the team whose runtime runs the cases and whose monitor records them.
        attempts: runs per case run when the runtime fails transiently.
    """

    def __init__(self, team: AgentTeam, *, attempts: int = 3) -> None:
        self.team = team
        self.runtime = RetryTransient(team.runtime, attempts)

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

    async def reproduce(self, name: str) -> list[str]:
        """Run agent ``name`` as it is now on its eval suite (else the sample query), once.

        Used when someone asks for a diagnosis the detector has not called for: the runs are
        recorded apart (they never feed detection), and they are part of the agent's own record,
        so the mediator's questions get answers about fresh evidence. Returns the failures seen.
        """
        spec = self.team.spec(name)
        suite = find_eval_suite(spec)
        failures: list[str] = []

        def collect(run: CaseRun) -> None:
            self._record(run)
            error = run.result.error
            if error is not None:
                failures.append(f"{error.kind.value}: {error.message}")
            elif not run.outcome.passed:
                failures.append(f"{run.case_id}: {run.outcome.detail}")

        if suite is not None:
            await run_suite(self.runtime, spec, suite, on_result=collect)
        else:
            await sample_query_check(self.runtime, spec, on_result=collect)
        return failures

    async def run_before(
        self,
        targets: Mapping[str, AgentSpec | None],
        suites: Mapping[str, EvalSuite | None],
    ) -> dict[str, SuiteRun]:
        """Each target's suite on its definition before the change (agents with a suite)."""
        before: dict[str, SuiteRun] = {}
        for name, old_spec in targets.items():
            suite = suites.get(name)
            if old_spec is not None and suite is not None:
                before[name] = await run_suite(
                    self.runtime, old_spec, suite, on_result=self._record
                )
        return before

    async def verify(
        self,
        name: str,
        spec: AgentSpec | None,
        suite: EvalSuite | None,
        before: SuiteRun | None,
    ) -> VerificationVerdict:
        """The verdict on agent ``name`` as it is after the change (``spec``; None: deleted)."""
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
        if suite is not None and before is not None:
            after = await run_suite(self.runtime, spec, suite, on_result=self._record)
            return compare(before, after)
        monitor = self.team.monitor
        metrics = monitor.get_agent_metrics(name) if monitor is not None else None
        return await sample_query_check(
            self.runtime,
            spec,
            baseline_avg_ms=metrics.baseline_avg_duration_ms if metrics else None,
            on_result=self._record,
        )
