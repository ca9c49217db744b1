"""``AnthropicRuntime``: agents run on the Anthropic Messages API.

The turn loop itself (tools, structured output, truncation, limits) is the shared one in
``tool_loop``; this module only turns a ``ModelRequest`` into a ``messages.create`` call, the
``Message`` back into a ``ModelResponse``, and the SDK's exceptions into ``AgentRunError``.
Each request runs under the one ``RetryPolicy`` and the client is built with ``max_retries=0``
so the SDK's own retries do not multiply the attempts. ``anthropic`` is imported only when a
runtime is constructed.

Error mapping (``AgentRunError.kind``): 429 -> RATE_LIMIT (with ``retry_after_s`` from
``retry-after-ms`` / ``retry-after``), 529 or ``overloaded_error`` -> OVERLOADED, other 5xx ->
SERVER_ERROR, connection failure -> CONNECTION, client timeout or 408 -> TIMEOUT, 401/403 ->
AUTHENTICATION, 404 naming the model -> MODEL_NOT_FOUND, other 4xx -> BAD_REQUEST, an ``error``
event inside a stream -> by its error type, anything else from the SDK -> RUNTIME.

Requests are non-streaming, except those with ``max_tokens`` above
``STREAMING_ABOVE_MAX_TOKENS``, which the SDK refuses to send without streaming (they might
outlast its 10-minute request timeout); those are streamed and collected into one message.

This client version has no ``temperature`` parameter anywhere (``messages.create`` lost it); an
agent's ``temperature`` is still sent, in the request body through ``extra_body``, because the
agent file asks for it. Pass ``send_temperature=False`` if the API rejects the field.
"""

from __future__ import annotations

import email.utils
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentmend.infrastructure.errors import AgentRunError, ConfigurationError, ErrorKind
from agentmend.infrastructure.llm.base import AgentResult, OutputT, RuntimeBase, ToolSpec, Usage
from agentmend.infrastructure.llm.network_guard import refuse_real_api_under_tests
from agentmend.infrastructure.llm.retry import RetryPolicy, run_with_retry
from agentmend.infrastructure.llm.tool_loop import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TURNS,
    Message,
    ModelRequest,
    ModelResponse,
    TextBlock,
    ToolUseBlock,
    run_agent_loop,
)

if TYPE_CHECKING:
    import anthropic

    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "MODEL_ALIASES",
    "PRICES_PER_MTOK",
    "STREAMING_ABOVE_MAX_TOKENS",
    "AnthropicRuntime",
    "estimate_cost_usd",
    "map_anthropic_error",
    "resolve_model",
]

STREAMING_ABOVE_MAX_TOKENS = 8192
"""Requests allowing more output tokens than this are streamed (the SDK's long-request rule)."""

MODEL_ALIASES: dict[str, str] = {
    "sonnet": "claude-sonnet-4-6",
    "opus": "claude-opus-4-6",
    "haiku": "claude-haiku-4-5",
}
"""Claude Code's model aliases in agent files, resolved to API model names."""


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens; cache writes at 1.25x input (5-minute), reads at 0.1x."""

    input: float
    output: float

    def cost(self, usage: Usage) -> float:
        tokens = (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_creation_tokens * self.input * 1.25
            + usage.cache_read_tokens * self.input * 0.1
        )
        return tokens / 1_000_000


PRICES_PER_MTOK: dict[str, Price] = {
    "claude-opus-4-6": Price(5.0, 25.0),
    "claude-opus-4-5": Price(5.0, 25.0),
    "claude-opus-4-1": Price(15.0, 75.0),
    "claude-opus-4-0": Price(15.0, 75.0),
    "claude-opus-4": Price(15.0, 75.0),
    "claude-sonnet-4-6": Price(3.0, 15.0),
    "claude-sonnet-4-5": Price(3.0, 15.0),
    "claude-sonnet-4-0": Price(3.0, 15.0),
    "claude-sonnet-4": Price(3.0, 15.0),
    "claude-3-7-sonnet": Price(3.0, 15.0),
    "claude-haiku-4-5": Price(1.0, 5.0),
    "claude-3-5-haiku": Price(0.8, 4.0),
    "claude-3-haiku": Price(0.25, 1.25),
}
"""List prices by model family (short-context rates); a family not listed has no cost."""

_DATED = re.compile(r"-(\d{8}|latest)$")


def estimate_cost_usd(model: str, usage: Usage) -> float | None:
    """The list-price cost of ``usage`` on ``model``, or None for a family not in the table."""
    price = PRICES_PER_MTOK.get(_DATED.sub("", model))
    return price.cost(usage) if price is not None else None


def resolve_model(spec: AgentSpec, default_model: str | None) -> str:
    """The API model name for ``spec``: aliases resolved, none or ``inherit`` the default.

    Raises:
        ConfigurationError: the spec names no model and there is no default.
    """
    name = spec.model
    if name is None or name == "inherit":
        name = default_model
    if name is None:
        raise ConfigurationError(
            f"agent {spec.name!r} names no model and the runtime has no default_model"
        )
    return MODEL_ALIASES.get(name, name)


def _retry_after_s(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return float(value) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def map_anthropic_error(exc: Exception) -> AgentRunError:
    """The ``AgentRunError`` for an exception raised by the ``anthropic`` client."""
    import anthropic

    if isinstance(exc, anthropic.APITimeoutError):
        return AgentRunError(ErrorKind.TIMEOUT, "the request to the model API timed out")
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return AgentRunError(ErrorKind.CONNECTION, f"could not reach the model API{detail}")
    if not isinstance(exc, anthropic.APIStatusError):
        return AgentRunError(ErrorKind.RUNTIME, f"{type(exc).__name__}: {exc}")
    message = exc.api_message or exc.message
    retry_after = _retry_after_s(exc.response.headers)
    if exc.status_code < 400:
        # An ``error`` event in the middle of a 200 stream: only the error type tells.
        kind = _STREAM_ERROR_KINDS.get(str(exc.type), ErrorKind.SERVER_ERROR)
        return AgentRunError(kind, message, retry_after_s=retry_after)
    status = exc.status_code
    if status == 429:
        kind = ErrorKind.RATE_LIMIT
    elif status == 529 or exc.type == "overloaded_error":
        kind = ErrorKind.OVERLOADED
    elif status >= 500:
        kind = ErrorKind.SERVER_ERROR
    elif status in (401, 403):
        kind = ErrorKind.AUTHENTICATION
    elif status == 408:
        kind = ErrorKind.TIMEOUT
    elif status == 404 and "model" in message.lower():
        # The messages endpoint has one resource in play; a 404 about another is a bad URL.
        kind = ErrorKind.MODEL_NOT_FOUND
    else:
        kind = ErrorKind.BAD_REQUEST
    return AgentRunError(kind, message, status_code=status, retry_after_s=retry_after)


_STREAM_ERROR_KINDS = {
    "rate_limit_error": ErrorKind.RATE_LIMIT,
    "overloaded_error": ErrorKind.OVERLOADED,
    "api_error": ErrorKind.SERVER_ERROR,
    "timeout_error": ErrorKind.TIMEOUT,
    "authentication_error": ErrorKind.AUTHENTICATION,
    "permission_error": ErrorKind.AUTHENTICATION,
    "invalid_request_error": ErrorKind.BAD_REQUEST,
    "request_too_large": ErrorKind.BAD_REQUEST,
}


def _message_param(message: Message) -> dict[str, Any]:
    content: list[Any] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            content.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            content.append(
                {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
            )
        else:
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": block.tool_use_id,
                "content": block.content,
            }
            if block.is_error:
                result["is_error"] = True
            content.append(result)
    return {"role": message.role, "content": content}


class AnthropicRuntime(RuntimeBase):
    """Runs agents on the Messages API (``anthropic.AsyncAnthropic``).

    Args:
        client: an ``AsyncAnthropic`` to use (a copy with ``max_retries=0`` is taken); or
        api_key: the key (default ``ANTHROPIC_API_KEY``) for a client this runtime builds,
        base_url: its base URL (default ``ANTHROPIC_BASE_URL``, then the SDK's default).
        retry_policy: the retry schedule per model request (default ``RetryPolicy()``).
        default_model: the model for specs that name none (or ``inherit``).
        request_timeout_s: the client's timeout per HTTP request (default: the SDK's).
        default_max_turns / default_max_tokens: for specs that do not set them.
        send_temperature: send a spec's ``temperature`` (through ``extra_body``).

    Raises:
        ConfigurationError: no client and no key, both a client and key/URL, or (under tests,
            ``AGENTMEND_TESTING=1``) a base URL that is not loopback.
    """

    def __init__(
        self,
        *,
        client: anthropic.AsyncAnthropic | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        retry_policy: RetryPolicy | None = None,
        default_model: str | None = None,
        request_timeout_s: float | None = None,
        default_max_turns: int = DEFAULT_MAX_TURNS,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        send_temperature: bool = True,
    ) -> None:
        import anthropic

        if default_max_turns < 1 or default_max_tokens < 1:
            raise ConfigurationError("default_max_turns and default_max_tokens must be positive")
        if client is not None:
            if api_key is not None or base_url is not None:
                raise ConfigurationError("give either client or api_key/base_url, not both")
            refuse_real_api_under_tests(str(client.base_url))
            self._client = client.with_options(max_retries=0)
            self._owns_client = False
        else:
            key = api_key or os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise ConfigurationError(
                    "AnthropicRuntime needs an API key: pass api_key= or a client=, "
                    "or set ANTHROPIC_API_KEY"
                )
            url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
            refuse_real_api_under_tests(url)
            timeout: float | anthropic.NotGiven = (
                request_timeout_s if request_timeout_s is not None else anthropic.NOT_GIVEN
            )
            self._client = anthropic.AsyncAnthropic(
                api_key=key, base_url=url, max_retries=0, timeout=timeout
            )
            self._owns_client = True
        self._retry = retry_policy or RetryPolicy()
        self._default_model = default_model
        self._default_max_turns = default_max_turns
        self._default_max_tokens = default_max_tokens
        self._send_temperature = send_temperature
        self._api_error: type[anthropic.AnthropicError] = anthropic.AnthropicError
        self._omit = anthropic.omit

    @property
    def client(self) -> anthropic.AsyncAnthropic:
        """The client in use (built with ``max_retries=0``)."""
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client if this runtime built it."""
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> AnthropicRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def resolve_model(self, spec: AgentSpec) -> str:
        """The API model name for ``spec`` (aliases resolved, ``inherit`` -> default)."""
        return resolve_model(spec, self._default_model)

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        """Run ``spec`` on ``prompt``; a failure is returned in ``AgentResult.error``."""
        return await run_agent_loop(
            spec,
            prompt,
            call_model=self._call_model,
            model=self.resolve_model(spec),
            tools=tools,
            output_type=output_type,
            default_max_turns=self._default_max_turns,
            default_max_tokens=self._default_max_tokens,
            cost=estimate_cost_usd,
            read_only_tools=self.read_only_tools,
        )

    async def _call_model(self, request: ModelRequest) -> ModelResponse:
        messages: Any = [_message_param(m) for m in request.messages]
        tools: Any = (
            [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in request.tools
            ]
            if request.tools
            else self._omit
        )
        tool_choice: Any = (
            {"type": "tool", "name": request.tool_choice}
            if request.tool_choice is not None
            else self._omit
        )
        extra_body = (
            {"temperature": request.temperature}
            if request.temperature is not None and self._send_temperature
            else None
        )

        system = request.system or self._omit
        # The SDK refuses a non-streaming request that may outlast its 10-minute timeout
        # (large max_tokens); such requests are streamed and collected into one message.
        streamed = request.max_tokens > STREAMING_ABOVE_MAX_TOKENS

        async def attempt() -> ModelResponse:
            message: anthropic.types.Message
            try:
                if streamed:
                    async with self._client.messages.stream(
                        model=request.model,
                        max_tokens=request.max_tokens,
                        system=system,
                        messages=messages,
                        tools=tools,
                        tool_choice=tool_choice,
                        extra_body=extra_body,
                    ) as stream:
                        message = await stream.get_final_message()
                else:
                    message = await self._client.messages.create(
                        model=request.model,
                        max_tokens=request.max_tokens,
                        system=system,
                        messages=messages,
                        tools=tools,
                        tool_choice=tool_choice,
                        extra_body=extra_body,
                    )
            except self._api_error as exc:
                raise map_anthropic_error(exc) from exc
            return _model_response(message)

        return await run_with_retry(self._retry, attempt)


def _model_response(message: anthropic.types.Message) -> ModelResponse:
    content: list[TextBlock | ToolUseBlock] = []
    for block in message.content:
        # Other block types (thinking, server tools) are not requested, so not expected.
        if block.type == "text":
            content.append(TextBlock(block.text))
        elif block.type == "tool_use":
            arguments = block.input if isinstance(block.input, dict) else {}
            content.append(ToolUseBlock(block.id, block.name, dict(arguments)))
    usage = message.usage
    return ModelResponse(
        content=tuple(content),
        stop_reason=message.stop_reason,
        usage=Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_input_tokens or 0,
            cache_creation_tokens=usage.cache_creation_input_tokens or 0,
        ),
        model=message.model,
    )
