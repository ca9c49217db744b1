"""What the MCP tools do, independent of the protocol: ``AgentmendTools``.

``agentmend.faces.mcp.server`` exposes these methods as MCP tools; tests call them directly too.
Each returns a ``ToolOutput`` (text for a model to read, plus the same facts as structured data,
shaped by ``agentmend.faces.mcp.results``) or raises an ``AgentmendError`` whose message names what
was wrong (``BadRequest`` for a request that does not fit: a missing field, an unknown agent, ...);
the server turns those into ``isError`` results. Nothing is written for a request that fails.

Opening is lazy and retried: the first call opens the workspace (``agentmend.faces.workspace``); if
it cannot be opened, that call and every later one fail with the problem, until it can. The tools
that only read (``status``, ``memory``, marked ``readOnlyHint``) open an existing workspace and
never create one: on a missing folder or store they fail naming it, and write nothing. The
others (``self_improve``, ``analyze``, ``run``) create it on first use. When the team has
published releases, opening also starts following them (``agentmend.faces.release_serving``):
``run`` is then served by the release its routing key draws, and ``status`` names it; a pinned
release the team does not have makes every call an error naming it. The
provider's runtimes are built the same way: a provider that cannot run (no API key, no SDK) is
tried again by every call that needs a model, so setting the key later needs no restart; calls
that need none (``status``, ``memory``, code plans) work meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from agentmend.faces.mcp.results import (
    ToolOutput,
    agent_analysis_output,
    code_smell_output,
    code_status_output,
    core_update_output,
    execution_output,
    json_text,
    last_cycle,
    plan_approved_output,
    plan_created_output,
    rollback_output,
    run_output,
    status_text,
)
from agentmend.faces.release_serving import (
    ReleaseChanges,
    ServedReleases,
    release_status_data,
    serve_releases,
)
from agentmend.faces.store_record import is_server_url, sqlite_path, store_for
from agentmend.faces.workspace import DB_NAME, Workspace
from agentmend.infrastructure.changes.cycle_requests import (
    AlreadyAnswered,
    CycleRequests,
    read_requests,
)
from agentmend.infrastructure.changes.proposal import GateVerdict, ProposedChange
from agentmend.infrastructure.changes.protocol.decisions import list_decisions, record_decision
from agentmend.infrastructure.code_update.updater import CodeUpdater, FileOperation
from agentmend.infrastructure.definitions.spec import load_agent_specs
from agentmend.infrastructure.errors import (
    AgentmendError,
    NotFound,
    SpecError,
    StoreError,
    WrongArgumentType,
)
from agentmend.infrastructure.limits import InputLimits
from agentmend.infrastructure.llm.base import AgentRuntime
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.redaction import redact_url
from agentmend.infrastructure.releases.routing import new_run_key
from agentmend.infrastructure.settings import Settings, load_settings
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.loop.checker_policies import holding_checker
from agentmend.roles.ask_agent_tool import AskAgentTool
from agentmend.roles.code_review import CodeAnalyst, CodeReviewer
from agentmend.roles.outcomes import QuestionAnswer
from agentmend.roles.team import UnknownAgent

if TYPE_CHECKING:
    from agentmend.loop.meta_orchestrator import MetaOrchestrator

__all__ = ["AgentmendTools", "BadRequest", "FileArg"]

log = get_logger(__name__)


class BadRequest(AgentmendError):
    """A request that cannot be carried out; its message names what was wrong."""


class FileArg(BaseModel):
    """One file of a plan (``self_improve`` ``files`` item)."""

    path: str = Field(description="File path relative to the project root")
    operation: Literal["create", "modify", "delete"]
    content: str | None = Field(
        default=None, description="The whole new file content (for create and modify)"
    )


class _UnavailableReviewer:
    """The supervisor when the configured provider cannot run: every review refuses."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def review(self, change: ProposedChange) -> GateVerdict:
        return GateVerdict(
            gate="code-supervisor", passed=False, reason=f"supervisor unavailable: {self.reason}"
        )


class AgentmendTools:
    """What the tools do, independent of the protocol (tested directly and through MCP).

    Args:
        workspace: the workspace folder (opened on first use and re-tried after a failure).
        project_root: the project code updates and code analysis apply to.
        settings: default ``Settings()`` from ``AGENTMEND_*`` (read when the workspace opens).
        approver: who ``approve`` records as the approving person.
    """

    def __init__(
        self,
        workspace: str | Path,
        *,
        project_root: str | Path | None = None,
        settings: Settings | None = None,
        approver: str = "mcp",
    ) -> None:
        self.workspace_path = Path(workspace).absolute()
        self.project_root = Path(project_root if project_root is not None else Path.cwd())
        self.project_root = self.project_root.absolute()
        self.approver = approver
        self._settings = settings
        self._workspace: Workspace | None = None
        self._runtime_error: str | None = None
        self._team_runtime: AgentRuntime | None = None
        self._roles_runtime: AgentRuntime | None = None
        self._orchestrator: MetaOrchestrator | None = None
        self._served: ServedReleases | None = None
        self._release_changes: ReleaseChanges | None = None
        self._analyze_lock = asyncio.Lock()

    # -- opening ---------------------------------------------------------------------------

    def workspace(self, *, create: bool = True) -> Workspace:
        """The open workspace.

        Args:
            create: make the workspace if it is missing; the read-only tools pass False, so
                asking for a status never leaves a workspace behind.

        Raises:
            BadRequest: it cannot be opened (settings, folder, store; without ``create``, a
                missing folder or store), naming the problem.
        """
        if self._workspace is not None:
            return self._workspace
        if not create:
            self._require_existing()
        try:
            settings = self._settings if self._settings is not None else load_settings()
            workspace = Workspace.open(self.workspace_path, settings=settings, create=create)
        except Exception as exc:  # any failure to open is reported on every call, not fatal
            problem = str(exc) or type(exc).__name__
            if not isinstance(exc, AgentmendError):
                problem = f"{type(exc).__name__}: {problem}"
            if str(self.workspace_path) not in problem:
                problem = f"workspace {self.workspace_path} cannot be opened: {problem}"
            raise BadRequest(problem) from exc
        try:  # a worker asked for a release the team does not have is refused here, named
            self._served = serve_releases(
                workspace,
                face="mcp",
                mode=workspace.settings.follow_releases,
                pin=workspace.settings.serve_release,
            )
        except AgentmendError as exc:
            workspace.close()
            raise BadRequest(f"cannot follow the team's releases: {exc}") from exc
        if self._served is not None:  # what changes from now on, status announces once
            self._release_changes = ReleaseChanges(self._served.follower)
        self._workspace = workspace
        log.info("workspace_opened", path=str(workspace.path), provider=workspace.settings.provider)
        self._build_runtimes()
        return workspace

    def _require_existing(self) -> None:
        """Refuse before opening when opening would create the folder or the store."""
        path = self.workspace_path
        if path.exists() and not path.is_dir():
            return  # Workspace.open names that problem ("it is a file")
        try:
            given = (self._settings if self._settings is not None else load_settings()).store_url
            location = str(store_for(path, given))
            file = None if is_server_url(location) else sqlite_path(location)
        except AgentmendError:
            return  # opening reports the setting, or the workspace's record, that cannot be used
        if not path.exists():
            missing = "the folder does not exist"
        elif file is None:
            return  # a server's store: opening it reads what is there, and creates no file
        elif not file.is_file():
            own = file == (path / DB_NAME).absolute()
            missing = f"it has no store ({DB_NAME if own else redact_url(location)})"
        else:
            return
        raise BadRequest(
            f"workspace {path} cannot be opened: {missing}; status and memory only read a "
            "workspace (self_improve or analyze create one)"
        )

    def _build_runtimes(self) -> str | None:
        """Build the provider's runtimes unless built; the problem if they cannot be (retried
        on every call until they can)."""
        if self._team_runtime is not None or self._workspace is None:
            return self._runtime_error
        workspace = self._workspace
        try:
            self._team_runtime, self._roles_runtime = workspace.runtimes()
        except AgentmendError as exc:
            self._runtime_error = f"provider {workspace.settings.provider}: {exc}"
            log.warning("provider_unavailable", problem=self._runtime_error)
        else:
            self._runtime_error = None
        return self._runtime_error

    def updater(self) -> CodeUpdater:
        workspace = self.workspace()
        problem = self._build_runtimes()
        reviewer = (
            CodeReviewer(self._roles_runtime)
            if problem is None and self._roles_runtime is not None
            else _UnavailableReviewer(problem or "no runtime")
        )
        return CodeUpdater(
            self.project_root,
            manager=workspace.manager,
            reviewer=reviewer,
            settings=workspace.settings,
            protected=(workspace.path, workspace.team_dir),
        )

    def orchestrator(self) -> MetaOrchestrator:
        """The workspace's orchestrator (made on first use), for detection and analysis."""
        workspace = self.workspace()
        if self._orchestrator is None:
            problem = self._build_runtimes()
            if problem is not None:
                raise BadRequest(problem)
            self._orchestrator = workspace.orchestrator(
                team_runtime=self._team_runtime,
                roles_runtime=self._roles_runtime,
                auto_improve=False,
                releases=self._served.follower if self._served is not None else None,
            )
        return self._orchestrator

    async def aclose(self) -> None:
        if self._served is not None:
            self._served.close()  # before the store it polls is closed
            self._served = None
        if self._workspace is not None:
            await self._workspace.aclose()
            self._workspace = None

    # -- self_improve ----------------------------------------------------------------------

    def _check_arguments(self, **arguments: Any) -> None:
        """Refuse any argument over ``Settings.max_tool_argument_bytes`` before any work.

        Raises:
            InputTooLarge: naming the argument, its size and the bound.
        """
        if self._workspace is not None:
            settings = self._workspace.settings
        else:  # the documented defaults until a workspace is open
            settings = self._settings or Settings.model_construct()
        limits = InputLimits.of(settings)
        for name, value in arguments.items():
            limits.tool_argument(name, value)

    async def self_improve(
        self,
        action: str,
        plan_id: str | None = None,
        description: str | None = None,
        files: list[FileArg] | None = None,
        diff: str | None = None,
        reason: str | None = None,
    ) -> ToolOutput:
        self._check_arguments(
            planId=plan_id,
            description=description,
            files=[f.model_dump() for f in files] if files else None,
            diff=diff,
            reason=reason,
        )
        handlers: dict[str, Callable[[], Awaitable[ToolOutput]]] = {
            "plan": lambda: self._plan(description, files, diff),
            "approve": lambda: self._approve(plan_id),
            "execute": lambda: self._execute(plan_id),
            "status": self._code_status,
            "rollback": lambda: self._rollback(plan_id, reason),
        }
        handler = handlers.get(action)
        if handler is None:
            raise BadRequest(
                f"unknown action {action!r}: use plan, approve, execute, status or rollback"
            )
        return await handler()

    async def _plan(
        self, description: str | None, files: list[FileArg] | None, diff: str | None
    ) -> ToolOutput:
        if not description or not description.strip():
            raise BadRequest("description is required for action plan")
        if not files and not (diff and diff.strip()):
            raise BadRequest("files (or diff) is required for action plan")
        updater = self.updater()
        operations = [FileOperation(**f.model_dump()) for f in files or ()]
        plan = await asyncio.to_thread(
            updater.create_plan,
            description,
            operations or None,
            diff=diff,
            created_by=self.approver,
        )
        return plan_created_output(plan)

    def _require_plan_id(self, plan_id: str | None, action: str) -> str:
        if not plan_id or not plan_id.strip():
            raise BadRequest(f"planId is required for action {action}")
        return plan_id.strip()

    async def _approve(self, plan_id: str | None) -> ToolOutput:
        pid = self._require_plan_id(plan_id, "approve")
        updater = self.updater()
        plan = await asyncio.to_thread(updater.approve, pid, approved_by=self.approver)
        return plan_approved_output(plan)

    async def _execute(self, plan_id: str | None) -> ToolOutput:
        pid = self._require_plan_id(plan_id, "execute")
        result = await self.updater().execute(pid)
        return execution_output(result)

    async def _code_status(self) -> ToolOutput:
        status = await asyncio.to_thread(self.updater().status)
        return code_status_output(status)

    async def _rollback(self, plan_id: str | None, reason: str | None) -> ToolOutput:
        if not reason or not reason.strip():
            raise BadRequest("reason is required for action rollback")
        updater = self.updater()
        pid = plan_id.strip() if plan_id and plan_id.strip() else None
        result = await asyncio.to_thread(
            updater.rollback, pid, reason=reason, requested_by=self.approver
        )
        return rollback_output(result)

    # -- analyze ---------------------------------------------------------------------------

    async def analyze(
        self,
        agent: str | None = None,
        path: str | None = None,
        description: str | None = None,
        reproduce: bool = False,
    ) -> ToolOutput:
        """Diagnose an agent (``reproduce``: run its eval suite first) or analyze a file.

        Nothing is applied. Without ``reproduce`` the diagnosis uses what is recorded and the
        mediator's questions (on a model provider, each question is a run of the agent); with
        it, the agent first runs its eval suite (else the sample query) as it is now: model
        calls and tool use by the agent, recorded apart from detection.
        """
        self._check_arguments(agent=agent, path=path, description=description)
        if agent and path:
            raise BadRequest("give agent (an agent's name) or path (a project file), not both")
        if path:
            if reproduce:
                raise BadRequest("reproduce goes with agent (run that agent's eval suite)")
            return await self._analyze_code(path, description)
        if description:
            raise BadRequest("description goes with path (propose a code update for that file)")
        if not agent or not agent.strip():
            raise BadRequest("agent is required (or path, to analyze a project file)")
        return await self._analyze_agent(agent.strip(), reproduce=reproduce)

    async def _analyze_agent(self, name: str, *, reproduce: bool) -> ToolOutput:
        orchestrator = self.orchestrator()
        async with self._analyze_lock:  # the mediator is one conversation at a time
            await asyncio.to_thread(orchestrator.team.reload)
            if name not in orchestrator.team:
                raise BadRequest(str(UnknownAgent(name, orchestrator.team.names)))
            orchestrator.monitor.refresh()  # runs the session recorded since
            issue = await orchestrator.issue_for(
                name, requested_by="an MCP client", reproduce=reproduce
            )
            detected = issue.detector != "request"
            mediator = orchestrator.mediator
            questions: list[QuestionAnswer] = []
            mediator.ask_agent_tool = AskAgentTool(orchestrator.team.ask_agent_registry())
            mediator.on_question = questions.append
            try:
                analysis = await mediator.analyze_issue(issue)
            finally:
                mediator.on_question = None
        output = agent_analysis_output(
            name, issue, analysis, questions, detected=detected, reproduced=reproduce
        )
        record_decision(
            orchestrator.store,
            "mcp.analyze",
            agent_name=name,
            payload={k: output.data[k] for k in ("detected", "issue", "analysis")},
        )
        return output

    async def _analyze_code(self, path: str, description: str | None) -> ToolOutput:
        workspace = self.workspace()
        problem = self._build_runtimes()
        if problem is not None:
            raise BadRequest(f"code analysis needs a model, and {problem}")
        analyst = CodeAnalyst(
            self._roles_runtime,
            self.project_root,
            protected=(workspace.path, workspace.team_dir),
        )
        if description is not None:
            return core_update_output(await analyst.propose_core_update(path, description))
        return code_smell_output(await analyst.analyze_code_smell(path))

    # -- run -------------------------------------------------------------------------------

    async def run(
        self, prompt: str, agent: str | None = None, routing_key: object = None
    ) -> ToolOutput:
        """Run the team (or one ``agent``) on ``prompt``, recorded; detection looks, nothing
        is applied. With releases, ``routing_key`` picks the release (None: a random key).

        Raises:
            WrongArgumentType: ``routing_key`` is not a string.
        """
        self._check_arguments(prompt=prompt, agent=agent, routingKey=routing_key)
        if routing_key is not None and not isinstance(routing_key, str):
            raise WrongArgumentType("routing key", routing_key, "must be a string (a user id)")
        if not prompt or not prompt.strip():
            raise BadRequest("prompt is required")
        orchestrator = self.orchestrator()
        key = routing_key if routing_key is not None else new_run_key()
        if agent is not None:
            if agent not in orchestrator.team:
                raise BadRequest(str(UnknownAgent(agent, orchestrator.team.names)))
            result = await orchestrator.team.run(agent, prompt, routing_key=key)
            results, issues, notice = {agent: result}, [], None
            checker = None
        else:
            task = await orchestrator.execute_task(prompt, routing_key=key)
            results, issues, notice = task.results, task.issues, task.store_notice
            checker = task.checker
        choice = self._served.follower.chosen(key) if self._served is not None else None
        return run_output(
            results,
            issues,
            release=choice.tags() if choice is not None else None,
            routing_key=routing_key,
            store_notice=notice,
            checker=checker.as_json() if agent is None and checker is not None else None,
        )

    async def issue(self, action: str, issue_id: str | None = None) -> ToolOutput:
        """The fleet checker's questions (``list``), or a person's answer to one (``approve``,
        ``decline``: audited as this server's ``approver``)."""
        self._check_arguments(issueId=issue_id)
        workspace = self.workspace(create=False)
        if action == "list":
            asked = read_requests(workspace.store, states=("asked",))
            data = {"questions": [r.as_json() for r in asked]}
            text = "\n".join(
                f"issue {r.issue_id}: a cycle for {r.agent} ({r.kind})? asked by {r.asked_by}"
                for r in asked
            )
            return ToolOutput(text=text or "No question from a fleet checker is waiting", data=data)
        if action not in ("approve", "decline"):
            raise BadRequest(f"unknown action {action!r}: use list, approve or decline")
        if not issue_id:
            raise BadRequest(f"issueId is required to {action}")
        who = Principal(user_id=self.approver, name=f"{self.approver} (MCP)")
        try:
            request = await asyncio.to_thread(
                CycleRequests(workspace.store).answer,
                issue_id,
                approve=action == "approve",
                by=who,
                audit=workspace.manager.audit,
            )
        except (NotFound, AlreadyAnswered) as exc:
            raise BadRequest(str(exc)) from exc
        return ToolOutput(
            text=f"issue {request.issue_id}: a cycle for {request.agent} {request.state}",
            data={"request": request.as_json()},
        )

    # -- status and memory -----------------------------------------------------------------

    async def status(self) -> ToolOutput:
        workspace = self.workspace(create=False)
        unreachable: str | None = None  # the store's error: what only it knows is left out
        try:
            workspace.monitor.refresh()
        except StoreError as exc:  # the runs this process made are still counted
            unreachable = str(exc)
        broken: dict[str, SpecError] = {}
        try:
            specs = sorted(load_agent_specs(workspace.team_dir, broken=broken))
        except AgentmendError as exc:
            raise BadRequest(f"the team's definitions cannot be loaded: {exc}") from exc
        metrics = workspace.monitor.get_metrics()
        detector = self._orchestrator.detector if self._orchestrator is not None else None
        agents = []
        for name in sorted(set(specs) | set(metrics)):
            m = metrics.get(name)
            entry: dict[str, Any] = {"name": name, "defined": name in specs}
            if m is not None:
                entry.update(
                    executions=m.executions,
                    success_rate=round(m.success_rate, 4),
                    p95_duration_ms=round(m.p95_duration_ms, 1),
                    avg_duration_ms=round(m.avg_duration_ms, 1),
                    consecutive_failures=m.consecutive_failures,
                    last_error=m.last_error,
                )
            else:
                entry["executions"] = 0
            stats = detector.statistics(name) if detector is not None else None
            if stats is not None:
                entry["detector"] = stats
            agents.append(entry)
        for stem, error in sorted(broken.items()):
            agents.append({"name": stem, "defined": False, "executions": 0, "broken": str(error)})
        unwritten, write_error = workspace.monitor.write_backlog()
        stored: dict[str, Any] = {}
        if unreachable is None:
            try:
                stored = await self._stored_status(workspace)
            except StoreError as exc:
                unreachable = str(exc)
        served = self._served.follower.status() if self._served is not None else None
        changes = self._release_changes.since_last_look() if self._release_changes else []
        data = {
            "workspace": str(workspace.path),
            "provider": workspace.settings.provider,
            "releases": release_status_data(served) if served is not None else None,
            "releaseChanges": changes,
            "projectRoot": str(self.project_root),
            "agents": agents,
            **stored,
            "storeUnreachable": unreachable,
            "unwrittenRuns": unwritten,
            "storeWriteError": write_error,
            "refusedRuns": workspace.monitor.backlog_status().refused,
        }
        return ToolOutput(text=status_text(data, agents, data.get("lastCycle")), data=data)

    async def _stored_status(self, workspace: Workspace) -> dict[str, Any]:
        """The part of ``status`` only the store knows: plans, the last cycle, changes, audit.

        Raises:
            StoreError: the store cannot be reached.
        """
        chain = workspace.manager.verify_audit_chain(repair=False)
        holder = holding_checker(workspace.store, workspace.team_dir)
        asked = (
            read_requests(workspace.store, team_id=holder.team_id, states=("asked",))
            if holder is not None
            else []
        )
        return {
            **(await self._code_status()).data,
            # while a fleet checker holds the team, its issues are left to it
            "fleetChecker": holder.as_json() if holder is not None else None,
            "checkerQuestions": [r.as_json() for r in asked],
            "lastCycle": last_cycle(workspace.store),
            "changes": workspace.manager.get_statistics(),
            "audit": {
                "ok": chain.ok,
                "rows_checked": chain.rows_checked,
                "problems": [f"{p.row_id}: {p.kind}: {p.detail}" for p in chain.problems],
            },
        }

    async def memory(self, query: str, agent: str | None = None, limit: int = 20) -> ToolOutput:
        if query not in ("history", "decisions", "audit", "config"):
            raise BadRequest(f"unknown query {query!r}: use history, decisions, audit or config")
        if not 1 <= limit <= 200:
            raise BadRequest(f"limit must be between 1 and 200, got {limit}")
        workspace = self.workspace(create=False)
        if query == "history":
            items: Any = [r.to_dict() for r in workspace.manager.get_history(agent, limit)]
            data = {"query": query, "items": items}
        elif query == "decisions":
            decisions = list_decisions(workspace.store, agent_name=agent, limit=limit)
            items = [
                {"id": d.id, "timestamp": d.timestamp.isoformat(), "kind": d.kind,
                 "agent_name": d.agent_name, "payload": d.payload}
                for d in decisions
            ]  # fmt: skip
            data = {"query": query, "items": items}
        elif query == "audit":
            entries = workspace.manager.audit.entries(agent_name=agent, limit=limit)
            items = [
                {"id": e.id, "timestamp": e.timestamp.isoformat(), "agent_name": e.agent_name,
                 "edit_type": e.edit_type, "old_value": e.old_value, "new_value": e.new_value,
                 "user_id": e.user_id, "user_name": e.user_name, "change_id": e.change_id,
                 "db_role": e.db_role}
                for e in entries
            ]  # fmt: skip
            chain = workspace.manager.verify_audit_chain(repair=False)
            data = {
                "query": query,
                "items": items,
                "chain": {
                    "ok": chain.ok,
                    "rows_checked": chain.rows_checked,
                    "problems": [f"{p.row_id}: {p.kind}: {p.detail}" for p in chain.problems],
                },
            }
        else:
            data = {"query": query, **_config(workspace, self.project_root, agent)}
        count = len(data.get("items", ()))
        head = f"memory {query}" + (f" for {agent}" if agent else "")
        head += f": {count} item(s)" if "items" in data else ""
        return ToolOutput(text=f"{head}\n{json_text(data)}", data=data)


def _config(workspace: Workspace, root: Path, agent: str | None) -> dict[str, Any]:
    from agentmend.roles.supervisor import agent_config

    settings = workspace.settings.shown()
    specs = load_agent_specs(workspace.team_dir)
    if agent is not None:
        if agent not in specs:
            raise BadRequest(str(UnknownAgent(agent, sorted(specs))))
        specs = {agent: specs[agent]}
    return {
        "workspace": str(workspace.path),
        "store": workspace.store.display,
        "team_dir": str(workspace.team_dir),
        "project_root": str(root),
        "settings": settings,
        "agents": {name: agent_config(spec) for name, spec in sorted(specs.items())},
    }
