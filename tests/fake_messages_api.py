"""A scripted fake of the Anthropic Messages API on 127.0.0.1, for tests and benchmarks; it
also speaks OpenAI's chat completions and Responses API, from the same script.

The real clients (the ``anthropic`` package, and the Claude Code CLI bundled with
``claude-agent-sdk``) talk to it over real HTTP, so the request building, response parsing, SSE
streaming and error handling of those clients run for real; only the model is scripted.

Usage::

    api = FakeMessagesAPI()            # started at once on 127.0.0.1, a free port
    api.enqueue(
        Reply.tool_use("lookup", {"q": "x"}),
        Reply.text("done", usage=Usage(input_tokens=12, output_tokens=3)),
    )
    client = anthropic.AsyncAnthropic(api_key="test", base_url=api.base_url, max_retries=0)
    ...
    assert api.message_requests()[1].tool_results()[0]["content"] == "..."
    api.close()

(in tests use the ``fake_api`` fixture from ``tests/conftest.py``, which closes the server.)

What it answers:

- ``POST /v1/messages`` (any query, e.g. ``?beta=true``): the next scripted ``Reply``. First the
  responder set with ``set_responder(fn)`` is asked (``fn(request) -> Reply | None``; ``None``
  falls through), then the FIFO queue filled by ``enqueue``, then the fallback (``set_fallback``),
  which by default is a 500 ``api_error`` saying "unscripted request" so a test that sends more
  requests than it scripted fails loudly. A message reply is sent as JSON, or as SSE when the
  request body has ``"stream": true`` (the exact event sequence of the real API: message_start,
  ping, content_block_start / content_block_delta (text_delta, input_json_delta) /
  content_block_stop per block, message_delta with stop_reason and usage, message_stop), using
  chunked transfer encoding as the real API does.
- ``POST /v1/chat/completions`` and ``POST /v1/responses`` (OpenAI; point a client's
  ``base_url`` at ``api.base_url + "/v1"``): the same script, each ``Reply`` rendered in that
  API's shape (text blocks become the message's text, tool_use blocks its tool or function
  calls, usage ``prompt_tokens``/``completion_tokens`` or ``input_tokens``/``output_tokens``;
  an error is OpenAI's ``{"error": {...}}`` body). Not streamed: a request asking for a stream
  gets a 400 saying so, so a test cannot silently take a stream for an answer.
- ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` with N a rough count.
- ``HEAD`` / ``GET`` anything: 200 with an empty body (``/api/hello`` and similar probes);
  other paths: 404 with the real API's ``not_found_error`` body.

``Reply`` constructors: ``Reply.text``, ``Reply.tool_use``, ``Reply.tool_uses`` (several tool_use
blocks in one message), ``Reply.structured`` (the ``StructuredOutput`` tool call the CLI asks
for with ``output_format``), ``Reply.message`` (any blocks), ``Reply.error`` (any status, JSON body
as the real API's ``{"type": "error", "error": {...}}``) with shortcuts ``Reply.rate_limited``
(429 with ``retry-after``), ``Reply.overloaded`` (529) and ``Reply.server_error`` (500),
``Reply.stream_error`` (a stream that fails after message_start with an ``error`` event),
``Reply.hang`` (hold the request until ``release_hangs()``, ``close()`` or ``seconds`` pass, then
answer ``then`` or drop the connection) and ``Reply.drop`` (close the connection without an
answer). Content blocks for ``Reply.message`` are ``text_block(...)`` / ``tool_use_block(...)``
dicts, the API's own shape.

Every request is recorded (``api.requests``; ``api.message_requests()`` keeps only
``POST /v1/messages``, ``api.model_requests()`` the model calls of all three APIs) with method,
path, query, lower-cased headers, raw body and parsed JSON.
"""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from agentmend.infrastructure.llm.base import Usage

__all__ = [
    "DEFAULT_USAGE",
    "STRUCTURED_OUTPUT_TOOL",
    "FakeMessagesAPI",
    "RecordedRequest",
    "Reply",
    "text_block",
    "tool_use_block",
]

STRUCTURED_OUTPUT_TOOL = "StructuredOutput"
"""The structured-output tool name of the Claude Code CLI and agentmend's Anthropic runtime."""

DEFAULT_USAGE = Usage(input_tokens=10, output_tokens=5)
"""Usage reported when a reply does not give its own."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

_ids = itertools.count(1)


def _next_id(prefix: str) -> str:
    return f"{prefix}_fake{next(_ids):06d}"


def text_block(text: str) -> dict[str, Any]:
    """A ``text`` content block as the API returns it."""
    return {"type": "text", "text": text}


def tool_use_block(name: str, input: Mapping[str, Any], id: str | None = None) -> dict[str, Any]:
    """A ``tool_use`` content block as the API returns it (``id`` made up if not given)."""
    return {"type": "tool_use", "id": id or _next_id("toolu"), "name": name, "input": dict(input)}


@dataclass(frozen=True)
class Reply:
    """One scripted answer. Build it with the class-method constructors, not directly."""

    kind: str  # "message" | "error" | "stream_error" | "hang" | "drop"
    blocks: tuple[dict[str, Any], ...] = ()
    stop_reason: str | None = "end_turn"
    usage: Usage = DEFAULT_USAGE
    model: str | None = None  # None: echo the request's model
    status: int = 200
    error_type: str = ""
    error_message: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    seconds: float = 0.0
    then: Reply | None = None

    @classmethod
    def message(
        cls,
        blocks: Sequence[Mapping[str, Any]],
        *,
        stop_reason: str | None = None,
        usage: Usage = DEFAULT_USAGE,
        model: str | None = None,
    ) -> Reply:
        """An assistant message; ``stop_reason`` defaults to tool_use if a block is a tool call."""
        frozen = tuple(dict(b) for b in blocks)
        if stop_reason is None:
            has_tool = any(b.get("type") == "tool_use" for b in frozen)
            stop_reason = "tool_use" if has_tool else "end_turn"
        return cls("message", frozen, stop_reason, usage, model)

    @classmethod
    def text(
        cls,
        text: str,
        *,
        usage: Usage = DEFAULT_USAGE,
        stop_reason: str = "end_turn",
        model: str | None = None,
    ) -> Reply:
        """A text answer; ``stop_reason="max_tokens"`` scripts a truncated one."""
        return cls.message([text_block(text)], stop_reason=stop_reason, usage=usage, model=model)

    @classmethod
    def tool_use(
        cls,
        name: str,
        input: Mapping[str, Any],
        *,
        id: str | None = None,
        text: str | None = None,
        usage: Usage = DEFAULT_USAGE,
    ) -> Reply:
        """One tool call (optionally preceded by a text block), stop_reason tool_use."""
        blocks = [text_block(text)] if text else []
        blocks.append(tool_use_block(name, input, id))
        return cls.message(blocks, stop_reason="tool_use", usage=usage)

    @classmethod
    def tool_uses(
        cls, *calls: tuple[str, Mapping[str, Any]], usage: Usage = DEFAULT_USAGE
    ) -> Reply:
        """Several tool calls in one message: ``Reply.tool_uses(("a", {...}), ("b", {...}))``."""
        return cls.message([tool_use_block(n, i) for n, i in calls], usage=usage)

    @classmethod
    def structured(
        cls,
        obj: Mapping[str, Any],
        *,
        name: str = STRUCTURED_OUTPUT_TOOL,
        usage: Usage = DEFAULT_USAGE,
    ) -> Reply:
        """The structured-output tool call whose input is ``obj``."""
        return cls.message([tool_use_block(name, obj)], stop_reason="tool_use", usage=usage)

    @classmethod
    def error(
        cls,
        status: int,
        type_: str | None = None,
        message: str = "scripted error",
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """An error response with the real API's JSON body; ``type_`` defaults by status."""
        return cls(
            "error",
            status=status,
            error_type=type_ or _ERROR_TYPES.get(status, "api_error"),
            error_message=message,
            headers=tuple((headers or {}).items()),
        )

    @classmethod
    def rate_limited(cls, retry_after: float = 1.0) -> Reply:
        """429 ``rate_limit_error`` with a ``retry-after`` header (seconds)."""
        value = str(int(retry_after)) if float(retry_after).is_integer() else str(retry_after)
        return cls.error(
            429, "rate_limit_error", "Number of request tokens has exceeded your rate limit.",
            {"retry-after": value},
        )  # fmt: skip

    @classmethod
    def overloaded(cls) -> Reply:
        """529 ``overloaded_error``, as the API answers when it is overloaded."""
        return cls.error(529, "overloaded_error", "Overloaded", {"x-should-retry": "true"})

    @classmethod
    def server_error(cls, status: int = 500) -> Reply:
        """A 5xx ``api_error``."""
        return cls.error(status, "api_error", "Internal server error")

    @classmethod
    def stream_error(cls, type_: str = "overloaded_error", message: str = "Overloaded") -> Reply:
        """A streamed request gets 200, message_start, then an ``error`` event (as the real API
        does when it fails mid-stream); a non-streamed one gets the matching status code."""
        status = next((s for s, t in _ERROR_TYPES.items() if t == type_), 500)
        return cls("stream_error", status=status, error_type=type_, error_message=message)

    @classmethod
    def hang(cls, seconds: float = 60.0, then: Reply | None = None) -> Reply:
        """Hold the request until released or ``seconds`` pass; then answer ``then`` or drop."""
        return cls("hang", seconds=seconds, then=then)

    @classmethod
    def drop(cls) -> Reply:
        """Close the connection without sending a response."""
        return cls("drop")


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    body: bytes
    json: Any  # the parsed body, or None when it is not JSON

    @property
    def is_messages(self) -> bool:
        return self.method == "POST" and self.path == "/v1/messages"

    @property
    def is_openai(self) -> bool:
        return self.method == "POST" and self.path in _OPENAI_PATHS

    @property
    def is_model_call(self) -> bool:
        """A model call in any of the three APIs."""
        return self.is_messages or self.is_openai

    @property
    def model(self) -> str | None:
        value = self._get("model")
        return value if isinstance(value, str) else None

    @property
    def stream(self) -> bool:
        return bool(self._get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        value = self._get("messages")
        return list(value) if isinstance(value, list) else []

    @property
    def tool_names(self) -> list[str]:
        """Names of the tools offered in the request."""
        tools = self._get("tools")
        return [t.get("name", "") for t in tools] if isinstance(tools, list) else []

    def tool_results(self) -> list[dict[str, Any]]:
        """The ``tool_result`` blocks of the last user message (what the tools answered)."""
        if not self.messages:
            return []
        content = self.messages[-1].get("content")
        if not isinstance(content, list):
            return []
        return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]

    def _get(self, key: str) -> Any:
        return self.json.get(key) if isinstance(self.json, dict) else None


def _api_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
        "output_tokens": usage.output_tokens,
        "service_tier": "standard",
    }


def _message_json(reply: Reply, model: str) -> dict[str, Any]:
    return {
        "id": _next_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [dict(b) for b in reply.blocks],
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": _api_usage(reply.usage),
    }


_OPENAI_PATHS = ("/v1/chat/completions", "/v1/responses")
_OPENAI_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def _reply_text(reply: Reply) -> str:
    return "".join(b["text"] for b in reply.blocks if b.get("type") == "text")


def _reply_calls(reply: Reply) -> list[dict[str, Any]]:
    return [b for b in reply.blocks if b.get("type") == "tool_use"]


def _chat_completion_json(reply: Reply, model: str) -> dict[str, Any]:
    """``reply`` as OpenAI's chat completion object."""
    message: dict[str, Any] = {"role": "assistant", "content": _reply_text(reply) or None}
    calls = _reply_calls(reply)
    if calls:
        message["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["input"])},
            }
            for call in calls
        ]
    usage = reply.usage
    return {
        "id": _next_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _OPENAI_FINISH.get(reply.stop_reason or "", "stop"),
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def _response_json(reply: Reply, model: str) -> dict[str, Any]:
    """``reply`` as the Responses API's response object."""
    output: list[dict[str, Any]] = []
    text = _reply_text(reply)
    if text:
        output.append(
            {
                "type": "message",
                "id": _next_id("msg"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in _reply_calls(reply):
        output.append(
            {
                "type": "function_call",
                "id": _next_id("fc"),
                "call_id": call["id"],
                "name": call["name"],
                "arguments": json.dumps(call["input"]),
                "status": "completed",
            }
        )
    usage = reply.usage
    return {
        "id": _next_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def _chunks(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _sse_events(reply: Reply, model: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events of a streamed message, in the order and shape the real API sends them."""
    message = _message_json(reply, model)
    start = dict(message, content=[], stop_reason=None)
    # message_start carries the input-side usage; output tokens are final in message_delta.
    start["usage"] = dict(message["usage"], output_tokens=1)
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        if block["type"] == "tool_use":
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            yield "content_block_start", {
                "type": "content_block_start", "index": index, "content_block": opening,
            }  # fmt: skip
            # The API sends the arguments as JSON text in pieces, starting with an empty one.
            pieces = ["", *_chunks(json.dumps(block["input"]), 16)]
            for piece in pieces:
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield "content_block_delta", {
                    "type": "content_block_delta", "index": index, "delta": delta,
                }  # fmt: skip
        elif block["type"] == "text":
            yield "content_block_start", {
                "type": "content_block_start", "index": index,
                "content_block": {"type": "text", "text": ""},
            }  # fmt: skip
            for piece in _chunks(block["text"], 8) if block["text"] else [""]:
                yield "content_block_delta", {
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": piece},
                }  # fmt: skip
        else:
            raise ValueError(f"fake API cannot stream a {block['type']!r} block")
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
            "usage": {k: v for k, v in message["usage"].items() if k != "service_tier"},
        },
    )
    yield "message_stop", {"type": "message_stop"}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients pool connections
    server: _Server
    timeout = 30.0  # an idle keep-alive connection does not hold its thread forever
    # Headers and body go out in separate writes; with Nagle's algorithm and the client's
    # delayed ACK each response would stall about 40 ms.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request stderr lines of http.server."""

    def setup(self) -> None:
        super().setup()
        self.server.api._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.api._track(self.connection, add=False)

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = None
        request = RecordedRequest(
            method=self.command,
            path=parts.path,
            query=parse_qs(parts.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            json=parsed,
        )
        api = self.server.api
        api._record(request)
        if request.is_messages:
            self._answer(api._reply_for(request), request)
        elif request.is_openai:
            self._answer_openai(api._reply_for(request), request)
        elif self.command == "POST" and request.path == "/v1/messages/count_tokens":
            self._send_json(200, {"input_tokens": max(1, len(body) // 4)})
        elif self.command in ("HEAD", "GET"):
            self._send_bytes(200, b"", "text/plain")
        else:
            error = {"type": "not_found_error", "message": f"Not found: {request.path}"}
            self._send_json(404, {"type": "error", "error": error})

    def _answer(self, reply: Reply, request: RecordedRequest) -> None:
        api = self.server.api
        if reply.kind == "hang":
            released = api._release.wait(reply.seconds)
            # After close() there is nobody to answer: drop instead of the scripted reply.
            closed = released and api._closed
            reply = Reply.drop() if reply.then is None or closed else reply.then
        if reply.kind == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if reply.kind == "stream_error" and request.stream:
            self._send_sse(reply, request.model or "claude-sonnet-4-6")
            return
        if reply.kind in ("error", "stream_error"):
            body = {
                "type": "error",
                "error": {"type": reply.error_type, "message": reply.error_message},
                "request_id": _next_id("req"),
            }
            self._send_json(reply.status, body, dict(reply.headers))
            return
        model = reply.model or request.model or "claude-sonnet-4-6"
        if request.stream:
            self._send_sse(reply, model)
        else:
            self._send_json(200, _message_json(reply, model))

    def _answer_openai(self, reply: Reply, request: RecordedRequest) -> None:
        if request.stream:
            reply = Reply.error(400, "invalid_request_error", "the fake API does not stream")
        if reply.kind == "hang":
            released = self.server.api._release.wait(reply.seconds)
            closed = released and self.server.api._closed
            reply = Reply.drop() if reply.then is None or closed else reply.then
        if reply.kind == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if reply.kind in ("error", "stream_error"):
            error = {
                "message": reply.error_message,
                "type": reply.error_type,
                "param": None,
                "code": reply.error_type,
            }
            self._send_json(reply.status, {"error": error}, dict(reply.headers))
            return
        model = reply.model or request.model or "gpt-4.1"
        if request.path == "/v1/responses":
            self._send_json(200, _response_json(reply, model))
        else:
            self._send_json(200, _chat_completion_json(reply, model))

    def _send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send_bytes(status, json.dumps(body).encode(), "application/json", headers)

    def _send_bytes(
        self,
        status: int,
        data: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", _next_id("req"))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def _send_sse(self, reply: Reply, model: str) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", _next_id("req"))
        self.end_headers()
        events = _sse_events(reply, model)
        if reply.kind == "stream_error":
            error = {"type": reply.error_type, "message": reply.error_message}
            events = iter([next(events), ("error", {"type": "error", "error": error})])
        for event, data in events:
            payload = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a held (hanging) request never blocks shutdown
    api: FakeMessagesAPI


@dataclass
class FakeMessagesAPI:
    """The fake server. Constructing it starts it; ``close()`` stops it (idempotent)."""

    host: str = "127.0.0.1"
    requests: list[RecordedRequest] = field(default_factory=list, init=False)
    _queue: deque[Reply] = field(default_factory=deque, init=False, repr=False)
    _responder: Callable[[RecordedRequest], Reply | None] | None = field(
        default=None, init=False, repr=False
    )
    _fallback: Reply | None = field(default=None, init=False, repr=False)
    _lock: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)
    _release: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)
    _connections: set[socket.socket] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self._fallback = Reply.error(500, "api_error", "unscripted request to the fake API")
        self._server = _Server((self.host, 0), _Handler)
        self._server.api = self
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-messages-api",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``, for ``base_url=`` or ``ANTHROPIC_BASE_URL``."""
        return f"http://{self.host}:{self.port}"

    def enqueue(self, *replies: Reply) -> None:
        """Append replies to the FIFO script for ``POST /v1/messages``."""
        with self._lock:
            self._queue.extend(replies)

    def set_responder(self, fn: Callable[[RecordedRequest], Reply | None] | None) -> None:
        """Route message requests by content; ``fn`` returning None falls through to the queue.

        ``fn`` runs on a server thread; an exception in it becomes a 500 naming it.
        """
        with self._lock:
            self._responder = fn

    def set_fallback(self, reply: Reply | None) -> None:
        """What to answer when the script is empty (None restores the loud 500)."""
        with self._lock:
            self._fallback = reply or Reply.error(
                500, "api_error", "unscripted request to the fake API"
            )

    @property
    def pending(self) -> int:
        """Scripted replies not yet used."""
        with self._lock:
            return len(self._queue)

    def message_requests(self) -> list[RecordedRequest]:
        """Only the ``POST /v1/messages`` requests, in arrival order."""
        with self._lock:
            return [r for r in self.requests if r.is_messages]

    def model_requests(self) -> list[RecordedRequest]:
        """The model calls of all three APIs, in arrival order."""
        with self._lock:
            return [r for r in self.requests if r.is_model_call]

    def wait_for_message_requests(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until ``count`` message requests have arrived (raises TimeoutError)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while sum(r.is_messages for r in self.requests) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"fake API: fewer than {count} message requests arrived")
                self._lock.wait(remaining)
            return [r for r in self.requests if r.is_messages]

    def release_hangs(self) -> None:
        """Let every held request (and any later ``Reply.hang``) go on at once."""
        self._release.set()

    def close(self) -> None:
        """Stop serving, release held requests and close open connections."""
        if self._closed:
            return
        self._closed = True
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeMessagesAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)
            self._lock.notify_all()

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _reply_for(self, request: RecordedRequest) -> Reply:
        with self._lock:
            responder = self._responder
        if responder is not None:
            try:
                routed = responder(request)
            except Exception as exc:  # the test's bug: answer loudly, keep serving
                return Reply.error(500, "api_error", f"fake API responder raised {exc!r}")
            if routed is not None:
                return routed
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            assert self._fallback is not None
            return self._fallback
