"""Driving the loop on the simulated team: the scenarios several test modules share.

``build`` makes orchestrators on a copy of the simulated team (closed after the test), with
``BASELINE`` healthy runs of baseline; ``warm_up`` gives them those runs, ``drive_until_cycle``
runs tasks until a cycle for an agent ran, ``faulty_issue`` reports an injected fault as a
detector would, and ``cooler_research_agent`` is an improver with one fixed proposal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_runtimes import RoutedRuntime, scripted_improver

from agentmend.infrastructure.models import ChangeType, IssueReport
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime
from agentmend.loop.cycle import CycleResult
from agentmend.loop.meta_orchestrator import MetaOrchestrator
from agentmend.roles.schemas import ProposedAction

__all__ = [
    "BASELINE",
    "Build",
    "build",
    "cooler_research_agent",
    "drive_until_cycle",
    "faulty_issue",
    "sim",
    "warm_up",
]

BASELINE = 50


Build = Callable[..., MetaOrchestrator]


@pytest.fixture
def build(tmp_path: Path) -> Iterator[Build]:
    made: list[MetaOrchestrator] = []

    def make(
        *, seed: int = 11, settings: Settings | None = None, **options: Any
    ) -> MetaOrchestrator:
        settings = settings or Settings(baseline_n=BASELINE, false_alarm_rate=1e-4)
        orchestrator = MetaOrchestrator.offline_simulated(
            tmp_path / "team", seed=seed, settings=settings, **options
        )
        made.append(orchestrator)
        return orchestrator

    yield make
    for orchestrator in made:
        orchestrator.close()


async def warm_up(orchestrator: MetaOrchestrator, tasks: int = BASELINE) -> None:
    for n in range(tasks):
        task = await orchestrator.execute_task(f"warm-up topic {n}")
        assert task.cycles == []


async def drive_until_cycle(
    orchestrator: MetaOrchestrator, agent: str, *, max_tasks: int = 40
) -> CycleResult:
    """Run tasks until a cycle for ``agent`` ran; fails the test if none does."""
    for n in range(max_tasks):
        task = await orchestrator.execute_task(f"faulty topic {n}")
        for cycle in task.cycles:
            if cycle.issue.agent_name == agent:
                return cycle
    pytest.fail(f"no cycle for {agent} within {max_tasks} tasks")


def sim(orchestrator: MetaOrchestrator) -> SimulatedRuntime:
    runtime = orchestrator.team.runtime
    assert isinstance(runtime, SimulatedRuntime)
    return runtime


async def faulty_issue(
    orchestrator: MetaOrchestrator,
    agent: str = "research-agent",
    runs: int = 4,
    fault: FaultKind = FaultKind.TRUNCATION,
) -> IssueReport:
    """Give ``agent`` a fault (truncated answers by default), run it a few times, and report it
    as a detector would."""
    sim(orchestrator).inject(agent, fault)
    for n in range(runs):
        await orchestrator.team.run(agent, f"topic {n}")
    metrics = orchestrator.monitor.get_agent_metrics(agent)
    assert metrics is not None
    return IssueReport(
        agent_name=agent,
        error_type="consecutive_failures",
        metrics=metrics.model_dump(),
        error_logs=list(metrics.recent_errors),
        context=f"{runs} consecutive failures",
        available_agents=orchestrator.team.names,
    )


def cooler_research_agent() -> RoutedRuntime:
    """An improver that always proposes a cooler temperature for research-agent."""
    return scripted_improver(
        [
            ProposedAction(
                action_type=ChangeType.PARAMETER_ADJUSTMENT,
                target_agent="research-agent",
                target_field="temperature",
                new_value=0.1,
                rationale="calmer answers",
                confidence=0.9,
            )
        ]
    )
