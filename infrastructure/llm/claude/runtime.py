"""``ClaudeAgentRuntime``: agents run by the Claude Code CLI through ``claude_agent_sdk.query``.

Each ``run`` starts the CLI bundled with the SDK (one process per run, about half a second of
start-up that is the CLI's own), serves the agent's ``ToolSpec``s from an in-process MCP server
and turns the CLI's ``ResultMessage`` into an ``AgentResult``. ``claude_agent_sdk`` is imported
only when a runtime is constructed.

How a run is set up:

- Tools: the ``ToolSpec``s become one in-process server (``create_sdk_mcp_server``) named
  ``agentmend``, so the model sees ``mcp__agentmend__<name>``; results and records use the bare
  name. Built-in tools are off (``tools=[]``) unless the spec lists them (``Read``, ``Grep``).
- Permissions: ``agentmend.infrastructure.definitions.permissions.allowed_tools`` turns the spec's
profile into the
  allowed set (the ``allowed_tools`` list, in wire names). A ``PreToolUse`` hook on every tool
  (``claude_sdk_tools.tool_gate``) denies any call outside that set, built-in or not, with a
  message naming the profile; ``can_use_tool`` refuses anything the CLI would still ask about.
  Every refusal is in ``AgentResult.permission_denials`` (a denial is reported, not an error:
  the agent saw the refusal and carried on). So ``locked`` and a deny-all custom profile refuse
  ``Read``/``Glob``/``Grep`` too, even when the spec declares them and they are offered.
- Isolation: no settings files (``setting_sources=[]``), no skills, no other MCP configs,
  no session files (``--no-session-persistence``), thinking off (the Anthropic runtime does not
  think either), ``HOME`` and the working directory in a private temporary directory.
- Environment: base URL, key, ``HOME``, ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``,
  ``CLAUDE_CODE_MAX_RETRIES`` (when ``max_retries`` is given) and
  ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` (the spec's ``max_tokens``) go to the CLI through
  ``ClaudeAgentOptions(env=...)``; ``os.environ`` is never changed. So do ``TRACEPARENT`` of the
  current span (the CLI's own OpenTelemetry spans then nest under the caller's) and
  ``agentmend.recorded=true`` in ``OTEL_RESOURCE_ATTRIBUTES`` (the run is recorded by agentmend
  already, so its exported spans are skipped on the way in).

Wire facts (claude-agent-sdk 0.2.187, CLI 2.1.330, observed against a local fake server):

- The CLI posts ``/v1/messages?beta=true`` with ``stream: true``. It prepends its own system
  blocks (a billing header, "You are a Claude agent, built on Anthropic's Claude Agent SDK.")
  before ours, and puts ``<system-reminder>`` text blocks before the prompt and after the last
  tool result of a request.
- ``temperature`` cannot be set: with thinking off the CLI always sends ``temperature: 1``. A
  spec's ``temperature`` is ignored by this runtime.
- A tool named in ``allowed_tools`` is approved before ``can_use_tool`` is asked (the SDK warns
  with ``CanUseToolShadowedWarning``, which is exactly the intent here, so it is filtered).
  ``StructuredOutput`` is always approved. The read-only built-ins (``Read``, ``Glob``,
  ``Grep``) are approved inside the CLI's working directory without ``can_use_tool`` ever being
  asked, whatever ``allowed_tools`` says; ``PreToolUse`` hooks run before that approval, and a
  hook's ``permissionDecision: "deny"`` stops the call (its result reads ``PreToolUse:<tool>
  hook error: <reason>``). A call to a tool the run does not offer fails with "No such tool
  available" before any hook. A refused call (by hook or callback) shows in
  ``ResultMessage.permission_denials`` as ``{"tool_name", "tool_use_id", "tool_input"}``.
- Structured output: ``output_format`` makes the CLI offer ``StructuredOutput`` and validate the
  model's input against the schema itself, retrying up to 5 times (then the result subtype is
  ``error_max_structured_output_retries``). A model that answers in text is asked once more;
  if it still does not call the tool the run "succeeds" with ``structured_output=None``.
- A reply cut at ``max_tokens`` is continued by the CLI (it sends "Output token limit hit.
  Resume directly ..."), so truncation rarely reaches the result.
- A failed API call ends the run with an ``is_error`` ``ResultMessage`` carrying the HTTP
  status, then the SDK raises ``ResultError`` (details in ``claude_sdk_errors``). The CLI
  retries 5xx/429/529 with backoff (for minutes) unless ``CLAUDE_CODE_MAX_RETRIES=0``.
- ``max_turns`` ends with subtype ``error_max_turns`` / ``terminal_reason="max_turns"``.
- On cancellation the SDK waits up to 5 s for the CLI to exit; a timed out or cancelled run is
  instead stopped at once through a marker variable in its environment (``RUN_MARKER_ENV``,
  see ``claude_cli_process``).

Errors: ``agentmend.infrastructure.llm.claude.errors`` maps the CLI's failures (HTTP status,
turns, structured output retries, aborts, SDK errors) to the Anthropic runtime's kinds, from
structured fields only. This runtime adds: structured output missing or not valid for the output
type -> OUTPUT_INVALID; the run's ``timeout_s`` -> TIMEOUT. A CLI that cannot be found raises
``ConfigurationError``: it is the installation's fault, not the agent's. Cancelling the task
that awaits ``run`` re-raises ``CancelledError`` once the CLI is gone. The run's message-stream
state is in ``claude_run_state``, the SDK tool adapters, the ``PreToolUse`` gate and the
refusing ``can_use_tool`` callback in ``claude_sdk_tools``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agentmend.infrastructure.definitions.permissions import allowed_tools, describe_profile
from agentmend.infrastructure.errors import AgentRunError, ConfigurationError, ErrorKind
from agentmend.infrastructure.llm.base import (
    AgentResult,
    OutputT,
    RuntimeBase,
    ToolSpec,
    Usage,
)
from agentmend.infrastructure.llm.claude.cli_process import RUN_MARKER_ENV, abort_run
from agentmend.infrastructure.llm.claude.errors import (
    error_from_exception,
    error_from_result,
    result_fields,
)
from agentmend.infrastructure.llm.claude.run_state import RunState
from agentmend.infrastructure.llm.claude.tools import refuser, sdk_tool, tool_gate
from agentmend.infrastructure.llm.network_guard import refuse_real_api_under_tests
from agentmend.infrastructure.llm.tool_loop import OUTPUT_TOOL_NAME, index_tools
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.tracing import RECORDED_ATTRIBUTE, trace_environment

if TYPE_CHECKING:
    from claude_agent_sdk import ClaudeAgentOptions

    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "RUN_MARKER_ENV",
    "SERVER_NAME",
    "ClaudeAgentRuntime",
]

log = get_logger(__name__)

SERVER_NAME = "agentmend"
"""The in-process MCP server that serves a run's ToolSpecs (``mcp__agentmend__<tool>``)."""


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
        state = RunState(tool_prefix=f"mcp__{SERVER_NAME}__")
        options = self._options(spec, plan, output_type, state, run_id)
        started = time.perf_counter()
        task = asyncio.create_task(self._drive(prompt, options, state), name=f"claude-{run_id}")
        try:
            done, _ = await asyncio.wait({task}, timeout=spec.timeout_s)
        except asyncio.CancelledError:
            await abort_run(task, run_id)
            raise
        if done:
            error = task.result()
        else:
            await abort_run(task, run_id)
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
        allowed = allowed_tools(
            spec.permission_profile, declared, offered, read_only_tools=self.read_only_tools
        )
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
        env.update(trace_environment())  # the CLI's own spans nest under the caller's span
        env.update(self._extra_env)
        # The run is agentmend's, recorded by it already: its spans are skipped on the way in.
        resources = self._extra_env.get("OTEL_RESOURCE_ATTRIBUTES") or os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        env["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(
            part for part in (resources, f"{RECORDED_ATTRIBUTE}=true") if part
        )
        env[RUN_MARKER_ENV] = run_id
        refuse_real_api_under_tests(self._effective_base_url())
        return env

    def _options(
        self,
        spec: AgentSpec,
        plan: _ToolPlan,
        output_type: type[OutputT] | None,
        state: RunState,
        run_id: str,
    ) -> ClaudeAgentOptions:
        from claude_agent_sdk import ClaudeAgentOptions, create_sdk_mcp_server

        servers: dict[str, Any] = {}
        if plan.sdk_tools:
            servers[SERVER_NAME] = create_sdk_mcp_server(
                SERVER_NAME, tools=[sdk_tool(t) for t in plan.sdk_tools]
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
            can_use_tool=refuser(spec.name, plan.profile_label, state),
            hooks={
                "PreToolUse": [tool_gate(spec.name, plan.profile_label, plan.allowed_wire, state)]
            },
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
        self, prompt: str, options: ClaudeAgentOptions, state: RunState
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
            return error_from_exception(
                exc, assistant_error=state.assistant_error, stderr=state.stderr
            )
        except Exception as exc:
            # The SDK raises bare Exceptions too (a control request that timed out, say): the
            # run failed, which is data; the traceback goes to the log in case it is a bug.
            log.warning("claude_run_failed", error=repr(exc), exc_info=True)
            return AgentRunError(ErrorKind.RUNTIME, f"{type(exc).__name__}: {exc}")
        return None

    def _result(
        self,
        spec: AgentSpec,
        state: RunState,
        error: AgentRunError | None,
        output_type: type[OutputT] | None,
        started: float,
    ) -> AgentResult[OutputT]:
        result = state.result
        if error is None and result is None:
            error = AgentRunError(ErrorKind.RUNTIME, "the CLI ended without a result")
        if error is None and result.is_error:
            error = error_from_result(result_fields(result), assistant_error=state.assistant_error)
        output: OutputT | None = None
        if error is None and output_type is not None:
            output, error = _parse_output(output_type, result.structured_output)
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
            permission_denials=state.denials(),
            model=state.model or spec.model,
        )


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
