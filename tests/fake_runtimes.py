"""Fake runtimes for tests: say what each run does instead of re-implementing ``AgentRuntime``.

The shipped fakes (``ScriptedRuntime``, ``FunctionRuntime`` in ``agentmend.infrastructure.llm
.testing``) script a *model*: the answers of each model request inside the real turn loop. Many
tests need less, or something else: a whole run that passes, fails, raises, hangs or takes a
given time, decided by which definition ran which prompt; the simulated team with something
happening in the middle of a run (a file edited or a lease taken while a change is verified);
or the offline roles with one role scripted. This module gives those three as one family:

- ``ScriptedRuns``: every run is answered by a function of the ``Call`` (definition, prompt,
  call number, repeat); all calls are recorded, with how many ran at once.
- ``HookedSimulation``: ``SimulatedRuntime`` that calls ``before``/``after`` hooks around each
  run, so a test can act at the moment a given definition is run.
- ``RoutedRuntime``: runs each agent on the runtime routed to its name, the rest on a default;
  ``offline_roles`` and ``scripted_improver`` build the common ones (the offline playbooks for
  every role but the scripted ones).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.llm.base import (
    AgentResult,
    AgentRuntime,
    OutputT,
    RuntimeBase,
    ToolSpec,
)
from agentmend.infrastructure.llm.offline import OfflineRuntime
from agentmend.infrastructure.llm.testing import ScriptedRuntime, Step
from agentmend.infrastructure.simulation import SimulatedRuntime
from agentmend.roles.playbooks import offline_policies
from agentmend.roles.schemas import ImprovementPlan, ProposedAction

__all__ = [
    "AfterHook",
    "Answer",
    "BeforeHook",
    "Call",
    "HookedSimulation",
    "RoutedRuntime",
    "RunFunction",
    "ScriptedRuns",
    "offline_roles",
    "scripted_improver",
]


@dataclass(frozen=True, slots=True)
class Call:
    """One run asked of a fake runtime.

    Attributes:
        spec: the definition the run was given.
        prompt: the prompt it was given.
        number: how many runs this runtime was asked for before this one (0 for the first).
        repeat: how many of those had an equal definition and the same prompt.
    """

    spec: AgentSpec
    prompt: str
    number: int
    repeat: int


def _record(calls: list[Call], spec: AgentSpec, prompt: str) -> Call:
    """Append the call of ``spec`` on ``prompt`` to ``calls`` and return it."""
    repeat = sum(1 for earlier in calls if earlier.prompt == prompt and earlier.spec == spec)
    call = Call(spec, prompt, len(calls), repeat)
    calls.append(call)
    return call


Answer: TypeAlias = str | AgentResult[Any]
"""What a run gives back: a text (a successful run with that text) or the whole result."""

RunFunction: TypeAlias = Callable[[Call], Answer | Awaitable[Answer]]
"""Decides one run of ``ScriptedRuns``; it may be async (to sleep or hang) and may raise."""


class ScriptedRuns(RuntimeBase):
    """A runtime whose runs are whole answers from a function, with no model turn loop.

    Each run is recorded as a ``Call`` and answered by ``answer(call)``. A string answer is a
    successful run with that text taking ``duration_ms``; an ``AgentResult`` is returned as it
    is (to fail a run, truncate it or give it its own duration). An exception the function
    raises comes out of ``run()``, as a real runtime's unexpected failure would.

    Args:
        answer: decides each run (sync or async).
        duration_ms: the duration of a run answered with a string.

    Attributes:
        calls: every run asked for, in the order asked.
        in_flight: runs started and not yet answered.
        peak: the most runs that were in flight at once.
    """

    def __init__(self, answer: RunFunction, *, duration_ms: float = 0.0) -> None:
        self._answer = answer
        self.duration_ms = duration_ms
        self.calls: list[Call] = []
        self.in_flight = 0
        self.peak = 0

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        call = _record(self.calls, spec, prompt)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            answer = self._answer(call)
            if inspect.isawaitable(answer):
                answer = await answer
        finally:
            self.in_flight -= 1
        if isinstance(answer, str):
            return AgentResult(agent_name=spec.name, text=answer, duration_ms=self.duration_ms)
        return answer


BeforeHook: TypeAlias = Callable[[Call], Awaitable[None] | None]
"""Called before a run is simulated; raising fails the run with that exception."""

AfterHook: TypeAlias = Callable[[Call, AgentResult[Any]], Awaitable[None] | None]
"""Called with the simulated result once a run has been simulated."""


class HookedSimulation(SimulatedRuntime):
    """The simulated team, calling a hook before and after each run it simulates.

    The hooks are attributes, so a test can set them once it knows what to look for (such as
    an agent's definition as loaded, to act on the first run of a changed one).

    Args:
        seed: the ``SimulatedRuntime`` seed.
        before: awaited (if async) with the ``Call`` before the run is simulated.
        after: awaited (if async) with the ``Call`` and the result after it is simulated.

    Attributes:
        calls: every run asked for, in the order asked.
    """

    def __init__(
        self, seed: int = 0, *, before: BeforeHook | None = None, after: AfterHook | None = None
    ) -> None:
        super().__init__(seed)
        self.before = before
        self.after = after
        self.calls: list[Call] = []

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        call = _record(self.calls, spec, prompt)
        if self.before is not None:
            pending = self.before(call)
            if inspect.isawaitable(pending):
                await pending
        result = await super()._run(spec, prompt, tools=tools, output_type=output_type)
        if self.after is not None:
            pending = self.after(call, result)
            if inspect.isawaitable(pending):
                await pending
        return result


class RoutedRuntime(RuntimeBase):
    """Runs each agent on the runtime routed to its name, every other agent on ``default``.

    Args:
        routes: agent name to the runtime that runs it.
        default: the runtime of the agents without a route.
    """

    def __init__(self, routes: Mapping[str, AgentRuntime], *, default: AgentRuntime) -> None:
        self.routes = dict(routes)
        self.default = default

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        runtime = self.routes.get(spec.name, self.default)
        if output_type is None:
            return await runtime.run(spec, prompt, tools=tools)
        return await runtime.run(spec, prompt, tools=tools, output_type=output_type)


def offline_roles(**scripted: AgentRuntime) -> RoutedRuntime:
    """The roles' runtime: the offline playbooks, except the roles given (``self_improver=...``
    scripts the role ``self-improver``)."""
    routes = {name.replace("_", "-"): runtime for name, runtime in scripted.items()}
    return RoutedRuntime(routes, default=OfflineRuntime(offline_policies()))


def scripted_improver(actions: Sequence[ProposedAction]) -> RoutedRuntime:
    """The offline roles, except an improver that proposes exactly ``actions``, once."""
    plan = ImprovementPlan(actions=list(actions))
    return offline_roles(self_improver=ScriptedRuntime([Step.output(plan)]))
