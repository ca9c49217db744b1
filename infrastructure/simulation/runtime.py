"""``SimulatedRuntime``: the six-agent team as a deterministic function of configuration and faults.

Each run's outcome depends only on (seed, agent name, the agent's call index, the definition it
was given, the faults active for it). Nothing sleeps: durations are computed from the model's
speed, the answer's length and the tools called, and a timeout is a computed duration beyond
``timeout_s``. Healthy agents still fail now and then (a few percent of transient API errors and
format slips) so detection is exercised against a realistic baseline.

The runtime remembers each agent's recent runs as the agent would remember them, and answers the
mediator's questions from that memory and from the agent's definition (``answers.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentmend.infrastructure.errors import AgentRunError, ConfigurationError, ErrorKind
from agentmend.infrastructure.files.atomic import atomic_write
from agentmend.infrastructure.llm.base import AgentResult, OutputT, RuntimeBase, ToolSpec, Usage
from agentmend.infrastructure.simulation.answers import compose_answer
from agentmend.infrastructure.simulation.engine import Conditions, Outcome, draw, simulate
from agentmend.infrastructure.simulation.faults import (
    Fault,
    FaultKind,
    faults_from_json,
    faults_to_json,
)
from agentmend.infrastructure.simulation.outputs import CannotFill, fill_output
from agentmend.infrastructure.simulation.run_record import RunRecord
from agentmend.infrastructure.simulation.team import (
    AVAILABLE_MODELS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TIMEOUT_S,
    ModelProfile,
    profile_for,
    resolve_model,
)
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from pathlib import Path

    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = ["AgentAnswerer", "SimulatedRuntime"]

log = get_logger(__name__)

AgentAnswerer = Callable[[str], Awaitable[str]]
"""An async function answering one question (what ``AskAgentTool`` keeps per agent)."""


@dataclass(slots=True)
class _ActiveFault:
    fault: Fault
    model: str | None
    remaining: int


class SimulatedRuntime(RuntimeBase):
    """An ``AgentRuntime`` whose agents behave by their configuration and the faults given.

    Args:
        seed: every random choice derives from it; same seed and same calls, same results.
        available_models: the models the API serves (names of known profiles, or profiles);
            default ``AVAILABLE_MODELS``.
        clock: seconds now, for the timestamps of remembered runs; default a simulated clock
            that advances by each run's simulated duration.
        base_failure_rate: probability of a transient API error on a healthy run.
        memory: how many recent runs each agent remembers.
        faults_file: where the injected faults are kept (a workspace's), so that every process
            opening it sees them: read here, rewritten whole at each ``inject`` and ``heal``.
            None keeps them in this object only.

    Raises:
        ConfigurationError: a bad argument, or a ``faults_file`` that is not one.
    """

    def __init__(
        self,
        seed: int = 0,
        available_models: Iterable[str | ModelProfile] | None = None,
        clock: Callable[[], float] | None = None,
        *,
        base_failure_rate: float = 0.02,
        memory: int = 50,
        faults_file: Path | None = None,
    ) -> None:
        if not 0.0 <= base_failure_rate < 1.0:
            raise ConfigurationError(
                f"base_failure_rate must be in [0, 1), got {base_failure_rate}"
            )
        if memory < 1:
            raise ConfigurationError(f"memory must be at least 1, got {memory}")
        self.seed = seed
        self.base_failure_rate = base_failure_rate
        self._models = self._model_table(available_models)
        self._clock = clock
        self._sim_time_s = 0.0
        self._memory = memory
        self._faults: dict[str, list[_ActiveFault]] = {}
        self._calls: dict[str, int] = {}
        self._log: dict[str, deque[RunRecord]] = {}
        self._last_spec: dict[str, AgentSpec] = {}
        self._faults_file = faults_file
        if faults_file is not None and faults_file.exists():
            for agent, kept in faults_from_json(
                faults_file.read_text(encoding="utf-8", errors="replace"), source=str(faults_file)
            ).items():
                self._faults[agent] = [_ActiveFault(f, f.model, f.calls) for f in kept]

    def _keep_faults(self) -> None:
        if self._faults_file is not None:
            current = {agent: self.faults(agent) for agent in self._faults}
            atomic_write(self._faults_file, faults_to_json(current))

    @staticmethod
    def _model_table(models: Iterable[str | ModelProfile] | None) -> dict[str, ModelProfile]:
        if models is None:
            return dict(AVAILABLE_MODELS)
        table: dict[str, ModelProfile] = {}
        for item in models:
            if isinstance(item, ModelProfile):
                table[item.name] = item
            elif item in AVAILABLE_MODELS:
                table[item] = AVAILABLE_MODELS[item]
            else:
                raise ConfigurationError(
                    f"available_models: no profile for model {item!r}; "
                    f"pass a ModelProfile or one of {sorted(AVAILABLE_MODELS)}"
                )
        if not table:
            raise ConfigurationError("available_models: at least one model is needed")
        return table

    @property
    def available_models(self) -> tuple[str, ...]:
        """The model names the simulated API serves."""
        return tuple(self._models)

    def now(self) -> float:
        """Seconds on the runtime's clock."""
        return self._clock() if self._clock is not None else self._sim_time_s

    # faults -------------------------------------------------------------------------------

    def inject(self, agent: str, fault: Fault | FaultKind | str) -> Fault:
        """Start ``fault`` for ``agent`` from its next run on; returns the fault with defaults.

        ``fault`` is a ``Fault``, a ``FaultKind`` or its value (``"truncation"``).

        Raises:
            ConfigurationError: ``fault`` names no fault kind (the message lists them).
        """
        if isinstance(fault, str) and not isinstance(fault, FaultKind):
            try:
                fault = FaultKind(fault)
            except ValueError:
                kinds = ", ".join(kind.value for kind in FaultKind)
                raise ConfigurationError(f"unknown fault {fault!r}; one of: {kinds}") from None
        if isinstance(fault, FaultKind):
            fault = Fault(fault)
        active = _ActiveFault(fault, fault.model, fault.calls)
        self._faults.setdefault(agent, []).append(active)
        self._keep_faults()
        log.debug("injected_fault", agent=agent, fault=fault.kind.value)
        return fault

    def heal(self, agent: str | None = None, kind: FaultKind | None = None) -> None:
        """End faults: of ``agent`` (or every agent), of ``kind`` (or every kind)."""
        log.debug("healed_faults", agent=agent, fault=kind.value if kind else None)
        names = list(self._faults) if agent is None else [agent]
        for name in names:
            kept = [
                a for a in self._faults.get(name, []) if kind is not None and a.fault.kind != kind
            ]
            if kept:
                self._faults[name] = kept
            else:
                self._faults.pop(name, None)
        self._keep_faults()

    def faults(self, agent: str) -> tuple[Fault, ...]:
        """The faults active for ``agent`` (the ground truth a test compares a diagnosis with)."""
        return tuple(active.fault for active in self._faults.get(agent, []))

    def history(self, agent: str) -> tuple[RunRecord, ...]:
        """The agent's remembered runs, oldest first."""
        return tuple(self._log.get(agent, ()))

    def call_count(self, agent: str) -> int:
        """How many runs ``agent`` has had on this runtime."""
        return self._calls.get(agent, 0)

    # ask_agent ----------------------------------------------------------------------------

    def answer_question(self, agent_name: str, question: str, spec: AgentSpec | None = None) -> str:
        """The agent's answer to a mediator's question, from its memory and its definition.

        Args:
            agent_name: who is asked.
            question: the question, matched on keywords (errors, tools, model, timeout,
                format, configuration); anything else gets a summary.
            spec: the agent's current definition; default the one it last ran with.

        Raises:
            ConfigurationError: no definition given and the agent never ran here.
        """
        definition = spec if spec is not None else self._last_spec.get(agent_name)
        if definition is None:
            raise ConfigurationError(
                f"agent {agent_name!r} has not run on this runtime; pass its spec to answer"
            )
        retired = {
            active.model
            for active in self._faults.get(agent_name, [])
            if active.fault.kind is FaultKind.MODEL_RETIRED and active.model is not None
        }
        serving = tuple(name for name in self._models if name not in retired)
        return compose_answer(
            profile_for(agent_name),
            question,
            definition,
            self.history(agent_name),
            serving,
        )

    def agent_registry(
        self, specs_provider: Callable[[], Mapping[str, AgentSpec]]
    ) -> dict[str, AgentAnswerer]:
        """``{name: async (question) -> answer}`` for ``AskAgentTool``.

        ``specs_provider`` is called at every question, so an agent answers with the definition
        it has now (after a fix is applied and the files are reloaded), not a stale one.
        """

        def answerer(name: str) -> AgentAnswerer:
            async def answer(question: str) -> str:
                spec = specs_provider().get(name)
                if spec is None:
                    raise LookupError(f"agent {name!r} is no longer defined")
                return self.answer_question(name, question, spec)

            return answer

        return {name: answerer(name) for name in sorted(specs_provider())}

    # running ------------------------------------------------------------------------------

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        """Simulate one run of ``spec`` on ``prompt``; failures come back inside the result.

        The agent calls its own simulated tools (its profile's), not the ``tools`` given, which
        are accepted for protocol compatibility and left uncalled.
        """
        del tools
        name = spec.name
        index = self._calls.get(name, 0)
        self._calls[name] = index + 1
        self._last_spec[name] = spec
        model_name = resolve_model(spec.model)
        max_tokens = spec.max_tokens if spec.max_tokens is not None else DEFAULT_MAX_TOKENS
        timeout_s = spec.timeout_s if spec.timeout_s is not None else DEFAULT_TIMEOUT_S
        model = self._models.get(model_name)
        outcome = simulate(
            spec,
            prompt,
            profile_for(name),
            model_name,
            model,
            self._conditions(name, model_name),
            draw(self.seed, name, index),
            base_failure_rate=self.base_failure_rate,
            max_tokens=max_tokens,
            timeout_s=timeout_s,
        )
        output: OutputT | None = None
        if output_type is not None and outcome.error is None:
            try:
                output = fill_output(output_type, outcome.text)
            except CannotFill as exc:
                outcome.text = ""
                outcome.format_problem = "structured"
                outcome.error = AgentRunError(
                    ErrorKind.OUTPUT_INVALID, f"structured output not produced: {exc}"
                )
        self._expire_storms(name)
        record = self._remember(spec, index, model_name, outcome, max_tokens, timeout_s)
        # An API-level rejection (it has a status code) processed no tokens and took no turn.
        rejected = outcome.error is not None and outcome.error.status_code is not None
        input_tokens = (len(spec.full_system_prompt) + len(prompt)) // 4 + 24
        usage = Usage(
            0 if rejected else input_tokens + 120 * len(outcome.tool_calls),
            outcome.output_tokens,
        )
        return AgentResult(
            agent_name=name,
            text=outcome.text,
            output=output,
            tool_calls=tuple(outcome.tool_calls),
            usage=usage,
            cost_usd=model.cost_usd(usage.input_tokens, usage.output_tokens) if model else 0.0,
            turns=0 if rejected else len(outcome.tool_calls) + 1,
            duration_ms=record.duration_ms,
            stop_reason=outcome.stop_reason,
            error=outcome.error,
            permission_denials=tuple(outcome.denied),
            model=model_name,
        )

    def _conditions(self, agent: str, model_name: str) -> Conditions:
        """What the agent's active faults amount to for its next run (and storm bookkeeping)."""
        actives = self._faults.get(agent, [])
        model_gone = throttled = format_strict = opaque = False
        token_factor = latency_factor = 1.0
        extra: list[str] = []
        message: str | None = None
        profile = profile_for(agent)
        for active in actives:
            fault = active.fault
            if fault.kind is FaultKind.MODEL_RETIRED:
                if active.model is None:
                    active.model = model_name  # the model it was on when the fault struck
                model_gone = model_gone or active.model == model_name
            elif fault.kind is FaultKind.RATE_LIMIT_STORM:
                throttled = True
                active.remaining -= 1
            elif fault.kind is FaultKind.TRUNCATION:
                token_factor *= fault.token_factor
            elif fault.kind is FaultKind.SLOW:
                latency_factor *= fault.latency_factor
            elif fault.kind is FaultKind.TOOL_DENIED:
                extra.append(fault.tool or profile.extra_tool)
            elif fault.kind is FaultKind.FORMAT_DRIFT:
                format_strict = True
            elif fault.kind is FaultKind.UNKNOWN:
                opaque = True
                message = message or fault.message
        return Conditions(
            model_gone=model_gone,
            throttled=throttled,
            token_factor=token_factor,
            latency_factor=latency_factor,
            extra_tools=tuple(extra),
            format_strict=format_strict,
            opaque_error=opaque,
            opaque_message=message,
        )

    def _expire_storms(self, agent: str) -> None:
        actives = self._faults.get(agent)
        if not actives:
            return
        kept = [
            a
            for a in actives
            if not (a.fault.kind is FaultKind.RATE_LIMIT_STORM and a.remaining <= 0)
        ]
        if kept:
            self._faults[agent] = kept
        else:
            del self._faults[agent]

    def _remember(
        self,
        spec: AgentSpec,
        index: int,
        model_name: str,
        outcome: Outcome,
        max_tokens: int,
        timeout_s: float,
    ) -> RunRecord:
        error = outcome.error
        record = RunRecord(
            index=index,
            at_s=self.now(),
            model=model_name,
            success=error is None,
            error_kind=error.kind if error else None,
            error_message=error.message if error else None,
            status_code=error.status_code if error else None,
            stop_reason=outcome.stop_reason,
            tools_called=tuple(call.name for call in outcome.tool_calls if not call.is_error),
            denied_tools=tuple(outcome.denied),
            allowed_tools=spec.tools,
            duration_ms=outcome.elapsed_ms,
            full_duration_ms=outcome.full_ms if outcome.full_ms is not None else outcome.elapsed_ms,
            output_tokens=outcome.output_tokens,
            needed_tokens=outcome.needed_tokens,
            max_tokens=max_tokens,
            timeout_s=timeout_s,
            max_turns=spec.max_turns,
            format_problem=outcome.format_problem,
        )
        self._log.setdefault(spec.name, deque(maxlen=self._memory)).append(record)
        if self._clock is None:
            self._sim_time_s += outcome.elapsed_ms / 1000.0
        return record
