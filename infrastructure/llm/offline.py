"""The offline runtime: runs the per-agent policy it is given, no key and no network.

Policies are plain async functions of an ``OfflineCall``. They use the same tools as a model
would (``call.call_tool``, recorded as tool calls) and return the same structured outputs, so the
roles above cannot tell an offline playbook from a model. The playbooks themselves live beside
the roles they stand in for (``agents/playbooks``); this module only runs them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from agentmend.infrastructure.errors import AgentRunError, ConfigurationError, ErrorKind
from agentmend.infrastructure.llm.base import (
    AgentResult,
    OutputT,
    RuntimeBase,
    ToolCallRecord,
    ToolSpec,
)
from agentmend.infrastructure.llm.tool_loop import (
    ToolUseBlock,
    denied_call,
    index_tools,
    is_denied,
    run_tool_call,
)

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = ["OfflineCall", "OfflinePolicy", "OfflineRuntime"]


@dataclass
class OfflineCall:
    """One run as a policy sees it: the spec, the prompt, the tools, the wanted output type."""

    spec: AgentSpec
    prompt: str
    tools: Sequence[ToolSpec]
    output_type: type[BaseModel] | None
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    permission_denials: list[str] = field(default_factory=list)

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolCallRecord:
        """Call a tool as a model would; failures come back as ``is_error`` records.

        A tool the spec's permission profile refuses is not run: its record says so and its name
        joins ``permission_denials``, as with every other runtime.
        """
        call = ToolUseBlock(
            id=f"offline_{len(self.tool_calls) + 1}", name=name, input=dict(arguments)
        )
        tools = index_tools(self.tools)
        if is_denied(self.spec, tools, name):
            self.permission_denials.append(name)
            record = denied_call(self.spec, call)
        else:
            record = await run_tool_call(tools, call)
        self.tool_calls.append(record)
        return record


OfflinePolicy = Callable[[OfflineCall], Awaitable[BaseModel | str]]
"""A policy returns the structured output (an instance of ``call.output_type``) or text."""


class OfflineRuntime(RuntimeBase):
    """Dispatches each run to the policy registered under the agent's name."""

    def __init__(self, policies: Mapping[str, OfflinePolicy]) -> None:
        self.policies = dict(policies)

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        policy = self.policies.get(spec.name)
        if policy is None:
            known = ", ".join(sorted(self.policies)) or "(none)"
            raise ConfigurationError(
                f"the offline runtime has no policy for agent {spec.name!r} (it has: {known}); "
                "run this agent on the anthropic or claude-agent-sdk provider"
            )
        call = OfflineCall(spec=spec, prompt=prompt, tools=tools, output_type=output_type)
        started = time.perf_counter()
        try:
            answer = await policy(call)
        except AgentRunError as exc:
            return self._result(spec, call, started, error=exc)
        output: OutputT | None = None
        text = answer if isinstance(answer, str) else answer.model_dump_json()
        if output_type is not None:
            try:
                output = output_type.model_validate(
                    answer.model_dump() if isinstance(answer, BaseModel) else answer
                )
            except ValidationError as exc:
                error = AgentRunError(ErrorKind.OUTPUT_INVALID, f"policy output invalid: {exc}")
                return self._result(spec, call, started, text=text, error=error)
        return self._result(spec, call, started, text=text, output=output)

    @staticmethod
    def _result(
        spec: AgentSpec,
        call: OfflineCall,
        started: float,
        *,
        text: str = "",
        output: OutputT | None = None,
        error: AgentRunError | None = None,
    ) -> AgentResult[OutputT]:
        return AgentResult(
            agent_name=spec.name,
            text=text,
            output=output,
            tool_calls=tuple(call.tool_calls),
            cost_usd=0.0,
            turns=len(call.tool_calls) + 1,
            duration_ms=(time.perf_counter() - started) * 1000,
            stop_reason="end_turn" if error is None else None,
            error=error,
            permission_denials=tuple(call.permission_denials),
            model="offline",
        )
