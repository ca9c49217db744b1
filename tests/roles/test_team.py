"""AgentTeam: definitions from a folder, runs recorded, bounded concurrency, questioning."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_runtimes import Call, ScriptedRuns

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.errors import AgentRunError, ConfigurationError, ErrorKind
from agentmend.infrastructure.llm.testing import ScriptedRuntime, Step
from agentmend.infrastructure.monitoring.performance_monitor import VERIFICATION, PerformanceMonitor
from agentmend.infrastructure.simulation import (
    TEAM_AGENT_NAMES,
    FaultKind,
    SimulatedRuntime,
    copy_team,
)
from agentmend.roles.team import AgentTeam, UnknownAgent, load_role_spec


@pytest.fixture
def monitor() -> Iterator[PerformanceMonitor]:
    with PerformanceMonitor(baseline_n=20) as mon:
        yield mon


@pytest.fixture
def team_dir(tmp_path: Path) -> Path:
    return copy_team(tmp_path / "team")


def slow_runtime(delay_s: float = 0.01, *, hang: str = "", raises: str = "") -> ScriptedRuns:
    """Sleeps per run (its ``peak`` is how many runs overlapped); fails or hangs on demand."""

    async def answer(call: Call) -> str:
        if call.spec.name == raises:
            raise AgentRunError(ErrorKind.OVERLOADED, "overloaded_error: Overloaded")
        await asyncio.sleep(60 if call.spec.name == hang else delay_s)
        return f"{call.spec.name}: {call.prompt}"

    return ScriptedRuns(answer, duration_ms=5)


def test_loads_the_definitions_and_names_unknown_agents(team_dir: Path) -> None:
    team = AgentTeam(team_dir, SimulatedRuntime())
    assert team.names == sorted(TEAM_AGENT_NAMES)
    assert len(team) == 6
    assert "research-agent" in team
    assert team.spec("research-agent").max_tokens == 2048
    with pytest.raises(UnknownAgent, match=r"no agent named 'ghost'.*research-agent") as caught:
        team.spec("ghost")
    assert caught.value.name == "ghost"


def test_an_empty_folder_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no agent definitions"):
        AgentTeam(tmp_path, SimulatedRuntime())


def test_reload_sees_the_files_as_they_are_now(team_dir: Path) -> None:
    team = AgentTeam(team_dir, SimulatedRuntime())
    path = team_dir / "research-agent.md"
    AgentSpec.from_file(path).with_changes(max_tokens=4096).save()
    assert team.spec("research-agent").max_tokens == 2048
    assert team.reload()["research-agent"].max_tokens == 4096
    assert team.spec("research-agent").max_tokens == 4096


async def test_run_records_every_run_in_the_monitor(
    team_dir: Path, monitor: PerformanceMonitor
) -> None:
    runtime = SimulatedRuntime(seed=3)
    team = AgentTeam(team_dir, runtime, monitor=monitor)
    runtime.inject("research-agent", FaultKind.TRUNCATION)
    result = await team.run("research-agent", "Pythagorean theorem")
    assert result.error is not None
    assert result.error.kind is ErrorKind.TRUNCATED
    await team.run("quality-agent", "Pythagorean theorem", source=VERIFICATION)
    metrics = monitor.get_agent_metrics("research-agent")
    assert metrics is not None
    assert (metrics.executions, metrics.failures) == (1, 1)
    assert metrics.last_error is not None
    assert metrics.last_error.startswith("truncated: ")
    assert metrics.output_tokens == result.usage.output_tokens > 0
    assert monitor.get_agent_metrics("quality-agent") is None  # verification runs apart
    assert monitor.get_agent_metrics("quality-agent", source=VERIFICATION) is not None


async def test_run_all_is_bounded_and_keeps_name_order(
    team_dir: Path, monitor: PerformanceMonitor
) -> None:
    runtime = slow_runtime()
    team = AgentTeam(team_dir, runtime, monitor=monitor)
    results = await team.run_all("q", concurrency=2)
    assert list(results) == team.names
    assert runtime.peak == 2
    assert all(r.text == f"{name}: q" for name, r in results.items())
    assert monitor.agents() == team.names


async def test_a_hung_or_failing_agent_becomes_a_failed_result(
    team_dir: Path, monitor: PerformanceMonitor
) -> None:
    runtime = slow_runtime(hang="quality-agent", raises="research-agent")
    team = AgentTeam(team_dir, runtime, monitor=monitor)
    results = await team.run_all("q", timeout_s=0.2)
    hung, raised = results["quality-agent"].error, results["research-agent"].error
    assert hung is not None
    assert hung.kind is ErrorKind.TIMEOUT
    assert raised is not None
    assert raised.kind is ErrorKind.OVERLOADED
    assert sum(r.success for r in results.values()) == 4
    metrics = monitor.get_agent_metrics("quality-agent")
    assert metrics is not None
    assert metrics.failures == 1
    assert metrics.last_error is not None
    assert "timeout" in metrics.last_error


async def test_run_all_rejects_unknown_names_before_running(team_dir: Path) -> None:
    runtime = slow_runtime()
    team = AgentTeam(team_dir, runtime)
    with pytest.raises(UnknownAgent):
        await team.run_all("q", names=["research-agent", "ghost"])
    assert runtime.peak == 0


async def test_simulated_agents_answer_from_their_memory_with_current_files(
    team_dir: Path,
) -> None:
    runtime = SimulatedRuntime(seed=1)
    team = AgentTeam(team_dir, runtime)
    registry = team.ask_agent_registry()
    assert sorted(registry) == team.names
    await team.run("research-agent", "Pythagorean theorem")
    before = await registry["research-agent"]("What max_tokens are you configured with?")
    assert "max_tokens 2048" in before
    AgentSpec.from_file(team_dir / "research-agent.md").with_changes(max_tokens=4096).save()
    team.reload()
    after = await registry["research-agent"]("What max_tokens are you configured with?")
    assert "max_tokens 4096" in after


async def test_a_model_agent_answers_with_a_summary_of_its_recorded_runs(
    team_dir: Path, monitor: PerformanceMonitor
) -> None:
    runtime = ScriptedRuntime(scripts={"research-agent": [Step.text("I keep getting cut off.")]})
    team = AgentTeam(team_dir, runtime, monitor=monitor)
    monitor.record("research-agent", success=False, duration_ms=10, error="truncated: cut at 2048")
    answer = await team.ask_agent_registry()["research-agent"]("Why do your runs fail?")
    assert answer == "I keep getting cut off."
    prompt = runtime.runs[-1].prompt
    assert "truncated: cut at 2048" in prompt
    assert prompt.endswith("Question from the team's mediator: Why do your runs fail?")
    metrics = monitor.get_agent_metrics("research-agent")
    assert metrics is not None
    assert metrics.executions == 1


async def test_a_model_agent_that_cannot_answer_raises_its_error(team_dir: Path) -> None:
    runtime = ScriptedRuntime(scripts={"research-agent": [Step.fail(ErrorKind.RATE_LIMIT)]})
    team = AgentTeam(team_dir, runtime)
    with pytest.raises(AgentRunError) as caught:
        await team.ask_agent_registry()["research-agent"]("Why?")
    assert caught.value.kind is ErrorKind.RATE_LIMIT


def test_role_definitions_ship_with_the_package() -> None:
    mediator = load_role_spec("socratic-mediator")
    assert mediator.tools == ("ask_agent",)
    assert "ROOT CAUSE ANALYSIS REPORT" in mediator.system_prompt
    improver = load_role_spec("self-improver")
    assert "ACTIONS: NONE" in improver.system_prompt
    supervisor = load_role_spec("supervisor")
    assert supervisor.permission_profile == "standard"
    models: set[Any] = {mediator.model, improver.model, supervisor.model}
    assert models == {"claude-sonnet-4-6"}
