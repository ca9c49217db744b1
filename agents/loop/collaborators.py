"""``LoopCollaborators``: the objects the improvement loop shares, built once and passed down.

The orchestrator, the cycle it runs and the change pipeline of that cycle all work on the same
team, store, monitor, detector, change manager, gates and roles. Built in one place, with the
defaults read from one ``Settings``, and handed down as one frozen value, they cannot drift
apart: the pipeline applies through the manager whose budget the gates check, every part traces
to the same provider, and a collaborator added later is one field here instead of a parameter
threaded through three constructors.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.trace import Tracer, TracerProvider

from agentmend.infrastructure.changes.gates import default_gates
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.proposal import ApprovalCallback, ChangeReviewer, Gate
from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.limits import InputLimits
from agentmend.infrastructure.llm.base import AgentRuntime
from agentmend.infrastructure.monitoring.performance_monitor import (
    PerformanceMonitor,
    monitor_options,
)
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.settings import Settings, load_settings
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.timeouts import StoreTimeouts
from agentmend.infrastructure.tracing import agentmend_tracer
from agentmend.loop.cycle_verification import CycleVerifier
from agentmend.loop.release_publishing import ReleasePublisher
from agentmend.roles.ask_agent_tool import AskAgentTool
from agentmend.roles.role_names import check_team_names
from agentmend.roles.self_improver import SelfImprover
from agentmend.roles.socratic_mediator import SocraticMediator
from agentmend.roles.supervisor import Supervisor
from agentmend.roles.team import AgentTeam

__all__ = ["LoopCollaborators", "default_detector"]


@dataclass(frozen=True, slots=True)
class LoopCollaborators:
    """What the orchestrator, the improvement cycle and the change pipeline share.

    Build it with ``build`` (the defaults below); the fields are the objects themselves, so a
    part that changes state (the monitor, the manager's budget, the team reloaded from its
    files) changes it for every holder alike.

    Attributes:
        team: the agents (definitions + runtime), with their monitor set.
        store: the database everything is recorded in.
        settings: thresholds, budget, approval timeout, yolo mode.
        monitor: the team's monitor, which records every run.
        detector: decides when an agent degraded, and holds its detection baselines.
        manager: the change history every change is applied and rolled back through.
        roles_runtime: what runs the mediator, improver and supervisor.
        principal: who the loop's changes are made for (the role gate judges against them,
            the audit rows name them).
        reviewer: the supervisor gate's reviewer.
        gates: the gates every change passes, in order.
        mediator: questions the agents to find an issue's root cause.
        improver: proposes, plans, gates and applies the changes.
        verifier: runs an agent's eval suite (or the weaker check) before and after a change.
        tracer: where the loop's spans go (the roles, each gate, verification, rollback).
        available_models: the models a model change may choose.
        publisher: publishes each kept change and each rollback as a release (None: the team
            directory is all there is).
        opened: the closers of what ``build`` opened itself (the default store and monitor),
            in the order to call them; the orchestrator built on this bundle calls them when
            it is closed.
    """

    team: AgentTeam
    store: Store
    settings: Settings
    monitor: PerformanceMonitor
    detector: IssueDetector
    manager: ImprovementManager
    roles_runtime: AgentRuntime
    principal: Principal
    reviewer: ChangeReviewer
    gates: tuple[Gate, ...]
    mediator: SocraticMediator
    improver: SelfImprover
    verifier: CycleVerifier
    tracer: Tracer
    available_models: tuple[str, ...]
    publisher: ReleasePublisher | None = None
    opened: tuple[Callable[[], object], ...] = ()

    @classmethod
    def build(
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
        detector: IssueDetector | None = None,
        gates: Sequence[Gate] | None = None,
        reviewer: ChangeReviewer | None = None,
        available_models: Collection[str] | None = None,
        max_questions: int = 10,
        tracer_provider: TracerProvider | None = None,
        publisher: ReleasePublisher | None = None,
    ) -> LoopCollaborators:
        """The loop's collaborators for ``team``, each one given or built from ``settings``.

        Args:
            team: the agents; its monitor is created on ``store`` if it has none.
            roles_runtime: what runs the mediator, improver and supervisor (the offline
                playbooks, a model API, or a fake).
            store: default ``<workspace>/agentmend.db``, opened here (and in ``opened``).
            workspace: where the default store lives; default ``settings.workspace``.
            settings: default ``load_settings()``.
            manager: the change history to apply through; default one on ``store`` (a
                workspace passes its own, so one process keeps one session budget).
            approval_callback: the human approval gate's question, a plain or async function
                of the ``ProposedChange`` returning True to apply it (None: every change is
                refused unless yolo mode is on). Used only to build the default gates.
            principal: default ``settings.default_principal`` (standard rights unless
                ``AGENTMEND_PRINCIPAL_ADMIN`` is set).
            detector: default one built from ``settings`` (mode, false-alarm rate, baseline).
            gates: default ``agentmend.infrastructure.changes.gates.default_gates``.
            reviewer: default a ``Supervisor`` on ``roles_runtime``.
            available_models: default the team runtime's ``available_models`` when it has
                them, else the simulated team's list.
            max_questions: the mediator's question budget per analysis.
            tracer_provider: default the globally registered provider, if any.
            publisher: see the attribute.

        Raises:
            RoleNameClash: a team agent is named like a role (``socratic-mediator``,
                ``self-improver``, ``supervisor``); nothing is opened.
        """
        check_team_names(team.names)  # before anything is opened
        settings = settings if settings is not None else load_settings()
        opened: list[Callable[[], object]] = []
        if store is None:
            base = Path(workspace) if workspace is not None else settings.workspace
            store = Store(base / "agentmend.db", timeouts=StoreTimeouts.from_settings(settings))
            opened.append(store.close)
        if team.monitor is None:
            team.monitor = PerformanceMonitor(store, **monitor_options(settings))
            opened.insert(0, team.monitor.close)
        monitor = team.monitor
        if detector is None:
            detector = default_detector(settings, store, monitor)
        if manager is None:
            manager = _default_manager(settings, store)
        principal = principal or settings.default_principal
        models = tuple(available_models or _default_models(team.runtime))
        tracer = agentmend_tracer(tracer_provider)
        reviewer = reviewer if reviewer is not None else Supervisor(roles_runtime)
        if isinstance(reviewer, Supervisor):
            reviewer.tracer = tracer
        if gates is None:
            gates = default_gates(
                manager=manager,
                principal=principal,
                reviewer=reviewer,
                approval_callback=approval_callback,
                settings=settings,
            )
        mediator = SocraticMediator(
            roles_runtime, AskAgentTool(team.ask_agent_registry()), max_questions=max_questions
        )
        improver = SelfImprover(
            roles_runtime,
            manager,
            root=team.directory,
            gates=gates,
            principal=principal,
            available_models=models,
            # the cycle reloads the team when the files change; the effector still checks
            # every definition against the disk, so a stale view is refused, never written
            specs_provider=lambda: team.specs,
            tracer=tracer,
        )
        return cls(
            team=team,
            store=store,
            settings=settings,
            monitor=monitor,
            detector=detector,
            manager=manager,
            roles_runtime=roles_runtime,
            principal=principal,
            reviewer=reviewer,
            gates=tuple(gates),
            mediator=mediator,
            improver=improver,
            verifier=CycleVerifier(team, design=settings.verification_design),
            tracer=tracer,
            available_models=models,
            publisher=publisher,
            opened=tuple(opened),
        )


def default_detector(
    settings: Settings, store: Store, monitor: PerformanceMonitor
) -> IssueDetector:
    """The detector ``settings`` describe, on ``monitor``, its issues kept in ``store``."""
    return IssueDetector(
        settings.detection_mode,
        false_alarm_rate=settings.false_alarm_rate,
        baseline_n=min(settings.baseline_n, monitor.baseline_n),
        min_baseline_n=settings.min_baseline_n,
        monitor=monitor,
        ledger=IssueLedger(store),
        backoff_runs=settings.issue_backoff_runs,
        backoff_max_runs=max(settings.issue_backoff_runs, settings.issue_backoff_max_runs),
    )


def _default_manager(settings: Settings, store: Store) -> ImprovementManager:
    key = settings.audit_hmac_key
    return ImprovementManager(
        store=store,
        max_improvements_per_session=settings.max_improvements_per_session,
        improvement_window_s=settings.improvement_window_s,  # a long-lived process
        max_improvements_per_window=settings.max_improvements_per_window,
        audit_hmac_key=key.get_secret_value() if key is not None else None,
        limits=InputLimits.of(settings),
    )


def _default_models(runtime: AgentRuntime) -> Collection[str]:
    served = getattr(runtime, "available_models", None)
    if isinstance(served, tuple | list | frozenset | set) and served:
        return tuple(str(name) for name in served)
    from agentmend.infrastructure.simulation import AVAILABLE_MODELS

    return tuple(AVAILABLE_MODELS)
