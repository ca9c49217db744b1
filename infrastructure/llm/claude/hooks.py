"""One line to monitor a claude-agent-sdk team: ``ClaudeAgentOptions(hooks=claude_sdk_hooks(m))``.

``claude_sdk_hooks(monitor)`` returns the ``hooks`` mapping for ``ClaudeAgentOptions``. Every
subagent run (an ``Agent``/``Task`` tool call, foreground or background) becomes one
``monitor.record(agent_type, success=..., duration_ms=...)``:

- duration: from the ``SubagentStart`` hook to the run's end, matched by ``agent_id``;
- success: the run ended with ``SubagentStop`` and none of its tool calls failed;
- failure: a ``PostToolUseFailure`` inside it (``error`` names the tools and the last error),
  or an API error that ended it. An API error inside a subagent fires no ``SubagentStop``: the
  CLI fires ``StopFailure`` with the subagent's ``agent_id`` and an error category
  (``server_error``, ``rate_limit``, ``authentication_failed``, ...), which becomes the record's
  error as ``"<ErrorKind>: ..."`` like a runtime's ``AgentRunError``, so detection and the
  playbooks read both the same way.

Tool calls are recorded too, as their own series ``tool:<tool name>`` (success or failure,
with the tool's ``duration_ms`` and the calling agent in ``extra``), so a failing tool shows
up as itself and not only as a failing agent; ``record_tools=False`` turns that off. A failed
call also counts against the subagent that made it (``extra["tool_failures"]``). A call cut off
by an interrupt is the user's doing and counts against nobody.

Wire facts (CLI 2.1.330, SDK 0.2.187):

- The model calls subagents through the ``Agent`` tool (the init message still lists it as
  ``Task``), input ``{description, prompt, subagent_type, run_in_background, ...}``. Subagents
  run in the background unless the call says ``run_in_background: false``
  (``AgentDefinition(background=False)`` did not change that). ``query()`` still waits for a
  background subagent: the SDK keeps the CLI's stdin open while a ``local_agent`` task is in
  flight, and the CLI runs one more main turn when it finishes.
- Tool hooks fired inside a subagent carry ``agent_id`` and ``agent_type``; on the main thread
  they carry neither. ``SubagentStart``/``SubagentStop`` carry ``agent_id``/``agent_type`` but
  not the spawning tool call's id.
- An API error inside a subagent fires ``StopFailure`` (with ``agent_id``) and no
  ``SubagentStop``; for a foreground call the ``Agent`` tool then fails too
  (``PostToolUseFailure`` on the main thread). ``StopFailure`` is not in the SDK's ``HookEvent``
  type but the CLI honours it.
- A call refused by ``can_use_tool`` fires no ``PostToolUseFailure``; it shows only in the
  session's ``ResultMessage.permission_denials``, so it does not count against the subagent.
- Token usage is not in these hook inputs (the foreground ``Agent`` tool's ``PostToolUse`` has
  it, a background one's does not), so records carry zero tokens and the subagent transcript
  path in ``extra``.

Release label: the app serves its own definitions, so agentmend does not route these runs,
but ``release=`` (the version or content hash of the release the subagents were read from, or
a function returning it, read at each ``SubagentStart``: ``linked_release_label`` of a followed
``.claude/agents``) with ``releases=ReleaseAttribution(ReleaseLog(store, team_id))`` tags each
subagent run with its release, arm and rollout, so it counts in the team's rollout. A label
naming no release is recorded with ``release_unattributed`` saying why; the run is never
dropped. Tool series are not tagged (they are not the team's runs).

Callbacks answer ``{}`` (no opinion) and never raise: a monitor that fails is logged, and the
user's agents run on. The ``extra`` keys avoid ``PerformanceMonitor.record``'s own keyword
``source`` (``recorded_by`` says where a record came from).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from agentmend.infrastructure.errors import ErrorKind
from agentmend.infrastructure.release_labels import ReleaseTagger, unattributed
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from claude_agent_sdk import HookContext, HookInput, HookJSONOutput, HookMatcher
    from claude_agent_sdk.types import HookEvent

__all__ = ["ExecutionRecorder", "SubagentTracker", "claude_sdk_hooks"]

log = get_logger(__name__)

_STOP_FAILURE_KINDS: dict[str, ErrorKind] = {
    "rate_limit": ErrorKind.RATE_LIMIT,
    "overloaded": ErrorKind.OVERLOADED,
    "server_error": ErrorKind.SERVER_ERROR,
    "authentication_failed": ErrorKind.AUTHENTICATION,
    "billing_error": ErrorKind.AUTHENTICATION,
    "invalid_request": ErrorKind.BAD_REQUEST,
    "model_not_found": ErrorKind.MODEL_NOT_FOUND,
    "max_output_tokens": ErrorKind.TRUNCATED,
}
"""The CLI's ``StopFailure`` error categories as agentmend's kinds (others are RUNTIME)."""

_MAX_TEXT = 500


class ExecutionRecorder(Protocol):
    """What the hooks need of a monitor (``PerformanceMonitor.record`` fits)."""

    def record(
        self,
        agent_name: str,
        *,
        success: bool,
        duration_ms: float,
        error: str | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float = 0.0,
        **extra: Any,
    ) -> object: ...


ReleaseLabel = int | str | Callable[[], object] | None
"""A release's version or content hash, or a function returning it (None: unlabelled)."""

Attribute = Callable[[object, object], Mapping[str, object]]
"""(label, team) -> the record's tags (``ReleaseAttribution.tags``)."""


@dataclass
class _OpenRun:
    agent_type: str
    started: float
    release: object = None
    tool_calls: int = 0
    tool_failures: list[str] = field(default_factory=list)
    last_tool_error: str | None = None


class SubagentTracker:
    """The state behind the hooks: open subagent runs by ``agent_id``.

    Every method is synchronous and awaits nothing, so callbacks the CLI fires concurrently
    cannot interleave inside one update.
    """

    def __init__(
        self,
        monitor: ExecutionRecorder,
        *,
        record_tools: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        release: ReleaseLabel = None,
        attribute: Attribute | None = None,
    ) -> None:
        self._monitor = monitor
        self._record_tools = record_tools
        self._clock = clock
        self._release = release
        self._attribute = attribute
        self._open: dict[str, _OpenRun] = {}

    @property
    def open_runs(self) -> dict[str, str]:
        """``agent_id -> agent_type`` of subagents started and not yet ended."""
        return {agent_id: run.agent_type for agent_id, run in self._open.items()}

    def subagent_started(self, data: Mapping[str, Any]) -> None:
        agent_id = str(data.get("agent_id", ""))
        self._open[agent_id] = _OpenRun(
            str(data.get("agent_type") or "subagent"), self._clock(), self._label()
        )

    def _label(self) -> object:
        """The release label now (a function is asked at each start: the link may move)."""
        release = self._release
        if not callable(release):
            return release
        try:
            return release()
        except Exception as exc:  # a label that cannot be read leaves the run unlabelled
            log.warning("release_label_unreadable", error=repr(exc))
            return None

    def _release_tags(self, run: _OpenRun | None) -> Mapping[str, object]:
        label = run.release if run is not None else self._label()
        if label is None:
            return {}
        if self._attribute is None:
            return unattributed(label, "no release log to attribute it to (pass releases=)")
        try:
            return self._attribute(label, None)
        except Exception as exc:  # the run is recorded whatever its label meets
            return unattributed(label, f"attribution failed: {exc!r}")

    def tool_finished(self, data: Mapping[str, Any], *, failed: bool) -> None:
        if failed and data.get("is_interrupt"):
            return
        tool = str(data.get("tool_name") or "unknown")
        agent_id = data.get("agent_id")
        run = self._open.get(agent_id) if isinstance(agent_id, str) else None
        error = _clip(data.get("error")) if failed else None
        if run is not None:
            run.tool_calls += 1
            if failed:
                run.tool_failures.append(tool)
                run.last_tool_error = error
        if self._record_tools:
            duration = data.get("duration_ms")
            self._record(
                f"tool:{tool}",
                success=not failed,
                duration_ms=float(duration) if isinstance(duration, int | float) else 0.0,
                error=f"{ErrorKind.RUNTIME.value}: tool {tool} failed: {error}" if failed else None,
                agent_id=agent_id,
                agent_type=data.get("agent_type") or "main",
                tool_use_id=data.get("tool_use_id"),
            )

    def subagent_stopped(self, data: Mapping[str, Any]) -> None:
        agent_id = str(data.get("agent_id", ""))
        run = self._open.pop(agent_id, None)
        agent_type = str(data.get("agent_type") or (run.agent_type if run else "subagent"))
        error = None
        if run is not None and run.tool_failures:
            error = (
                f"{ErrorKind.RUNTIME.value}: {len(run.tool_failures)} tool call(s) failed "
                f"({', '.join(dict.fromkeys(run.tool_failures))}); last: {run.last_tool_error}"
            )
        self._finish(agent_id, agent_type, run, error, transcript=data.get("agent_transcript_path"))

    def subagent_failed(self, data: Mapping[str, Any]) -> None:
        """A ``StopFailure``: the run ended on an API error (main thread: nothing to record)."""
        agent_id = data.get("agent_id")
        if not isinstance(agent_id, str):
            return
        run = self._open.pop(agent_id, None)
        agent_type = str(data.get("agent_type") or (run.agent_type if run else "subagent"))
        category = str(data.get("error") or "unknown")
        kind = _STOP_FAILURE_KINDS.get(category, ErrorKind.RUNTIME)
        detail = _clip(data.get("error_details") or data.get("last_assistant_message") or category)
        self._finish(agent_id, agent_type, run, f"{kind.value}: {detail}", api_error=category)

    def _finish(
        self,
        agent_id: str,
        agent_type: str,
        run: _OpenRun | None,
        error: str | None,
        **extra: Any,
    ) -> None:
        duration = (self._clock() - run.started) * 1000.0 if run is not None else 0.0
        self._record(
            agent_type,
            success=error is None,
            duration_ms=max(0.0, duration),
            error=error,
            agent_id=agent_id,
            recorded_by="claude_sdk_hooks",
            tool_calls=run.tool_calls if run is not None else 0,
            tool_failures=list(run.tool_failures) if run is not None else [],
            start_seen=run is not None,
            **{k: v for k, v in extra.items() if v is not None},
            **self._release_tags(run),
        )

    def _record(
        self, agent_name: str, *, success: bool, duration_ms: float, error: str | None, **extra: Any
    ) -> None:
        try:
            self._monitor.record(
                agent_name, success=success, duration_ms=duration_ms, error=error, **extra
            )
        except Exception as exc:  # the user's agents must run on whatever the monitor does
            log.warning("monitor_record_failed", agent=agent_name, error=repr(exc))


def _clip(value: object) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"


def claude_sdk_hooks(
    monitor: ExecutionRecorder,
    *,
    existing: Mapping[HookEvent, Sequence[HookMatcher]] | None = None,
    record_tools: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    release: ReleaseLabel = None,
    releases: ReleaseTagger | None = None,
) -> dict[HookEvent, list[HookMatcher]]:
    """The ``hooks`` for ``ClaudeAgentOptions`` that record every subagent run into ``monitor``.

    Args:
        monitor: a ``PerformanceMonitor`` (anything with its ``record`` signature).
        existing: hooks you already pass; they are kept, before ours, and not modified.
        record_tools: also record each tool call as ``tool:<name>``.
        clock: seconds, monotonic (a test can pass a fake).
        release: the label of the release the subagents run (a version, a content hash, or a
            function returning one at each subagent's start); see the module docstring.
        releases: resolves that label to release, arm and rollout for the record.

    Returns:
        A new ``dict[HookEvent, list[HookMatcher]]``, ready for ``ClaudeAgentOptions(hooks=...)``.
    """
    from claude_agent_sdk import HookMatcher

    tracker = SubagentTracker(
        monitor,
        record_tools=record_tools,
        clock=clock,
        release=release,
        attribute=releases.tags if releases is not None else None,
    )

    def callback(update: Callable[[Mapping[str, Any]], None]) -> HookMatcher:
        async def hook(
            hook_input: HookInput, tool_use_id: str | None, context: HookContext
        ) -> HookJSONOutput:
            try:
                update(cast(Mapping[str, Any], hook_input))
            except Exception as exc:  # malformed input from a newer CLI: never break the run
                log.warning("hook_input_unreadable", error=repr(exc))
            return {}

        return HookMatcher(matcher=None, hooks=[hook])

    ours: dict[str, HookMatcher] = {
        "SubagentStart": callback(tracker.subagent_started),
        "SubagentStop": callback(tracker.subagent_stopped),
        "StopFailure": callback(tracker.subagent_failed),
        "PostToolUse": callback(lambda data: tracker.tool_finished(data, failed=False)),
        "PostToolUseFailure": callback(lambda data: tracker.tool_finished(data, failed=True)),
    }
    merged: dict[HookEvent, list[HookMatcher]] = {
        event: list(matchers) for event, matchers in (existing or {}).items()
    }
    for event, matcher in ours.items():
        # StopFailure is missing from the SDK's HookEvent literal; the CLI accepts it.
        merged.setdefault(cast("HookEvent", event), []).append(matcher)
    return merged
