"""The scripted and function runtimes drive the shared turn loop deterministically."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from fake_messages_api import FakeMessagesAPI, Reply
from pydantic import BaseModel

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.errors import AgentRunError, ErrorKind
from agentmend.infrastructure.llm.anthropic_runtime import AnthropicRuntime
from agentmend.infrastructure.llm.base import AgentResult, AgentRuntime, ToolError, ToolSpec, Usage
from agentmend.infrastructure.llm.retry import RetryPolicy
from agentmend.infrastructure.llm.testing import (
    FunctionRuntime,
    ScriptedRuntime,
    Step,
    TurnInfo,
    UnexpectedModelCall,
)
from agentmend.infrastructure.llm.tool_loop import (
    OUTPUT_TOOL_NAME,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    run_tool_calls,
)


def make_spec(name: str = "worker", **changes: Any) -> AgentSpec:
    fields: dict[str, Any] = {
        "name": name,
        "description": "does work",
        "system_prompt": f"You are {name}.",
        "model": "claude-haiku-4-5",
        # the tools here are made up for the test; the profiles have their own tests
        "permission_profile": "open",
    }
    fields.update(changes)
    return AgentSpec(**fields)


class AddArgs(BaseModel):
    a: int
    b: int


class Sum(BaseModel):
    total: int


def adder(calls: list[dict[str, Any]]) -> ToolSpec:
    async def add(arguments: dict[str, Any]) -> str:
        calls.append(arguments)
        if arguments["a"] < 0:
            raise ToolError("negative numbers are not supported")
        return str(arguments["a"] + arguments["b"])

    return ToolSpec("add", "Add two integers.", add, input_model=AddArgs)


def test_fakes_satisfy_the_runtime_protocol() -> None:
    assert isinstance(ScriptedRuntime(), AgentRuntime)
    assert isinstance(FunctionRuntime(lambda messages, info: "x"), AgentRuntime)


async def test_scripted_tool_calls_really_run_the_handlers_and_are_recorded() -> None:
    seen: list[dict[str, Any]] = []
    runtime = ScriptedRuntime(
        [
            Step.tool_call("add", {"a": 2, "b": 3}, usage=Usage(10, 2)),
            Step.tool_call("add", {"a": -1, "b": 3}),
            Step.text("2 + 3 = 5", usage=Usage(20, 4)),
        ]
    )
    tool = adder(seen)

    result = await runtime.run(make_spec(), "add 2 and 3", tools=[tool])

    assert result.success, result.error
    assert result.text == "2 + 3 = 5"
    assert seen == [{"a": 2, "b": 3}, {"a": -1, "b": 3}]
    assert [(c.id, c.output, c.is_error) for c in result.tool_calls] == [
        ("call_1_1", "5", False),
        ("call_2_1", "negative numbers are not supported", True),
    ]
    assert result.usage == Usage(30, 6)
    assert result.turns == 3
    assert result.cost_usd is None  # fakes price nothing
    [run] = runtime.runs
    assert (run.spec.name, run.prompt, run.tools, run.output_type) == (
        "worker",
        "add 2 and 3",
        (tool,),
        None,
    )
    assert run.result is result
    assert run.messages[0] == Message("user", (TextBlock("add 2 and 3"),))
    assert run.messages[2] == Message("user", (ToolResultBlock("call_1_1", "5"),))
    assert run.requests[0].system == "You are worker."
    runtime.assert_complete()


async def test_an_unexpected_call_fails_loudly() -> None:
    runtime = ScriptedRuntime([Step.tool_call("add", {"a": 1, "b": 1})])

    with pytest.raises(
        UnexpectedModelCall, match=r"'worker' made model request 2 .*script is empty"
    ):
        await runtime.run(make_spec(), "add", tools=[adder([])])

    assert isinstance(UnexpectedModelCall("x"), AssertionError)


def test_assert_complete_names_the_unused_steps() -> None:
    runtime = ScriptedRuntime([Step.text("a")], scripts={"critic": [Step.text("b")]})

    with pytest.raises(UnexpectedModelCall, match="never used") as raised:
        runtime.assert_complete()

    assert "critic" in str(raised.value)
    assert "<shared>" in str(raised.value)


async def test_per_agent_scripts_let_a_team_run_in_parallel() -> None:
    runtime = ScriptedRuntime(
        [Step.text("shared answer")],
        scripts={"planner": [Step.text("plan")], "critic": [Step.text("critique")]},
    )

    results = await asyncio.gather(
        runtime.run(make_spec("critic"), "review"),
        runtime.run(make_spec("planner"), "plan"),
        runtime.run(make_spec("other"), "anything"),
    )

    assert [r.text for r in results] == ["critique", "plan", "shared answer"]
    runtime.assert_complete()


async def test_scripted_structured_output_with_its_repair_turn() -> None:
    runtime = ScriptedRuntime([Step.output({"total": "five"}), Step.output(Sum(total=5))])

    result = await runtime.run(make_spec(), "sum", output_type=Sum)

    assert result.output == Sum(total=5)
    first, second = runtime.runs[0].requests
    assert first.tool_choice == second.tool_choice == OUTPUT_TOOL_NAME
    [repair] = second.messages[-1].tool_results
    assert repair.is_error
    assert "total" in repair.content


async def test_a_script_that_no_model_could_answer_is_refused() -> None:
    with pytest.raises(UnexpectedModelCall, match="without output_type"):
        await ScriptedRuntime([Step.output(Sum(total=1))]).run(make_spec(), "x")
    with pytest.raises(UnexpectedModelCall, match="forces the 'StructuredOutput' tool"):
        await ScriptedRuntime([Step.text("no")]).run(make_spec(), "x", output_type=Sum)


async def test_scripted_failures_and_truncation_come_back_as_errors() -> None:
    runtime = ScriptedRuntime(
        [
            Step.fail(ErrorKind.RATE_LIMIT, "slow down"),
            Step.truncated("half an ans"),
            Step.fail(AgentRunError(ErrorKind.MODEL_NOT_FOUND, "model: x", status_code=404)),
        ]
    )

    limited = await runtime.run(make_spec(), "a")
    truncated = await runtime.run(make_spec(), "b")
    missing = await runtime.run(make_spec(), "c")

    assert limited.error is not None
    assert limited.error.kind is ErrorKind.RATE_LIMIT
    assert truncated.truncated
    assert truncated.text == "half an ans"
    assert truncated.error is not None
    assert truncated.error.kind is ErrorKind.TRUNCATED
    assert missing.error is not None
    assert missing.error.status_code == 404


async def test_scripted_turn_limit_and_timeout() -> None:
    looping = ScriptedRuntime([Step.tool_call("add", {"a": 1, "b": 1})] * 3)
    limited = await looping.run(make_spec(max_turns=3), "loop", tools=[adder([])])

    async def slow(arguments: dict[str, Any]) -> str:
        await asyncio.sleep(30)
        return "late"

    sleeper = ToolSpec("slow", "sleeps", slow, input_schema={"type": "object"})
    timed = await ScriptedRuntime([Step.tool_call("slow")]).run(
        make_spec(timeout_s=0.05), "wait", tools=[sleeper]
    )

    assert limited.error is not None
    assert limited.error.kind is ErrorKind.MAX_TURNS
    assert (limited.turns, len(limited.tool_calls)) == (3, 2)
    assert timed.error is not None
    assert timed.error.kind is ErrorKind.TIMEOUT


async def test_function_runtime_answers_from_the_conversation() -> None:
    infos: list[TurnInfo] = []

    async def model(messages: Sequence[Message], info: TurnInfo) -> Step | str:
        infos.append(info)
        last = messages[-1]
        if last.tool_results:
            return f"the sum is {last.tool_results[0].content}"
        numbers = [int(w) for w in last.text.split() if w.isdigit()]
        return Step.tool_call("add", {"a": numbers[0], "b": numbers[1]})

    runtime = FunctionRuntime(model)

    result = await runtime.run(make_spec(), "add 20 and 22", tools=[adder([])])

    assert result.text == "the sum is 42"
    assert [i.turn for i in infos] == [1, 2]
    assert [t.name for t in infos[0].tools] == ["add"]
    assert infos[0].tool_choice is None
    assert infos[0].spec.name == "worker"
    assert runtime.runs[0].messages[1] == Message(
        "assistant", (ToolUseBlock("call_1_1", "add", {"a": 20, "b": 22}),)
    )


async def test_function_runtime_structured_output_sync_function() -> None:
    def model(messages: Sequence[Message], info: TurnInfo) -> Step:
        assert info.output_type is Sum
        assert info.tool_choice == OUTPUT_TOOL_NAME
        return Step.output({"total": len(messages)})

    result = await FunctionRuntime(model).run(make_spec(), "count", output_type=Sum)

    assert result.output == Sum(total=1)


async def test_run_tool_calls_is_the_shared_path() -> None:
    seen: list[dict[str, Any]] = []
    calls = [ToolUseBlock("1", "add", {"a": 1, "b": 2}), ToolUseBlock("2", "sub", {})]

    records = await run_tool_calls([adder(seen)], calls)

    assert (records[0].id, records[0].output, records[0].is_error) == ("1", "3", False)
    assert records[1].is_error
    assert "Unknown tool 'sub'" in records[1].output


async def test_scripted_and_anthropic_runtimes_agree_on_the_same_conversation(
    fake_api: FakeMessagesAPI,
) -> None:
    """The fakes test the production loop: the same model moves give the same result."""
    fake_api.enqueue(
        Reply.tool_uses(("add", {"a": 1, "b": 2}), ("add", {"a": -5, "b": 1})),
        Reply.text("done"),
        Reply.structured({"total": 3}),
    )
    scripted = ScriptedRuntime(
        [
            Step.tool_calls(("add", {"a": 1, "b": 2}), ("add", {"a": -5, "b": 1})),
            Step.text("done"),
            Step.output(Sum(total=3)),
        ]
    )
    spec = make_spec()
    async with AnthropicRuntime(
        api_key="k", base_url=fake_api.base_url, retry_policy=RetryPolicy.no_retry()
    ) as real:
        via_api = await real.run(spec, "sum", tools=[adder([])], output_type=Sum)
    via_script = await scripted.run(spec, "sum", tools=[adder([])], output_type=Sum)

    def shape(result: AgentResult[Sum]) -> tuple[Any, ...]:
        calls = tuple((c.name, c.input, c.output, c.is_error) for c in result.tool_calls)
        return result.output, result.text, calls, result.turns, result.stop_reason, result.error

    assert shape(via_api) == shape(via_script)
    api_final = fake_api.message_requests()[-1]
    assert api_final.json["messages"][-1]["content"][0]["text"] == (
        scripted.runs[0].messages[-1].text
    )


def _recording_tool(name: str, calls: list[str]) -> ToolSpec:
    async def handler(arguments: dict[str, Any]) -> str:
        calls.append(name)
        return f"{name} ran"

    return ToolSpec(name, f"the {name} tool", handler, input_schema={"type": "object"})


@pytest.mark.parametrize(
    ("profile", "declared", "denied"),
    [
        # a tool nobody classed is privileged under standard ...
        ("standard", ("search",), ["search", "Bash"]),
        ("standard", ("search", "Bash"), ["search", "Bash"]),
        # ... until the read_only_tools setting lists it; shell never is standard
        ("standard+listed", ("search",), ["Bash"]),
        ("standard+listed", ("search", "Bash"), ["Bash"]),
        ("locked", ("search", "Bash"), ["search", "Bash"]),
        ("open", None, []),
    ],
)
async def test_the_permission_profile_refuses_and_reports_tools_it_does_not_allow(
    profile: str, declared: tuple[str, ...] | None, denied: list[str]
) -> None:
    ran: list[str] = []
    tools = [_recording_tool("search", ran), _recording_tool("Bash", ran)]
    runtime = ScriptedRuntime([Step.tool_calls(("search", {}), ("Bash", {})), Step.text("done")])
    if profile == "standard+listed":
        profile, runtime.read_only_tools = "standard", ("search", "Bash")  # Bash: ignored
    spec = AgentSpec(
        name="worker",
        description="d",
        tools=declared,
        permission_profile=profile,  # type: ignore[arg-type]
    )
    result = await runtime.run(spec, "go", tools=tools)
    assert result.success
    assert list(result.permission_denials) == denied
    assert ran == [name for name in ("search", "Bash") if name not in denied]
    refused = [c for c in result.tool_calls if c.name in denied]
    assert all(c.is_error and "Permission denied" in c.output for c in refused)
    runtime.assert_complete()
