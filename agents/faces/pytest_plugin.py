"""pytest fixtures for failure-cycle tests of a team: ``pip install "agentmend[testing]"``.

Registered through the ``pytest11`` entry point (``agentmend = "agentmend.faces.pytest_plugin"``),
so every fixture below is available in any test run once agentmend is installed. Importing this
module imports nothing but pytest: the team, runtimes and roles are imported when a fixture is
first used, so a test run that uses none of them pays nothing.

Example::

    async def test_truncation_is_repaired(agentmend_orchestrator, inject_fault):
        for n in range(50):                      # the healthy baseline
            await agentmend_orchestrator.execute_task(f"topic {n}")
        inject_fault("research-agent", "truncation")
        for n in range(40):
            task = await agentmend_orchestrator.execute_task(f"topic {n}")
            if task.cycles:
                break
        assert task.cycles[0].status == "kept"

Override ``agentmend_team_dir`` to run on copies of your own definitions,
``agentmend_settings`` to change thresholds, ``agentmend_seed`` for another deterministic world.

Your own agents run on ``agentmend_cassette_runtime``: ``pytest --agentmend-record CASSETTE``
runs them on the Messages API once (with ``ANTHROPIC_API_KEY``) and keeps every exchange, and
``pytest --agentmend-replay CASSETTE`` serves them again with no key and no network (a request
not recorded fails the test, naming the agent and the turn)::

    from agentmend import AgentTeam

    async def test_refunds(agentmend_cassette_runtime):
        team = AgentTeam(".agentmend/agents", agentmend_cassette_runtime)
        result = await team.run("support-agent", "Can I return shoes after three weeks?")
        assert "30 days" in result.text

An ``async def`` test that uses these fixtures runs on its own event loop with no async plugin
and no configuration; when an async plugin (pytest-asyncio, anyio) runs the test, it does.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from agentmend.infrastructure.llm.base import AgentRuntime
    from agentmend.infrastructure.settings import Settings
    from agentmend.infrastructure.simulation import Fault, FaultKind, SimulatedRuntime
    from agentmend.infrastructure.store.api import Store
    from agentmend.loop.meta_orchestrator import MetaOrchestrator
    from agentmend.roles.team import AgentTeam

__all__ = [
    "InjectFault",
    "agentmend_cassette_runtime",
    "agentmend_orchestrator",
    "agentmend_runtime",
    "agentmend_seed",
    "agentmend_settings",
    "agentmend_store",
    "agentmend_team",
    "agentmend_team_dir",
    "inject_fault",
]

InjectFault = Callable[..., "Fault"]
"""``inject_fault(agent, kind, **parameters) -> Fault``; ``kind`` a ``FaultKind``, its value
(``"truncation"``) or a ``Fault``; parameters are ``Fault``'s (``token_factor=4.0``, ...)."""


_FIXTURES = frozenset(__all__) - {"InjectFault"}
_ASYNC_PLUGIN_MARKERS = ("asyncio", "anyio", "trio")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agentmend")
    group.addoption(
        "--agentmend-record",
        metavar="CASSETTE",
        type=Path,
        help="agentmend_cassette_runtime runs on the Messages API and stores every exchange "
        "in CASSETTE (default: $AGENTMEND_RECORD)",
    )
    group.addoption(
        "--agentmend-replay",
        metavar="CASSETTE",
        type=Path,
        help="agentmend_cassette_runtime serves the exchanges recorded in CASSETTE: no key, "
        "no network (default: $AGENTMEND_REPLAY)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test on agentmend's fixtures when no async plugin runs it.

    The documented example (docs/faces/pytest.md) must work in a project with only agentmend
    (and pytest) installed:
    without this, pytest fails every ``async def`` test unless pytest-asyncio is installed
    *and* configured (``asyncio_mode = auto``). A test an async plugin took over (marked, or
    already wrapped into a plain function by pytest-asyncio's auto mode) is left to it.
    """
    function = pyfuncitem.obj
    if not inspect.iscoroutinefunction(function):
        return None
    if _FIXTURES.isdisjoint(pyfuncitem.fixturenames):
        return None
    if any(pyfuncitem.get_closest_marker(name) for name in _ASYNC_PLUGIN_MARKERS):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(function(**arguments))
    return True


@pytest.fixture
def agentmend_seed() -> int:
    """The simulated world's seed: same seed, same runs, same cycles."""
    return 0


@pytest.fixture
def agentmend_settings() -> Settings:
    """Settings for a quick simulated loop: a 50-run baseline, the human gate skipped."""
    from agentmend.infrastructure.settings import Settings

    return Settings(baseline_n=50, false_alarm_rate=1e-4, yolo_mode=True)


@pytest.fixture
def agentmend_team_dir(tmp_path: Path) -> Path:
    """A fresh copy of the simulated six-agent team's definitions and eval suites."""
    from agentmend.infrastructure.simulation import copy_team

    return copy_team(tmp_path / "agentmend_team")


@pytest.fixture
def agentmend_runtime(agentmend_seed: int) -> SimulatedRuntime:
    """The simulated runtime the team runs on (inject faults into it)."""
    from agentmend.infrastructure.simulation import SimulatedRuntime

    return SimulatedRuntime(agentmend_seed)


@pytest.fixture
def agentmend_cassette_runtime(request: pytest.FixtureRequest) -> AgentRuntime:
    """Your own agents' runtime: recording into (``--agentmend-record``) or replaying
    (``--agentmend-replay``) a cassette; fails the test, saying what to pass, with neither."""
    from agentmend.faces.workspace import build_runtimes
    from agentmend.infrastructure.errors import ConfigurationError
    from agentmend.infrastructure.settings import load_settings

    record = request.config.getoption("agentmend_record")
    replay = request.config.getoption("agentmend_replay")
    if record is None and replay is None:
        settings = load_settings()
        record, replay = settings.record, settings.replay
    if record is None and replay is None:
        pytest.fail(
            "agentmend_cassette_runtime needs a cassette: pytest --agentmend-replay CASSETTE "
            "(record it once with --agentmend-record CASSETTE and ANTHROPIC_API_KEY)",
            pytrace=False,
        )
    try:
        runtime, _ = build_runtimes("offline", record=record, replay=replay)
    except ConfigurationError as exc:
        pytest.fail(str(exc), pytrace=False)
    return runtime


@pytest.fixture
def agentmend_store(tmp_path: Path) -> Iterator[Store]:
    """The test's own store (executions, changes, audit, decisions)."""
    from agentmend.infrastructure.store.api import Store

    with Store(tmp_path / "agentmend.db") as store:
        yield store


@pytest.fixture
def agentmend_team(
    agentmend_team_dir: Path,
    agentmend_runtime: SimulatedRuntime,
    agentmend_store: Store,
    agentmend_settings: Settings,
) -> Iterator[AgentTeam]:
    """The team in ``agentmend_team_dir`` on ``agentmend_runtime``, every run recorded."""
    from agentmend.infrastructure.monitoring.performance_monitor import (
        PerformanceMonitor,
        monitor_options,
    )
    from agentmend.roles.team import AgentTeam

    monitor = PerformanceMonitor(agentmend_store, **monitor_options(agentmend_settings))
    try:
        yield AgentTeam(agentmend_team_dir, agentmend_runtime, monitor=monitor)
    finally:
        monitor.close()


@pytest.fixture
def agentmend_orchestrator(
    agentmend_team: AgentTeam, agentmend_store: Store, agentmend_settings: Settings
) -> Iterator[MetaOrchestrator]:
    """An orchestrator on ``agentmend_team`` with the offline playbooks as its roles, running
    a cycle for every detected issue (``auto_improve``)."""
    from agentmend.infrastructure.llm.offline import OfflineRuntime
    from agentmend.loop.meta_orchestrator import MetaOrchestrator
    from agentmend.roles.playbooks import offline_policies

    with MetaOrchestrator.for_team(
        agentmend_team,
        roles_runtime=OfflineRuntime(offline_policies()),
        store=agentmend_store,
        settings=agentmend_settings,
        auto_improve=True,
    ) as orchestrator:
        yield orchestrator


@pytest.fixture
def inject_fault(agentmend_runtime: SimulatedRuntime) -> InjectFault:
    """Start a fault for an agent from its next run on; returns the fault with its defaults."""
    from agentmend.infrastructure.errors import WrongArgumentType
    from agentmend.infrastructure.simulation import Fault, FaultKind

    def inject(agent: str, kind: FaultKind | Fault | str, **parameters: Any) -> Fault:
        if isinstance(kind, Fault):
            if parameters:
                raise WrongArgumentType(
                    "parameters", parameters, "go with a fault kind, not with a Fault"
                )
            return agentmend_runtime.inject(agent, kind)
        return agentmend_runtime.inject(agent, Fault(FaultKind(kind), **parameters))

    return inject
