"""The runtime seam: everything in agentmend that calls a model goes through ``AgentRuntime``.

Given an agent's spec, a prompt, the tools it may call and optionally a pydantic output type, a
runtime runs the agent's turn loop and returns an ``AgentResult``. A run that fails is data (an
``AgentResult`` whose ``error`` says why) so the monitor can record it; misuse and configuration
errors raise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload, runtime_checkable

from pydantic import BaseModel

from agentmend.infrastructure.errors import AgentRunError, ErrorKind, InvalidArgument

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "AgentResult",
    "AgentRuntime",
    "OutputT",
    "RuntimeBase",
    "ToolCallRecord",
    "ToolError",
    "ToolHandler",
    "ToolSpec",
    "Usage",
]

OutputT = TypeVar("OutputT", bound=BaseModel)

ToolHandler = Callable[[dict[str, Any]], Awaitable[str]]
"""An async tool handler: validated arguments in, text for the model out.

A handler reports a failure the model should see by raising ``ToolError`` (or any exception);
the runtime turns it into an ``is_error`` tool result, never into a failed run.
"""


class ToolError(Exception):
    """Raised by a tool handler to return an error result to the model."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the agent may call, the same object for every runtime.

    ``input_model`` (a pydantic model) or ``input_schema`` (a JSON schema) describes the
    arguments; with a model, arguments are validated before the handler runs.
    ``permission_action`` is the action string a permission gate checks (such as
    ``tool:self_edit:model <model>`` and friends), if the tool needs one.
    """

    name: str
    description: str
    handler: ToolHandler
    input_model: type[BaseModel] | None = None
    input_schema: dict[str, Any] | None = None
    permission_action: str | None = None

    def __post_init__(self) -> None:
        if (self.input_model is None) == (self.input_schema is None):
            raise InvalidArgument(
                f"tool {self.name!r}",
                self.input_schema,
                "needs exactly one of input_model, input_schema",
            )

    def json_schema(self) -> dict[str, Any]:
        if self.input_model is not None:
            return self.input_model.model_json_schema()
        assert self.input_schema is not None
        return self.input_schema

    def validate_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validated arguments (raises pydantic's ValidationError on bad input)."""
        if self.input_model is None:
            return dict(arguments)
        return self.input_model.model_validate(arguments).model_dump(mode="json")


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call the agent made and what came back."""

    id: str
    name: str
    input: dict[str, Any]
    output: str
    is_error: bool = False
    duration_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_creation_tokens + other.cache_creation_tokens,
        )


@dataclass(frozen=True, slots=True)
class AgentResult(Generic[OutputT]):
    """What one agent run produced, successful or not."""

    agent_name: str
    text: str = ""
    output: OutputT | None = None
    tool_calls: tuple[ToolCallRecord, ...] = ()
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    turns: int = 0
    duration_ms: float = 0.0
    stop_reason: str | None = None
    error: AgentRunError | None = None
    permission_denials: tuple[str, ...] = ()
    model: str | None = None

    @property
    def success(self) -> bool:
        return self.error is None

    @property
    def truncated(self) -> bool:
        return self.stop_reason == "max_tokens" or (
            self.error is not None and self.error.kind is ErrorKind.TRUNCATED
        )


@runtime_checkable
class AgentRuntime(Protocol):
    """Runs one agent turn loop. Implementations: Anthropic, claude-agent-sdk, offline, fakes.

    The two overloads let a type checker infer the result type with and without an
    ``output_type`` (one generic signature leaves it unsolved when ``output_type`` is omitted);
    an implementation may keep the single generic signature.
    """

    @overload
    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: None = None,
    ) -> AgentResult[Any]: ...

    @overload
    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT],
    ) -> AgentResult[OutputT]: ...


class RuntimeBase(ABC):
    """The public ``run`` of every runtime, typed once; a runtime implements ``_run``.

    Subclassing is optional (``AgentRuntime`` is a protocol), but it gives callers of the
    concrete class the same inferred result types as callers of the protocol.
    """

    read_only_tools: tuple[str, ...] = ()
    """The ``read_only_tools`` setting: tools ``standard`` lets the agent call although they
    are not known to be read-only (see ``agentmend.infrastructure.definitions.permissions``)."""

    @overload
    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: None = None,
    ) -> AgentResult[Any]: ...

    @overload
    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT],
    ) -> AgentResult[OutputT]: ...

    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[Any]:
        """Run ``spec`` on ``prompt``; a failed run is returned in ``AgentResult.error``."""
        return await self._run(spec, prompt, tools=tools, output_type=output_type)

    @abstractmethod
    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec],
        output_type: type[OutputT] | None,
    ) -> AgentResult[OutputT]: ...
