"""Runtimes for tests: a scripted model and a function model, shipped with the package.

Both drive the same turn loop as ``AnthropicRuntime`` (``tool_loop.run_agent_loop``): the tool
handlers passed to ``run()`` really run, structured output is validated with its repair turn,
truncation and turn limits behave the same. Only the model's answers are made up.

- ``ScriptedRuntime``: a queue of ``Step``s, one per model request (so a tool call and the
  answer after it are two steps). Optional per-agent queues (``scripts={"name": [...]}``) let a
  whole team be scripted; an agent without its own queue uses the shared one. A request with
  no step left raises ``UnexpectedModelCall`` out of ``run()``; ``assert_complete()`` raises if
  steps remain.
- ``FunctionRuntime``: ``fn(messages, info) -> Step | str`` (sync or async) is asked for each
  model request, with the conversation so far (``tool_loop.Message`` objects, the Messages API
  shape: see ``tool_loop``) and a ``TurnInfo`` (spec, tools offered, forced tool, turn).

Both record every run in ``runs`` (spec, prompt, tools, output type, each ``ModelRequest`` the
loop made, and the result).

``run_runtime_conformance(factory)`` (from ``conformance``) holds any runtime, yours too, to the
``AgentRuntime`` contract.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from agentmend.infrastructure.errors import AgentmendError, AgentRunError, ErrorKind
from agentmend.infrastructure.llm.base import AgentResult, OutputT, RuntimeBase, ToolSpec, Usage
from agentmend.infrastructure.llm.conformance import (
    ConformanceReport,
    RuntimeConformanceError,
    Scenario,
    run_runtime_conformance,
)
from agentmend.infrastructure.llm.tool_loop import (
    OUTPUT_TOOL_NAME,
    Message,
    ModelRequest,
    ModelResponse,
    TextBlock,
    ToolDefinition,
    ToolUseBlock,
    run_agent_loop,
)

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "ConformanceReport",
    "FunctionRuntime",
    "RecordedRun",
    "RuntimeConformanceError",
    "Scenario",
    "ScriptedRuntime",
    "Step",
    "TurnInfo",
    "UnexpectedModelCall",
    "run_runtime_conformance",
]


class UnexpectedModelCall(AgentmendError, AssertionError):
    """A fake runtime was asked for a model answer its script does not have."""


@dataclass(frozen=True, slots=True)
class Step:
    """One scripted model answer (or failure). Build it with the class methods.

    Tool-call ids left empty are filled in when the step is used (``call_<turn>_<n>``).
    """

    response: ModelResponse | None = None
    error: AgentRunError | None = None

    @classmethod
    def text(cls, text: str, *, usage: Usage | None = None) -> Step:
        """A plain answer that ends the turn."""
        return cls(ModelResponse((TextBlock(text),), "end_turn", usage or Usage()))

    @classmethod
    def tool_call(
        cls,
        name: str,
        input: Mapping[str, Any] | None = None,
        *,
        id: str = "",
        text: str = "",
        usage: Usage | None = None,
    ) -> Step:
        """One tool call, optionally after some text."""
        blocks: list[TextBlock | ToolUseBlock] = [TextBlock(text)] if text else []
        blocks.append(ToolUseBlock(id, name, dict(input or {})))
        return cls(ModelResponse(tuple(blocks), "tool_use", usage or Usage()))

    @classmethod
    def tool_calls(cls, *calls: tuple[str, Mapping[str, Any]], usage: Usage | None = None) -> Step:
        """Several tool calls in one answer: ``Step.tool_calls(("a", {...}), ("b", {...}))``."""
        blocks = tuple(ToolUseBlock("", name, dict(arguments)) for name, arguments in calls)
        return cls(ModelResponse(blocks, "tool_use", usage or Usage()))

    @classmethod
    def output(cls, value: BaseModel | Mapping[str, Any], *, usage: Usage | None = None) -> Step:
        """The structured answer (a model instance, or a raw mapping to test validation)."""
        data = value.model_dump(mode="json") if isinstance(value, BaseModel) else dict(value)
        block = ToolUseBlock("", OUTPUT_TOOL_NAME, data)
        return cls(ModelResponse((block,), "tool_use", usage or Usage()))

    @classmethod
    def truncated(cls, text: str = "", *, usage: Usage | None = None) -> Step:
        """An answer cut off at max_tokens."""
        return cls(ModelResponse((TextBlock(text),), "max_tokens", usage or Usage()))

    @classmethod
    def fail(cls, error: AgentRunError | ErrorKind, message: str = "scripted failure") -> Step:
        """The model call fails (an API error, after the runtime's retries)."""
        return cls(
            error=error if isinstance(error, AgentRunError) else AgentRunError(error, message)
        )

    @classmethod
    def of(cls, response: ModelResponse) -> Step:
        """Any response, as is."""
        return cls(response)


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """What a ``FunctionRuntime`` function knows besides the conversation."""

    spec: AgentSpec
    tools: tuple[ToolDefinition, ...]
    tool_choice: str | None
    turn: int
    output_type: type[BaseModel] | None
    request: ModelRequest


@dataclass
class RecordedRun:
    """One ``run()`` call on a fake runtime."""

    spec: AgentSpec
    prompt: str
    tools: tuple[ToolSpec, ...]
    output_type: type[BaseModel] | None
    requests: list[ModelRequest] = field(default_factory=list)
    result: AgentResult[Any] | None = None

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation as of the last model request."""
        return self.requests[-1].messages if self.requests else ()


def _fill_ids(response: ModelResponse, turn: int) -> ModelResponse:
    if all(not isinstance(b, ToolUseBlock) or b.id for b in response.content):
        return response
    content = tuple(
        replace(b, id=f"call_{turn}_{n}") if isinstance(b, ToolUseBlock) and not b.id else b
        for n, b in enumerate(response.content, start=1)
    )
    return replace(response, content=content)


def _check_step(step: Step, request: ModelRequest, where: str) -> None:
    """Refuse a step no real model could give to this request: a mistake in the script."""
    if step.response is None:
        return
    names = [b.name for b in step.response.tool_uses]
    offered = {t.name for t in request.tools}
    if OUTPUT_TOOL_NAME in names and OUTPUT_TOOL_NAME not in offered:
        raise UnexpectedModelCall(
            f"{where}: the step gives structured output but run() was called without output_type"
        )
    if request.tool_choice is not None and request.tool_choice not in names:
        raise UnexpectedModelCall(
            f"{where}: the request forces the {request.tool_choice!r} tool "
            f"but the step calls {names or 'no tool'}"
        )


class _FakeRuntime(RuntimeBase):
    """What both fakes share: recording and running the shared loop."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.runs: list[RecordedRun] = []

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        record = RecordedRun(spec, prompt, tuple(tools), output_type)
        self.runs.append(record)

        async def call_model(request: ModelRequest) -> ModelResponse:
            record.requests.append(request)
            step = await self._next_step(request, record)
            _check_step(step, request, f"agent {spec.name!r}, turn {request.turn}")
            if step.error is not None:
                raise step.error
            assert step.response is not None
            return _fill_ids(step.response, request.turn)

        result = await run_agent_loop(
            spec,
            prompt,
            call_model=call_model,
            model=spec.model or self.model,
            tools=tools,
            output_type=output_type,
            read_only_tools=self.read_only_tools,
        )
        record.result = result
        return result

    async def _next_step(self, request: ModelRequest, record: RecordedRun) -> Step:
        raise NotImplementedError


class ScriptedRuntime(_FakeRuntime):
    """A model that answers from a queue of steps and fails loudly when it runs out."""

    def __init__(
        self,
        steps: Iterable[Step] = (),
        *,
        scripts: Mapping[str, Iterable[Step]] | None = None,
        model: str = "scripted-model",
    ) -> None:
        super().__init__(model)
        self._shared: deque[Step] = deque(steps)
        self._scripts: dict[str, deque[Step]] = {
            name: deque(agent_steps) for name, agent_steps in (scripts or {}).items()
        }

    def add(self, *steps: Step, agent: str | None = None) -> None:
        """Append steps to the shared queue, or to ``agent``'s own queue."""
        if agent is None:
            self._shared.extend(steps)
        else:
            self._scripts.setdefault(agent, deque()).extend(steps)

    def remaining(self, agent: str | None = None) -> int:
        """Steps not yet used (shared queue, or ``agent``'s)."""
        return len(self._shared if agent is None else self._scripts.get(agent, ()))

    def assert_complete(self) -> None:
        """Raise ``UnexpectedModelCall`` if any queue still holds steps."""
        left = {"<shared>": len(self._shared)} | {n: len(q) for n, q in self._scripts.items()}
        unused = {name: count for name, count in left.items() if count}
        if unused:
            raise UnexpectedModelCall(f"scripted steps were never used: {unused}")

    async def _next_step(self, request: ModelRequest, record: RecordedRun) -> Step:
        own = self._scripts.get(request.agent_name)
        queue = own if own is not None else self._shared
        if not queue:
            last = request.messages[-1]
            raise UnexpectedModelCall(
                f"agent {request.agent_name!r} made model request {request.turn} but its "
                f"script is empty (last message from {last.role}: "
                f"{(last.text or repr(last.content))[:200]!r})"
            )
        return queue.popleft()


ModelFunction = Callable[[Sequence[Message], TurnInfo], "Step | str | Awaitable[Step | str]"]


class FunctionRuntime(_FakeRuntime):
    """A model that is a function of the conversation: ``fn(messages, info) -> Step | str``.

    A plain string is shorthand for ``Step.text``.
    """

    def __init__(self, fn: ModelFunction, *, model: str = "function-model") -> None:
        super().__init__(model)
        self._fn = fn

    async def _next_step(self, request: ModelRequest, record: RecordedRun) -> Step:
        info = TurnInfo(
            spec=record.spec,
            tools=request.tools,
            tool_choice=request.tool_choice,
            turn=request.turn,
            output_type=record.output_type,
            request=request,
        )
        answer = self._fn(request.messages, info)
        if inspect.isawaitable(answer):
            answer = await answer
        return Step.text(answer) if isinstance(answer, str) else answer
