"""The agent turn loop, shared by every runtime that drives a model one request at a time.

A runtime supplies one function, ``call_model(ModelRequest) -> ModelResponse`` (raising
``AgentRunError`` when the call fails), and ``run_agent_loop`` does the rest the same way for
all of them: the tool-use loop with a turn limit, concurrent tool calls, argument validation,
structured output through a forced tool with one repair turn, truncation, the run timeout,
usage and cost. The Anthropic runtime and the testing fakes go through this one code path, so
a test with a fake exercises what production runs.

The conversation format (what ``ModelRequest.messages`` holds and what a ``FunctionRuntime``
function receives) mirrors the Messages API: a tuple of ``Message(role, content)`` with
``role`` "user" or "assistant" and ``content`` a tuple of ``TextBlock(text)``,
``ToolUseBlock(id, name, input)`` (assistant) and ``ToolResultBlock(tool_use_id, content,
is_error)`` (user). The first message is the user's prompt.

Semantics worth knowing:

- ``max_turns`` counts model requests. A model that still wants tools (or owes the structured
  answer) when the limit is reached fails with ``MAX_TURNS``; its tool calls are not run.
- Several tool calls in one response run concurrently; each becomes a ``ToolCallRecord``.
  A handler that raises, an unknown tool name and invalid arguments all become ``is_error``
  tool results the model sees, never a failed run.
- Structured output: the output model's schema is offered as the ``StructuredOutput`` tool.
  With no other tools the first request forces it (``tool_choice``); with tools the model may
  call it when done, and a model that ends its turn without it is asked once more with the
  tool forced. Invalid input gets one repair turn (an ``is_error`` result carrying the
  validation message, tool forced again); a second failure is ``OUTPUT_INVALID``. Other tool
  calls made in the same response as ``StructuredOutput`` are not run.
- ``stop_reason == "max_tokens"`` ends the run as ``TRUNCATED`` (``stop_reason`` kept).
- A failed run keeps what it produced (last text, tool calls, usage, turns) beside ``error``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from agentmend.infrastructure.definitions.permissions import allowed_tools, describe_profile
from agentmend.infrastructure.errors import AgentRunError, ConfigurationError, ErrorKind
from agentmend.infrastructure.llm.base import (
    AgentResult,
    OutputT,
    ToolCallRecord,
    ToolError,
    ToolSpec,
    Usage,
)

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MAX_TURNS",
    "OUTPUT_TOOL_NAME",
    "ContentBlock",
    "Message",
    "ModelCall",
    "ModelRequest",
    "ModelResponse",
    "TextBlock",
    "ToolDefinition",
    "ToolResultBlock",
    "ToolUseBlock",
    "denied_call",
    "is_denied",
    "run_agent_loop",
    "run_tool_call",
    "run_tool_calls",
]

OUTPUT_TOOL_NAME = "StructuredOutput"
"""The forced tool that carries structured output (the name the Claude Code CLI uses too)."""

DEFAULT_MAX_TURNS = 10
DEFAULT_MAX_TOKENS = 4096

_OUTPUT_TOOL_DESCRIPTION = (
    "Give your final answer by calling this tool exactly once, with the answer as its input."
)
_ASK_FOR_OUTPUT = f"Now give your final answer by calling the {OUTPUT_TOOL_NAME} tool."
_SKIPPED = f"Not run: the final answer was given through {OUTPUT_TOOL_NAME} in the same turn."


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    tool_use_id: str
    content: str
    is_error: bool = False


ContentBlock = TextBlock | ToolUseBlock | ToolResultBlock


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the conversation, in the Messages API's shape."""

    role: Literal["user", "assistant"]
    content: tuple[ContentBlock, ...]

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_uses(self) -> tuple[ToolUseBlock, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolUseBlock))

    @property
    def tool_results(self) -> tuple[ToolResultBlock, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolResultBlock))


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """A tool as the model sees it."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything one model request needs; ``tool_choice`` names a tool the model must call."""

    agent_name: str
    model: str
    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...]
    tool_choice: str | None
    max_tokens: int
    temperature: float | None
    turn: int


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """What the model answered to one request."""

    content: tuple[TextBlock | ToolUseBlock, ...]
    stop_reason: str | None = "end_turn"
    usage: Usage = field(default_factory=Usage)
    model: str | None = None

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_uses(self) -> tuple[ToolUseBlock, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolUseBlock))


ModelCall = Callable[[ModelRequest], Awaitable[ModelResponse]]
"""One model request; raises ``AgentRunError`` when the call fails."""

CostFunction = Callable[[str, Usage], float | None]


def _describe_exception(exc: Exception) -> str:
    # A ToolError's message is meant for the model; anything else also says what broke.
    if isinstance(exc, ToolError):
        return str(exc) or "tool error"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def run_tool_call(tools: Mapping[str, ToolSpec], call: ToolUseBlock) -> ToolCallRecord:
    """Run one tool call; every failure becomes an ``is_error`` record, never an exception."""
    started = time.perf_counter()
    tool = tools.get(call.name)
    is_error = True
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        output = f"Unknown tool {call.name!r}; available tools: {known}."
    else:
        try:
            arguments = tool.validate_arguments(call.input)
        except ValidationError as exc:
            output = f"Invalid arguments for tool {call.name!r}: {exc}"
        else:
            try:
                result = await tool.handler(arguments)
            except Exception as exc:  # the model sees the failure and can recover
                output = _describe_exception(exc)
            else:
                output = result if isinstance(result, str) else str(result)
                is_error = False
    return ToolCallRecord(
        id=call.id,
        name=call.name,
        input=dict(call.input),
        output=output,
        is_error=is_error,
        duration_ms=(time.perf_counter() - started) * 1000.0,
    )


async def run_tool_calls(
    tools: Mapping[str, ToolSpec] | Sequence[ToolSpec], calls: Sequence[ToolUseBlock]
) -> list[ToolCallRecord]:
    """Run the tool calls of one model response concurrently, results in call order."""
    index = tools if isinstance(tools, Mapping) else index_tools(tools)
    if len(calls) == 1:
        return [await run_tool_call(index, calls[0])]
    return list(await asyncio.gather(*(run_tool_call(index, c) for c in calls)))


def index_tools(tools: Sequence[ToolSpec]) -> dict[str, ToolSpec]:
    """Tools by name; a duplicate name is a configuration error."""
    index: dict[str, ToolSpec] = {}
    for tool in tools:
        if tool.name in index:
            raise ConfigurationError(f"two tools are named {tool.name!r}")
        index[tool.name] = tool
    return index


@dataclass
class _RunState:
    """What a run has produced so far (kept when it fails)."""

    text: str = ""
    usage: Usage = field(default_factory=Usage)
    turns: int = 0
    stop_reason: str | None = None
    model: str | None = None
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    permission_denials: list[str] = field(default_factory=list)
    read_only_tools: tuple[str, ...] = ()  # the setting, for the permission check


async def run_agent_loop(
    spec: AgentSpec,
    prompt: str,
    *,
    call_model: ModelCall,
    model: str,
    tools: Sequence[ToolSpec] = (),
    output_type: type[OutputT] | None = None,
    default_max_turns: int = DEFAULT_MAX_TURNS,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    cost: CostFunction | None = None,
    read_only_tools: Sequence[str] = (),
) -> AgentResult[OutputT]:
    """Run one agent to completion over ``call_model``; failures come back in ``error``.

    ``read_only_tools`` is the setting of that name (see
    ``agentmend.infrastructure.definitions.permissions``).

    Raises:
        ConfigurationError: duplicate tool names, or a tool named like the output tool.
    """
    started = time.perf_counter()
    index = index_tools(tools)
    definitions = [ToolDefinition(t.name, t.description, t.json_schema()) for t in tools]
    if output_type is not None:
        if OUTPUT_TOOL_NAME in index:
            raise ConfigurationError(f"a tool may not be named {OUTPUT_TOOL_NAME!r}")
        schema = output_type.model_json_schema()
        definitions.append(ToolDefinition(OUTPUT_TOOL_NAME, _OUTPUT_TOOL_DESCRIPTION, schema))
    max_turns = spec.max_turns or default_max_turns
    state = _RunState(model=model, read_only_tools=tuple(read_only_tools))
    output: OutputT | None = None
    error: AgentRunError | None = None
    try:
        async with asyncio.timeout(spec.timeout_s):
            output = await _loop(
                spec, prompt, call_model, model, index, tuple(definitions), output_type,
                max_turns, spec.max_tokens or default_max_tokens, state,
            )  # fmt: skip
    except AgentRunError as exc:
        error = exc
    except TimeoutError:
        error = AgentRunError(
            ErrorKind.TIMEOUT, f"agent {spec.name!r} did not finish within {spec.timeout_s} s"
        )
    return AgentResult(
        agent_name=spec.name,
        text=state.text,
        output=output,
        tool_calls=tuple(state.tool_calls),
        usage=state.usage,
        cost_usd=cost(state.model or model, state.usage) if cost is not None else None,
        turns=state.turns,
        duration_ms=(time.perf_counter() - started) * 1000.0,
        stop_reason=state.stop_reason,
        error=error,
        permission_denials=tuple(state.permission_denials),
        model=state.model,
    )


async def _loop(
    spec: AgentSpec,
    prompt: str,
    call_model: ModelCall,
    model: str,
    tools: Mapping[str, ToolSpec],
    definitions: tuple[ToolDefinition, ...],
    output_type: type[OutputT] | None,
    max_turns: int,
    max_tokens: int,
    state: _RunState,
) -> OutputT | None:
    messages: list[Message] = [Message("user", (TextBlock(prompt),))]
    # With nothing else to call, the structured answer is the only move: force it at once.
    force = OUTPUT_TOOL_NAME if output_type is not None and not tools else None
    repairs_left = 1
    system = spec.full_system_prompt
    while True:
        state.turns += 1
        response = await call_model(
            ModelRequest(
                agent_name=spec.name,
                model=model,
                system=system,
                messages=tuple(messages),
                tools=definitions,
                tool_choice=force,
                max_tokens=max_tokens,
                temperature=spec.temperature,
                turn=state.turns,
            )
        )
        state.usage += response.usage
        state.stop_reason = response.stop_reason
        if response.model:
            state.model = response.model
        if response.text:
            state.text = response.text
        messages.append(Message("assistant", response.content))
        if response.stop_reason == "max_tokens":
            raise AgentRunError(
                ErrorKind.TRUNCATED,
                f"the response hit max_tokens={max_tokens} and was cut off",
            )
        calls = response.tool_uses
        final = next((c for c in calls if c.name == OUTPUT_TOOL_NAME), None)
        if output_type is not None and final is not None:
            try:
                return output_type.model_validate(final.input)
            except ValidationError as exc:
                if repairs_left == 0:
                    raise AgentRunError(
                        ErrorKind.OUTPUT_INVALID,
                        f"structured output still invalid after a repair turn: {exc}",
                    ) from None
                repairs_left -= 1
                _check_turns_left(state, max_turns, "repair the structured output")
                repair = ToolResultBlock(final.id, f"Invalid output: {exc}", is_error=True)
                skipped = (ToolResultBlock(c.id, _SKIPPED, True) for c in calls if c is not final)
                messages.append(Message("user", (repair, *skipped)))
                force = OUTPUT_TOOL_NAME
                continue
        if not calls:
            if output_type is None:
                return None
            _check_turns_left(state, max_turns, "give the structured output")
            messages.append(Message("user", (TextBlock(_ASK_FOR_OUTPUT),)))
            force = OUTPUT_TOOL_NAME
            continue
        _check_turns_left(state, max_turns, "answer its tool calls")
        records = await _run_permitted(spec, tools, calls, state)
        state.tool_calls.extend(records)
        results = tuple(ToolResultBlock(r.id, r.output, r.is_error) for r in records)
        messages.append(Message("user", results))
        force = None


async def _run_permitted(
    spec: AgentSpec,
    tools: Mapping[str, ToolSpec],
    calls: Sequence[ToolUseBlock],
    state: _RunState,
) -> list[ToolCallRecord]:
    """Run the calls the spec's permission profile allows; refuse and report the others.

    Every tool is offered, as the claude-agent-sdk runtime offers them, so a model can try a
    tool its profile does not allow; the refusal is an ``is_error`` result the model sees and
    a ``permission_denials`` entry the improvement loop sees, never hidden.
    """
    allowed = allowed_tools(
        spec.permission_profile, spec.tools, tools, read_only_tools=state.read_only_tools
    )
    permitted = [c for c in calls if c.name in allowed or c.name not in tools]
    records = dict(
        zip((c.id for c in permitted), await run_tool_calls(tools, permitted), strict=True)
    )
    for call in calls:
        if call.id not in records:
            state.permission_denials.append(call.name)
            records[call.id] = denied_call(spec, call)
    return [records[c.id] for c in calls]


def is_denied(spec: AgentSpec, tools: Mapping[str, ToolSpec], name: str) -> bool:
    """Whether a call of ``name`` (one of ``tools``) is refused by the spec's permission profile."""
    return name in tools and name not in allowed_tools(spec.permission_profile, spec.tools, tools)


def denied_call(spec: AgentSpec, call: ToolUseBlock) -> ToolCallRecord:
    """The ``is_error`` result of a call the permission profile refused, naming the profile."""
    return ToolCallRecord(
        id=call.id,
        name=call.name,
        input=dict(call.input),
        output=(
            f"Permission denied: tool {call.name!r} is not allowed for agent "
            f"{spec.name!r} (permission profile: {describe_profile(spec.permission_profile)})."
        ),
        is_error=True,
    )


def _check_turns_left(state: _RunState, max_turns: int, purpose: str) -> None:
    if state.turns >= max_turns:
        raise AgentRunError(
            ErrorKind.MAX_TURNS,
            f"reached max_turns={max_turns} with a turn still needed to {purpose}",
        )
