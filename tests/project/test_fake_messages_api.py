"""The fake Messages API speaks the real protocol: the real ``anthropic`` client parses it."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from anthropic.types import MessageParam
from fake_messages_api import STRUCTURED_OUTPUT_TOOL, FakeMessagesAPI, RecordedRequest, Reply

from agentmend.infrastructure.llm.base import Usage

MODEL = "claude-sonnet-4-6"  # 4-5 makes the client warn DeprecationWarning
USER: list[MessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def client(fake_api: FakeMessagesAPI) -> AsyncIterator[anthropic.AsyncAnthropic]:
    c = anthropic.AsyncAnthropic(api_key="test-key", base_url=fake_api.base_url, max_retries=0)
    try:
        yield c
    finally:
        await c.close()


def _raw(api: FakeMessagesAPI, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=payload, headers={"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def test_text_reply_is_parsed_by_the_real_client(
    fake_api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    usage = Usage(input_tokens=12, output_tokens=3, cache_read_tokens=4, cache_creation_tokens=2)
    fake_api.enqueue(Reply.text("hello there", usage=usage))

    message = await client.messages.create(model=MODEL, max_tokens=64, messages=USER)

    assert message.content[0].type == "text"
    assert message.content[0].text == "hello there"
    assert message.stop_reason == "end_turn"
    assert message.model == MODEL
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 3)
    assert message.usage.cache_read_input_tokens == 4
    assert message.usage.cache_creation_input_tokens == 2
    [request] = fake_api.message_requests()
    # this client version sends the key as a bearer token; older ones used x-api-key
    credentials = request.headers.get("x-api-key", "") + request.headers.get("authorization", "")
    assert "test-key" in credentials
    assert request.json["messages"] == USER
    assert request.model == MODEL


async def test_streamed_tool_uses_and_text_are_accumulated_by_the_real_client(
    fake_api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    long_input = {"query": "a fairly long argument " * 4, "n": [1, 2, 3], "nested": {"ok": True}}
    fake_api.enqueue(
        Reply.tool_uses(("search", long_input), ("count", {})),
        Reply.text("the final answer is forty-two", usage=Usage(input_tokens=7, output_tokens=9)),
    )

    async with client.messages.stream(model=MODEL, max_tokens=64, messages=USER) as stream:
        first = await stream.get_final_message()
    texts: list[str] = []
    async with client.messages.stream(model=MODEL, max_tokens=64, messages=USER) as stream:
        async for chunk in stream.text_stream:
            texts.append(chunk)
        second = await stream.get_final_message()

    assert first.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "name", None)) for b in first.content] == [
        ("tool_use", "search"),
        ("tool_use", "count"),
    ]
    assert first.content[0].type == "tool_use"
    assert first.content[0].input == long_input
    assert first.content[1].type == "tool_use"
    assert first.content[1].input == {}
    assert second.content[0].type == "text"
    assert second.content[0].text == "the final answer is forty-two"
    assert len(texts) > 1  # really streamed in pieces
    assert second.stop_reason == "end_turn"
    assert (second.usage.input_tokens, second.usage.output_tokens) == (7, 9)
    assert all(r.stream for r in fake_api.message_requests())


async def test_structured_reply_and_max_tokens_stop_reason(
    fake_api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    fake_api.enqueue(Reply.structured({"a": 1}), Reply.text("cut of", stop_reason="max_tokens"))

    structured = await client.messages.create(model=MODEL, max_tokens=64, messages=USER)
    truncated = await client.messages.create(model=MODEL, max_tokens=64, messages=USER)

    block = structured.content[0]
    assert block.type == "tool_use"
    assert (block.name, block.input) == (STRUCTURED_OUTPUT_TOOL, {"a": 1})
    assert truncated.stop_reason == "max_tokens"


async def test_error_replies_become_the_real_clients_typed_errors(
    fake_api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    fake_api.enqueue(
        Reply.rate_limited(retry_after=3),
        Reply.overloaded(),
        Reply.server_error(),
        Reply.error(400, message="max_tokens: must be positive"),
    )

    with pytest.raises(anthropic.RateLimitError) as rate:
        await client.messages.create(model=MODEL, max_tokens=64, messages=USER)
    with pytest.raises(anthropic.OverloadedError) as overloaded:
        await client.messages.create(model=MODEL, max_tokens=64, messages=USER)
    with pytest.raises(anthropic.InternalServerError) as server:
        await client.messages.create(model=MODEL, max_tokens=64, messages=USER)
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model=MODEL, max_tokens=64, messages=USER)

    assert rate.value.response.headers["retry-after"] == "3"
    assert rate.value.type == "rate_limit_error"
    assert overloaded.value.status_code == 529
    assert overloaded.value.type == "overloaded_error"
    assert server.value.status_code == 500
    assert bad.value.api_message == "max_tokens: must be positive"


async def test_unscripted_request_fails_loudly_and_fallback_can_be_set(
    fake_api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(anthropic.InternalServerError, match="unscripted request"):
        await client.messages.create(model=MODEL, max_tokens=64, messages=USER)

    fake_api.set_fallback(Reply.text("default"))
    message = await client.messages.create(model=MODEL, max_tokens=64, messages=USER)

    assert message.content[0].type == "text"
    assert message.content[0].text == "default"


async def test_responder_routes_by_request_and_falls_through_to_the_queue(
    fake_api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    def route(request: RecordedRequest) -> Reply | None:
        return Reply.text("title") if request.model == "claude-haiku-4-5" else None

    fake_api.set_responder(route)
    fake_api.enqueue(Reply.text("main"))

    main = await client.messages.create(model=MODEL, max_tokens=64, messages=USER)
    title = await client.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=USER)

    assert [main.content[0].type, title.content[0].type] == ["text", "text"]
    assert main.content[0].text == "main"  # type: ignore[union-attr]
    assert title.content[0].text == "title"  # type: ignore[union-attr]
    assert fake_api.pending == 0


async def test_drop_is_a_connection_error(
    fake_api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    fake_api.enqueue(Reply.drop(), Reply.text("after"))

    with pytest.raises(anthropic.APIConnectionError):
        await client.messages.create(model=MODEL, max_tokens=64, messages=USER)
    message = await client.messages.create(model=MODEL, max_tokens=64, messages=USER)

    assert message.content[0].type == "text"


async def test_hang_holds_until_released_then_answers(
    fake_api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    fake_api.enqueue(Reply.hang(seconds=30, then=Reply.text("late")))

    call = asyncio.create_task(client.messages.create(model=MODEL, max_tokens=64, messages=USER))
    await asyncio.to_thread(fake_api.wait_for_message_requests, 1)
    await asyncio.sleep(0.05)
    assert not call.done()
    fake_api.release_hangs()
    message = await asyncio.wait_for(call, timeout=5)

    assert message.content[0].type == "text"


def test_close_returns_promptly_while_a_request_hangs() -> None:
    api = FakeMessagesAPI()
    api.enqueue(Reply.hang(seconds=60))
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=10)
    conn.request("POST", "/v1/messages", body=b"{}", headers={"content-type": "application/json"})
    api.wait_for_message_requests(1)

    api.close()

    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        conn.getresponse()
    conn.close()


def test_other_paths_are_answered_harmlessly_and_recorded(fake_api: FakeMessagesAPI) -> None:
    status_head, _ = _raw(fake_api, "HEAD", "/api/hello")
    status_count, count_body = _raw(
        fake_api, "POST", "/v1/messages/count_tokens?beta=true", {"messages": USER}
    )
    status_other, other_body = _raw(fake_api, "POST", "/v1/other", {})

    assert (status_head, status_count, status_other) == (200, 200, 404)
    assert json.loads(count_body)["input_tokens"] >= 1
    assert json.loads(other_body)["error"]["type"] == "not_found_error"
    assert [(r.method, r.path) for r in fake_api.requests] == [
        ("HEAD", "/api/hello"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/other"),
    ]
    assert fake_api.requests[1].query == {"beta": ["true"]}
    assert fake_api.message_requests() == []


async def test_beta_query_is_a_messages_request(fake_api: FakeMessagesAPI) -> None:
    fake_api.enqueue(Reply.tool_use("t", {"x": 1}))

    status, body = await asyncio.to_thread(
        _raw, fake_api, "POST", "/v1/messages?beta=true", {"model": MODEL, "messages": USER}
    )

    assert status == 200
    assert json.loads(body)["content"][0]["name"] == "t"
    [request] = fake_api.message_requests()
    assert request.query == {"beta": ["true"]}


def test_one_script_answers_openai_chat_completions_and_the_responses_api(
    fake_api: FakeMessagesAPI,
) -> None:
    # (the real openai client parses these in tests/infrastructure/telemetry/
    # test_instrumented_apps.py, with the instrumented apps' venv)
    fake_api.enqueue(
        Reply.tool_use(
            "lookup", {"q": "x"}, text="looking", usage=Usage(input_tokens=9, output_tokens=4)
        ),
        Reply.text("done", usage=Usage(input_tokens=12, output_tokens=3)),
    )
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}
    status, raw = _raw(fake_api, "POST", "/v1/chat/completions", body)
    assert status == 200
    completion = json.loads(raw)
    (choice,) = completion["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "looking"
    (call,) = choice["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "lookup",
        {"q": "x"},
    )
    assert completion["usage"] == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    assert completion["model"] == "gpt-4.1"

    status, raw = _raw(fake_api, "POST", "/v1/responses", {"model": "gpt-4.1", "input": "hi"})
    assert status == 200
    response = json.loads(raw)
    assert response["object"] == "response"
    (message,) = response["output"]
    assert message["content"][0] == {"type": "output_text", "text": "done", "annotations": []}
    assert (response["usage"]["input_tokens"], response["usage"]["output_tokens"]) == (12, 3)
    assert [r.path for r in fake_api.model_requests()] == ["/v1/chat/completions", "/v1/responses"]
    assert fake_api.message_requests() == []


def test_openai_errors_have_openais_shape_and_streams_are_refused(
    fake_api: FakeMessagesAPI,
) -> None:
    fake_api.enqueue(Reply.rate_limited(2), Reply.text("never streamed"))
    status, raw = _raw(fake_api, "POST", "/v1/responses", {"model": "m", "input": "hi"})
    assert status == 429
    assert json.loads(raw)["error"]["type"] == "rate_limit_error"
    body = {"model": "m", "messages": [], "stream": True}
    status, raw = _raw(fake_api, "POST", "/v1/chat/completions", body)
    assert status == 400
    assert "does not stream" in json.loads(raw)["error"]["message"]
