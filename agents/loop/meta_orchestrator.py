"""``MetaOrchestrator``: runs the team, watches it, and runs the improvement cycle when it degrades.

The facade users know. ``execute_task`` runs every agent on a query (bounded concurrency, every
run recorded), asks the detector whether anything degraded, and for each issue runs the cycle
(``auto_improve``) or asks ``confirm_cycle`` first (the interactive session's y/n).

The orchestrator, its cycle and the cycle's change pipeline share one set of collaborators
(team, store, monitor, detector, manager, roles, gates, tracer, publisher), built once as a
``LoopCollaborators`` (``agentmend.loop.collaborators``) and passed down.

The loop itself, step by step, lives in two modules:

- ``agentmend.loop.improvement_cycle``: ``run_improvement_cycle`` = analyse (the mediator questions
  the agents) -> propose (the improver) -> the change; ``apply_self_edit`` = one action an
  agent asked for (its self-edit tools, bound by ``self_edit_tools``) -> the same change.
- ``agentmend.loop.change_pipeline``: the change = plan -> run before -> gate -> apply -> verify ->
  keep or roll back, one at a time.

This module keeps the open issues, decides when a cycle runs, and undoes changes on request
(``rollback``). It also drives the watches on changes to agents without an eval suite
(``advance_watches``): each production run of a watched agent recorded through the team
advances its watch, which keeps or rolls the change back as soon as the live runs decide, and
no cycle is started for an agent while its change is watched (one change at a time). Every
step of a cycle is a ``CycleEvent`` in the store, so ``replay(cycle_id)`` rebuilds its
``CycleResult`` from the store alone.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry.trace import Span, TracerProvider

from agentmend.infrastructure.changes.gates import ConfidenceGate, HumanApprovalGate
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.proposal import ApprovalCallback, ChangeReviewer, Gate
from agentmend.infrastructure.changes.protocol.change_log import ChangeLog, ChangeRow
from agentmend.infrastructure.changes.protocol.decisions import record_decision
from agentmend.infrastructure.changes.protocol.team_registry import team_id
from agentmend.infrastructure.changes.watch import ChangeWatch
from agentmend.infrastructure.detection.checker_seat import SeatHolder
from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.errors import (
    ChangeNotFound,
    ConfigurationError,
    PermissionRequired,
    RollbackConflict,
    StoreError,
)
from agentmend.infrastructure.llm.base import AgentRuntime, ToolSpec
from agentmend.infrastructure.models import (
    ChangeRecord,
    ChangeStatus,
    ImprovementAction,
    IssueReport,
)
from agentmend.infrastructure.monitoring.performance_monitor import (
    RUN,
    PerformanceMonitor,
    monitor_options,
)
from agentmend.infrastructure.principal import ADMIN, ChangeAuthor, Principal
from agentmend.infrastructure.settings import Settings, load_settings
from agentmend.infrastructure.simulation import SimulatedRuntime
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.tracing import set_outcome, work_span
from agentmend.loop.checker_policies import holding_checker
from agentmend.loop.collaborators import LoopCollaborators
from agentmend.loop.cycle import CycleResult, OnProgress, TaskResult, replay_cycle
from agentmend.loop.cycle_verification import baseline_agents
from agentmend.loop.improvement_cycle import SELF_EDIT, ImprovementCycle
from agentmend.loop.release_publishing import ReleasePublisher
from agentmend.loop.self_edit_tools import Authorize, self_edit_tools, verified_apply
from agentmend.roles.team import AgentTeam

__all__ = ["SELF_EDIT", "ConfirmCycle", "MetaOrchestrator", "OnProgress"]

log = get_logger(__name__)

T = TypeVar("T")

ConfirmCycle = Callable[[IssueReport], bool | Awaitable[bool]]
"""Asks whether to run a cycle for an issue (the interactive y/n), plain or async; True runs
it."""

DECLINED_WORSE_BY = 0.25
"""How much an agent's issue must grow in severity (see ``IssueReport.severity``: the excess
failure fraction, or log2 of the slow-down) after a "no" before it is offered again."""


class MetaOrchestrator:
    """Executes tasks on a team, detects degradation and runs improvement cycles.

    Built on the loop's collaborators (``LoopCollaborators``: team, store, monitor, detector,
    manager, roles, gates, tracer, publisher, ...), which it shares with its
    ``ImprovementCycle`` and that cycle's ``ChangePipeline``. ``for_team`` builds them and the
    orchestrator in one call, the common case; ``offline_simulated`` builds the simulated team
    with the offline playbooks.

    Args:
        shared: the loop's collaborators (``LoopCollaborators.build``); what building them
            opened (``shared.opened``) is closed with this orchestrator.
        auto_improve: run a cycle for each detected issue without asking.
        confirm_cycle: otherwise, ask this whether to run one (no answer within
            ``settings.auto_decision_timeout`` is no). An issue declined is not offered
            again until it is a kind not declined yet for that agent, or ``DECLINED_WORSE_BY``
            more severe, or a cycle is asked for (``run_improvement_cycle``).
        on_progress: called with every ``CycleEvent`` as it happens.
        concurrency: agents run at once by ``execute_task``.
        task_timeout_s: a wall-clock limit per agent run in ``execute_task``.

    Raises:
        ConfigurationError: ``auto_improve`` while nobody can approve a change (no
            ``approval_callback`` and yolo mode off): every cycle would be refused.
    """

    def __init__(
        self,
        shared: LoopCollaborators,
        *,
        auto_improve: bool = False,
        confirm_cycle: ConfirmCycle | None = None,
        on_progress: OnProgress | None = None,
        concurrency: int = 4,
        task_timeout_s: float | None = None,
    ) -> None:
        self.shared = shared
        self._owned: list[Callable[[], object]] = list(shared.opened)
        self.settings = shared.settings
        self.store = shared.store
        self.team = shared.team
        self.monitor = shared.monitor
        self.detector = shared.detector
        self.manager = shared.manager
        self.roles_runtime = shared.roles_runtime
        self.principal = shared.principal
        self.reviewer = shared.reviewer
        self.gates = shared.gates
        self.mediator = shared.mediator
        self.improver = shared.improver
        self.verifier = shared.verifier
        self.tracer = shared.tracer
        self.available_models = shared.available_models
        self.publisher = shared.publisher
        self.confirm_cycle = confirm_cycle
        self.concurrency = concurrency
        self.task_timeout_s = task_timeout_s
        self._auto_improve = False
        self.auto_improve = auto_improve  # checks that someone can approve
        # per agent, the issues declined, by kind: a kind already declined is offered again
        # only when clearly worse
        self._declined: dict[str, dict[str, IssueReport]] = {}
        self._pending: dict[str, IssueReport] = {}
        self.cycle = ImprovementCycle(shared, on_progress=on_progress)
        self.watcher = self.cycle.changes.watcher
        # the agents with a change watched here, read again at each task and check (a watch
        # another process started on this host is picked up there); a run of one advances it
        self._watched: set[str] = {w.agent for w in self.watcher.open_here()}
        self.team.add_run_listener(self._on_run)
        self._owned.insert(0, lambda: self.team.remove_run_listener(self._on_run))

    @classmethod
    def for_team(
        cls,
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
        tracer_provider: TracerProvider | None = None,
        publisher: ReleasePublisher | None = None,
    ) -> MetaOrchestrator:
        """An orchestrator for ``team``, its collaborators built by ``LoopCollaborators.build``.

        The collaborators' keywords (``store``, ``workspace``, ``settings``, ``manager``,
        ``approval_callback``, ``principal``, ``detector``, ``gates``, ``reviewer``,
        ``available_models``, ``max_questions``, ``tracer_provider``, ``publisher``) are
        documented there, the orchestrator's own (``auto_improve``, ``confirm_cycle``,
        ``on_progress``, ``concurrency``, ``task_timeout_s``) on the class.

        Raises:
            RoleNameClash: a team agent is named like a role (``socratic-mediator``,
                ``self-improver``, ``supervisor``); nothing is opened.
            ConfigurationError: ``auto_improve`` while nobody can approve a change.
        """
        shared = LoopCollaborators.build(
            team,
            roles_runtime=roles_runtime,
            store=store,
            workspace=workspace,
            settings=settings,
            manager=manager,
            approval_callback=approval_callback,
            principal=principal,
            detector=detector,
            gates=gates,
            reviewer=reviewer,
            available_models=available_models,
            max_questions=max_questions,
            tracer_provider=tracer_provider,
            publisher=publisher,
        )
        return cls(
            shared,
            auto_improve=auto_improve,
            confirm_cycle=confirm_cycle,
            on_progress=on_progress,
            concurrency=concurrency,
            task_timeout_s=task_timeout_s,
        )

    @property
    def auto_improve(self) -> bool:
        """Run a cycle for every detected issue without asking ``confirm_cycle``.

        Raises:
            ConfigurationError: set to True while nobody can approve a change (a human
                approval gate with no callback and yolo mode off).
        """
        return self._auto_improve

    @auto_improve.setter
    def auto_improve(self, value: bool) -> None:
        if value and any(
            isinstance(gate, HumanApprovalGate) and gate.callback is None and not gate.yolo_mode
            for gate in self.gates
        ):
            raise ConfigurationError(
                "auto_improve=True but nobody can approve a change, so every cycle would be "
                "refused: pass approval_callback (a function of the ProposedChange returning "
                "True to apply it) or turn on yolo_mode"
            )
        self._auto_improve = value

    @property
    def on_progress(self) -> OnProgress | None:
        """Called with every ``CycleEvent`` as it happens (the cycle's, settable here)."""
        return self.cycle.on_progress

    @on_progress.setter
    def on_progress(self, value: OnProgress | None) -> None:
        self.cycle.on_progress = value

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
        ``<directory>/.agent/agentmend.db``; other keyword options go to ``for_team``.
        """
        from agentmend.infrastructure.llm.offline import OfflineRuntime
        from agentmend.infrastructure.simulation import copy_team
        from agentmend.roles.playbooks import offline_policies

        folder = Path(directory)
        if not any(folder.glob("*.md")):
            copy_team(folder)
        settings = settings if settings is not None else load_settings()
        if yolo_mode is not None:
            settings = settings.model_copy(update={"yolo_mode": yolo_mode})
        runtime = runtime if runtime is not None else SimulatedRuntime(seed)
        own_store = store is None
        store = store if store is not None else Store(folder / ".agent" / "agentmend.db")
        monitor = PerformanceMonitor(store, **monitor_options(settings))
        team = AgentTeam(folder, runtime, monitor=monitor)
        orchestrator = cls.for_team(
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

    async def execute_task(self, query: str, *, routing_key: str | None = None) -> TaskResult:
        """Run every agent on ``query``, check for issues, and run or offer cycles.

        ``routing_key``: for a team that follows releases, the key (a user or conversation id)
        that picks the release serving this task; None draws a random one.

        While the store cannot be reached the task is still run; following rollouts, judging
        watches and detection are skipped for it, named in ``store_notice``.
        """
        skipped: dict[str, str] = {}  # a step that needs the store: why it was skipped
        self._unless_store_fails("following rollouts", self.follow_rollouts, skipped)
        # runs recorded elsewhere since may already decide a watch
        self._unless_store_fails("watched changes", self.advance_watches, skipped)
        results = await self.team.run_all(
            query,
            concurrency=self.concurrency,
            timeout_s=self.task_timeout_s,
            routing_key=routing_key,
        )
        issues = self._unless_store_fails("detection", self.check_all_issues, skipped) or []
        task = TaskResult(query=query, results=results, issues=issues)
        if issues:
            task.checker = self._unless_store_fails("fleet checker", self.fleet_checker, skipped)
        if skipped:
            why = list(skipped.values())[-1]
            task.store_notice = f"store unreachable, skipped {', '.join(skipped)}: {why}"
        if task.checker is not None:
            # the checker holds the team: its policy deals with the issues (a cycle asked for
            # by name still runs, and the issue's claim decides between the two)
            task.left_to_checker = list(issues)
            return task
        for issue in issues:
            if issue.agent_name not in self._pending:
                continue  # a cycle for an earlier issue of this task dealt with it
            if self._hold_while_watched(issue):
                continue  # one change at a time: the agent's change is being watched
            if not self.auto_improve and self._still_declined(issue):
                continue  # "no" holds until the issue changes or a cycle is asked for
            if not await self._wants_cycle(issue):
                if self.confirm_cycle is not None:
                    task.declined.append(issue)
                    self._declined.setdefault(issue.agent_name, {})[issue.error_type] = issue
                    self._pending.pop(issue.agent_name, None)
                    self.detector.cycle_finished(issue, kept=False, outcome="declined")
                    record_decision(
                        self.store,
                        "issue_declined",
                        agent_name=issue.agent_name,
                        payload={"issue": issue.model_dump(mode="json")},
                    )
                continue
            task.cycles.append(await self.run_improvement_cycle(issue))
        return task

    @staticmethod
    def _unless_store_fails(step: str, work: Callable[[], T], skipped: dict[str, str]) -> T | None:
        """One of a task's steps that need the store, skipped (None) when the store fails.

        A question is answered on the release being served even while the store is out of
        reach (a server down, a volume gone): its runs wait in the monitor's bounded backlog
        and are written when the store is back. What cannot go on without the store
        (following rollouts, judging watches, detection) is skipped for this question, with
        the store's error in ``skipped``; the next question tries again.
        """
        try:
            return work()
        except StoreError as exc:
            skipped[step] = str(exc)
            log.info("task_step_skipped", step=step, error=str(exc))
            return None

    def _hold_while_watched(self, issue: IssueReport) -> bool:
        """Hold ``issue`` (no cycle) when a change to its agent is watched on live runs.

        The issue is recorded on the detector as held (outcome ``watch_open``), like a cycle
        that changed nothing: it is raised again after its hold if the condition persists once
        the watch has ended.
        """
        watch = next(iter(self.watcher.open_watches(issue.agent_name)), None)
        if watch is None:
            return False
        self._pending.pop(issue.agent_name, None)
        self.detector.cycle_finished(issue, kept=False, outcome="watch_open")
        record_decision(
            self.store,
            "issue_held_while_watched",
            agent_name=issue.agent_name,
            payload={"issue": issue.model_dump(mode="json"), "watch_id": watch.watch_id},
        )
        log.info("issue_held_while_watched", agent=issue.agent_name, watch_id=watch.watch_id)
        return True

    # -- watched changes (agents without an eval suite) ------------------------------------

    def _on_run(self, agent_name: str, source: str) -> None:
        if source == RUN and agent_name in self._watched:
            try:
                self.advance_watches(agent_name)
            except StoreError as exc:  # the run stands; the watch is judged once it is back
                log.warning("watch_not_advanced", agent=agent_name, error=str(exc))

    def advance_watches(self, agent_name: str | None = None) -> list[ChangeWatch]:
        """Judge the open watches of this host (of ``agent_name`` only, if given) on every run
        recorded so far; returns those that ended now (kept or rolled back).

        Called after each production run of a watched agent, before each task and at each
        check for issues, so a change that hurts is rolled back at the run that shows it. A
        watch that ends reloads the team (the next runs use the files as they now are); a kept
        one resolves the issue its cycle answered and, with a ``publisher``, is published as
        a release like any kept change.
        """
        watches = self.watcher.open_here(agent_name)
        if agent_name is None:
            self._watched = {w.agent for w in watches}
        if not watches:
            return []
        self.monitor.flush()  # the watch reads the runs from the store
        ended: list[ChangeWatch] = []
        for watch in watches:
            change_ids = self.watcher.changes_of(watch.watch_id)
            now = self.watcher.advance(watch.watch_id)
            if now.state != "watching":
                ended.append(now)
                self._watch_ended(now, change_ids)
        if ended:
            self.team.reload()
            self._watched = {w.agent for w in self.watcher.open_here()}
        return ended

    def _watch_ended(self, watch: ChangeWatch, change_ids: Sequence[str]) -> None:
        log.info(
            "watched_change_ended",
            agent=watch.agent,
            watch_id=watch.watch_id,
            verdict=watch.verdict,
            runs=watch.pairs,
        )
        if watch.state != "kept":
            return
        issue_id = watch.origin.get("issue_id")
        if isinstance(issue_id, str):
            first = next(iter(change_ids), None)
            self.detector.ledger.resolve(issue_id, change_id=first)
        if self.publisher is not None and change_ids:
            self.publisher.kept(
                self.team.directory,
                list(change_ids),
                by=self.principal,
                reason=f"kept for {watch.agent}: shown better on its live runs",
            )

    def _still_declined(self, issue: IssueReport) -> bool:
        declined = self._declined.get(issue.agent_name, {}).get(issue.error_type)
        return declined is not None and issue.severity < declined.severity + DECLINED_WORSE_BY

    async def _wants_cycle(self, issue: IssueReport) -> bool:
        if self.auto_improve:
            return True
        if self.confirm_cycle is None:
            return False
        try:
            async with asyncio.timeout(self.settings.auto_decision_timeout):
                answer = self.confirm_cycle(issue)
                if inspect.isawaitable(answer):
                    answer = await answer
                return answer is True
        except TimeoutError:
            log.info("cycle_not_confirmed", agent=issue.agent_name, reason="no answer in time")
            return False

    def fleet_checker(self) -> SeatHolder | None:
        """The fleet checker holding this team's seat now (None: none, or silent past its
        term). While one does, ``execute_task`` leaves the issues it finds to it."""
        return holding_checker(self.store, Path(self.team.directory))

    def check_all_issues(self) -> list[IssueReport]:
        """Every open issue, most severe first (new detections merged with unhandled ones).

        Open watches are advanced first (``advance_watches``).
        """
        self.advance_watches()
        for issue in self.detector.check(self.monitor):
            known = self._pending.get(issue.agent_name)
            if known is None or issue.severity >= known.severity:
                self._pending[issue.agent_name] = issue
        return sorted(self._pending.values(), key=lambda i: i.severity, reverse=True)

    def check_performance_issues(self) -> IssueReport | None:
        """The most urgent open issue, or None."""
        issues = self.check_all_issues()
        return issues[0] if issues else None

    def next_issue(self) -> IssueReport | None:
        """The issue a request for "a cycle, whichever is most urgent" means, or None.

        The most urgent open issue; else one whose cycle was declined here; else an issue the
        store holds (held by any process, such as a session's "no"): asked for again, its hold
        yields to the cycle (see the cycle's claim).
        """
        urgent = self.check_performance_issues() or next(iter(self.declined_issues()), None)
        if urgent is not None:
            return urgent
        held = self.detector.ledger.issues(active=True)
        if not held:
            return None
        row = held[0]  # the newest
        metrics = self.monitor.get_agent_metrics(row.agent)
        dumped = metrics.model_dump() if metrics is not None else {}
        return IssueReport(
            agent_name=row.agent,
            error_type=row.kind,
            metrics=dumped,
            error_logs=list(dumped.get("recent_errors", ())),
            context=row.context,
            available_agents=self.team.names,
            detector=row.detector,
            issue_id=row.issue_id,
        )

    def declined_issues(self) -> list[IssueReport]:
        """The issues whose cycle was declined, most severe first: still open, not offered
        again until they change, but what a person asking for a cycle means."""
        declined = [issue for kinds in self._declined.values() for issue in kinds.values()]
        return sorted(declined, key=lambda issue: issue.severity, reverse=True)

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

        Restores the files byte for byte and reloads the team. Every kept group the rollback
        undoes (with ``cascade``, the later groups built on it too) gives back the detection
        baseline it started, once for each agent it started one for, newest group first: each
        agent is judged again against the baseline it had before the oldest group undone.
        Returns the rolled-back record, or None when there is nothing to roll back.

        An agent's baselines go back newest first, so a kept group can give its baseline back
        only when no newer kept change that the rollback leaves in place (one on other files of
        the agent, such as its docs, which ``cascade`` does not reach) started one for the same
        agent since. Such a rollback is refused before anything changes, naming the newer
        changes: roll those back first.

        Raises:
            ChangeNotFound: ``change_id`` is unknown.
            PermissionRequired: it is another team's change and the principal is not an
                administrator.
            RollbackConflict: the files changed since, or later changes build on this one
                (``force`` / ``cascade`` say to go ahead), or a newer kept change left in
                place started a detection baseline for one of its agents (its ids are the
                conflict's ``dependents``).
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
        record = self.manager.get_change(change_id)
        if record is None:
            raise ChangeNotFound(change_id)
        self._refuse_another_teams_change(change_id)
        self._withdraw_running_canary(change_id)
        # what a cascade would undo (a rollback without cascade undoes just the group, or is
        # refused when this holds more), oldest first as the history reads
        closure = self.manager.rollback_closure(change_id)[::-1]
        _refuse_out_of_order_baselines(self.manager.changes, change_id, closure)
        with work_span(
            self.tracer,
            "agentmend.rollback",
            **{"agentmend.change_id": change_id, "agentmend.rollback.reason": reason},
        ):
            done = self.manager.rollback_by_id(
                change_id,
                reason=reason,
                force=force,
                cascade=cascade,
                author=ChangeAuthor.of(self.principal),
            )
        if not done:
            return None
        self.team.reload()
        if self.publisher is not None:
            self.publisher.rolled_back(
                self.team.directory, [change_id], by=self.principal, reason=reason
            )
        undone = [
            member
            for member in closure
            if (now := self.manager.changes.get(member.change_id)) is not None
            and now.status is ChangeStatus.ROLLED_BACK
        ]
        for group in _groups_newest_first(undone):
            for name in baseline_agents([member.record for member in group]):
                self.detector.on_change_rolled_back(name, self.monitor)
        record_decision(
            self.store,
            "change_rolled_back_on_request",
            agent_name=record.action.target_agent,
            payload={
                "change_id": change_id,
                "reason": reason,
                "undone": [member.change_id for member in undone],
            },
        )
        return self.manager.get_change(change_id)

    def _refuse_another_teams_change(self, change_id: str) -> None:
        """Changes are team-scoped: another team's change is rolled back only by an
        administrator (a store shared by teams lets each see the others' history)."""
        owner = self.manager.changes.team_of(change_id)
        if owner is None or self.principal.is_admin:
            return
        mine = team_id(self.team.directory, self.store)
        if owner != mine:
            raise PermissionRequired(
                self.principal.user_id, ADMIN, f"roll back a change of team {owner}"
            )

    def _withdraw_running_canary(self, change_id: str) -> None:
        """Take the running canary's changes out of the team folder before a rollback on
        request, newest first, each as a rollback on request of its own.

        The rollback publishes the team folder as the stable release; a folder that still
        carried a change only the running canary carries would ship it unjudged, and the
        release log refuses that. Once the canary's changes are out, that publication rolls
        the rollout back first (reason ``superseded``, audited).
        """
        if self.publisher is None:
            return
        for carried in reversed(self.publisher.running_change_ids()):
            now = self.manager.get_change(carried)
            if carried == change_id or now is None:
                continue
            if now.status in (ChangeStatus.APPLIED, ChangeStatus.KEPT):
                reason = f"its canary gives way to the rollback of {change_id}"
                self.rollback(carried, reason=reason)

    def follow_rollouts(self) -> list[str]:
        """Roll back, in the team folder, the kept changes whose canary release was rolled back.

        With a ``publisher``, a kept change is judged again on live runs as a canary; when the
        canary is rolled back (shown worse, slower, or not proven), the change must leave the
        team folder too, or the next release would carry it again. Each is rolled back as a
        rollback on request (its group with it), which publishes the restored folder as the
        stable release. A change whose files moved on since is left as it is and logged.
        Returns the ids rolled back now.
        """
        if self.publisher is None:
            return []
        undone: list[str] = []
        for change_id in self.publisher.undone_change_ids():
            record = self.manager.get_change(change_id)
            if record is None or record.status is not ChangeStatus.KEPT:
                continue
            try:
                if self.rollback(change_id, reason="its canary release was rolled back"):
                    undone.append(change_id)
            except RollbackConflict as exc:
                log.warning("canary_change_not_rolled_back", change_id=change_id, error=str(exc))
        return undone

    # -- the cycle (agentmend.loop.improvement_cycle) -------------------------------------------

    async def run_improvement_cycle(self, issue: IssueReport) -> CycleResult:
        """Diagnose, fix, verify, and keep or roll back; see ``agentmend.loop.improvement_cycle``.

        Returns a ``CycleResult`` that is truthy when a change was kept. Failures of the
        models are outcomes (``status``), never exceptions; an exception (a bug, an outage of
        the store) is recorded and re-raised, after rolling back anything applied.
        """
        self._declined.pop(issue.agent_name, None)  # asked for: a past "no" is superseded
        with work_span(
            self.tracer,
            "agentmend.improvement_cycle",
            **{"gen_ai.agent.name": issue.agent_name, "agentmend.issue": issue.error_type},
        ) as span:
            result = await self.cycle.improve(
                issue, settle=lambda: self._pending.pop(issue.agent_name, None)
            )
            _end_cycle_span(span, result)
        if result.status == "claimed_elsewhere":
            return result  # the issue is another process's: its cycle settles it
        if result.watch is not None:
            self._watched.add(result.watch.agent)
        self.detector.cycle_finished(
            issue,
            kept=bool(result),
            outcome=result.status,
            change_id=result.group_id or next(iter(result.change_ids), None),
        )
        if result.analysis is not None and result.analysis.responsible_agent is not None:
            self._pending.pop(result.analysis.responsible_agent, None)
        if result and self.publisher is not None:
            self.publisher.kept(
                self.team.directory,
                result.change_ids,
                by=self.principal,
                reason=f"kept for {issue.agent_name}: {issue.error_type}",
            )
        return result

    async def apply_self_edit(self, action: ImprovementAction) -> CycleResult:
        """Make one self-edit through exactly the path a cycle's change takes.

        ``action`` (built by a self-edit tool for the agent that called it) is planned by the
        effector, run on the agent's eval suite as it is now (without a suite the change is
        watched on the agent's live runs instead, the cycle ends ``watching``; with too little
        traffic to watch, the sample query runs), judged by
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

        The action's ``confidence_score`` is replaced by ``self_edit_confidence``: a self-edit
        has no analysis behind it, so its confidence is not the agent's to set.
        """
        action = action.model_copy(update={"confidence_score": self.self_edit_confidence})
        with work_span(
            self.tracer,
            "agentmend.self_edit",
            **{"gen_ai.agent.name": action.target_agent},
        ) as span:
            result = await self.cycle.self_edit(action, available_agents=self.team.names)
            _end_cycle_span(span, result)
        if result.watch is not None:
            self._watched.add(result.watch.agent)
        return result

    @property
    def self_edit_confidence(self) -> float:
        """The fixed confidence of every self-edit: the confidence gate's own threshold.

        Neutral on purpose. A self-edit has no root cause analysis whose confidence could be
        measured, and an agent that rated its own edit could pass the confidence gate at will.
        At the threshold, that gate neither refuses nor favours a self-edit; the role,
        supervisor and human gates and the verification decide. ``settings.min_confidence``
        with the default gates; the threshold of the first ``ConfidenceGate`` among custom ones.
        """
        gate = next((g for g in self.gates if isinstance(g, ConfidenceGate)), None)
        return gate.min_confidence if gate is not None else self.settings.min_confidence

    def self_edit_tools(
        self, agent_name: str, *, authorize: Authorize | None = None
    ) -> list[ToolSpec]:
        """The four self-edit tools for ``agent_name``, bound to ``apply_self_edit``.

        Give them to the agent's runs (``team.run(name, prompt, tools=...)``): each call is
        planned, gated, applied, verified and kept or rolled back as ``apply_self_edit`` says.
        A kept edit answers the model with the change id and the verdict; anything else is a
        tool error naming why (the refusing gate, the failed verification, ...). The tools
        take no confidence from the agent; every edit carries ``self_edit_confidence``.

        Raises:
            UnknownAgent: ``agent_name`` is not in the team.
        """
        self.team.spec(agent_name)  # raises UnknownAgent, naming the agents there are
        return self_edit_tools(
            agent_name,
            verified_apply(self.apply_self_edit),
            authorize=authorize,
            confidence=self.self_edit_confidence,
        )

    # -- the record --------------------------------------------------------------------------

    def replay(self, cycle_id: str) -> CycleResult:
        """A past cycle's result, rebuilt from the store."""
        return replay_cycle(self.store, cycle_id)


def _refuse_out_of_order_baselines(
    changes: ChangeLog, change_id: str, closure: Sequence[ChangeRow]
) -> None:
    """Refuse a rollback whose baselines are not the newest of their agents (see ``rollback``).

    Raises:
        RollbackConflict: naming the newer kept changes, as ``dependents``.
    """
    oldest: dict[str, int] = {}  # per agent: the oldest undone group that started its baseline
    for member in closure:
        for name in baseline_agents([member.record]):
            oldest[name] = min(oldest.get(name, member.seq), member.seq)
    if not oldest:
        return
    inside = {member.change_id for member in closure}
    newer: dict[str, list[str]] = {}
    for later in _changes_after(changes, min(oldest.values())):
        if later.change_id in inside:
            continue
        for name in baseline_agents([later.record]):
            if name in oldest and later.seq > oldest[name]:
                newer.setdefault(later.change_id, []).append(name)
    if newer:
        agents = ", ".join(sorted({name for names in newer.values() for name in names}))
        ids = ", ".join(newer)
        raise RollbackConflict(
            change_id,
            f"later kept change(s) {ids} started a newer detection baseline for {agents}, and "
            "an agent's baselines go back newest first; roll those back first",
            dependents=tuple(newer),
        )


def _end_cycle_span(span: Span, result: CycleResult) -> None:
    span.set_attributes(
        {
            "agentmend.cycle_id": result.cycle_id,
            "agentmend.cycle.status": result.status,
            "agentmend.change_ids": tuple(result.change_ids),
        }
    )
    set_outcome(span, result.status != "error", result.error)


def _changes_after(changes: ChangeLog, seq: int) -> list[ChangeRow]:
    """Every change recorded after ``seq``, oldest first (the history read newest first)."""
    limit = 256
    while True:
        rows = changes.history(None, limit)
        if len(rows) < limit or rows[0].seq <= seq:
            return [row for row in rows if row.seq > seq]
        limit *= 4


def _groups_newest_first(members: Sequence[ChangeRow]) -> list[list[ChangeRow]]:
    """``members`` by group (a change without one is its own), the newest group first."""
    groups: dict[str, list[ChangeRow]] = {}
    for member in members:
        groups.setdefault(member.record.group_id or member.change_id, []).append(member)
    return sorted(groups.values(), key=lambda group: max(m.seq for m in group), reverse=True)
