"""``ClaudeAgentRuntime``: agents run by the Claude Code CLI through ``claude_agent_sdk.query``.

Each ``run`` starts the CLI bundled with the SDK (one process per run, about half a second of
start-up that is the CLI's own), serves the agent's ``ToolSpec``s from an in-process MCP server
and turns the CLI's ``ResultMessage`` into an ``AgentResult``. ``claude_agent_sdk`` is imported
only when a runtime is constructed.

How a run is set up:

- Tools: the ``ToolSpec``s become one in-process server (``create_sdk_mcp_server``) named
  ``agentmend``, so the model sees ``mcp__agentmend__<name>``; results and records use the bare
  name. Built-in tools are off (``tools=[]``) unless the spec lists them (``Read``, ``Grep``).
- Permissions: ``infrastructure.permissions.allowed_tools`` turns the spec's profile into the
  ``allowed_tools`` list; any other call reaches ``can_use_tool``, which refuses it with a
  message naming the profile. Refusals are in ``AgentResult.permission_denials`` (a denial is
  reported, not an error: the agent saw the refusal and carried on).
- Isolation: no settings files (``setting_sources=[]``), no skills, no other MCP configs,
  no session files (``--no-session-persistence``), thinking off (the Anthropic runtime does not
  think either), ``HOME`` and the working directory in a private temporary directory.
- Environment: base URL, key, ``HOME``, ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``,
  ``CLAUDE_CODE_MAX_RETRIES`` (when ``max_retries`` is given) and
  ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` (the spec's ``max_tokens``) go to the CLI through
  ``ClaudeAgentOptions(env=...)``; ``os.environ`` is never changed.

Wire facts (claude-agent-sdk 0.2.187, CLI 2.1.330, observed against a local fake server):

- The CLI posts ``/v1/messages?beta=true`` with ``stream: true``. It prepends its own system
  blocks (a billing header, "You are a Claude agent, built on Anthropic's Claude Agent SDK.")
  before ours, and puts ``<system-reminder>`` text blocks before the prompt and after the last
  tool result of a request.
- ``temperature`` cannot be set: with thinking off the CLI always sends ``temperature: 1``. A
  spec's ``temperature`` is ignored by this runtime.
- A tool named in ``allowed_tools`` is approved before ``can_use_tool`` is asked (the SDK warns
  with ``CanUseToolShadowedWarning``, which is exactly the intent here, so it is filtered).
  ``StructuredOutput`` is always approved. A refused call shows in
  ``ResultMessage.permission_denials`` as ``{"tool_name", "tool_use_id", "tool_input"}``.
- Structured output: ``output_format`` makes the CLI offer ``StructuredOutput`` and validate the
  model's input against the schema itself, retrying up to 5 times (then the result subtype is
  ``error_max_structured_output_retries``). A model that answers in text is asked once more;
  if it still does not call the tool the run "succeeds" with ``structured_output=None``.
- A reply cut at ``max_tokens`` is continued by the CLI (it sends "Output token limit hit.
  Resume directly ..."), so truncation rarely reaches the result.
- A failed API call ends the run with a ``ResultMessage`` whose ``is_error`` is true, subtype
  ``success``, ``terminal_reason="api_error"`` and ``api_error_status`` (the HTTP status; the raw
  frame also has ``api_error_type``, e.g. ``overloaded_error``), then the SDK raises
  ``ResultError`` carrying that frame. A connection failure has no status. The CLI retries
  5xx/429/529 with backoff (for minutes) unless ``CLAUDE_CODE_MAX_RETRIES=0``.
- ``max_turns`` ends with subtype ``error_max_turns`` / ``terminal_reason="max_turns"``.
- On cancellation the SDK closes the CLI's stdin and waits up to 5 s for it to exit before
  sending SIGTERM (the CLI does not exit on EOF while a request is in flight). To end a timed
  out or cancelled run at once, every run carries a marker variable (``AGENTMEND_RUN_ID``) in the
  CLI's environment; on abort the runtime finds its child process by that marker (Linux
  ``/proc``) and sends SIGTERM, then SIGKILL after a grace period. Elsewhere the SDK's own
  close still stops the process, only later.

Error mapping (the same kinds as the Anthropic runtime), from structured fields only:
``api_error_status`` 429 -> RATE_LIMIT; 529 or ``api_error_type == "overloaded_error"`` ->
OVERLOADED; other 5xx -> SERVER_ERROR; 401/403 -> AUTHENTICATION; 408 -> TIMEOUT; 404 with the
CLI's ``model_not_found`` assistant error -> MODEL_NOT_FOUND; other 4xx -> BAD_REQUEST; an API
error with no status -> CONNECTION; ``error_max_turns`` -> MAX_TURNS; structured output retries
exhausted, missing or not valid for the output type -> OUTPUT_INVALID; an aborted turn ->
CANCELLED; the run's ``timeout_s`` -> TIMEOUT; other SDK errors (process exit, connection to the
CLI, unreadable output) -> RUNTIME. A CLI that cannot be found raises ``ConfigurationError``:
it is the installation's fault, not the agent's. Cancelling the task that awaits ``run``
re-raises ``CancelledError`` once the CLI is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from pydantic import ValidationError

from infrastructure.errors import AgentRunError, ConfigurationError, ErrorKind
from infrastructure.llm.base import (
    AgentResult,
    OutputT,
    RuntimeBase,
    ToolCallRecord,
    ToolError,
    ToolSpec,
    Usage,
)
from infrastructure.llm.network_guard import refuse_real_api_under_tests
from infrastructure.llm.tool_loop import OUTPUT_TOOL_NAME, index_tools
from infrastructure.permissions import allowed_tools, describe_profile

if TYPE_CHECKING:
    from claude_agent_sdk import (
        CanUseTool,
        ClaudeAgentOptions,
        PermissionResultDeny,
        SdkMcpTool,
        ToolPermissionContext,
    )

    from infrastructure.spec import AgentSpec

__all__ = [
    "RUN_MARKER_ENV",
    "SERVER_NAME",
    "ClaudeAgentRuntime",
    "error_from_result",
]

log = structlog.get_logger(__name__)

SERVER_NAME = "agentmend"
"""The in-process MCP server that serves a run's ToolSpecs (``mcp__agentmend__<tool>``)."""

RUN_MARKER_ENV = "AGENTMEND_RUN_ID"
"""Set in each CLI process's environment so an aborted run can find and stop its process."""

_KILL_GRACE_S = 3.0
_STDERR_LINES = 20


# --- error mapping ---------------------------------------------------------------------------


def error_from_result(
    data: Mapping[str, Any], *, assistant_error: str | None = None
) -> AgentRunError:
    """The ``AgentRunError`` for a failed result frame (``ResultError.data`` or the fields of a
    ``ResultMessage``), read from its structured fields.

    Args:
        data: the result payload: ``subtype``, ``terminal_reason``, ``api_error_status``,
            ``api_error_type``, ``errors``, ``result``.
        assistant_error: the ``error`` of the CLI's synthetic assistant message for the failed
            call (``model_not_found``, ``rate_limit``, ...), when one was seen.
    """
    subtype = data.get("subtype")
    reason = data.get("terminal_reason")
    status = data.get("api_error_status")
    error_type = data.get("api_error_type")
    message = _result_text(data)
    if isinstance(status, int):
        return AgentRunError(
            _kind_for_status(status, error_type, assistant_error), message, status_code=status
        )
    if reason == "api_error":
        # No HTTP status means no HTTP response: the server could not be reached.
        return AgentRunError(ErrorKind.CONNECTION, message)
    if subtype == "error_max_turns" or reason == "max_turns":
        return AgentRunError(ErrorKind.MAX_TURNS, message)
    if subtype == "error_max_structured_output_retries":
        return AgentRunError(ErrorKind.OUTPUT_INVALID, message)
    if isinstance(reason, str) and reason.startswith("aborted"):
        return AgentRunError(ErrorKind.CANCELLED, message)
    return AgentRunError(ErrorKind.RUNTIME, message)


def _kind_for_status(status: int, error_type: object, assistant_error: str | None) -> ErrorKind:
    if status == 429:
        return ErrorKind.RATE_LIMIT
    if status == 529 or error_type == "overloaded_error":
        return ErrorKind.OVERLOADED
    if status >= 500:
        return ErrorKind.SERVER_ERROR
    if status in (401, 403):
        return ErrorKind.AUTHENTICATION
    if status == 408:
        return ErrorKind.TIMEOUT
    if status == 404 and assistant_error == "model_not_found":
        return ErrorKind.MODEL_NOT_FOUND
    return ErrorKind.BAD_REQUEST


def _result_text(data: Mapping[str, Any]) -> str:
    errors = data.get("errors")
    if isinstance(errors, list):
        texts = [e.strip() for e in errors if isinstance(e, str) and e.strip()]
        if texts:
            return "; ".join(texts)
    result = data.get("result")
    if isinstance(result, str) and result.strip():
        return result.strip()
    subtype = data.get("subtype")
    return f"the CLI reported an error ({subtype})" if subtype else "the CLI reported an error"


def _error_from_exception(exc: Exception, state: _RunState) -> AgentRunError:
    """Map an SDK exception (``ResultError`` included) raised while reading the run."""
    from claude_agent_sdk import ProcessError, ResultError

    if isinstance(exc, ResultError):
        return error_from_result(exc.data, assistant_error=state.assistant_error)
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ProcessError) and state.stderr:
        detail += " | stderr: " + " / ".join(state.stderr)
    return AgentRunError(ErrorKind.RUNTIME, detail)


# --- one run's state --------------------------------------------------------------------------


@dataclass
class _RunState:
    """What the message stream has shown so far; kept when the run fails or times out."""

    tool_prefix: str
    text: str = ""  # the text of the last assistant response that had any
    text_message_id: str | None = None
    calls: dict[str, ToolCallRecord] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    denied: list[str] = field(default_factory=list)
    result: Any = None  # the ResultMessage
    model: str | None = None
    assistant_error: str | None = None
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=_STDERR_LINES))

    def display_name(self, wire_name: str) -> str:
        return wire_name.removeprefix(self.tool_prefix)

    def observe(self, message: Any) -> None:
        from claude_agent_sdk import (
            AssistantMessage,
            ResultMessage,
            TextBlock,
            ToolResultBlock,
            ToolUseBlock,
            UserMessage,
        )

        if isinstance(message, ResultMessage):
            self.result = message
            return
        # Messages from inside a subagent carry the spawning call's id; they are not ours.
        if getattr(message, "parent_tool_use_id", None) is not None:
            return
        if isinstance(message, AssistantMessage):
            if message.error is not None:
                self.assistant_error = message.error
                return
            self.model = message.model
            for block in message.content:
                if isinstance(block, TextBlock):
                    # The CLI emits one AssistantMessage per content block of a response.
                    if message.message_id != self.text_message_id or message.message_id is None:
                        self.text = ""
                        self.text_message_id = message.message_id
                    self.text += block.text
                elif isinstance(block, ToolUseBlock) and block.name != OUTPUT_TOOL_NAME:
                    self.started[block.id] = time.perf_counter()
                    self.calls[block.id] = ToolCallRecord(
                        id=block.id,
                        name=self.display_name(block.name),
                        input=dict(block.input),
                        output="",
                    )
        elif isinstance(message, UserMessage) and isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolResultBlock):
                    self._finish_call(block.tool_use_id, block.content, bool(block.is_error))

    def _finish_call(self, call_id: str, content: Any, is_error: bool) -> None:
        call = self.calls.get(call_id)
        if call is None:
            return
        started = self.started.pop(call_id, None)
        elapsed = (time.perf_counter() - started) * 1000.0 if started is not None else 0.0
        self.calls[call_id] = ToolCallRecord(
            id=call.id,
            name=call.name,
            input=call.input,
            output=_content_text(content),
            is_error=is_error,
            duration_ms=elapsed,
        )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(item.get("text", "")) for item in content if isinstance(item, Mapping)
        ).strip()
    return "" if content is None else str(content)


# --- process cleanup --------------------------------------------------------------------------


def _marked_children(run_id: str) -> list[int]:
    """Pids of this process's children whose environment carries ``run_id`` (Linux only)."""
    if not os.path.isdir("/proc"):
        return []
    marker = f"{RUN_MARKER_ENV}={run_id}".encode()
    me = os.getpid()
    found: list[int] = []
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat_file:
                    stat = stat_file.read()
                # The command name is in parentheses and may contain spaces.
                if int(stat.rsplit(b")", 1)[1].split()[1]) != me:
                    continue
                with open(f"/proc/{entry.name}/environ", "rb") as environ_file:
                    environ = environ_file.read()
            except (OSError, ValueError, IndexError):
                continue
            if marker in environ.split(b"\0"):
                found.append(int(entry.name))
    return found


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


async def _abort(task: asyncio.Task[Any], run_id: str) -> None:
    """Stop a run's CLI process at once, then let the SDK's cleanup finish."""
    pids = _marked_children(run_id)
    _signal_all(pids, signal.SIGTERM)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=_KILL_GRACE_S)
    if not done:
        _signal_all(_marked_children(run_id), signal.SIGKILL)
        await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # consumed: the run's outcome is the abort, not this error
    log.info("run_aborted", run_id=run_id, signalled=len(pids))


# --- the runtime ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ToolPlan:
    """Which tools a run offers, under which names, and which of them are pre-approved."""

    sdk_tools: tuple[ToolSpec, ...]
    builtins: tuple[str, ...]
    allowed_wire: tuple[str, ...]
    profile_label: str


class ClaudeAgentRuntime(RuntimeBase):
    """Runs agents with the Claude Code CLI (``claude_agent_sdk.query``).

    Args:
        base_url: the Messages API base URL for the CLI (``ANTHROPIC_BASE_URL``); default: the
            inherited environment's, else the real API.
        api_key: the key for the CLI (``ANTHROPIC_API_KEY``); default: the inherited one.
        home: ``HOME`` for the CLI (where it keeps its config); default: a private temporary
            directory made on first use and removed by ``aclose()``.
        cwd: the CLI's working directory (what built-in file tools see); default: ``home``.
        extra_env: more variables for the CLI (they win over the runtime's own, except the
            run marker).
        cli_path: the Claude Code executable; default: the one bundled with the SDK.
        max_retries: ``CLAUDE_CODE_MAX_RETRIES`` for the CLI; ``None`` keeps the CLI's default
            (which retries for minutes). Give 0 when an outer policy retries.
        default_model: the model for specs that name none (or ``inherit``); ``None`` leaves
            the choice to the CLI.

    Raises:
        ConfigurationError: ``cli_path`` is not a file, or (under tests, ``AGENTMEND_TESTING=1``)
            the base URL the CLI would use is not a loopback address.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        home: str | Path | None = None,
        cwd: str | Path | None = None,
        extra_env: Mapping[str, str] | None = None,
        cli_path: str | Path | None = None,
        max_retries: int | None = None,
        default_model: str | None = None,
    ) -> None:
        # Imported here so a missing SDK fails at construction, not on the first run.
        import claude_agent_sdk  # noqa: F401

        if cli_path is not None and not Path(cli_path).is_file():
            raise ConfigurationError(f"cli_path {str(cli_path)!r} is not a file")
        if max_retries is not None and max_retries < 0:
            raise ConfigurationError("max_retries must be 0 or more")
        self._base_url = base_url
        self._api_key = api_key
        self._extra_env = dict(extra_env or {})
        self._cli_path = Path(cli_path) if cli_path is not None else None
        self._max_retries = max_retries
        self._default_model = default_model
        self._given_home = Path(home) if home is not None else None
        self._cwd = Path(cwd) if cwd is not None else None
        self._temp_home: Path | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False
        refuse_real_api_under_tests(self._effective_base_url())

    # -- lifecycle

    async def aclose(self) -> None:
        """Remove the private ``HOME`` if this runtime made one. Idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    async def __aenter__(self) -> ClaudeAgentRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def home(self) -> Path:
        """The CLI's ``HOME`` (made now if it is the private temporary one)."""
        if self._given_home is not None:
            return self._given_home
        if self._temp_home is None:
            self._temp_home = Path(tempfile.mkdtemp(prefix="agentmend-claude-"))
            self._finalizer = weakref.finalize(
                self, shutil.rmtree, str(self._temp_home), ignore_errors=True
            )
        return self._temp_home

    # -- the run

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        """Run ``spec`` on ``prompt`` in a fresh CLI process; failures come back in ``error``.

        Raises:
            ConfigurationError: the runtime is closed, tools are misnamed or duplicated, the
                profile is unknown, the base URL is refused under tests, or the CLI is missing.
            asyncio.CancelledError: the awaiting task was cancelled (the CLI is stopped first).
        """
        if self._closed:
            raise ConfigurationError("this ClaudeAgentRuntime is closed")
        plan = self._plan(spec, tools)
        run_id = uuid.uuid4().hex
        state = _RunState(tool_prefix=f"mcp__{SERVER_NAME}__")
        options = self._options(spec, plan, output_type, state, run_id)
        started = time.perf_counter()
        task = asyncio.create_task(self._drive(prompt, options, state), name=f"claude-{run_id}")
        try:
            done, _ = await asyncio.wait({task}, timeout=spec.timeout_s)
        except asyncio.CancelledError:
            await _abort(task, run_id)
            raise
        if done:
            error = task.result()
        else:
            await _abort(task, run_id)
            error = AgentRunError(
                ErrorKind.TIMEOUT, f"agent {spec.name!r} did not finish within {spec.timeout_s} s"
            )
        return self._result(spec, state, error, output_type, started)

    def _effective_base_url(self) -> str | None:
        return (
            self._base_url
            or self._extra_env.get("ANTHROPIC_BASE_URL")
            or os.environ.get("ANTHROPIC_BASE_URL")
            or None
        )

    def _plan(self, spec: AgentSpec, tools: Sequence[ToolSpec]) -> _ToolPlan:
        index = index_tools(tools)
        if OUTPUT_TOOL_NAME in index:
            raise ConfigurationError(f"a tool may not be named {OUTPUT_TOOL_NAME!r}")
        prefix = f"mcp__{SERVER_NAME}__"
        declared: list[str] | None = None
        builtins: list[str] = []
        if spec.tools is not None:
            declared = []
            for name in spec.tools:
                bare = name.removeprefix(prefix)
                declared.append(bare)
                if bare not in index and not bare.startswith("mcp__"):
                    builtins.append(bare)
        offered = [*index, *builtins]
        allowed = allowed_tools(spec.permission_profile, declared, offered)
        wire = sorted(prefix + name if name in index else name for name in allowed)
        return _ToolPlan(
            sdk_tools=tuple(tools),
            builtins=tuple(dict.fromkeys(builtins)),
            allowed_wire=tuple(wire),
            profile_label=describe_profile(spec.permission_profile),
        )

    def _environment(self, spec: AgentSpec, run_id: str) -> dict[str, str]:
        env: dict[str, str] = {}
        if self._base_url:
            env["ANTHROPIC_BASE_URL"] = self._base_url
        if self._api_key:
            env["ANTHROPIC_API_KEY"] = self._api_key
        env["HOME"] = str(self.home)
        env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
        if self._max_retries is not None:
            env["CLAUDE_CODE_MAX_RETRIES"] = str(self._max_retries)
        if spec.max_tokens:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(spec.max_tokens)
        env.update(self._extra_env)
        env[RUN_MARKER_ENV] = run_id
        refuse_real_api_under_tests(self._effective_base_url())
        return env

    def _options(
        self,
        spec: AgentSpec,
        plan: _ToolPlan,
        output_type: type[OutputT] | None,
        state: _RunState,
        run_id: str,
    ) -> ClaudeAgentOptions:
        from claude_agent_sdk import ClaudeAgentOptions, create_sdk_mcp_server

        servers: dict[str, Any] = {}
        if plan.sdk_tools:
            servers[SERVER_NAME] = create_sdk_mcp_server(
                SERVER_NAME, tools=[_sdk_tool(t) for t in plan.sdk_tools]
            )
        output_format = (
            {"type": "json_schema", "schema": output_type.model_json_schema()}
            if output_type is not None
            else None
        )
        model = spec.model if spec.model not in (None, "inherit") else self._default_model
        return ClaudeAgentOptions(
            system_prompt=spec.full_system_prompt,
            model=model,
            max_turns=spec.max_turns,
            tools=list(plan.builtins),
            allowed_tools=list(plan.allowed_wire),
            mcp_servers=servers,
            strict_mcp_config=True,
            can_use_tool=_refuser(spec.name, plan.profile_label, state),
            output_format=output_format,
            env=self._environment(spec, run_id),
            cwd=str(self._cwd or self.home),
            cli_path=self._cli_path,
            setting_sources=[],
            skills=[],
            thinking={"type": "disabled"},
            extra_args={"no-session-persistence": None},
            stderr=state.stderr.append,
        )

    async def _drive(
        self, prompt: str, options: ClaudeAgentOptions, state: _RunState
    ) -> AgentRunError | None:
        from claude_agent_sdk import (
            CanUseToolShadowedWarning,
            ClaudeSDKError,
            CLINotFoundError,
            query,
        )

        # The shadowing is the design (pre-approved tools skip the refusing callback). The SDK
        # warns inside the generator, after its first await, so a catch_warnings() block would
        # span awaits and race with concurrent runs; one narrow, idempotent filter does not.
        warnings.filterwarnings("ignore", category=CanUseToolShadowedWarning)
        try:
            async for message in query(prompt=prompt, options=options):
                state.observe(message)
        except CLINotFoundError as exc:
            raise ConfigurationError(f"the Claude Code CLI was not found: {exc}") from exc
        except ClaudeSDKError as exc:
            return _error_from_exception(exc, state)
        except Exception as exc:
            # The SDK raises bare Exceptions too (a control request that timed out, say): the
            # run failed, which is data; the traceback goes to the log in case it is a bug.
            log.warning("claude_run_failed", error=repr(exc), exc_info=True)
            return AgentRunError(ErrorKind.RUNTIME, f"{type(exc).__name__}: {exc}")
        return None

    def _result(
        self,
        spec: AgentSpec,
        state: _RunState,
        error: AgentRunError | None,
        output_type: type[OutputT] | None,
        started: float,
    ) -> AgentResult[OutputT]:
        result = state.result
        if error is None and result is None:
            error = AgentRunError(ErrorKind.RUNTIME, "the CLI ended without a result")
        if error is None and result.is_error:
            error = error_from_result(_result_fields(result), assistant_error=state.assistant_error)
        output: OutputT | None = None
        if error is None and output_type is not None:
            output, error = _parse_output(output_type, result.structured_output)
        denials = state.denied
        if result is not None and result.permission_denials:
            denials = [
                state.display_name(str(d.get("tool_name", "")))
                for d in result.permission_denials
                if isinstance(d, Mapping)
            ]
        return AgentResult(
            agent_name=spec.name,
            text=state.text,
            output=output,
            tool_calls=tuple(state.calls.values()),
            usage=_usage(result.usage if result is not None else None),
            cost_usd=result.total_cost_usd if result is not None else None,
            turns=result.num_turns if result is not None else 0,
            duration_ms=(time.perf_counter() - started) * 1000.0,
            stop_reason=result.stop_reason if result is not None else None,
            error=error,
            permission_denials=tuple(denials),
            model=state.model or spec.model,
        )


def _sdk_tool(tool: ToolSpec) -> SdkMcpTool[Any]:
    """The SDK tool for a ToolSpec: validated arguments in, text or an ``is_error`` result out."""
    from claude_agent_sdk import tool as sdk_tool

    schema = dict(tool.json_schema())
    # The SDK reads a dict without "type"/"properties" as a {name: python type} mapping.
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})

    async def handler(arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            validated = tool.validate_arguments(arguments)
        except ValidationError as exc:
            return _tool_error(f"Invalid arguments for tool {tool.name!r}: {exc}")
        try:
            text = await tool.handler(validated)
        except ToolError as exc:
            return _tool_error(str(exc) or "tool error")
        except Exception as exc:  # the model sees the failure and can recover
            log.warning("tool_handler_failed", tool=tool.name, error=repr(exc))
            return _tool_error(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        return {"content": [{"type": "text", "text": text if isinstance(text, str) else str(text)}]}

    decorated: SdkMcpTool[Any] = sdk_tool(tool.name, tool.description, schema)(handler)
    return decorated


def _tool_error(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "is_error": True}


def _refuser(agent: str, profile_label: str, state: _RunState) -> CanUseTool:
    """The ``can_use_tool`` callback: every call that reaches it is outside the profile."""
    from claude_agent_sdk import PermissionResultDeny

    async def can_use_tool(
        tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultDeny:
        name = state.display_name(tool_name)
        state.denied.append(name)
        log.info("tool_denied", agent=agent, tool=name, profile=profile_label)
        reason = f" ({context.decision_reason})" if context.decision_reason else ""
        return PermissionResultDeny(
            message=(
                f"Permission denied: agent {agent!r} may not use tool {name!r} under its "
                f"permission profile {profile_label}{reason}. Continue without this tool."
            )
        )

    return can_use_tool


def _result_fields(result: Any) -> dict[str, Any]:
    return {
        "subtype": result.subtype,
        "terminal_reason": result.terminal_reason,
        "api_error_status": result.api_error_status,
        "errors": result.errors,
        "result": result.result,
    }


def _parse_output(
    output_type: type[OutputT], structured: Any
) -> tuple[OutputT | None, AgentRunError | None]:
    if structured is None:
        return None, AgentRunError(
            ErrorKind.OUTPUT_INVALID,
            f"the agent did not call {OUTPUT_TOOL_NAME}; no structured output",
        )
    try:
        return output_type.model_validate(structured), None
    except ValidationError as exc:
        return None, AgentRunError(
            ErrorKind.OUTPUT_INVALID, f"structured output is not a valid {output_type.__name__}: "
            f"{exc}",
        )  # fmt: skip


def _usage(raw: Mapping[str, Any] | None) -> Usage:
    if not raw:
        return Usage()

    def number(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) else 0

    return Usage(
        input_tokens=number("input_tokens"),
        output_tokens=number("output_tokens"),
        cache_read_tokens=number("cache_read_input_tokens"),
        cache_creation_tokens=number("cache_creation_input_tokens"),
    )
