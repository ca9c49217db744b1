"""AnthropicRuntime through the real ``anthropic`` client against the fake Messages API."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from fake_messages_api import FakeMessagesAPI, Reply
from pydantic import BaseModel, Field

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.errors import AgentRunError, ConfigurationError, ErrorKind
from agentmend.infrastructure.llm.anthropic_runtime import AnthropicRuntime, estimate_cost_usd
from agentmend.infrastructure.llm.base import ToolError, ToolSpec, Usage
from agentmend.infrastructure.llm.network_guard import (
    NetworkGuard,
    NetworkRefusedError,
    is_loopback_url,
    refuse_non_loopback,
    under_tests,
)
from agentmend.infrastructure.llm.retry import RetryPolicy, is_retryable, run_with_retry

# Captured at import, before any test's guard patches the socket module.
_REAL_CONNECT = socket.socket.connect
_REAL_GETADDRINFO = socket.getaddrinfo

MODEL = "claude-sonnet-4-6"  # claude-sonnet-4-5 makes this client warn (deprecated)


class Sleeps:
    """A recording no-op sleep for the retry policy."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def make_spec(**changes: Any) -> AgentSpec:
    fields: dict[str, Any] = {
        "name": "researcher",
        "description": "looks things up",
        "system_prompt": "You look things up.",
        "model": MODEL,
        "max_tokens": 512,
        # the tools here are made up for the test; the profiles have their own tests
        "permission_profile": "open",
    }
    fields.update(changes)
    return AgentSpec(**fields)


class LookupArgs(BaseModel):
    key: str
    limit: int = 3


async def lookup(arguments: dict[str, Any]) -> str:
    if arguments["key"] == "missing":
        raise ToolError("no record for 'missing'")
    return f"value of {arguments['key']} (limit {arguments['limit']})"


LOOKUP = ToolSpec("lookup", "Look a key up.", lookup, input_model=LookupArgs)


class Verdict(BaseModel):
    label: str
    score: float = Field(ge=0, le=1)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def runtime(fake_api: FakeMessagesAPI, sleeps: Sleeps) -> AsyncIterator[AnthropicRuntime]:
    policy = RetryPolicy(max_attempts=3, initial_wait_s=0.5, sleep=sleeps)
    rt = AnthropicRuntime(api_key="test-key", base_url=fake_api.base_url, retry_policy=policy)
    try:
        yield rt
    finally:
        await rt.aclose()


async def test_tool_loop_over_several_turns(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    fake_api.enqueue(
        Reply.tool_use("lookup", {"key": "alpha"}, text="Let me look.", usage=Usage(100, 20)),
        Reply.tool_use("lookup", {"key": "beta", "limit": 1}, usage=Usage(150, 10, 40, 8)),
        Reply.text("alpha and beta found", usage=Usage(200, 30)),
    )
    spec = make_spec(temperature=0.2)

    result = await runtime.run(spec, "find alpha and beta", tools=[LOOKUP])

    assert result.success, result.error
    assert result.text == "alpha and beta found"
    assert result.turns == 3
    assert result.stop_reason == "end_turn"
    assert result.model == MODEL
    assert [(c.name, c.input, c.output) for c in result.tool_calls] == [
        ("lookup", {"key": "alpha"}, "value of alpha (limit 3)"),
        ("lookup", {"key": "beta", "limit": 1}, "value of beta (limit 1)"),
    ]
    assert result.usage == Usage(450, 60, 40, 8)
    assert result.cost_usd == pytest.approx(estimate_cost_usd(MODEL, result.usage))
    assert result.cost_usd is not None
    assert result.cost_usd > 0
    first, second, third = fake_api.message_requests()
    assert first.json["system"] == spec.full_system_prompt
    assert first.json["model"] == MODEL
    assert first.json["max_tokens"] == 512
    assert first.json["temperature"] == 0.2
    assert first.json["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "find alpha and beta"}]}
    ]
    assert first.json["tools"][0]["input_schema"] == LookupArgs.model_json_schema()
    assert "tool_choice" not in first.json
    [alpha_result] = second.tool_results()
    assert alpha_result["tool_use_id"] == result.tool_calls[0].id
    assert alpha_result["content"] == "value of alpha (limit 3)"
    assert "is_error" not in alpha_result
    assert len(third.messages) == 5  # prompt, call, result, call, result


async def test_tool_calls_of_one_turn_run_concurrently(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    # Each handler waits for the other to start: run one after the other, both would time out.
    ping_started, pong_started = asyncio.Event(), asyncio.Event()

    def handler(mine: asyncio.Event, other: asyncio.Event, answer: str) -> ToolSpec:
        async def run(arguments: dict[str, Any]) -> str:
            mine.set()
            await asyncio.wait_for(other.wait(), timeout=2)
            return answer

        return ToolSpec(answer, f"answers {answer}", run, input_schema={"type": "object"})

    tools = [
        handler(ping_started, pong_started, "ping"),
        handler(pong_started, ping_started, "pong"),
    ]
    fake_api.enqueue(Reply.tool_uses(("ping", {}), ("pong", {})), Reply.text("both answered"))

    result = await runtime.run(make_spec(), "call both", tools=tools)

    assert result.success, result.error
    assert [(c.name, c.output, c.is_error) for c in result.tool_calls] == [
        ("ping", "ping", False),
        ("pong", "pong", False),
    ]
    results = fake_api.message_requests()[1].tool_results()
    assert [r["content"] for r in results] == ["ping", "pong"]


async def test_tool_failures_are_error_results_the_model_sees(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    async def crash(arguments: dict[str, Any]) -> str:
        raise KeyError("boom")

    crasher = ToolSpec("crash", "always fails", crash, input_schema={"type": "object"})
    fake_api.enqueue(
        Reply.tool_uses(
            ("lookup", {"key": "missing"}),
            ("crash", {}),
            ("nope", {}),
            ("lookup", {"limit": "many"}),
        ),
        Reply.text("I could not find it"),
    )

    result = await runtime.run(make_spec(), "find it", tools=[LOOKUP, crasher])

    assert result.success, result.error  # tool failures are the model's business, not the run's
    results = fake_api.message_requests()[1].tool_results()
    assert all(r["is_error"] is True for r in results)
    assert results[0]["content"] == "no record for 'missing'"
    assert results[1]["content"] == "KeyError: 'boom'"
    assert "Unknown tool 'nope'" in results[2]["content"]
    assert "crash, lookup" in results[2]["content"]
    assert "Invalid arguments for tool 'lookup'" in results[3]["content"]
    assert "key" in results[3]["content"]
    assert "limit" in results[3]["content"]
    assert [c.is_error for c in result.tool_calls] == [True, True, True, True]


async def test_structured_output_is_forced_and_repaired_once(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    fake_api.enqueue(
        Reply.structured({"label": "good", "score": 7}),
        Reply.structured({"label": "good", "score": 0.7}),
    )

    result = await runtime.run(make_spec(), "rate it", output_type=Verdict)

    assert result.success, result.error
    assert result.output == Verdict(label="good", score=0.7)
    assert result.turns == 2
    first, second = fake_api.message_requests()
    forced = {"type": "tool", "name": "StructuredOutput"}
    assert first.json["tool_choice"] == forced
    assert second.json["tool_choice"] == forced
    assert first.json["tools"][0]["input_schema"] == Verdict.model_json_schema()
    [repair] = second.tool_results()
    assert repair["is_error"] is True
    assert "score" in repair["content"]
    assert "less than or equal to 1" in repair["content"]


async def test_structured_output_invalid_twice_is_output_invalid(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    fake_api.enqueue(Reply.structured({"label": 1}), Reply.structured({"score": 0.5}))

    result = await runtime.run(make_spec(), "rate it", output_type=Verdict)

    assert result.error is not None
    assert result.error.kind is ErrorKind.OUTPUT_INVALID
    assert result.output is None
    assert len(fake_api.message_requests()) == 2


async def test_structured_output_after_tools_is_asked_for_when_the_model_just_talks(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    fake_api.enqueue(
        Reply.tool_use("lookup", {"key": "a"}),
        Reply.text("it is good"),
        Reply.structured({"label": "good", "score": 1}),
    )

    result = await runtime.run(make_spec(), "rate a", tools=[LOOKUP], output_type=Verdict)

    assert result.output == Verdict(label="good", score=1)
    assert result.text == "it is good"
    first, _, third = fake_api.message_requests()
    assert "tool_choice" not in first.json  # with tools the model chooses
    assert set(first.tool_names) == {"lookup", "StructuredOutput"}
    assert third.json["tool_choice"] == {"type": "tool", "name": "StructuredOutput"}


async def test_max_tokens_is_reported_as_truncation(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    fake_api.enqueue(Reply.text("The answer is", stop_reason="max_tokens"))

    result = await runtime.run(make_spec(max_tokens=16), "explain")

    assert result.stop_reason == "max_tokens"
    assert result.truncated
    assert result.error is not None
    assert result.error.kind is ErrorKind.TRUNCATED
    assert "max_tokens=16" in result.error.message
    assert result.text == "The answer is"  # what was produced is kept beside the error


async def test_turn_limit_stops_a_model_that_keeps_calling_tools(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    fake_api.set_fallback(Reply.tool_use("lookup", {"key": "again"}))

    result = await runtime.run(make_spec(max_turns=2), "loop", tools=[LOOKUP])

    assert result.error is not None
    assert result.error.kind is ErrorKind.MAX_TURNS
    assert result.turns == 2
    assert len(fake_api.message_requests()) == 2
    assert len(result.tool_calls) == 1  # the last turn's calls are not run


async def test_rate_limit_then_success_retries_once_honouring_retry_after(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime, sleeps: Sleeps
) -> None:
    fake_api.enqueue(Reply.rate_limited(retry_after=2), Reply.text("ok"))

    result = await runtime.run(make_spec(), "hi")

    assert result.success, result.error
    assert result.text == "ok"
    assert len(fake_api.message_requests()) == 2
    assert sleeps.waits == [2.0]
    assert all(r.headers.get("x-stainless-retry-count") == "0" for r in fake_api.requests)


async def test_persistent_overload_is_a_typed_error_without_partial_result(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime, sleeps: Sleeps
) -> None:
    fake_api.enqueue(Reply.overloaded(), Reply.overloaded(), Reply.overloaded())

    result = await runtime.run(make_spec(), "hi")

    assert result.error is not None
    assert result.error.kind is ErrorKind.OVERLOADED
    assert result.error.status_code == 529
    assert (result.text, result.output, result.tool_calls) == ("", None, ())
    assert len(fake_api.message_requests()) == 3
    assert len(sleeps.waits) == 2
    assert all(0.5 <= w <= 30 for w in sleeps.waits)


async def test_bad_request_is_not_retried(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime, sleeps: Sleeps
) -> None:
    fake_api.enqueue(Reply.error(400, message="messages: roles must alternate"))

    result = await runtime.run(make_spec(), "hi")

    assert result.error is not None
    assert result.error.kind is ErrorKind.BAD_REQUEST
    assert result.error.message == "messages: roles must alternate"
    assert len(fake_api.message_requests()) == 1
    assert sleeps.waits == []


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (Reply.error(401, message="invalid x-api-key"), ErrorKind.AUTHENTICATION),
        (Reply.error(403, message="not allowed"), ErrorKind.AUTHENTICATION),
        (Reply.error(404, message="model: claude-nope"), ErrorKind.MODEL_NOT_FOUND),
        (Reply.error(404, message="Not found"), ErrorKind.BAD_REQUEST),
        (Reply.error(413, message="too large"), ErrorKind.BAD_REQUEST),
        (Reply.server_error(), ErrorKind.SERVER_ERROR),
        (Reply.drop(), ErrorKind.CONNECTION),
    ],
)
async def test_api_failures_map_to_error_kinds(
    fake_api: FakeMessagesAPI, reply: Reply, kind: ErrorKind
) -> None:
    fake_api.set_fallback(reply)
    async with AnthropicRuntime(
        api_key="k", base_url=fake_api.base_url, retry_policy=RetryPolicy.no_retry()
    ) as runtime:
        result = await runtime.run(make_spec(), "hi")

    assert result.error is not None
    assert result.error.kind is kind


async def test_a_hanging_request_is_bounded_by_timeout_s(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    fake_api.enqueue(Reply.hang(seconds=30))
    started = time.monotonic()

    result = await runtime.run(make_spec(timeout_s=0.3), "hi")

    assert result.error is not None
    assert result.error.kind is ErrorKind.TIMEOUT
    assert time.monotonic() - started < 5
    assert len(fake_api.message_requests()) == 1


async def test_large_max_tokens_requests_are_streamed(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime
) -> None:
    # The SDK refuses such a request without streaming; the SSE path must give the same result.
    fake_api.enqueue(
        Reply.tool_uses(("lookup", {"key": "a"}), ("lookup", {"key": "b"}), usage=Usage(5, 5)),
        Reply.text("streamed answer", usage=Usage(7, 3)),
    )

    result = await runtime.run(make_spec(max_tokens=32_000), "go", tools=[LOOKUP])

    assert result.success, result.error
    assert result.text == "streamed answer"
    assert [c.output for c in result.tool_calls] == [
        "value of a (limit 3)",
        "value of b (limit 3)",
    ]
    assert result.usage == Usage(12, 8)
    assert [r.stream for r in fake_api.message_requests()] == [True, True]


async def test_an_error_event_mid_stream_is_typed_and_retried(
    fake_api: FakeMessagesAPI, runtime: AnthropicRuntime, sleeps: Sleeps
) -> None:
    fake_api.enqueue(Reply.stream_error("overloaded_error"), Reply.text("recovered"))

    result = await runtime.run(make_spec(max_tokens=32_000), "go")

    assert result.text == "recovered"
    assert len(fake_api.message_requests()) == 2
    assert len(sleeps.waits) == 1


async def test_an_error_event_mid_stream_maps_by_its_type(fake_api: FakeMessagesAPI) -> None:
    fake_api.enqueue(Reply.stream_error("invalid_request_error", "bad tool schema"))
    async with AnthropicRuntime(
        api_key="k", base_url=fake_api.base_url, retry_policy=RetryPolicy.no_retry()
    ) as runtime:
        result = await runtime.run(make_spec(max_tokens=32_000), "go")

    assert result.error is not None
    assert result.error.kind is ErrorKind.BAD_REQUEST
    assert result.error.message == "bad tool schema"
    assert result.error.status_code is None


async def test_a_given_client_is_used_without_its_own_retries(fake_api: FakeMessagesAPI) -> None:
    client = anthropic.AsyncAnthropic(api_key="k", base_url=fake_api.base_url, max_retries=5)
    fake_api.enqueue(Reply.server_error())
    try:
        runtime = AnthropicRuntime(client=client, retry_policy=RetryPolicy.no_retry())
        result = await runtime.run(make_spec(), "hi")
    finally:
        await client.close()

    assert runtime.client.max_retries == 0
    assert result.error is not None
    assert result.error.kind is ErrorKind.SERVER_ERROR
    assert len(fake_api.message_requests()) == 1


async def test_temperature_can_be_kept_out_of_the_request(fake_api: FakeMessagesAPI) -> None:
    fake_api.set_fallback(Reply.text("ok"))
    async with AnthropicRuntime(
        api_key="k", base_url=fake_api.base_url, send_temperature=False
    ) as runtime:
        await runtime.run(make_spec(temperature=0.3), "hi")

    [request] = fake_api.message_requests()
    assert "temperature" not in request.json


async def test_model_aliases_and_defaults(fake_api: FakeMessagesAPI) -> None:
    fake_api.set_fallback(Reply.text("ok"))
    async with AnthropicRuntime(
        api_key="k", base_url=fake_api.base_url, default_model="claude-haiku-4-5"
    ) as runtime:
        await runtime.run(make_spec(model="sonnet"), "hi")
        await runtime.run(make_spec(model=None), "hi")
        no_default = AnthropicRuntime(api_key="k", base_url=fake_api.base_url)
        with pytest.raises(ConfigurationError, match="names no model"):
            await no_default.run(make_spec(model=None), "hi")
        await no_default.aclose()

    assert [r.model for r in fake_api.message_requests()] == [
        "claude-sonnet-4-6",
        "claude-haiku-4-5",
    ]


def test_misuse_raises_configuration_error(
    fake_api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="API key"):
        AnthropicRuntime(base_url=fake_api.base_url)
    client = anthropic.AsyncAnthropic(api_key="k", base_url=fake_api.base_url)
    with pytest.raises(ConfigurationError, match="not both"):
        AnthropicRuntime(client=client, api_key="k")
    with pytest.raises(ConfigurationError, match="loopback"):
        AnthropicRuntime(api_key="k", base_url="https://api.anthropic.com")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="default"):
        AnthropicRuntime(api_key="k")


def test_cost_table_knows_families_and_admits_ignorance() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)

    assert estimate_cost_usd("claude-sonnet-4-6", usage) == pytest.approx(18.0)
    assert estimate_cost_usd("claude-haiku-4-5-20251001", usage) == pytest.approx(6.0)
    assert estimate_cost_usd("claude-opus-4-1", Usage(cache_read_tokens=1_000_000)) == (
        pytest.approx(1.5)
    )
    assert estimate_cost_usd("some-other-model", usage) is None


# --- the retry policy ---------------------------------------------------------------------


async def test_retry_gives_up_when_the_wait_would_pass_the_deadline() -> None:
    sleeps = Sleeps()
    policy = RetryPolicy(max_attempts=5, max_wait_s=60, deadline_s=10, sleep=sleeps)
    calls = 0

    async def limited() -> str:
        nonlocal calls
        calls += 1
        raise AgentRunError(ErrorKind.RATE_LIMIT, "slow down", status_code=429, retry_after_s=30)

    with pytest.raises(AgentRunError) as raised:
        await run_with_retry(policy, limited)

    assert raised.value.kind is ErrorKind.RATE_LIMIT
    assert (calls, sleeps.waits) == (1, [])


async def test_retry_waits_grow_and_are_capped() -> None:
    sleeps = Sleeps()
    policy = RetryPolicy(max_attempts=5, initial_wait_s=1, max_wait_s=5, sleep=sleeps)

    async def down() -> str:
        raise AgentRunError(ErrorKind.SERVER_ERROR, "down", status_code=500)

    with pytest.raises(AgentRunError):
        await run_with_retry(policy, down)

    assert len(sleeps.waits) == 4
    for attempt, wait in enumerate(sleeps.waits, start=1):
        assert min(5.0, 2.0 ** (attempt - 1)) <= wait <= min(5.0, 2.0 ** (attempt - 1) + 1)


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (AgentRunError(ErrorKind.RATE_LIMIT, "", status_code=429), True),
        (AgentRunError(ErrorKind.OVERLOADED, "", status_code=529), True),
        (AgentRunError(ErrorKind.SERVER_ERROR, "", status_code=503), True),
        (AgentRunError(ErrorKind.CONNECTION, ""), True),
        (AgentRunError(ErrorKind.TIMEOUT, ""), True),
        (AgentRunError(ErrorKind.TIMEOUT, "", status_code=408), True),
        (AgentRunError(ErrorKind.BAD_REQUEST, "", status_code=409), True),
        (AgentRunError(ErrorKind.BAD_REQUEST, "", status_code=400), False),
        (AgentRunError(ErrorKind.AUTHENTICATION, "", status_code=401), False),
        (AgentRunError(ErrorKind.MODEL_NOT_FOUND, "", status_code=404), False),
        (AgentRunError(ErrorKind.TRUNCATED, ""), False),
        (ValueError("not a model failure"), False),
    ],
)
def test_what_is_retried(error: BaseException, retryable: bool) -> None:
    assert is_retryable(error) is retryable


# --- the network guard --------------------------------------------------------------------


def test_the_guard_refuses_non_loopback_and_allows_loopback(fake_api: FakeMessagesAPI) -> None:
    with refuse_non_loopback() as guard:
        with pytest.raises(NetworkRefusedError, match=r"203\.0\.113\.7:443"):
            socket.create_connection(("203.0.113.7", 443), timeout=1)
        with pytest.raises(NetworkRefusedError, match=r"api\.anthropic\.com"):
            socket.getaddrinfo("api.anthropic.com", 443)
        with socket.socket() as sock, pytest.raises(NetworkRefusedError):
            sock.connect_ex(("198.51.100.1", 80))
        with socket.create_connection(("127.0.0.1", fake_api.port), timeout=1):
            pass
        socket.getaddrinfo("localhost", fake_api.port)

    assert guard.refused == ["203.0.113.7:443", "api.anthropic.com:443", "198.51.100.1:80"]
    assert issubclass(NetworkRefusedError, ConnectionRefusedError)


def test_every_test_runs_under_the_guard_and_knows_it_is_a_test(
    network_guard: NetworkGuard | None,
) -> None:
    with pytest.raises(NetworkRefusedError):
        socket.create_connection(("192.0.2.1", 80), timeout=1)

    assert under_tests()
    assert network_guard is not None
    assert network_guard.refused == ["192.0.2.1:80"]  # would fail the test at teardown
    network_guard.refused.clear()


@pytest.mark.allow_network
def test_the_allow_network_marker_lifts_the_guard() -> None:
    # Only the wiring is checked: nothing connects anywhere.
    assert socket.socket.connect is _REAL_CONNECT
    assert socket.getaddrinfo is _REAL_GETADDRINFO


def test_the_guard_is_undone_after_the_block() -> None:
    connect = socket.socket.connect
    with refuse_non_loopback():
        assert socket.socket.connect is not connect
    assert socket.socket.connect is connect


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8080", True),
        ("http://localhost:1234/v1", True),
        ("http://[::1]:80", True),
        ("127.0.0.1:9", True),
        ("https://api.anthropic.com", False),
        ("http://10.0.0.1", False),
        ("http://127.0.0.1.example.com", False),
        ("", False),
    ],
)
def test_is_loopback_url(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback
