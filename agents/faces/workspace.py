"""``Workspace``: the one way to open an agentmend workspace folder.

The interactive session (``main.py``) and the MCP server open the same folder the same way, so
they share one store and one team::

    <workspace>/
      agentmend.db                the store: executions, changes, audit, plans, decisions
      agentmend.db.audit-head     the audit chain's head
      store-url                   the store, when it is not agentmend.db: its URL without a
                                  password (``agentmend.faces.store_record``)
      (agentmend.infrastructure.changes.audit.log) agents/                     the team's
      definitions (<name>.md, <name>.evals.yaml)
        .agent/                   backups and the lock of changes to the definitions

Opening settles what processes that are gone left unproven: changes being verified (restored,
FAILED ``interrupted``) and code plans being executed (restored, ``failed``); see
``agentmend.infrastructure.changes.protocol.abandoned`` and
``agentmend.infrastructure.code_update.plan_recovery``. Changes watched on live runs are continued,
not undone (``agentmend.infrastructure.changes.watch``).

On first open, with no definitions given, the simulated six-agent team is copied into
``agents/`` (the offline default needs no key and no network). ``Workspace.orchestrator()``
builds a ``MetaOrchestrator`` on the workspace's store and monitor, with the runtimes of the
configured provider.

Example::

    with Workspace.open(".agentmend") as ws:
        orchestrator = ws.orchestrator(auto_improve=True)
        result = await orchestrator.execute_task("Explain the Pythagorean theorem")
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmend.faces.store_record import DB_NAME, needs_record, record_store, store_for
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.watch import ChangeWatcher
from agentmend.infrastructure.code_update.plan_recovery import settle_interrupted_plans
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.detection.team_baseline import settle_team_baseline
from agentmend.infrastructure.errors import AgentmendError, ConfigurationError
from agentmend.infrastructure.limits import InputLimits
from agentmend.infrastructure.llm.base import AgentRuntime, RuntimeBase
from agentmend.infrastructure.monitoring.performance_monitor import (
    PerformanceMonitor,
    monitor_options,
)
from agentmend.infrastructure.settings import Provider, Settings, load_settings
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.retention import RetentionPolicy, RetentionSweeper
from agentmend.infrastructure.store.timeouts import StoreTimeouts

if TYPE_CHECKING:
    from agentmend.infrastructure.releases.follower import ReleaseFollower
    from agentmend.loop.meta_orchestrator import MetaOrchestrator

__all__ = [
    "DB_NAME",
    "TEAM_DIR_NAME",
    "TeamDirError",
    "Workspace",
    "WorkspaceError",
    "build_runtimes",
]

TEAM_DIR_NAME = "agents"
FAULTS_NAME = "simulated-faults.json"
"""The simulated team's injected faults, kept so that every face of the workspace sees them."""


class WorkspaceError(ConfigurationError):
    """The workspace cannot be opened; names the folder and the problem."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"workspace {self.path} cannot be opened: {problem}")


class TeamDirError(ConfigurationError):
    """The agent definitions folder given to the workspace cannot be used; names that folder.

    Raised before anything is created, so a mistyped ``--agents`` leaves no workspace behind.
    """

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"agent definitions folder {self.path} cannot be used: {problem}")


def _check_team_dir(team: Path) -> None:
    """Raise ``TeamDirError`` unless ``team`` is a folder holding agent definitions."""
    if not team.exists():
        raise TeamDirError(team, "it does not exist")
    if not team.is_dir():
        raise TeamDirError(team, "it is a file, not a folder")
    if not any(team.glob("*.md")):
        raise TeamDirError(team, "it holds no agent definitions (*.md)")


def build_runtimes(
    provider: Provider,
    *,
    seed: int = 0,
    faults_file: Path | None = None,
    record: Path | None = None,
    replay: Path | None = None,
) -> tuple[AgentRuntime, AgentRuntime]:
    """(the team's runtime, the roles' runtime) for ``provider``.

    ``offline``: the simulated team's runtime (its injected faults kept in ``faults_file``)
    and the offline playbooks. ``anthropic``: the
    Messages API for both (needs ``ANTHROPIC_API_KEY``). ``claude-agent-sdk``: the Claude Code
    CLI for both. ``record`` (a cassette file) runs both on the Messages API and stores every
    exchange; ``replay`` serves both from a recorded cassette, with no key and no network;
    either one wins over ``provider``.

    Raises:
        ConfigurationError: the provider cannot be used here (no key, no SDK), or both
            ``record`` and ``replay`` are given, saying why.
        CassetteError: the cassette cannot be read or recorded into, naming it.
    """
    if record is not None and replay is not None:
        raise ConfigurationError("give --record or --replay, not both")
    if replay is not None:
        from agentmend.infrastructure.llm.cassette import ReplayRuntime

        replaying = ReplayRuntime(replay)
        return replaying, replaying
    if record is not None:
        from agentmend.infrastructure.llm.cassette import RecordingRuntime

        recording = RecordingRuntime(record)  # raises without a key
        return recording, recording
    if provider == "offline":
        from agentmend.infrastructure.llm.offline import OfflineRuntime
        from agentmend.infrastructure.simulation import SimulatedRuntime
        from agentmend.roles.playbooks import offline_policies

        return SimulatedRuntime(seed, faults_file=faults_file), OfflineRuntime(offline_policies())
    if provider == "anthropic":
        from agentmend.infrastructure.llm.anthropic_runtime import AnthropicRuntime

        anthropic_runtime = AnthropicRuntime()  # raises without a key
        return anthropic_runtime, anthropic_runtime
    if provider == "claude-agent-sdk":
        from agentmend.infrastructure.llm.claude.runtime import ClaudeAgentRuntime

        try:
            cli_runtime = ClaudeAgentRuntime()
        except ImportError as exc:
            raise ConfigurationError(f"provider claude-agent-sdk: {exc}") from exc
        return cli_runtime, cli_runtime
    raise ConfigurationError(
        f"unknown provider {provider!r}: use offline, anthropic or claude-agent-sdk"
    )


class Workspace:
    """An open workspace: its settings, store, improvement manager, monitor and team folder.

    Use :meth:`open`; close it (or use it as a context manager) to stop the monitor's flusher
    and close the store.
    """

    def __init__(
        self,
        path: Path,
        settings: Settings,
        store: Store,
        manager: ImprovementManager,
        monitor: PerformanceMonitor,
        team_dir: Path,
    ) -> None:
        self.path = path
        self.settings = settings
        self.store = store
        self.manager = manager
        self.monitor = monitor
        self.team_dir = team_dir
        self._runtimes: list[AgentRuntime] = []
        self._orchestrators: list[MetaOrchestrator] = []
        self._closed = False
        policy = RetentionPolicy.of(settings)
        # old runs and decisions are pruned in the background when a policy is set
        self._sweeper = RetentionSweeper(store, policy) if policy.enabled else None

    @classmethod
    def open(
        cls,
        path: str | Path | None = None,
        *,
        settings: Settings | None = None,
        create: bool = True,
        team_dir: str | Path | None = None,
        interactive: bool = False,
        baseline_default: int | None = None,
    ) -> Workspace:
        """Open (and with ``create``, make) the workspace at ``path``.

        Args:
            path: the folder; default ``settings.workspace`` (``AGENTMEND_WORKSPACE``, else
                ``./.agentmend``).
            settings: default ``Settings()`` (read from ``AGENTMEND_*``); its ``workspace``
                is set to ``path``.
            create: make the folder, the store and the simulated team when missing.
            team_dir: the team's definitions to use instead of ``<workspace>/agents``
                (nothing is copied there).
            interactive: the interactive session's workspace: the improvement budget is per
                session (``max_improvements_per_session``) rather than a rolling window.
            baseline_default: the detection baseline to record when the store has none and
                ``settings`` does not set one (the store's is used otherwise: see
                :mod:`agentmend.infrastructure.detection.team_baseline`).

        Raises:
            TeamDirError: ``team_dir`` is missing, a file, or holds no definitions (checked
                first: nothing is created then).
            WorkspaceError: the folder is missing (without ``create``) or is a file, the store
                is not an agentmend database, or the workspace's own team folder has no
                definitions.
        """
        base = settings if settings is not None else load_settings()
        folder = Path(path) if path is not None else base.workspace
        settings = base.model_copy(update={"workspace": folder})
        if team_dir is not None:
            _check_team_dir(Path(team_dir))
        if folder.exists() and not folder.is_dir():
            raise WorkspaceError(folder, "it is a file, not a folder")
        if not folder.exists() and not create:
            raise WorkspaceError(folder, "the folder does not exist")
        team = Path(team_dir) if team_dir is not None else folder / TEAM_DIR_NAME
        try:  # before anything is made: a store given that is not the recorded one is refused
            location = store_for(folder, settings.store_url)
        except AgentmendError as exc:
            raise WorkspaceError(folder, str(exc)) from exc
        opened: list[Any] = []
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if team_dir is None and create and not any(team.glob("*.md")):
                from agentmend.infrastructure.simulation import copy_team

                copy_team(team)
            if not team.is_dir() or not any(team.glob("*.md")):
                raise WorkspaceError(folder, f"no agent definitions (*.md) in {team}")
            store = Store(
                location,
                files_dir=folder,
                timeouts=StoreTimeouts.from_settings(settings),
            )
            opened.append(store)
            settings = settle_team_baseline(store, settings, default=baseline_default)
            key = settings.audit_hmac_key
            manager = ImprovementManager(
                store=store,
                max_improvements_per_session=settings.max_improvements_per_session,
                # the interactive session keeps a budget per session; a process that
                # runs for days (the MCP server, library use) gets the rolling one
                improvement_window_s=None if interactive else settings.improvement_window_s,
                max_improvements_per_window=settings.max_improvements_per_window,
                audit_hmac_key=key.get_secret_value() if key is not None else None,
                limits=InputLimits.of(settings),
            )
            # the manager settled the unproven changes of processes gone; now the code plans
            # they were executing (every face opens here, so every start settles them)
            settle_interrupted_plans(manager)
            # a change watched on live runs is not undone but continued: judged on the runs
            # recorded so far, so a watch whose process died is decided here if it can be
            ChangeWatcher(manager).continue_all()
            monitor = PerformanceMonitor(store, **monitor_options(settings))
            # the detector's tables exist from the open on, so that a request that fails later
            # (an unknown agent, say) leaves the store as it found it
            IssueLedger(store)
            if needs_record(folder, settings.store_url):
                # the first open given a store records it: every face opened here later
                # finds it, whoever starts it and with whatever environment
                record_store(folder, location)
        except WorkspaceError:
            _close_all(opened)
            raise
        except (AgentmendError, OSError, sqlite3.Error) as exc:
            _close_all(opened)
            raise WorkspaceError(folder, str(exc)) from exc
        return cls(folder, settings, store, manager, monitor, team)

    @property
    def store_path(self) -> Path:
        return self.store.path

    def runtimes(self, *, seed: int = 0) -> tuple[AgentRuntime, AgentRuntime]:
        """(team runtime, roles runtime) of the configured provider; closed with the workspace.

        Raises:
            ConfigurationError: the provider cannot be used (no key, ...).
        """
        team, roles = build_runtimes(
            self.settings.provider,
            seed=seed,
            faults_file=self.path / FAULTS_NAME,
            record=self.settings.record,
            replay=self.settings.replay,
        )
        for runtime in (team, roles):  # the setting the role gate judges by, enforced alike
            if isinstance(runtime, RuntimeBase):
                runtime.read_only_tools = self.settings.read_only_tools
        self._runtimes.extend(r for r in {id(team): team, id(roles): roles}.values())
        return team, roles

    def orchestrator(
        self,
        *,
        team_runtime: AgentRuntime | None = None,
        roles_runtime: AgentRuntime | None = None,
        seed: int = 0,
        releases: ReleaseFollower | None = None,
        **options: Any,
    ) -> MetaOrchestrator:
        """A ``MetaOrchestrator`` on this workspace's store, monitor and team folder.

        Runtimes default to the configured provider's (``runtimes``). ``options`` go to
        ``MetaOrchestrator.for_team`` (``auto_improve``, ``approval_callback``,
        ``confirm_cycle``, ``on_progress``, ``principal``, ...). It shares the workspace's
        store and monitor and does not close them. ``releases``: serve each run from the
        release its routing key draws (``agentmend.faces.release_serving``); cycles still
        change the team folder.

        Raises:
            ConfigurationError: the provider cannot be used, or the team folder is invalid.
        """
        from agentmend.loop.meta_orchestrator import MetaOrchestrator
        from agentmend.roles.team import AgentTeam

        if team_runtime is None or roles_runtime is None:
            default_team, default_roles = self.runtimes(seed=seed)
            team_runtime = team_runtime or default_team
            roles_runtime = roles_runtime or default_roles
        team = AgentTeam(self.team_dir, team_runtime, monitor=self.monitor, releases=releases)
        orchestrator = MetaOrchestrator.for_team(
            team,
            roles_runtime=roles_runtime,
            store=self.store,
            settings=self.settings,
            manager=self.manager,
            **options,
        )
        self._orchestrators.append(orchestrator)
        return orchestrator

    def close(self) -> None:
        """Flush and stop the monitor, close the store. Idempotent.

        Runtimes holding network clients are closed by :meth:`aclose`.
        """
        if self._closed:
            return
        self._closed = True
        for orchestrator in self._orchestrators:
            orchestrator.close()
        if self._sweeper is not None:
            self._sweeper.close()
        self.monitor.close()
        self.manager.close()
        self.store.close()

    async def aclose(self) -> None:
        """Close the runtimes this workspace built (HTTP clients, CLI homes), then :meth:`close`."""
        runtimes, self._runtimes = self._runtimes, []
        for runtime in runtimes:
            closer = getattr(runtime, "aclose", None)
            if closer is not None:
                await closer()
        self.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Workspace:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _close_all(opened: list[Any]) -> None:
    for thing in reversed(opened):
        thing.close()
