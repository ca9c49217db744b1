"""The contract of ``AgentRuntime``, as checks any runtime (yours too) can be run against.

Callers of a runtime rely on five things: a failed run is returned in ``AgentResult.error``, never
raised; a tool handler that raises becomes an ``is_error`` tool result and the run goes on; a tool
the agent's permission profile does not allow is refused and named in ``permission_denials``;
an ``output_type`` answer is validated, and an invalid one is ``OUTPUT_INVALID``; a cancelled run
ends promptly.

Each check is a ``Scenario``: the model's side of the run, as the turns it gives (``ModelResponse``
in the Messages API shape of ``tool_loop``), an ``AgentRunError`` for a model call that fails, or
a model that never answers (``hangs``). ``factory(scenario)`` returns a runtime whose model
behaves that way (a fake server answering those turns, a script, a policy), or ``None`` when the
runtime cannot stage that scenario (a simulation that never calls the tools it is given); the
check is then reported as not staged, never as passed.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from agentmend.infrastructure.errors import AgentmendError, AgentRunError, ErrorKind
from agentmend.infrastructure.llm.base import AgentResult, AgentRuntime, ToolError, ToolSpec
from agentmend.infrastructure.llm.tool_loop import (
    OUTPUT_TOOL_NAME,
    ModelResponse,
    TextBlock,
    ToolUseBlock,
)

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "CheckResult",
    "ConformanceAnswer",
    "ConformanceReport",
    "RuntimeConformanceError",
    "RuntimeFactory",
    "Scenario",
    "run_runtime_conformance",
]


class ConformanceAnswer(BaseModel):
    """The ``output_type`` of the structured-output checks."""

    answer: str
    score: int = Field(ge=0, le=10)


Turn = ModelResponse | AgentRunError
"""One model request's outcome: the answer, or the error the model call failed with."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """One check's run: what the runtime is asked, and how its model behaves.

    ``turns`` are answered in order, one per model request; with ``hangs`` the first request is
    never answered, and the model side sets ``reached`` when that request arrives (so the run
    is cancelled mid-request). ``tools`` records every call its handlers get in ``handled``.
    """

    name: str
    spec: AgentSpec
    prompt: str
    turns: tuple[Turn, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    output_type: type[BaseModel] | None = None
    hangs: bool = False
    handled: list[tuple[str, dict[str, Any]]] = field(default_factory=list, compare=False)
    reached: threading.Event = field(default_factory=threading.Event, compare=False)


RuntimeFactory = Callable[[Scenario], "AgentRuntime | Awaitable[AgentRuntime | None] | None"]
"""Builds a runtime whose model plays ``scenario`` (``None``: cannot stage it)."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    """How one check went: ``passed``, ``failed`` (``detail`` says why) or ``not_staged``."""

    name: str
    status: Literal["passed", "failed", "not_staged"]
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ConformanceReport:
    """Every check's result, in the order they ran."""

    results: tuple[CheckResult, ...]

    def names(self, status: str) -> tuple[str, ...]:
        """The names of the checks with ``status``."""
        return tuple(r.name for r in self.results if r.status == status)


class RuntimeConformanceError(AgentmendError, AssertionError):
    """A runtime broke the ``AgentRuntime`` contract; ``failures`` says where, one per check."""

    def __init__(self, failures: tuple[str, ...]) -> None:
        self.failures = failures
        super().__init__("runtime does not conform: " + "; ".join(failures))


Verify = Callable[[AgentResult[Any], Scenario], None]
"""What a check's result must show; raises ``_Failed`` saying what it does not."""


class _Failed(Exception):
    """A check's expectation that did not hold (collected into the report, never raised out)."""


def _expect(condition: bool, problem: str) -> None:
    if not condition:
        raise _Failed(problem)


def _text(text: str) -> ModelResponse:
    return ModelResponse((TextBlock(text),), "end_turn")


def _call(name: str, arguments: dict[str, Any]) -> ModelResponse:
    # an empty id: each runtime's model side gives its own, as a real model would
    return ModelResponse((ToolUseBlock("", name, arguments),), "tool_use")


def _tool(handled: list[tuple[str, dict[str, Any]]], name: str, behaviour: str) -> ToolSpec:
    async def handler(arguments: dict[str, Any]) -> str:
        handled.append((name, dict(arguments)))
        if behaviour == "tool_error":
            raise ToolError("the history store is unavailable")
        if behaviour == "crash":
            raise RuntimeError("an unexpected failure inside the tool")
        return f"{name}: {arguments.get('text', '')}"

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return ToolSpec(name, f"The {name} tool.", handler, input_schema=schema)


def _scenarios(spec: AgentSpec) -> list[tuple[Scenario, Verify]]:
    """The checks: each scenario with what its result must show."""
    with_tools = spec.with_changes(tools=("echo", "history"))
    checks: list[tuple[Scenario, Verify]] = []

    def scenario(name: str, **fields: Any) -> Scenario:
        handled: list[tuple[str, dict[str, Any]]] = []
        tools = tuple(_tool(handled, n, b) for n, b in fields.pop("tool_behaviour", ()))
        return Scenario(
            name,
            fields.pop("spec", spec),
            "Conformance check.",
            tools=tools,
            handled=handled,
            **fields,
        )

    def answered(result: AgentResult[Any], s: Scenario) -> None:
        _expect(result.error is None, f"the run failed: {result.error!r}")
        _expect(result.agent_name == s.spec.name, f"agent_name is {result.agent_name!r}")
        _expect(bool(result.text.strip()), "the answer's text is empty")

    checks.append((scenario("answers", turns=(_text("The answer is 42."),)), answered))

    def tool_ran(result: AgentResult[Any], s: Scenario) -> None:
        _expect(s.handled == [("echo", {"text": "ping"})], f"the handler got {s.handled}")
        records = [r for r in result.tool_calls if r.name == "echo"]
        _expect(len(records) == 1, f"tool_calls are {[r.name for r in result.tool_calls]}")
        _expect(not records[0].is_error and "echo: ping" in records[0].output, f"{records[0]}")
        _expect(result.error is None, f"the run failed: {result.error!r}")

    checks.append(
        (
            scenario(
                "runs_a_tool",
                spec=with_tools,
                tool_behaviour=(("echo", "ok"),),
                turns=(_call("echo", {"text": "ping"}), _text("Got pong.")),
            ),
            tool_ran,
        )
    )

    def tool_failed(word: str) -> Verify:
        def check(result: AgentResult[Any], s: Scenario) -> None:
            _expect(len(s.handled) == 1, f"the handler got {s.handled}")
            records = [r for r in result.tool_calls if r.name == "history"]
            _expect(len(records) == 1, f"tool_calls are {[r.name for r in result.tool_calls]}")
            _expect(records[0].is_error, "a raising handler's result is not is_error")
            _expect(word in records[0].output, f"the error result does not say {word!r}")
            _expect(result.error is None, f"a raising tool failed the run: {result.error!r}")

        return check

    for name, behaviour, word in (
        ("tool_error_is_an_error_result", "tool_error", "unavailable"),
        ("tool_exception_is_an_error_result", "crash", "unexpected failure"),
    ):
        checks.append(
            (
                scenario(
                    name,
                    spec=with_tools,
                    tool_behaviour=(("history", behaviour),),
                    turns=(_call("history", {}), _text("Carried on without it.")),
                ),
                tool_failed(word),
            )
        )

    def failed_as_data(result: AgentResult[Any], s: Scenario) -> None:
        _expect(isinstance(result.error, AgentRunError), f"error is {result.error!r}")
        _expect(not result.success and result.output is None, "a failed run reports success")

    refused = AgentRunError(ErrorKind.BAD_REQUEST, "conformance: the request was refused")
    checks.append((scenario("failed_call_is_data", turns=(refused,)), failed_as_data))

    def denied(result: AgentResult[Any], s: Scenario) -> None:
        _expect("shell" in result.permission_denials, f"denials are {result.permission_denials}")
        _expect(all(n != "shell" for n, _ in s.handled), "the denied tool's handler ran")

    checks.append(
        (
            scenario(
                "denied_tool_is_reported",
                # standard: "shell" is neither declared nor on its read-only list
                spec=spec.with_changes(tools=("echo",), permission_profile="standard"),
                tool_behaviour=(("echo", "ok"), ("shell", "ok")),
                turns=(_call("shell", {"text": "rm -rf /"}), _text("Done without it.")),
            ),
            denied,
        )
    )

    def structured(result: AgentResult[Any], s: Scenario) -> None:
        _expect(result.error is None, f"the run failed: {result.error!r}")
        _expect(isinstance(result.output, ConformanceAnswer), f"output is {result.output!r}")

    good = {"answer": "yes", "score": 7}
    checks.append(
        (
            scenario(
                "output_is_validated",
                output_type=ConformanceAnswer,
                turns=(_call(OUTPUT_TOOL_NAME, good),),
            ),
            structured,
        )
    )

    def invalid(result: AgentResult[Any], s: Scenario) -> None:
        kind = result.error.kind if result.error is not None else None
        _expect(kind is ErrorKind.OUTPUT_INVALID, f"error kind is {kind}, not output_invalid")
        _expect(result.output is None, f"an invalid output was returned: {result.output!r}")

    bad = {"answer": "yes", "score": 99}
    checks.append(
        (
            scenario(
                "invalid_output_is_output_invalid",
                output_type=ConformanceAnswer,
                turns=(_call(OUTPUT_TOOL_NAME, bad),) * 3,
            ),
            invalid,
        )
    )

    def never(result: AgentResult[Any], s: Scenario) -> None:
        raise _Failed(f"a run whose model never answers returned {result!r}")

    checks.append(
        (scenario("cancel_is_prompt", spec=spec.with_changes(timeout_s=None), hangs=True), never)
    )
    return checks


async def run_runtime_conformance(
    factory: RuntimeFactory,
    *,
    spec: AgentSpec | None = None,
    only: Sequence[str] = (),
    cancel_within_s: float = 15.0,
    settle_s: float = 0.5,
) -> ConformanceReport:
    """Run every check against the runtimes ``factory`` builds; raise if any failed.

    Args:
        factory: ``factory(scenario)`` returns a runtime whose model plays ``scenario`` (or an
            awaitable of one), or ``None`` when it cannot stage it. A runtime with an ``aclose``
            method is closed after its check.
        spec: the agent the checks run (default: a small one named ``conformance``).
        only: the names of the checks to run (default: all).
        cancel_within_s: how long a cancelled run may take to end.
        settle_s: how long to wait for the hanging request to reach the model
            (``scenario.reached``) before the run is cancelled anyway.

    Returns:
        The report, listing the checks that passed and those the factory did not stage.

    Raises:
        RuntimeConformanceError: a check failed; every failure is listed.
    """
    from agentmend.infrastructure.definitions.spec import AgentSpec

    # "open": the checks' own in-process tools are not on the standard profile's read-only
    # list, and what is checked is the runtime's contract, not the profile's classes
    base = spec or AgentSpec(
        name="conformance",
        description="conformance checks",
        system_prompt="Answer briefly.",
        permission_profile="open",
    )
    results: list[CheckResult] = []
    for scenario, verify in _scenarios(base):
        if only and scenario.name not in only:
            continue
        built = factory(scenario)
        runtime = await built if inspect.isawaitable(built) else built
        if runtime is None:
            results.append(CheckResult(scenario.name, "not_staged"))
            continue
        try:
            if scenario.hangs:
                await _check_cancel(runtime, scenario, verify, cancel_within_s, settle_s)
            else:
                verify(await _run(runtime, scenario), scenario)
        except _Failed as exc:
            results.append(CheckResult(scenario.name, "failed", str(exc)))
        except Exception as exc:  # run() raised: the contract says a failed run is data
            results.append(CheckResult(scenario.name, "failed", f"run() raised {exc!r}"))
        else:
            results.append(CheckResult(scenario.name, "passed"))
        finally:
            close = getattr(runtime, "aclose", None)
            if close is not None:
                await close()
    report = ConformanceReport(tuple(results))
    failures = tuple(f"{r.name}: {r.detail}" for r in report.results if r.status == "failed")
    if failures:
        raise RuntimeConformanceError(failures)
    return report


async def _run(runtime: AgentRuntime, scenario: Scenario) -> AgentResult[Any]:
    if scenario.output_type is None:
        return await runtime.run(scenario.spec, scenario.prompt, tools=scenario.tools)
    return await runtime.run(
        scenario.spec, scenario.prompt, tools=scenario.tools, output_type=scenario.output_type
    )


async def _check_cancel(
    runtime: AgentRuntime,
    scenario: Scenario,
    verify: Verify,
    within_s: float,
    settle_s: float,
) -> None:
    """Cancel a run whose model never answers; it must end, as cancelled, within ``within_s``."""
    task = asyncio.ensure_future(_run(runtime, scenario))
    deadline = time.monotonic() + settle_s
    # ``reached`` is a thread's event (a fake server's handler may set it): poll it
    while not (task.done() or scenario.reached.is_set()) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    if task.done():
        verify(task.result(), scenario)  # raises: the run should still be waiting
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=within_s)
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise _Failed(f"a cancelled run was still going after {within_s} s")
    if not task.cancelled():
        error = task.exception()
        raise _Failed(f"a cancelled run ended with {error or task.result()!r}, not cancelled")
