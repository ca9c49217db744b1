"""``MetaOrchestrator``: runs the team, watches it, and runs the improvement cycle when it degrades.

``execute_task`` runs every agent on a query (bounded concurrency, every run recorded), asks the
detector whether anything degraded, and for each issue runs the cycle (``auto_improve``) or asks
``confirm_cycle`` first (the interactive session's y/n). ``run_improvement_cycle`` is the loop::

    analysis (mediator questions the agents)        unusable: done ("analysis_failed")
      -> proposal (improver)                         none: done ("no_action")
      -> plan: the exact bytes of each action         invalid: done ("invalid_proposal")
      -> eval suites loaded and run BEFORE the change (without a suite: the sample query),
         recorded apart from production runs; everything already passing: done
         ("not_reproduced", nothing could be shown to help)
      -> gates per action, every verdict recorded     all refused: done ("refused")
      -> apply the accepted changes as one group
      -> reload, the same run AFTER, compare (without a suite: the weaker check, see
         ``agents.cycle_verification``)
      -> keep (a new detection baseline, unless only the weaker check spoke for the change:
         see ``agents.cycle_verification.fresh_baselines``)
         or  roll back the whole group (why, with the scores)

``apply_self_edit`` takes one action an agent asked for (seed 002's self-edit tools, bound by
``self_edit_tools``) through the same path from the plan on, recorded the same way.

Verification runs that fail transiently (rate limit, overload) are run again: the weather of
the API is not what a change is judged on.
Any exception after the apply rolls the group back before it propagates, so a crash in
verification never leaves an unproven change in place.

Every step is a ``CycleEvent``: logged with structlog under the step's name, written to the
store's ``decisions`` table (kind ``cycle.<step>``, the cycle id in the payload), and passed to
``on_progress``. The ``CycleResult`` is the fold of those events (``agents.cycle.fold_events``),
so ``replay_cycle(store, cycle_id)`` rebuilds it from the store alone.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import structlog

from agents.ask_agent_tool import AskAgentTool
from agents.cycle import (
    CycleRecorder,
    CycleResult,
    CycleStatus,
    OnProgress,
    QuestionAnswer,
    TaskResult,
    fold_events,
    replay_cycle,
)
from agents.cycle_verification import (
    NEW_BASELINE,
    BeforeRun,
    CycleVerifier,
    baseline_agents,
    fresh_baselines,
    not_reproduced_reason,
    passes_everything,
)
from agents.self_edit_tools import Authorize, self_edit_tools, verified_apply
from agents.self_improver import GatedAction, InvalidProposal, SelfImprover
from agents.socratic_mediator import SocraticMediator, is_failed
from agents.supervisor import Supervisor
from agents.team import AgentTeam
from infrastructure.changes.change_log import record_decision
from infrastructure.changes.gates import default_gates
from infrastructure.changes.improvement_manager import ImprovementManager
from infrastructure.changes.safety import (
    ApprovalCallback,
    ChangeReviewer,
    Gate,
    GateVerdict,
    Principal,
    ProposedChange,
)
from infrastructure.errors import AgentmendError, ChangeNotFound
from infrastructure.evaluation.evals import EvalSuite
from infrastructure.evaluation.verification import VerificationVerdict
from infrastructure.llm.base import AgentRuntime, ToolSpec
from infrastructure.models import (
    ChangeRecord,
    ChangeStatus,
    ImprovementAction,
    IssueReport,
    RootCauseAnalysis,
)
from infrastructure.monitoring.detection import IssueDetector
from infrastructure.monitoring.performance_monitor import PerformanceMonitor
from infrastructure.settings import Settings
from infrastructure.simulation import SimulatedRuntime
from infrastructure.spec import AgentSpec
from infrastructure.store import Store

__all__ = ["SELF_EDIT", "ConfirmCycle", "MetaOrchestrator", "OnProgress"]

log = structlog.get_logger(__name__)

SELF_EDIT = "self_edit"
"""The ``error_type`` (and ``detector``) of the issue a self-edit is recorded under."""


_CHANGING: ContextVar[bool] = ContextVar("agentmend_changing", default=False)
"""Set while this task makes a change (plan to keep or roll back): nested changes are refused."""

ConfirmCycle = Callable[[IssueReport], Awaitable[bool]]
"""Asks whether to run a cycle for an issue (the interactive y/n); True runs it."""


class MetaOrchestrator:
    """Executes tasks on a team, detects degradation and runs improvement cycles.

    Args:
        team: the agents (definitions + runtime); its monitor is created on ``store`` if it
            has none.
        roles_runtime: what runs the mediator, improver and supervisor (the offline playbooks,
            a model API, or a fake).
        store: the database everything is recorded in; default ``<workspace>/agentmend.db``.
        workspace: where the default store lives; default ``settings.workspace``.
        settings: thresholds, budget, approval timeout, yolo mode.
        manager: the change history to apply through; default one on ``store`` (a workspace
            passes its own, so one process keeps one session budget).
        approval_callback: the human approval gate's question (None: refused unless yolo).
        principal: who the cycle runs for; default ``settings.default_principal`` (standard
            rights unless ``AGENTMEND_PRINCIPAL_ADMIN`` is set).
        auto_improve: run a cycle for each detected issue without asking.
        confirm_cycle: otherwise, ask this whether to run one (no answer within
            ``settings.auto_decision_timeout`` is no).
        on_progress: called with every ``CycleEvent`` as it happens.
        detector: default one built from ``settings`` (mode, false-alarm rate, baseline).
        gates: default ``infrastructure.changes.gates.default_gates``.
        reviewer: the supervisor gate's reviewer; default a ``Supervisor`` on ``roles_runtime``.
        available_models: the models a model change may choose; default the team runtime's
            ``available_models`` when it has them, else the simulated team's list.
        max_questions: the mediator's question budget per analysis.
        concurrency: agents run at once by ``execute_task``.
        task_timeout_s: a wall-clock limit per agent run in ``execute_task``.
    """

    def __init__(
        self,
        team: AgentTeam,
        *,
        roles_runtime: AgentRuntime,
        store: Store | None = None,
        workspace: str | Path | None = None,
        settings: Settings | None = None,
        manager: ImprovementManager | None = None,
        approval_callback: ApprovalCallback | None = None,
        principal: Principal | None = None,
        auto_improve: bool = False,
        confirm_cycle: ConfirmCycle | None = None,
        on_progress: OnProgress | None = None,
        detector: IssueDetector | None = None,
        gates: Sequence[Gate] | None = None,
        reviewer: ChangeReviewer | None = None,
        available_models: Collection[str] | None = None,
        max_questions: int = 10,
        concurrency: int = 4,
        task_timeout_s: float | None = None,
    ) -> None:
        self.settings = settings if settings is not None else Settings()
        self._owned: list[Callable[[], None]] = []
        if store is None:
            base = Path(workspace) if workspace is not None else self.settings.workspace
            store = Store(base / "agentmend.db")
            self._owned.append(store.close)
        self.store = store
        self.team = team
        if team.monitor is None:
            team.monitor = PerformanceMonitor(store, baseline_n=self.settings.baseline_n)
            self._owned.insert(0, team.monitor.close)
        self.monitor: PerformanceMonitor = team.monitor
        self.detector = detector or IssueDetector(
            self.settings.detection_mode,
            false_alarm_rate=self.settings.false_alarm_rate,
            baseline_n=min(self.settings.baseline_n, self.monitor.baseline_n),
            monitor=self.monitor,
        )
        if manager is None:
            key = self.settings.audit_hmac_key
            manager = ImprovementManager(
                store=store,
                max_improvements_per_session=self.settings.max_improvements_per_session,
                audit_hmac_key=key.get_secret_value() if key is not None else None,
            )
        self.manager = manager
        self.roles_runtime = roles_runtime
        self.principal = principal or self.settings.default_principal
        self.auto_improve = auto_improve
        self.confirm_cycle = confirm_cycle
        self.on_progress = on_progress
        self.concurrency = concurrency
        self.task_timeout_s = task_timeout_s
        self.available_models = tuple(available_models or _default_models(team.runtime))
        self.reviewer: ChangeReviewer = reviewer or Supervisor(roles_runtime)
        if gates is None:
            gates = default_gates(
                manager=self.manager,
                principal=self.principal,
                reviewer=self.reviewer,
                approval_callback=approval_callback,
                settings=self.settings,
            )
        self.gates = list(gates)
        self.mediator = SocraticMediator(
            roles_runtime,
            AskAgentTool(team.ask_agent_registry()),
            max_questions=max_questions,
        )
        self.improver = SelfImprover(
            roles_runtime,
            self.manager,
            root=team.directory,
            gates=self.gates,
            principal=self.principal,
            available_models=self.available_models,
            # the cycle reloads the team when the files change; the effector still checks
            # every definition against the disk, so a stale view is refused, never written
            specs_provider=lambda: self.team.specs,
        )
        self._pending: dict[str, IssueReport] = {}
        self.verifier = CycleVerifier(team)
        self._change_lock = asyncio.Lock()

    # -- construction for the offline demo and tests -----------------------------------------

    @classmethod
    def offline_simulated(
        cls,
        directory: str | Path,
        *,
        seed: int = 0,
        settings: Settings | None = None,
        store: Store | None = None,
        yolo_mode: bool | None = True,
        approval_callback: ApprovalCallback | None = None,
        auto_improve: bool = True,
        runtime: SimulatedRuntime | None = None,
        roles_runtime: AgentRuntime | None = None,
        **options: Any,
    ) -> MetaOrchestrator:
        """The simulated six-agent team (copied into ``directory`` if it holds no definitions)
        on a ``SimulatedRuntime(seed)`` (or ``runtime``), with the offline playbooks as
        mediator, improver and supervisor (or ``roles_runtime``). ``yolo_mode`` (default on)
        skips the human gate, as a demo needs; pass ``yolo_mode=False`` with an
        ``approval_callback`` to be asked. The store defaults to
        ``<directory>/.agent/agentmend.db``; other keyword options go to the constructor.
        """
        from agents.playbooks import offline_policies
        from infrastructure.llm.offline import OfflineRuntime
        from infrastructure.simulation import copy_team

        folder = Path(directory)
        if not any(folder.glob("*.md")):
            copy_team(folder)
        settings = settings if settings is not None else Settings()
        if yolo_mode is not None:
            settings = settings.model_copy(update={"yolo_mode": yolo_mode})
        runtime = runtime if runtime is not None else SimulatedRuntime(seed)
        own_store = store is None
        store = store if store is not None else Store(folder / ".agent" / "agentmend.db")
        monitor = PerformanceMonitor(store, baseline_n=settings.baseline_n)
        team = AgentTeam(folder, runtime, monitor=monitor)
        orchestrator = cls(
            team,
            roles_runtime=roles_runtime or OfflineRuntime(offline_policies()),
            store=store,
            settings=settings,
            approval_callback=approval_callback,
            auto_improve=auto_improve,
            **options,
        )
        orchestrator._owned.insert(0, monitor.close)
        if own_store:
            orchestrator._owned.append(store.close)
        return orchestrator

    def close(self) -> None:
        """Close what this orchestrator opened (monitor, store); idempotent."""
        owned, self._owned = self._owned, []
        for closer in owned:
            closer()

    def __enter__(self) -> MetaOrchestrator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> MetaOrchestrator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    # -- tasks and detection -----------------------------------------------------------------

    async def execute_task(self, query: str) -> TaskResult:
        """Run every agent on ``query``, check for issues, and run or offer cycles."""
        results = await self.team.run_all(
            query, concurrency=self.concurrency, timeout_s=self.task_timeout_s
        )
        issues = self.check_all_issues()
        task = TaskResult(query=query, results=results, issues=issues)
        for issue in issues:
            if issue.agent_name not in self._pending:
                continue  # a cycle for an earlier issue of this task dealt with it
            if not await self._wants_cycle(issue):
                if self.confirm_cycle is not None:
                    task.declined.append(issue)
                    self._pending.pop(issue.agent_name, None)
                    record_decision(
                        self.store,
                        "issue_declined",
                        agent_name=issue.agent_name,
                        payload={"issue": issue.model_dump(mode="json")},
                    )
                continue
            task.cycles.append(await self.run_improvement_cycle(issue))
        return task

    async def _wants_cycle(self, issue: IssueReport) -> bool:
        if self.auto_improve:
            return True
        if self.confirm_cycle is None:
            return False
        try:
            async with asyncio.timeout(self.settings.auto_decision_timeout):
                return (await self.confirm_cycle(issue)) is True
        except TimeoutError:
            log.info("cycle_not_confirmed", agent=issue.agent_name, reason="no answer in time")
            return False

    def check_all_issues(self) -> list[IssueReport]:
        """Every open issue, most severe first (new detections merged with unhandled ones)."""
        for issue in self.detector.check(self.monitor):
            known = self._pending.get(issue.agent_name)
            if known is None or issue.severity >= known.severity:
                self._pending[issue.agent_name] = issue
        return sorted(self._pending.values(), key=lambda i: i.severity, reverse=True)

    def check_performance_issues(self) -> IssueReport | None:
        """The most urgent open issue, or None (seed 003's API)."""
        issues = self.check_all_issues()
        return issues[0] if issues else None

    async def issue_for(
        self, agent_name: str, *, requested_by: str = "a user", reproduce: bool = True
    ) -> IssueReport:
        """The open issue of ``agent_name``, or one built on request when none is open.

        Lets a person (``/improve AGENT``) or a client (MCP ``analyze``) ask for a diagnosis
        before the detector has fired. With ``reproduce``, the agent first runs its eval suite
        (else the sample query) once as it is now (recorded apart from detection), so the
        diagnosis rests on fresh evidence rather than on however few runs happen to be
        recorded; the failures seen go into the report's error logs. Those are real runs of
        the agent (model calls, its tools): MCP ``analyze`` makes them only when asked. The
        report says it was requested and by whom.

        Raises:
            UnknownAgent: ``agent_name`` is not in the team.
        """
        self.team.spec(agent_name)  # raises UnknownAgent, naming the agents there are
        open_issue = next((i for i in self.check_all_issues() if i.agent_name == agent_name), None)
        if open_issue is not None:
            return open_issue
        failures = await self.verifier.reproduce(agent_name) if reproduce else []
        metrics = self.monitor.get_agent_metrics(agent_name)
        dumped = metrics.model_dump() if metrics is not None else {}
        found = (
            f"; running its eval cases now reproduced {len(failures)} failure(s)"
            if failures
            else ("; its eval cases pass now" if reproduce else "")
        )
        return IssueReport(
            agent_name=agent_name,
            error_type="requested_analysis",
            metrics=dumped,
            error_logs=[*dumped.get("recent_errors", ()), *failures[:10]],
            context=f"analysis requested by {requested_by}; the detector has no open issue "
            f"for this agent{found}",
            available_agents=self.team.names,
            detector="request",
            severity=0.0,
        )

    def rollback(
        self,
        change_id: str | None = None,
        *,
        reason: str = "rolled back on request",
        force: bool = False,
        cascade: bool = False,
    ) -> ChangeRecord | None:
        """Undo a change (default: the most recent applied or kept one) and its whole group.

        Restores the files byte for byte, reloads the team, and gives every agent whose
        detection baseline the kept group restarted (each member's agent) the baseline it had
        before. Returns the rolled-back record, or None when there is nothing to roll back.

        Raises:
            ChangeNotFound: ``change_id`` is unknown.
            RollbackConflict: the files changed since, or later changes build on this one
                (``force`` / ``cascade`` say to go ahead).
        """
        if change_id is None:
            live = [
                r
                for r in self.manager.get_history(limit=200)
                if r.status in (ChangeStatus.APPLIED, ChangeStatus.KEPT)
            ]
            if not live:
                return None
            change_id = live[-1].change_id
        row = self.manager.changes.get(change_id)
        if row is None:
            raise ChangeNotFound(change_id)
        record = row.record
        members = [member.record for member in self.manager.changes.live_group(row)]
        done = self.manager.rollback_by_id(
            change_id,
            reason=reason,
            force=force,
            cascade=cascade,
            user_id=self.principal.user_id,
            user_name=self.principal.name,
        )
        if not done:
            return None
        self.team.reload()
        for name in baseline_agents(members):
            self.detector.on_change_rolled_back(name, self.monitor)
        record_decision(
            self.store,
            "change_rolled_back_on_request",
            agent_name=record.action.target_agent,
            payload={"change_id": change_id, "reason": reason},
        )
        return self.manager.get_change(change_id)

    # -- the cycle ---------------------------------------------------------------------------

    def _role_calls(self) -> int:
        reviewer_calls = getattr(self.reviewer, "model_calls", 0)
        calls = self.mediator.model_calls + self.improver.model_calls
        return calls + (reviewer_calls if isinstance(reviewer_calls, int) else 0)

    async def run_improvement_cycle(self, issue: IssueReport) -> CycleResult:
        """Diagnose, fix, verify, and keep or roll back; see the module docstring.

        Returns a ``CycleResult`` that is truthy when a change was kept. Failures of the
        models are outcomes (``status``), never exceptions; an exception (a bug, an outage of
        the store) is recorded and re-raised, after rolling back anything applied.
        """
        result = await self._recorded(issue, lambda rec: self._cycle(issue, rec), settles=True)
        if result.analysis is not None and result.analysis.responsible_agent is not None:
            self._pending.pop(result.analysis.responsible_agent, None)
        return result

    async def apply_self_edit(self, action: ImprovementAction) -> CycleResult:
        """Make one self-edit (seed 002) through exactly the path a cycle's change takes.

        ``action`` (built by a self-edit tool for the agent that called it) is planned by the
        effector, run on the agent's eval suite (else the sample query) as it is now, judged by
        every gate in order with each verdict recorded (the role gate by this orchestrator's
        principal, the invoking user, never by the agent), applied through the manager,
        verified after the change against that run, and kept (with a new detection baseline,
        unless only the weaker check spoke for it) or rolled back byte for byte. It is recorded
        in the store as a cycle (``replay``), whose issue has ``error_type="self_edit"``.

        Nothing is applied when the plan is invalid (``invalid_proposal``), when the agent
        already passes its cases (``not_reproduced``: a change can be kept only when it is
        shown to fix something), or when a gate refuses (``refused``). Like
        ``run_improvement_cycle``, failures are outcomes and an exception after the apply rolls
        the change back before it propagates.
        """
        agent = action.target_agent
        issue = IssueReport(
            agent_name=agent,
            error_type=SELF_EDIT,
            context=f"self-edit of {action.target_field or action.action_type.value} "
            f"requested by {agent}",
            available_agents=self.team.names,
            detector=SELF_EDIT,
            severity=0.0,
        )

        async def body(rec: CycleRecorder) -> tuple[CycleStatus, str | None]:
            self.team.reload()  # the files are the truth, as in a cycle
            await rec.emit(
                "actions_proposed",
                agent,
                f"1 action: {agent} edits its own {action.target_field or 'definition'}",
                actions=[action.model_dump(mode="json")],
                summary=f"self-edit requested by {agent}",
            )
            return await self._change(rec, [action], agent, applied_by=f"self-edit:{agent}")

        return await self._recorded(issue, body, settles=False)

    def self_edit_tools(
        self, agent_name: str, *, authorize: Authorize | None = None
    ) -> list[ToolSpec]:
        """Seed 002's four self-edit tools for ``agent_name``, bound to ``apply_self_edit``.

        Give them to the agent's runs (``team.run(name, prompt, tools=...)``): each call is
        planned, gated, applied, verified and kept or rolled back as ``apply_self_edit`` says.
        A kept edit answers the model with the change id and the verdict; anything else is a
        tool error naming why (the refusing gate, the failed verification, ...).

        Raises:
            UnknownAgent: ``agent_name`` is not in the team.
        """
        self.team.spec(agent_name)  # raises UnknownAgent, naming the agents there are
        return self_edit_tools(
            agent_name, verified_apply(self.apply_self_edit), authorize=authorize
        )

    async def _recorded(
        self,
        issue: IssueReport,
        body: Callable[[CycleRecorder], Awaitable[tuple[CycleStatus, str | None]]],
        *,
        settles: bool,
    ) -> CycleResult:
        """Run ``body`` as one recorded cycle: started, its steps, finished (even on error)."""
        cycle_id = uuid.uuid4().hex[:12]
        recorder = CycleRecorder(self.store, cycle_id, self.on_progress)
        started = time.perf_counter()
        calls_before = self._role_calls()
        status: CycleStatus = "error"
        error: str | None = None
        failure: BaseException | None = None
        try:
            await recorder.emit(
                "cycle_started",
                issue.agent_name,
                f"{issue.error_type} on {issue.agent_name}: {issue.context}",
                issue=issue.model_dump(mode="json"),
            )
            status, error = await body(recorder)
        except BaseException as exc:
            failure = exc
            status = "rolled_back" if recorder.rolled_back else "error"
            error = f"{type(exc).__name__}: {exc}"
        if settles:
            self._pending.pop(issue.agent_name, None)
        try:
            await recorder.emit(
                "cycle_finished",
                issue.agent_name,
                f"cycle {status}" + (f": {error}" if error else ""),
                status=status,
                error=error,
                model_calls=self._role_calls() - calls_before,
                duration_ms=(time.perf_counter() - started) * 1000,
            )
        except Exception as exc:
            if failure is None:
                raise
            # the first failure is the one worth seeing; this one is only logged
            log.error("cycle_not_recorded", cycle_id=cycle_id, error=str(exc))
        if failure is not None:
            raise failure
        return fold_events(recorder.events)

    async def _cycle(
        self, issue: IssueReport, rec: CycleRecorder
    ) -> tuple[CycleStatus, str | None]:
        analysis = await self._analyse(issue, rec)
        if is_failed(analysis):
            return "analysis_failed", analysis.identified_cause
        try:
            proposal = await self.improver.propose_plan(analysis)
        except InvalidProposal as exc:
            return await _invalid(rec, exc, analysis.agent_name)
        await rec.emit(
            "actions_proposed",
            analysis.agent_name,
            f"{len(proposal.actions)} action(s): {proposal.summary}",
            actions=[action.model_dump(mode="json") for action in proposal.actions],
            summary=proposal.summary,
        )
        if not proposal.actions:
            return "no_action", None
        return await self._change(rec, proposal.actions, analysis.agent_name)

    async def _change(
        self,
        rec: CycleRecorder,
        actions: Sequence[ImprovementAction],
        agent: str,
        *,
        applied_by: str = "self-improver",
    ) -> tuple[CycleStatus, str | None]:
        """Plan, run before, gate, apply, verify, keep or roll back: one change at a time.

        Cycles and self-edits of this orchestrator take turns here, so the budget gate and the
        verification of one never see another's half-made change. A self-edit asked for from
        inside a change being made (an agent's verification run calling its tool) is refused
        rather than waiting for the change that waits for it.
        """
        if _CHANGING.get():
            return "error", (
                "another change is being verified in this task; a change cannot be made from "
                "inside it"
            )
        async with self._change_lock:
            token = _CHANGING.set(True)
            try:
                return await self._change_now(rec, actions, agent, applied_by)
            finally:
                _CHANGING.reset(token)

    async def _change_now(
        self,
        rec: CycleRecorder,
        actions: Sequence[ImprovementAction],
        agent: str,
        applied_by: str,
    ) -> tuple[CycleStatus, str | None]:
        # the exam is fixed before anything can change it
        try:
            suites = self.verifier.load_suites([a.target_agent for a in actions])
        except AgentmendError as exc:
            return "error", f"cannot load an eval suite: {exc}"
        try:
            planned = self.improver.plan_all(actions)
        except InvalidProposal as exc:
            return await _invalid(rec, exc, agent)
        targets = _targets([item.change for item in planned if item.change is not None])
        before = await self.verifier.run_before(targets, suites)
        if before and len(before) == len(targets) and all(map(passes_everything, before.values())):
            # nothing fails on the agent's own cases (or its sample query), so no change could
            # be shown to help: do not write one only to roll it back (and spend the budget)
            return "not_reproduced", not_reproduced_reason(before)
        gated = await self.improver.gate_all(planned, on_verdict=self._verdict_recorder(rec))
        accepted = [item for item in gated if item.accepted]
        if not accepted:
            return "refused", _refusals(gated)
        changes = [item.change for item in accepted if item.change is not None]
        targets = _targets(changes)
        before = {name: run for name, run in before.items() if name in targets}
        try:
            records = self.improver.apply(changes, applied_by=applied_by)
        except AgentmendError as exc:  # the manager wrote nothing (or put it all back)
            return "error", f"could not apply: {exc}"
        change_ids = [record.change_id for record in records]
        try:
            await rec.emit(
                "change_applied",
                agent,
                f"applied {len(records)} change(s) to {', '.join(sorted(targets))}",
                change_ids=change_ids,
                group_id=records[0].group_id,
                paths=[edit.path for change in changes for edit in change.edits],
            )
            verdicts = await self._verify(targets, suites, before, rec)
            rejected = {name: v for name, v in verdicts.items() if not v.accepted}
            # a keep proven only by the weaker check keeps the old detection baseline (see
            # fresh_baselines): production traffic is then still judged against the agent's
            # behaviour before the fault, which is what catches a fix one query misjudged
            fresh = fresh_baselines(verdicts, self.team)
            if not rejected:
                summary = {name: v.model_dump(mode="json") for name, v in verdicts.items()}
                self.manager.mark_kept(
                    change_ids[0],
                    {"cycle_id": rec.cycle_id, "verdicts": summary, NEW_BASELINE: fresh},
                )
        except BaseException as exc:  # nothing unproven stays applied, whatever went wrong
            why = f"error after the change was applied: {type(exc).__name__}: {exc}"
            await self._roll_back(rec, change_ids, why, targets)
            raise
        if rejected:
            reason = "verification failed: " + "; ".join(
                f"{name}: {verdict.reason}" for name, verdict in rejected.items()
            )
            await self._roll_back(rec, change_ids, reason, targets, verdicts)
            return "rolled_back", None
        for name in fresh:
            self.detector.on_change_kept(name, self.monitor)
        kept_old = [name for name in targets if name not in fresh and name in self.team]
        note = (
            f" (weaker check only: {', '.join(kept_old)} keep(s) the detection baseline from "
            "before the change)"
            if kept_old
            else ""
        )
        await rec.emit(
            "change_kept",
            agent,
            "kept: " + "; ".join(f"{n}: {v.reason}" for n, v in verdicts.items()) + note,
            change_ids=change_ids,
            new_baseline=fresh,
        )
        return "kept", None

    async def _analyse(self, issue: IssueReport, rec: CycleRecorder) -> RootCauseAnalysis:
        # the files are the truth: read them once per cycle (someone may have edited them), and
        # rebuild the registry, since agents may have been created or deleted since
        self.team.reload()
        self.mediator.ask_agent_tool = AskAgentTool(self.team.ask_agent_registry())

        async def asked(exchange: QuestionAnswer) -> None:
            await rec.emit(
                "question_asked",
                exchange.agent_name,
                exchange.question,
                **exchange.model_dump(mode="json"),
            )

        self.mediator.on_question = asked
        try:
            analysis = await self.mediator.analyze_issue(issue)
        finally:
            self.mediator.on_question = None
        await rec.emit(
            "analysis_completed",
            analysis.agent_name,
            f"{analysis.cause_category or 'cause'} ({analysis.confidence_score:.2f}): "
            f"{analysis.identified_cause}",
            analysis=analysis.model_dump(mode="json"),
        )
        return analysis

    def _verdict_recorder(
        self, rec: CycleRecorder
    ) -> Callable[[int, ProposedChange | None, GateVerdict | None, str | None], Awaitable[None]]:
        counts: dict[int, int] = {}
        total = len(self.gates)

        async def on_verdict(
            index: int,
            change: ProposedChange | None,
            verdict: GateVerdict | None,
            error: str | None,
        ) -> None:
            counts[index] = counts.get(index, 0) + (verdict is not None)
            action = change.action if change is not None else None
            accepted = verdict is not None and verdict.passed and counts[index] == total
            message = (
                f"{verdict.gate}: {'passed' if verdict.passed else 'refused'}: {verdict.reason}"
                if verdict is not None
                else f"not gated: {error}"
            )
            await rec.emit(
                "gate_checked",
                action.target_agent if action is not None else None,
                message,
                index=index,
                action=action.model_dump(mode="json") if action is not None else None,
                diff=change.diff if change is not None else "",
                paths=[e.path for e in change.edits] if change is not None else [],
                verdict=verdict.model_dump(mode="json") if verdict is not None else None,
                error=error,
                accepted=accepted,
            )

        return on_verdict

    async def _verify(
        self,
        targets: dict[str, AgentSpec | None],
        suites: dict[str, EvalSuite | None],
        before: dict[str, BeforeRun],
        rec: CycleRecorder,
    ) -> dict[str, VerificationVerdict]:
        specs = self.team.reload()
        verdicts: dict[str, VerificationVerdict] = {}
        for name in targets:
            verdict = await self.verifier.verify(
                name, specs.get(name), suites.get(name), before.get(name)
            )
            verdicts[name] = verdict
            await rec.emit(
                "verification_completed",
                name,
                verdict.reason,
                agent=name,
                verdict=verdict.model_dump(mode="json"),
            )
        return verdicts

    async def _roll_back(
        self,
        rec: CycleRecorder,
        change_ids: list[str],
        reason: str,
        targets: dict[str, AgentSpec | None],
        verdicts: dict[str, VerificationVerdict] | None = None,
    ) -> None:
        self.manager.rollback_by_id(change_ids[0], reason=reason)
        rec.rolled_back = True
        self.team.reload()
        scores = {
            name: {"before": v.before_score, "after": v.after_score}
            for name, v in (verdicts or {}).items()
        }
        await rec.emit(
            "change_rolled_back",
            next(iter(targets), None),
            reason,
            change_ids=change_ids,
            reason=reason,
            scores=scores,
        )

    # -- the record --------------------------------------------------------------------------

    def replay(self, cycle_id: str) -> CycleResult:
        """A past cycle's result, rebuilt from the store."""
        return replay_cycle(self.store, cycle_id)


def _targets(changes: Sequence[ProposedChange]) -> dict[str, AgentSpec | None]:
    """The agents the changes touch, with their definitions before the change."""
    targets: dict[str, AgentSpec | None] = {}
    for change in changes:
        name = change.action.target_agent
        if change.new_spec is not None:
            name = change.new_spec.name
        targets.setdefault(name, change.old_spec)
    return targets


async def _invalid(rec: CycleRecorder, exc: InvalidProposal, agent: str) -> tuple[CycleStatus, str]:
    """Record an unusable proposal; nothing was applied."""
    await rec.emit("proposal_invalid", exc.agent or agent, str(exc), error=str(exc))
    return "invalid_proposal", str(exc)


def _refusals(gated: Sequence[GatedAction]) -> str:
    reasons = []
    for item in gated:
        refusal = next((v for v in item.verdicts if not v.passed), None)
        if refusal is not None:
            reasons.append(f"action {item.index}: {refusal.gate}: {refusal.reason}")
        elif item.error is not None:
            reasons.append(f"action {item.index}: {item.error}")
    return "every action was refused: " + "; ".join(reasons)


def _default_models(runtime: AgentRuntime) -> Collection[str]:
    served = getattr(runtime, "available_models", None)
    if isinstance(served, tuple | list | frozenset | set) and served:
        return tuple(str(name) for name in served)
    from infrastructure.simulation import AVAILABLE_MODELS

    return tuple(AVAILABLE_MODELS)
