"""``AgentTeam``: a directory of agent definitions bound to a runtime, every run recorded.

The definition files are the source of truth (the improvement cycle edits them), so the team
reads them again on ``reload()`` rather than keeping its own copy of what an agent is. Every run
through ``run``/``run_all`` is recorded in the monitor, a failure as data: a run that raises a
runtime's ``AgentRunError`` or exceeds the team's wall-clock timeout becomes a failed
``AgentResult`` like any other, so one bad agent never takes its team-mates' answers with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentmend.infrastructure.definitions.spec import AgentSpec, load_agent_specs
from agentmend.infrastructure.errors import (
    AgentmendError,
    AgentRunError,
    ConfigurationError,
    ErrorKind,
    SpecError,
)
from agentmend.infrastructure.llm.base import AgentResult, AgentRuntime, ToolSpec
from agentmend.infrastructure.monitoring.performance_monitor import RUN, PerformanceMonitor
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.roles.ask_agent_tool import AgentCallable

if TYPE_CHECKING:
    from agentmend.infrastructure.releases.follower import ReleaseChoice, ReleaseFollower

__all__ = ["DEFINITIONS_DIR", "AgentTeam", "UnknownAgent", "load_role_spec"]

log = get_logger(__name__)

_SUMMARY_ERRORS = 5

DEFINITIONS_DIR = Path(__file__).resolve().parent / "definitions"
"""The roles' own definitions (mediator, improver, supervisor), shipped with the package."""


def load_role_spec(name: str) -> AgentSpec:
    """A role's shipped definition (``agents/definitions/<name>.md``)."""
    return AgentSpec.from_file(DEFINITIONS_DIR / f"{name}.md")


class UnknownAgent(AgentmendError, KeyError):
    """A name that is not an agent of the team; the message lists the ones that are."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"no agent named {name!r} in the team (agents: {', '.join(known)})")

    def __str__(self) -> str:  # KeyError would show the repr of the message
        return str(self.args[0])


@runtime_checkable
class _AnswersFromMemory(Protocol):
    """A runtime whose agents answer questions from their own runs (the simulated runtime)."""

    def agent_registry(
        self, specs_provider: Callable[[], Mapping[str, AgentSpec]]
    ) -> dict[str, AgentCallable]: ...


class AgentTeam:
    """The team's agents: definitions read from ``directory``, run on ``runtime``.

    Args:
        directory: the folder of ``<name>.md`` definitions (and their eval suites).
        runtime: what runs the agents.
        monitor: where every run is recorded (None: runs are not recorded).
        releases: follow the team's releases (``directory`` is then the follower's team
            link): each run is served by the release the follower chooses for its routing
            key (the canary for its share) and its record carries that release. A
            ``directory`` other than the link (the team folder a face's cycles change) keeps
            its own definitions for the cycle while runs are served from the releases.
    """

    def __init__(
        self,
        directory: str | Path,
        runtime: AgentRuntime,
        *,
        monitor: PerformanceMonitor | None = None,
        releases: ReleaseFollower | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.runtime = runtime
        self.monitor = monitor
        self.releases = releases
        self._specs: dict[str, AgentSpec] = {}
        self._broken: dict[str, SpecError] = {}
        self._release_specs: dict[Path, dict[str, AgentSpec]] = {}
        self._run_listeners: list[Callable[[str, str], object]] = []
        self.reload()

    @classmethod
    def following(
        cls,
        releases: ReleaseFollower,
        runtime: AgentRuntime,
        *,
        monitor: PerformanceMonitor | None = None,
    ) -> AgentTeam:
        """A team served from the releases ``releases`` follows (see ``releases``)."""
        return cls(releases.team_dir, runtime, monitor=monitor, releases=releases)

    # -- definitions -----------------------------------------------------------------------

    def reload(self) -> dict[str, AgentSpec]:
        """Read the definitions again (after a change was applied or rolled back).

        A definition that does not load fails only its own agent (:attr:`broken`, and
        :meth:`spec` raises its ``SpecError``); the others load.
        """
        broken: dict[str, SpecError] = {}
        self._specs_directory = self.directory.resolve()
        specs = load_agent_specs(self.directory, broken=broken)
        if not specs:
            if broken:
                raise next(iter(broken.values()))
            raise ConfigurationError(f"{self.directory}: no agent definitions (*.md) found")
        self._specs = specs
        self._broken = broken
        return dict(specs)

    @property
    def broken(self) -> Mapping[str, SpecError]:
        """The definitions that did not load, by file stem, with why."""
        return dict(self._broken)

    @property
    def specs(self) -> Mapping[str, AgentSpec]:
        """The definitions as last loaded, by agent name."""
        return dict(self._specs)

    @property
    def names(self) -> list[str]:
        return sorted(self._specs)

    def spec(self, name: str) -> AgentSpec:
        """One agent's definition.

        Raises:
            SpecError: the agent's own definition file is broken.
            UnknownAgent: the team has no agent of that name.
        """
        try:
            return self._specs[name]
        except KeyError:
            if name in self._broken:
                raise self._broken[name] from None
            raise UnknownAgent(name, self.names) from None

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    # -- running ---------------------------------------------------------------------------

    async def run(
        self,
        name: str,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        timeout_s: float | None = None,
        source: str = RUN,
        routing_key: str | None = None,
    ) -> AgentResult[Any]:
        """Run one agent and record the run; a failure comes back in ``result.error``.

        Args:
            timeout_s: a wall-clock limit on top of the runtime's own; exceeding it gives a
                ``TIMEOUT`` result.
            source: the monitor source (``"verification"`` keeps the run out of detection).
            routing_key: with releases, the key that picks the run's release (a user or
                conversation id keeps one caller on one arm); None draws a random run id.

        Raises:
            WrongArgumentType: ``routing_key`` is not a string.
        """
        tags: dict[str, object] = {}
        if self.releases is not None:
            choice = self.releases.choose(routing_key)
            spec = self._served_spec(choice, name)
            tags = choice.tags()
        else:
            if routing_key is not None and not isinstance(routing_key, str):
                from agentmend.infrastructure.errors import WrongArgumentType

                raise WrongArgumentType("routing key", routing_key, "must be a string")
            spec = self.spec(name)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                result: AgentResult[Any] = await self.runtime.run(spec, prompt, tools=tools)
        except TimeoutError:
            error = AgentRunError(ErrorKind.TIMEOUT, f"no result within the team's {timeout_s:g} s")
            result = AgentResult(
                agent_name=name, error=error, duration_ms=(time.perf_counter() - started) * 1000
            )
        except AgentRunError as exc:  # a runtime may raise what it could have returned
            result = AgentResult(
                agent_name=name, error=exc, duration_ms=(time.perf_counter() - started) * 1000
            )
        self.record(result, source=source, tags=tags)
        return result

    def _served_spec(self, choice: ReleaseChoice, name: str) -> AgentSpec:
        """``name``'s definition in the chosen release (read once: a release never changes)."""
        following_link = self.releases is not None and self.directory == self.releases.team_dir
        if (
            following_link
            and choice.arm == "stable"
            and self._specs_directory != choice.directory.resolve()
        ):
            self.reload()  # the stable release moved on: names and specs follow it
        specs = self._release_specs.get(choice.directory)
        if specs is None:
            specs = load_agent_specs(choice.directory)
            if len(self._release_specs) >= 4:  # old releases are pruned from disk too
                self._release_specs.pop(next(iter(self._release_specs)))
            self._release_specs[choice.directory] = specs
        try:
            return specs[name]
        except KeyError:
            raise UnknownAgent(name, sorted(specs)) from None

    def add_run_listener(self, listener: Callable[[str, str], object]) -> None:
        """Call ``listener(agent_name, source)`` after each run is recorded (the loop advances
        a change watched on the agent's live runs there)."""
        self._run_listeners.append(listener)

    def remove_run_listener(self, listener: Callable[[str, str], object]) -> None:
        if listener in self._run_listeners:
            self._run_listeners.remove(listener)

    def record(
        self,
        result: AgentResult[Any],
        *,
        source: str = RUN,
        tags: Mapping[str, object] | None = None,
    ) -> None:
        """Put one run into the monitor (no-op without one); ``tags`` go into its ``extra``.

        Then each run listener is told of it (see :meth:`add_run_listener`).
        """
        if self.monitor is None:
            return
        self.monitor.record(
            result.agent_name,
            success=result.success,
            duration_ms=max(0.0, result.duration_ms),
            error=str(result.error) if result.error is not None else None,
            input_tokens=result.usage.input_tokens,
            output_tokens=result.usage.output_tokens,
            cost_usd=result.cost_usd or 0.0,
            source=source,
            **(tags or {}),
        )
        for listener in list(self._run_listeners):
            listener(result.agent_name, source)

    async def run_all(
        self,
        prompt: str,
        *,
        names: Sequence[str] | None = None,
        concurrency: int = 4,
        timeout_s: float | None = None,
        routing_key: str | None = None,
    ) -> dict[str, AgentResult[Any]]:
        """Run every agent (or ``names``) on ``prompt``, at most ``concurrency`` at once.

        ``routing_key``: as in :meth:`run` (one key keeps the whole task on one release).

        Results come back in the team's name order whatever order the runs finish in.
        """
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
        chosen = list(names) if names is not None else self.names
        for name in chosen:
            self.spec(name)  # unknown names fail before anything runs
        gate = asyncio.Semaphore(concurrency)
        key = routing_key
        if self.releases is not None and key is None:
            from agentmend.infrastructure.releases.routing import new_run_key

            key = new_run_key()  # one task, one release for all its agents

        async def one(name: str) -> AgentResult[Any]:
            async with gate:
                return await self.run(name, prompt, timeout_s=timeout_s, routing_key=key)

        results = await asyncio.gather(*(one(name) for name in chosen))
        return dict(zip(chosen, results, strict=True))

    # -- questioning -----------------------------------------------------------------------

    def ask_agent_registry(self) -> dict[str, AgentCallable]:
        """``{name: async (question) -> answer}`` for ``AskAgentTool``.

        A runtime whose agents remember their runs (the simulated runtime) answers from that
        memory. Any other runtime runs the agent on the question, prefixed with a summary of
        its recent executions from the monitor, since a model has no memory of its own; these
        interrogation runs are not recorded (they are not work).
        """
        if isinstance(self.runtime, _AnswersFromMemory):
            return self.runtime.agent_registry(lambda: self._specs)

        def answerer(name: str) -> AgentCallable:
            async def answer(question: str) -> str:
                spec = self.spec(name)
                summary = self.execution_summary(name)
                prompt = f"{summary}\n\nQuestion from the team's mediator: {question}"
                result: AgentResult[Any] = await self.runtime.run(spec, prompt)
                if result.error is not None:
                    raise result.error
                return result.text

            return answer

        return {name: answerer(name) for name in self.names}

    def execution_summary(self, name: str) -> str:
        """What the monitor knows of the agent's recent runs, in plain words."""
        metrics = self.monitor.get_agent_metrics(name) if self.monitor is not None else None
        if metrics is None:
            return "You have no recorded runs yet."
        lines = [
            f"Your recent runs: {metrics.executions} recorded, success rate "
            f"{metrics.success_rate:.0%} over the latest {min(metrics.executions, 100)}, "
            f"average duration {metrics.avg_duration_ms:.0f} ms, "
            f"{metrics.consecutive_failures} failures in a row now."
        ]
        errors = list(metrics.recent_errors)[-_SUMMARY_ERRORS:]
        if errors:
            lines.append("Your latest errors were:")
            lines.extend(f"- {error}" for error in errors)
        earlier = list(metrics.errors_before_change)[-_SUMMARY_ERRORS:]
        if earlier:
            lines.append(
                f"History only, from before {metrics.errors_before_change_label} (already"
                " addressed, not current):"
            )
            lines.extend(f"- {error}" for error in earlier)
        return "\n".join(lines)
