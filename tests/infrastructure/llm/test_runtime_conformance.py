"""Every runtime we ship holds to the ``AgentRuntime`` contract (``run_runtime_conformance``).

Each runtime gets a factory that makes its model play a scenario: the scripted and function
runtimes from steps, the offline runtime from a policy, the Anthropic and Claude runtimes from the
fake Messages API (the real ``anthropic`` client and the real bundled Claude Code CLI talking to a
server on 127.0.0.1), the simulated runtime from its faults. What a factory cannot stage is
reported as not staged, and each test pins which checks those are, so none is skipped quietly.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from fake_messages_api import FakeMessagesAPI, RecordedRequest, Reply, text_block, tool_use_block

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.errors import AgentRunError, ErrorKind
from agentmend.infrastructure.llm.anthropic_runtime import AnthropicRuntime
from agentmend.infrastructure.llm.base import AgentRuntime
from agentmend.infrastructure.llm.cassette import RecordingRuntime, ReplayRuntime
from agentmend.infrastructure.llm.claude.runtime import ClaudeAgentRuntime
from agentmend.infrastructure.llm.conformance import CheckResult, ConformanceReport, Scenario
from agentmend.infrastructure.llm.offline import OfflineCall, OfflineRuntime
from agentmend.infrastructure.llm.retry import RetryPolicy
from agentmend.infrastructure.llm.testing import (
    FunctionRuntime,
    RuntimeConformanceError,
    ScriptedRuntime,
    Step,
    TurnInfo,
    run_runtime_conformance,
)
from agentmend.infrastructure.llm.tool_loop import (
    OUTPUT_TOOL_NAME,
    Message,
    ModelResponse,
    TextBlock,
)
from agentmend.infrastructure.simulation import (
    FORMAT_INSTRUCTION,
    Fault,
    FaultKind,
    SimulatedRuntime,
)

SONNET = "claude-sonnet-4-6"
SPEC = AgentSpec(
    name="conformance",
    description="conformance checks",
    system_prompt="Answer.",
    model=SONNET,
    permission_profile="open",  # the checks' own tools are not on standard's read-only list
)
ALL_CHECKS = (
    "answers",
    "runs_a_tool",
    "tool_error_is_an_error_result",
    "tool_exception_is_an_error_result",
    "failed_call_is_data",
    "denied_tool_is_reported",
    "output_is_validated",
    "invalid_output_is_output_invalid",
    "cancel_is_prompt",
)


async def _never_answers(scenario: Scenario) -> Any:
    scenario.reached.set()
    await asyncio.Event().wait()


def _steps(scenario: Scenario) -> list[Step]:
    return [Step.of(t) if isinstance(t, ModelResponse) else Step(error=t) for t in scenario.turns]


def _assert_all_passed(report: ConformanceReport, not_staged: Sequence[str] = ()) -> None:
    assert report.names("not_staged") == tuple(not_staged)
    assert report.names("passed") == tuple(c for c in ALL_CHECKS if c not in not_staged)


async def test_the_scripted_runtime_conforms() -> None:
    def factory(scenario: Scenario) -> AgentRuntime:
        if scenario.hangs:
            return FunctionRuntime(lambda messages, info: _never_answers(scenario))
        return ScriptedRuntime(_steps(scenario))

    _assert_all_passed(await run_runtime_conformance(factory, spec=SPEC))


async def test_the_function_runtime_conforms() -> None:
    def factory(scenario: Scenario) -> AgentRuntime:
        steps = deque(_steps(scenario))

        async def model(messages: Sequence[Message], info: TurnInfo) -> Step:
            if scenario.hangs:
                await _never_answers(scenario)
            return steps.popleft()

        return FunctionRuntime(model)

    _assert_all_passed(await run_runtime_conformance(factory, spec=SPEC))


async def test_the_offline_runtime_conforms() -> None:
    def factory(scenario: Scenario) -> AgentRuntime:
        async def policy(call: OfflineCall) -> Any:
            if scenario.hangs:
                await _never_answers(scenario)
            for turn in scenario.turns:
                if isinstance(turn, AgentRunError):
                    raise turn
                for use in turn.tool_uses:
                    if use.name == OUTPUT_TOOL_NAME:
                        assert call.output_type is not None
                        if use.input.get("score", 0) > 10:  # as the model wrote it: invalid
                            return str(use.input)
                        return call.output_type.model_validate(use.input)
                    await call.call_tool(use.name, use.input)
                if not turn.tool_uses:
                    return turn.text
            return ""

        return OfflineRuntime({scenario.spec.name: policy})

    _assert_all_passed(await run_runtime_conformance(factory, spec=SPEC))


def _simulated(scenario: Scenario) -> AgentRuntime | None:
    runtime = SimulatedRuntime(seed=7, base_failure_rate=0.0)
    name = scenario.spec.name
    if scenario.name in ("answers", "output_is_validated"):
        return runtime
    if scenario.name == "failed_call_is_data":
        runtime.inject(name, Fault(FaultKind.RATE_LIMIT_STORM, calls=1))
        return runtime
    if scenario.name == "denied_tool_is_reported":
        runtime.inject(name, Fault(FaultKind.TOOL_DENIED, tool="shell"))
        return runtime
    return None  # it runs its own simulated tools, never hangs and always fills a valid output


async def test_the_simulated_runtime_conforms_where_it_can_be_staged() -> None:
    # simulated replies keep to the format only while the prompt ends with its instruction
    spec = SPEC.with_changes(system_prompt=f"Answer.\n\n{FORMAT_INSTRUCTION}")
    report = await run_runtime_conformance(_simulated, spec=spec)
    _assert_all_passed(
        report,
        not_staged=(
            "runs_a_tool",
            "tool_error_is_an_error_result",
            "tool_exception_is_an_error_result",
            "invalid_output_is_output_invalid",
            "cancel_is_prompt",
        ),
    )


def _replies(scenario: Scenario, tool_prefix: str) -> deque[Reply]:
    """The scenario's turns as the fake Messages API's replies."""
    replies: deque[Reply] = deque()
    for turn in scenario.turns:
        if isinstance(turn, AgentRunError):
            assert turn.kind is ErrorKind.BAD_REQUEST
            replies.append(Reply.error(400, "invalid_request_error", turn.message))
            continue
        blocks = [
            text_block(block.text)
            if isinstance(block, TextBlock)
            else tool_use_block(
                block.name if block.name == OUTPUT_TOOL_NAME else tool_prefix + block.name,
                block.input,
            )
            for block in turn.content
        ]
        replies.append(Reply.message(blocks))
    if scenario.hangs:
        replies.append(Reply.hang(60))
    return replies


def _play(api: FakeMessagesAPI, scenario: Scenario, tool_prefix: str) -> None:
    replies = _replies(scenario, tool_prefix)

    def respond(request: RecordedRequest) -> Reply | None:
        if scenario.hangs:
            scenario.reached.set()
        # a client that asks again (the CLI re-asks for a valid structured output) gets the
        # model's last answer again, as a model set in its ways would give
        return replies.popleft() if len(replies) > 1 else (replies[0] if replies else None)

    api.set_responder(respond)


async def test_the_anthropic_runtime_conforms(fake_api: FakeMessagesAPI) -> None:
    def factory(scenario: Scenario) -> AgentRuntime:
        _play(fake_api, scenario, tool_prefix="")
        return AnthropicRuntime(
            api_key="test-key", base_url=fake_api.base_url, retry_policy=RetryPolicy.no_retry()
        )

    _assert_all_passed(await run_runtime_conformance(factory, spec=SPEC, settle_s=60))
    assert len(fake_api.message_requests()) >= len(ALL_CHECKS)  # the real client sent them


@pytest.mark.slow
async def test_the_claude_agent_runtime_conforms(fake_api: FakeMessagesAPI) -> None:
    def factory(scenario: Scenario) -> AgentRuntime:
        _play(fake_api, scenario, tool_prefix="mcp__agentmend__")
        return ClaudeAgentRuntime(base_url=fake_api.base_url, api_key="sk-test", max_retries=0)

    # cancelled once the CLI is inside its request, however long it took to start
    _assert_all_passed(await run_runtime_conformance(factory, spec=SPEC, settle_s=60))
    assert all(
        r.headers["user-agent"].startswith("claude-cli/") for r in fake_api.message_requests()
    )


async def test_a_runtime_that_breaks_the_contract_is_named_check_by_check() -> None:
    class RaisesOnFailure(ScriptedRuntime):
        """Raises a failed model call out of run(), and drops every tool call record."""

        async def _run(self, spec: AgentSpec, prompt: str, **kwargs: Any) -> Any:
            result = await super()._run(spec, prompt, **kwargs)
            if result.error is not None and result.error.kind is ErrorKind.BAD_REQUEST:
                raise result.error
            from dataclasses import replace

            return replace(result, tool_calls=())

    def factory(scenario: Scenario) -> AgentRuntime | None:
        return None if scenario.hangs else RaisesOnFailure(_steps(scenario))

    with pytest.raises(RuntimeConformanceError) as caught:
        await run_runtime_conformance(factory, spec=SPEC)
    failed = {failure.partition(":")[0] for failure in caught.value.failures}
    assert failed == {
        "runs_a_tool",
        "tool_error_is_an_error_result",
        "tool_exception_is_an_error_result",
        "failed_call_is_data",
    }
    assert any("raised" in failure for failure in caught.value.failures)


async def test_a_runtime_that_ignores_cancellation_fails_the_cancel_check() -> None:
    class Stubborn(FunctionRuntime):
        async def _run(self, spec: AgentSpec, prompt: str, **kwargs: Any) -> Any:
            try:
                return await super()._run(spec, prompt, **kwargs)
            except asyncio.CancelledError:
                await asyncio.sleep(0.5)  # swallows the cancel and answers late
                return await ScriptedRuntime([Step.text("late")])._run(spec, prompt, **kwargs)

    def factory(scenario: Scenario) -> AgentRuntime | None:
        if not scenario.hangs:
            return None
        return Stubborn(lambda messages, info: _never_answers(scenario))

    with pytest.raises(RuntimeConformanceError, match="cancel_is_prompt: a cancelled run ended"):
        await run_runtime_conformance(factory, spec=SPEC, settle_s=0.05)


def test_check_results_name_their_status() -> None:
    report = ConformanceReport((CheckResult("a", "passed"), CheckResult("b", "not_staged")))
    assert report.names("passed") == ("a",)
    assert report.names("not_staged") == ("b",)


async def test_the_recording_runtime_conforms(fake_api: FakeMessagesAPI, tmp_path: Path) -> None:
    counter = iter(range(1000))

    def factory(scenario: Scenario) -> AgentRuntime:
        _play(fake_api, scenario, tool_prefix="")
        return RecordingRuntime(
            tmp_path / f"cassette-{next(counter)}.json",
            api_key="test-key",
            base_url=fake_api.base_url,
            retry_policy=RetryPolicy.no_retry(),
        )

    _assert_all_passed(await run_runtime_conformance(factory, spec=SPEC, settle_s=60))


async def test_the_replay_runtime_conforms(fake_api: FakeMessagesAPI, tmp_path: Path) -> None:
    counter = iter(range(1000))

    async def factory(scenario: Scenario) -> AgentRuntime | None:
        # a failed call is not recorded, and a hanging one never answered: nothing to replay
        if scenario.hangs or any(isinstance(t, AgentRunError) for t in scenario.turns):
            return None
        _play(fake_api, scenario, tool_prefix="")
        cassette = tmp_path / f"cassette-{next(counter)}.json"
        no_retry = RetryPolicy.no_retry()
        recording = RecordingRuntime(
            cassette, api_key="test-key", base_url=fake_api.base_url, retry_policy=no_retry
        )
        await recording.run(
            scenario.spec,
            scenario.prompt,
            tools=scenario.tools,
            output_type=scenario.output_type,
        )
        await recording.aclose()
        scenario.handled.clear()  # the check counts the tool calls of its own run
        return ReplayRuntime(cassette)

    report = await run_runtime_conformance(factory, spec=SPEC)
    _assert_all_passed(report, not_staged=("failed_call_is_data", "cancel_is_prompt"))
