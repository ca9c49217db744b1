"""The MCP server: agentmend's workspace as five orthogonal tools over stdio.

Run ``python -m agentmend.mcp_server`` (or the ``agentmend-mcp`` console script) from the project
an editor or agent works on. It opens the same workspace as the interactive session
(``--workspace``, else ``AGENTMEND_WORKSPACE``, else ``./.agentmend``) and serves, following
the rule that fewer, orthogonal tools make more workflows possible:

- ``self_improve``: code-level updates of the project: ``action`` plan |
  approve | execute | status | rollback, with ``planId``, ``description``, ``files``
  (``path``, ``operation`` create | modify | delete, ``content``) or ``diff``, and ``reason``.
  ``approve`` IS the human approval: the person (or the agent acting for them) who calls it
  approves that plan. ``execute`` runs the supervisor review, applies the plan as one change
  group, compiles and runs the configured tests, and rolls everything back on failure.
- ``analyze``: ``agent`` -> detection and the Socratic mediator's root-cause analysis, applying
  nothing (``reproduce``: run the agent's eval suite first); or ``path`` (and ``description``)
  -> a code-smell analysis (or a proposed diff), which needs a model runtime. It is
  not marked read-only: it changes no definition and no code, but it runs the agents (the
  mediator's questions are runs of the agent on a model provider, ``reproduce`` runs the eval
  suite, each with the agent's own tools) and records what it did. It is marked
  non-destructive instead.
- ``run``: ``prompt`` (and ``agent``) -> the team's answers, every run recorded; detection looks,
  nothing is applied. When the team has releases the server is a worker: it follows them
  (``--follow-releases``, ``--release``; see ``agentmend.faces.release_serving``) and each call is
  served by the release its ``routingKey`` draws (a random key when none is given), the canary
  for its share; the answer names the release and arm.
- ``status``: each agent's metrics, pending plans, the last execution and the last cycle, and
  the release served (or that the store is out of reach and the last release runs on).
- ``memory``: ``query`` history | decisions | audit | config.

Errors: a request that cannot be carried out (unknown action, missing ``planId``, unknown agent,
path outside the project root, ...) is an ``isError`` result naming what was wrong, and writes
nothing; a workspace that cannot be opened makes every call such an error, naming the problem,
and the server keeps running (each call tries to open it again). A request over
``Settings.max_request_bytes`` or nested deeper than ``Settings.max_request_depth`` is answered
with a JSON-RPC error by the pre-filter in front of the SDK's stdin reader
(:mod:`agentmend.faces.mcp.stdin`) and never parsed. Only the protocol writes to stdout: logging
goes to stderr, configured before anything logs.
"""

import argparse
import asyncio
import os
import select
import sys
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from agentmend.faces.mcp.options import PROJECT_ROOT_ENV, add_server_arguments
from agentmend.faces.mcp.results import ToolOutput
from agentmend.faces.mcp.stdin import serve_stdio
from agentmend.faces.mcp.tools import AgentmendTools, BadRequest, FileArg
from agentmend.infrastructure.errors import AgentmendError
from agentmend.infrastructure.redaction import redact
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

__all__ = [
    "DEFAULT_WORKSPACE",
    "PROJECT_ROOT_ENV",
    "add_server_arguments",
    "build_server",
    "main",
    "run",
]

log = get_logger(__name__)

SERVER_NAME = "agentmend"
DEFAULT_WORKSPACE = ".agentmend"

Action = Literal["plan", "approve", "execute", "status", "rollback"]
IssueAction = Literal["list", "approve", "decline"]
MemoryQuery = Literal["history", "decisions", "audit", "config"]


# -- the protocol --------------------------------------------------------------------------

_INSTRUCTIONS = (
    "agentmend keeps a team of LLM agents healthy and updates this project's code safely. "
    "self_improve: plan a code change (files or a unified diff), approve it (your approval is "
    "the human approval), execute it (reviewed, applied with backups, compiled and tested, "
    "rolled back automatically on failure), check status, or roll it back with a reason. "
    "analyze: diagnose an agent (nothing is applied; reproduce=true runs its eval suite first) "
    "or a project file. run: ask the team (routingKey: a user or conversation id keeps one "
    "caller on one release). status: agents' "
    "health, pending plans, the last cycle. memory: history, decisions, audit or config."
)


def build_server(tools: AgentmendTools) -> "MCPServer":
    """The MCP server exposing ``tools`` (imports the ``mcp`` SDK)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import ValidationError

    server: MCPServer = MCPServer(SERVER_NAME, instructions=_INSTRUCTIONS, log_level="WARNING")

    async def answer(call: Awaitable[ToolOutput]) -> CallToolResult:
        # everything said to the model passes the one redaction: no store password reaches it
        try:
            out = await call
        except AgentmendError as exc:  # every expected failure, named (BadRequest and the rest)
            raise ToolError(redact(str(exc))) from exc
        except ValidationError as exc:
            raise ToolError(redact(f"invalid arguments: {exc}")) from exc
        return CallToolResult(
            content=[TextContent(type="text", text=redact(out.text))],
            structured_content=_redacted(out.data),
        )

    @server.tool(
        name="self_improve",
        annotations=ToolAnnotations(destructive_hint=True, open_world_hint=False),
        structured_output=False,
    )
    async def self_improve(
        action: Annotated[Action, Field(description="The action to perform")],
        planId: Annotated[  # the name existing MCP clients send
            str | None, Field(description="ID of the plan (approve, execute; rollback: optional)")
        ] = None,
        description: Annotated[
            str | None, Field(description="Description of the improvement (plan)")
        ] = None,
        files: Annotated[
            list[FileArg] | None, Field(description="Files to create, modify or delete (plan)")
        ] = None,
        diff: Annotated[
            str | None,
            Field(description="A unified diff against the project, instead of files (plan)"),
        ] = None,
        reason: Annotated[str | None, Field(description="Reason for the rollback")] = None,
    ) -> CallToolResult:
        """Safely modify this project's code with review, backups, tests and automatic rollback.

        Actions:
        - plan: create a plan (description + files, or description + diff); nothing is written
        - approve: approve a plan for execution (this is the human approval)
        - execute: run an approved plan: supervisor review, apply all files as one group with
          backups, compile changed Python, run the configured tests; any failure rolls every
          file back byte for byte (the result says ROLLBACK PERFORMED)
        - status: pending plans, last execution, active improvement
        - rollback: undo a completed plan (planId, default the newest) with a reason

        Paths are relative to the project root; allowed: .py .md .json .yaml .yml .toml .txt.
        """
        return await answer(tools.self_improve(action, planId, description, files, diff, reason))

    @server.tool(
        name="analyze",
        # not read-only: the agents run (questions; with reproduce, the eval suite) and the
        # analysis is recorded; nothing is applied, hence not destructive
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, open_world_hint=False
        ),
        structured_output=False,
    )
    async def analyze(
        agent: Annotated[
            str | None, Field(description="An agent of the team: diagnose it (applies nothing)")
        ] = None,
        path: Annotated[
            str | None, Field(description="A project file: analyze it for bugs and design debt")
        ] = None,
        description: Annotated[
            str | None,
            Field(description="With path: propose a diff for this improvement (not applied)"),
        ] = None,
        reproduce: Annotated[
            bool,
            Field(
                description="With agent: first run the agent's eval suite as it is now (model "
                "calls and tool use by the agent) so the diagnosis rests on fresh runs"
            ),
        ] = False,
    ) -> CallToolResult:
        """Diagnose an agent or analyze a project file. Applies no change.

        - agent: run detection and the Socratic mediator (it questions the agents; on a model
          provider each question runs the agent) and return the issue report and the
          root-cause analysis: responsible agent, cause, confidence, evidence,
          recommendations. With reproduce=true the agent first runs its eval suite (else one
          sample query): real runs of the agent, with its tools, recorded apart from
          detection. The analysis is recorded in memory (decisions).
        - path (+ description): code-smell findings for a project file, or a proposed unified
          diff for the described improvement (needs a model provider, not the offline one).
        """
        return await answer(tools.analyze(agent, path, description, reproduce))

    @server.tool(
        name="run",
        # the agents run and the runs are recorded; nothing is changed, hence not destructive
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, open_world_hint=False
        ),
        structured_output=False,
    )
    async def run(
        prompt: Annotated[str, Field(description="The task or question for the team")],
        agent: Annotated[
            str | None, Field(description="Run only this agent (default: every agent)")
        ] = None,
        routingKey: Annotated[  # camelCase, as the other tools' arguments
            str | None,
            Field(
                description="Picks the release that serves this call when the team has a "
                "canary: a user or conversation id keeps one caller on one release (default: "
                "a random key per call)"
            ),
        ] = None,
    ) -> CallToolResult:
        """Run the team (or one agent) on a prompt and return the answers.

        Every run is recorded and detection looks at it; no change is applied. When the team
        publishes releases, the call is served by the release its routingKey draws (the
        canary for its share of keys, else the stable release) and the answer says which.
        """
        return await answer(tools.run(prompt, agent, routingKey))

    @server.tool(
        name="status",
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
        structured_output=False,
    )
    async def status() -> CallToolResult:
        """Each agent's health (runs, success rate, p95 latency, detector statistics), pending
        code plans, the last execution and the last improvement cycle."""
        return await answer(tools.status())

    @server.tool(
        name="issue",
        annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False),
        structured_output=False,
    )
    async def issue(
        action: Annotated[IssueAction, Field(description="list, approve or decline")],
        issueId: Annotated[
            str | None, Field(description="The issue the fleet checker asked about")
        ] = None,
    ) -> CallToolResult:
        """The team's fleet checker's questions (agentmend watch --on-issue ask) and answers.

        Actions:
        - list: the questions waiting: may the checker run a cycle for this issue?
        - approve: yes (this is the human approval; the checker runs the cycle at its next
          check, and every other gate of the cycle still holds)
        - decline: no (the checker holds the issue)
        Each answer is an audit row naming who gave it.
        """
        return await answer(tools.issue(action, issueId))

    @server.tool(
        name="memory",
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
        structured_output=False,
    )
    async def memory(
        query: Annotated[
            MemoryQuery,
            Field(description="history (changes), decisions, audit (trail + chain check), config"),
        ],
        agent: Annotated[
            str | None,
            Field(description="Only this agent's entries ('project' for code updates)"),
        ] = None,
        limit: Annotated[int, Field(ge=1, le=200, description="Newest entries to return")] = 20,
    ) -> CallToolResult:
        """Query agentmend's memory: the change history, the decisions taken along the loop,
        the audit trail (with its tamper check), or the configuration and agent definitions."""
        return await answer(tools.memory(query, agent, limit))

    return server


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="agentmend-mcp", description="agentmend's MCP server (stdio)."
    )
    add_server_arguments(parser)
    return parser.parse_args(argv)


# After the client closes stdin: how long the server may take to finish on its own, and then
# how long closing the workspace may take before the process ends regardless.
_EXIT_GRACE_S = 0.4
_CLOSE_GRACE_S = 0.4


def _watch_for_hangup(fd: int, on_hangup: threading.Event) -> None:
    """Set ``on_hangup`` once the client's end of stdin is closed (a daemon thread).

    Polls a duplicate of stdin for the hang-up alone, never reading it, so requests still in
    the pipe stay the SDK's to read. A pipe reports POLLHUP when its last writer closes (even
    with data unread); a socket reports POLLRDHUP. A regular file never hangs up: then the SDK
    reading EOF ends the server the usual way.
    """
    poller = select.poll()
    poller.register(fd, getattr(select, "POLLRDHUP", 0))
    try:
        while True:
            events = poller.poll()
            if any(ev & ~select.POLLIN for _, ev in events):
                on_hangup.set()
                return
    finally:
        os.close(fd)


def _redacted(value: Any) -> Any:
    """``value`` (a tool's data) with every string passed through ``redact``."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(item) for item in value]
    return value


async def _serve(tools: AgentmendTools) -> None:
    server = build_server(tools)
    limits = Settings.model_construct()  # the documented defaults, if the workspace fails
    try:
        limits = tools.workspace().settings  # open now, so a problem shows in the log at once
    except BadRequest as exc:
        log.error("workspace_unavailable", problem=str(exc))
    hangup = threading.Event()
    try:
        watched = os.dup(0) if hasattr(select, "poll") else -1
    except OSError:  # no stdin at all: nothing to watch, the SDK sees EOF at once
        watched = -1
    if watched >= 0 and hasattr(select, "poll"):  # no poll() on Windows
        threading.Thread(
            target=_watch_for_hangup, args=(watched, hangup), name="mcp-stdin-hangup", daemon=True
        ).start()
    serving = asyncio.ensure_future(
        serve_stdio(server, max_bytes=limits.max_request_bytes, max_depth=limits.max_request_depth)
    )
    try:
        while not serving.done() and not hangup.is_set():
            await asyncio.wait({serving}, timeout=0.05)
        if not serving.done():
            await asyncio.wait({serving}, timeout=_EXIT_GRACE_S)
        if serving.done():
            serving.result()
            return
        # Stuck after the client left: replies nobody reads fill stdout and the SDK's writer
        # blocks in a thread for good, so the process would never end. Save the workspace
        # and end the process without waiting for that thread.
        log.warning("mcp_client_gone_with_calls_in_flight")
        serving.cancel()
        await asyncio.wait({asyncio.ensure_future(tools.aclose())}, timeout=_CLOSE_GRACE_S)
        sys.stderr.flush()
        os._exit(0)
    finally:
        await tools.aclose()


def main(argv: list[str] | None = None) -> int:
    """Run the server over stdio until the client closes it."""
    return run(_parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the server with the options of :func:`add_server_arguments` (parsed)."""
    from agentmend.infrastructure.settings import InvalidSetting, load_settings
    from agentmend.infrastructure.structured_logger import configure_logging

    overrides: dict[str, object] = {"store_url": args.store} if args.store else {}
    if args.follow_releases:
        overrides["follow_releases"] = args.follow_releases
    if args.release is not None:
        overrides["serve_release"] = args.release
    try:
        settings = load_settings(**overrides)
    except InvalidSetting as exc:  # one line and exit 2, as every face says it
        sys.stderr.write(f"agentmend-mcp: {exc}\n")
        return 2
    configure_logging(args.log_level, stream=sys.stderr)  # stdout belongs to the protocol
    workspace = args.workspace or os.environ.get("AGENTMEND_WORKSPACE") or DEFAULT_WORKSPACE
    root = args.root or os.environ.get(PROJECT_ROOT_ENV) or Path.cwd()
    tools = AgentmendTools(workspace, project_root=root, settings=settings)
    try:
        asyncio.run(_serve(tools))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
