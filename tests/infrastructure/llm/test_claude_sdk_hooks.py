"""claude_sdk_hooks: subagent runs recorded into a monitor, from the hooks the CLI fires.

The first tests drive the hook callbacks with the inputs the CLI sends (shapes copied from the
bundled CLI 2.1.330); the last ones run the real CLI against the fake Messages API with
subagents defined through ``ClaudeAgentOptions(agents=...)``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from claude_agent_sdk import (
    AgentDefinition,
    ClaudeAgentOptions,
    HookMatcher,
    ResultMessage,
    create_sdk_mcp_server,
    query,
    tool,
)
from claude_agent_sdk.types import HookEvent
from fake_messages_api import FakeMessagesAPI, RecordedRequest, Reply

from agentmend.infrastructure.llm.claude.hooks import claude_sdk_hooks
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor


@dataclass
class Record:
    agent_name: str
    success: bool
    duration_ms: float
    error: str | None
    extra: dict[str, Any]


@dataclass
class RecordingMonitor:
    """A monitor fake with ``PerformanceMonitor.record``'s signature."""

    records: list[Record] = field(default_factory=list)

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
    ) -> Record:
        rec = Record(agent_name, success, duration_ms, error, extra)
        self.records.append(rec)
        return rec

    def named(self, name: str) -> list[Record]:
        return [r for r in self.records if r.agent_name == name]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Fire:
    """Calls the hook callbacks the way the SDK does for a CLI hook request."""

    def __init__(self, hooks: dict[HookEvent, list[HookMatcher]]) -> None:
        self.hooks = hooks

    async def __call__(self, event: str, **fields: Any) -> list[Any]:
        data = {"session_id": "s", "transcript_path": "/t", "cwd": "/", "hook_event_name": event}
        data.update(fields)
        outputs = []
        for matcher in self.hooks.get(cast(HookEvent, event), []):
            for callback in matcher.hooks:
                outputs.append(
                    await callback(cast(Any, data), fields.get("tool_use_id"), {"signal": None})
                )
        return outputs


@pytest.fixture
def monitor() -> RecordingMonitor:
    return RecordingMonitor()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# --- the callbacks ------------------------------------------------------------------------------


def test_the_result_is_the_hooks_option(monitor: RecordingMonitor) -> None:
    hooks = claude_sdk_hooks(monitor)
    options = ClaudeAgentOptions(hooks=hooks)
    assert options.hooks is hooks
    assert set(hooks) == {
        "SubagentStart", "SubagentStop", "StopFailure", "PostToolUse", "PostToolUseFailure",
    }  # fmt: skip
    assert all(isinstance(m, HookMatcher) for matchers in hooks.values() for m in matchers)


async def test_a_subagent_run_is_recorded_from_start_to_stop(
    monitor: RecordingMonitor, clock: FakeClock
) -> None:
    fire = Fire(claude_sdk_hooks(monitor, clock=clock))
    assert await fire("SubagentStart", agent_id="a1", agent_type="helper") == [{}]
    clock.now += 0.25
    await fire(
        "PostToolUse", agent_id="a1", agent_type="helper", tool_name="Read",
        tool_input={}, tool_response="ok", tool_use_id="t1", duration_ms=12,
    )  # fmt: skip
    clock.now += 0.5
    await fire("SubagentStop", agent_id="a1", agent_type="helper", agent_transcript_path="/x.jsonl")

    [run] = monitor.named("helper")
    assert run.success
    assert run.error is None
    assert run.duration_ms == pytest.approx(750.0)
    assert run.extra["agent_id"] == "a1"
    assert run.extra["tool_calls"] == 1
    assert run.extra["transcript"] == "/x.jsonl"
    [read] = monitor.named("tool:Read")
    assert read.success
    assert read.duration_ms == 12
    assert read.extra["agent_type"] == "helper"


async def test_a_tool_failure_inside_fails_the_run(
    monitor: RecordingMonitor, clock: FakeClock
) -> None:
    fire = Fire(claude_sdk_hooks(monitor, clock=clock))
    await fire("SubagentStart", agent_id="a1", agent_type="helper")
    await fire(
        "PostToolUseFailure", agent_id="a1", agent_type="helper", tool_name="mcp__t__lookup",
        tool_input={}, tool_use_id="t1", error="lookup broke", is_interrupt=False, duration_ms=3,
    )  # fmt: skip
    await fire("SubagentStop", agent_id="a1", agent_type="helper")

    [run] = monitor.named("helper")
    assert not run.success
    assert run.error is not None
    assert "mcp__t__lookup" in run.error
    assert "lookup broke" in run.error
    assert run.extra["tool_failures"] == ["mcp__t__lookup"]
    [tool_record] = monitor.named("tool:mcp__t__lookup")
    assert not tool_record.success
    assert tool_record.error is not None


async def test_an_api_error_ends_the_run_through_stop_failure(
    monitor: RecordingMonitor, clock: FakeClock
) -> None:
    fire = Fire(claude_sdk_hooks(monitor, clock=clock))
    await fire("SubagentStart", agent_id="a1", agent_type="helper")
    clock.now += 0.1
    await fire(
        "StopFailure", agent_id="a1", agent_type="helper", error="rate_limit",
        last_assistant_message="API Error: Request rejected (429)",
    )  # fmt: skip
    await fire("StopFailure", error="server_error")  # the main thread: not a subagent run

    [run] = monitor.records
    assert run.agent_name == "helper"
    assert not run.success
    assert run.error is not None
    assert run.error.startswith("rate_limit: ")
    assert run.duration_ms == pytest.approx(100.0)
    assert run.extra["api_error"] == "rate_limit"


async def test_parallel_runs_of_one_agent_are_kept_apart(
    monitor: RecordingMonitor, clock: FakeClock
) -> None:
    fire = Fire(claude_sdk_hooks(monitor, clock=clock))
    await fire("SubagentStart", agent_id="a1", agent_type="helper")
    clock.now += 1.0
    await fire("SubagentStart", agent_id="a2", agent_type="helper")
    await fire(
        "PostToolUseFailure", agent_id="a2", agent_type="helper", tool_name="Grep",
        tool_input={}, tool_use_id="t2", error="bad regex",
    )  # fmt: skip
    clock.now += 1.0
    await fire("SubagentStop", agent_id="a1", agent_type="helper")
    clock.now += 1.0
    await fire("SubagentStop", agent_id="a2", agent_type="helper")

    first, second = monitor.named("helper")
    assert (first.extra["agent_id"], first.success, first.duration_ms) == ("a1", True, 2000.0)
    assert (second.extra["agent_id"], second.success, second.duration_ms) == ("a2", False, 2000.0)


async def test_interrupts_count_against_nobody_and_tools_can_be_left_out(
    monitor: RecordingMonitor, clock: FakeClock
) -> None:
    fire = Fire(claude_sdk_hooks(monitor, record_tools=False, clock=clock))
    await fire("SubagentStart", agent_id="a1", agent_type="helper")
    await fire(
        "PostToolUseFailure", agent_id="a1", agent_type="helper", tool_name="Bash",
        tool_input={}, tool_use_id="t1", error="Interrupted", is_interrupt=True,
    )  # fmt: skip
    await fire("SubagentStop", agent_id="a1", agent_type="helper")

    [run] = monitor.records
    assert run.agent_name == "helper"
    assert run.success


async def test_a_stop_without_a_start_is_still_recorded(monitor: RecordingMonitor) -> None:
    fire = Fire(claude_sdk_hooks(monitor))
    await fire("SubagentStop", agent_id="zz", agent_type="late")
    [run] = monitor.records
    assert (run.agent_name, run.duration_ms, run.extra["start_seen"]) == ("late", 0.0, False)


async def test_a_failing_monitor_never_breaks_the_agents() -> None:
    class Broken:
        def record(self, agent_name: str, **fields: Any) -> None:
            raise RuntimeError("disk full")

    fire = Fire(claude_sdk_hooks(Broken()))
    await fire("SubagentStart", agent_id="a1", agent_type="helper")
    assert await fire("SubagentStop", agent_id="a1", agent_type="helper") == [{}]
    assert await fire("SubagentStop") == [{}]  # unreadable input as well


async def test_existing_hooks_are_kept_first_and_not_modified(monitor: RecordingMonitor) -> None:
    seen: list[str] = []

    async def mine(hook_input: Any, tool_use_id: str | None, context: Any) -> Any:
        seen.append(hook_input["hook_event_name"])
        return {}

    existing: dict[HookEvent, list[HookMatcher]] = {
        "SubagentStop": [HookMatcher(hooks=[mine])],
        "PreToolUse": [HookMatcher(matcher="Bash", hooks=[mine])],
    }
    snapshot = {k: list(v) for k, v in existing.items()}

    hooks = claude_sdk_hooks(monitor, existing=existing)

    assert existing == snapshot
    assert hooks["PreToolUse"] == existing["PreToolUse"]
    assert hooks["SubagentStop"][0] is existing["SubagentStop"][0]
    assert len(hooks["SubagentStop"]) == 2
    fire = Fire(hooks)
    await fire("SubagentStart", agent_id="a1", agent_type="helper")
    await fire("SubagentStop", agent_id="a1", agent_type="helper")
    assert seen == ["SubagentStop"]
    assert len(monitor.named("helper")) == 1


# --- through the real CLI -------------------------------------------------------------------------

LEAD = "You are the lead."
HELPER = "You are the helper."


@tool("lookup", "Look something up.", {"type": "object", "properties": {"q": {"type": "string"}}})
async def failing_lookup(arguments: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("lookup backend down")


def system_text(request: RecordedRequest) -> str:
    return " ".join(
        b.get("text", "") for b in request.json.get("system") or [] if isinstance(b, dict)
    )


def conversation(request: RecordedRequest) -> str:
    return json.dumps(request.messages)


@pytest.fixture
def performance_monitor() -> Iterator[PerformanceMonitor]:
    with PerformanceMonitor() as monitor:
        yield monitor


@pytest.fixture
def cli_home() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="agentmend-hooks-") as home:
        yield home


def options(fake_api: FakeMessagesAPI, home: str, hooks: Any) -> ClaudeAgentOptions:
    env = {
        "ANTHROPIC_BASE_URL": fake_api.base_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "HOME": home,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    return ClaudeAgentOptions(
        env=env,
        cwd=home,
        model="claude-sonnet-4-6",
        system_prompt=LEAD,
        tools=["Agent"],
        allowed_tools=["Agent", "mcp__team__lookup"],
        mcp_servers={"team": create_sdk_mcp_server("team", tools=[failing_lookup])},
        agents={
            "helper": AgentDefinition(
                description="Looks things up.",
                prompt=HELPER,
                tools=["mcp__team__lookup"],
                model="claude-haiku-4-5",
            )
        },
        setting_sources=[],
        skills=[],
        hooks=hooks,
    )


async def run_cli(opts: ClaudeAgentOptions) -> ResultMessage:
    result = None
    async for message in query(prompt="Delegate both tasks.", options=opts):
        if isinstance(message, ResultMessage):
            result = message
    assert result is not None
    return result


async def test_cli_foreground_subagent_runs_are_recorded(
    fake_api: FakeMessagesAPI,
    monitor: RecordingMonitor,
    performance_monitor: PerformanceMonitor,
    cli_home: str,
) -> None:
    lead_turns = 0

    def respond(request: RecordedRequest) -> Reply:
        nonlocal lead_turns
        if HELPER in system_text(request):
            talk = conversation(request)
            if "TASK-ONE" in talk and not request.tool_results():
                return Reply.tool_use("mcp__team__lookup", {"q": "x"})
            return Reply.text("HELPER-REPORT")
        lead_turns += 1
        if lead_turns <= 2:
            task = "TASK-ONE" if lead_turns == 1 else "TASK-TWO"
            # run_in_background=False keeps the runs in order (background is the default)
            return Reply.tool_use(
                "Agent",
                {"description": task, "prompt": task, "subagent_type": "helper",
                 "run_in_background": False},
            )  # fmt: skip
        return Reply.text("LEAD-DONE")

    fake_api.set_responder(respond)

    # two sets merged: the real monitor's hooks on top of the recording fake's
    hooks = claude_sdk_hooks(performance_monitor, existing=claude_sdk_hooks(monitor))
    result = await run_cli(options(fake_api, cli_home, hooks))

    assert result.result == "LEAD-DONE"
    helper = performance_monitor.get_agent_metrics("helper")
    assert helper is not None
    assert (helper.executions, helper.failures) == (2, 1)
    assert any("lookup backend down" in e for e in helper.recent_errors)
    assert helper.avg_duration_ms > 0
    lookup_metrics = performance_monitor.get_agent_metrics("tool:mcp__team__lookup")
    assert lookup_metrics is not None
    assert (lookup_metrics.executions, lookup_metrics.failures) == (1, 1)
    # the fake keeps each record, in order
    first, second = monitor.named("helper")
    assert not first.success
    assert first.error is not None
    assert "lookup backend down" in first.error
    assert first.extra["tool_failures"] == ["mcp__team__lookup"]
    assert second.success
    assert second.error is None
    assert first.duration_ms > 0
    assert second.duration_ms > 0
    assert first.extra["agent_id"] != second.extra["agent_id"]
    [lookup] = monitor.named("tool:mcp__team__lookup")
    assert not lookup.success
    assert lookup.extra["agent_id"] == first.extra["agent_id"]
    helper_requests = [r for r in fake_api.message_requests() if HELPER in system_text(r)]
    assert [r.model for r in helper_requests] == ["claude-haiku-4-5"] * 3


async def test_cli_background_subagent_api_error_is_a_failed_run(
    fake_api: FakeMessagesAPI, performance_monitor: PerformanceMonitor, cli_home: str
) -> None:
    lead_turns = 0

    def respond(request: RecordedRequest) -> Reply:
        nonlocal lead_turns
        if HELPER in system_text(request):
            return Reply.server_error(500)
        lead_turns += 1
        if lead_turns == 1:  # launched in the background, this CLI's default
            return Reply.tool_use(
                "Agent", {"description": "look", "prompt": "TASK", "subagent_type": "helper"}
            )
        return Reply.text("LEAD-DONE")

    fake_api.set_responder(respond)

    await run_cli(options(fake_api, cli_home, claude_sdk_hooks(performance_monitor)))

    helper = performance_monitor.get_agent_metrics("helper")
    assert helper is not None
    assert (helper.executions, helper.failures) == (1, 1)
    assert helper.last_error is not None
    assert helper.last_error.startswith("server_error: ")
    assert any(HELPER in system_text(r) for r in fake_api.message_requests())
