"""A cycle on an agent without an eval suite: the change is watched on the agent's live runs.

The cycle ends ``watching``; the agent's next production runs (recorded through the team, as
the session, the MCP server and a library's ``AgentTeam`` record them) advance the watch, which
rolls a harmful change back as soon as the runs show it hurts, keeps a real fix once they show
it helps, and rolls back a change that does not help when its budget is spent. While the watch
is open no other change is made to that agent. A process killed with the watch open leaves the
change live, and the next open of the workspace continues the watch instead of undoing it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crash_child import kill_at_marker
from cycle_watch_child import AGENT, improver_setting

from agentmend.infrastructure.changes.protocol.decisions import list_decisions
from agentmend.infrastructure.changes.watch import ChangeWatcher
from agentmend.infrastructure.models import ChangeStatus, IssueReport
from agentmend.infrastructure.monitoring.performance_monitor import VERIFICATION
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import AVAILABLE_MODELS, FaultKind, SimulatedRuntime
from agentmend.loop.cycle import cycle_events, replay_cycle
from agentmend.loop.cycle_history import cycle_of_change, cycle_summaries, latest_cycles
from agentmend.loop.meta_orchestrator import MetaOrchestrator

Build = Callable[..., MetaOrchestrator]


@pytest.fixture
def build(tmp_path: Path) -> Iterator[Build]:
    made: list[MetaOrchestrator] = []

    def make(*, failure_rate: float = 0.02, **options: Any) -> MetaOrchestrator:
        options.setdefault("settings", Settings(baseline_n=20, detection_mode="rules"))
        orchestrator = MetaOrchestrator.offline_simulated(
            tmp_path / "team",
            seed=5,
            runtime=SimulatedRuntime(5, base_failure_rate=failure_rate),
            **options,
        )
        (orchestrator.team.directory / f"{AGENT}.evals.yaml").unlink()
        made.append(orchestrator)
        return orchestrator

    yield make
    for orchestrator in made:
        orchestrator.close()


def definitions(orchestrator: MetaOrchestrator) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(orchestrator.team.directory.glob("*.md"))}


def sim(orchestrator: MetaOrchestrator) -> SimulatedRuntime:
    runtime = orchestrator.team.runtime
    assert isinstance(runtime, SimulatedRuntime)
    return runtime


async def runs(orchestrator: MetaOrchestrator, n: int, start: int = 0) -> int:
    """Run research-agent ``n`` times as production traffic; returns how many succeeded."""
    ok = 0
    for i in range(start, start + n):
        ok += (await orchestrator.team.run(AGENT, f"question {i}")).success
    return ok


def issue_of(orchestrator: MetaOrchestrator, kind: str = "low_success_rate") -> IssueReport:
    metrics = orchestrator.monitor.get_agent_metrics(AGENT)
    assert metrics is not None
    return IssueReport(
        agent_name=AGENT,
        error_type=kind,
        metrics=metrics.model_dump(),
        error_logs=list(metrics.recent_errors),
        context="raised for the test",
        available_agents=orchestrator.team.names,
    )


async def watch_until_ended(orchestrator: MetaOrchestrator, most: int) -> int:
    """Production runs of research-agent until its watch ends; returns the runs it took."""
    for n in range(1, most + 1):
        await orchestrator.team.run(AGENT, f"after {n}")
        if not orchestrator.watcher.open_watches(AGENT):
            return n
    return most


async def test_a_fix_without_a_suite_is_watched_on_live_runs_and_kept_once_shown_better(
    build: Build,
) -> None:
    orchestrator = build()
    await runs(orchestrator, 30)
    sim(orchestrator).inject(AGENT, FaultKind.TRUNCATION)
    assert await runs(orchestrator, 30, start=30) == 0
    before = definitions(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(issue_of(orchestrator))
    assert cycle.status == "watching", cycle.summary()
    assert not cycle  # not kept yet
    assert cycle.watch is not None
    assert (cycle.watch.agent, cycle.watch.verdict, cycle.watch.budget) == (AGENT, "watching", 60)
    assert cycle.verifications == {}  # no sample query ran: live runs judge it
    assert orchestrator.monitor.get_agent_metrics(AGENT, source=VERIFICATION) is None
    assert definitions(orchestrator) != before  # applied, and the team runs it
    (record,) = orchestrator.manager.get_history()
    assert record.status is ChangeStatus.APPLIED
    steps = [e.step for e in cycle_events(orchestrator.store, cycle.cycle_id)]
    assert steps[-3:] == ["change_applied", "change_watched", "cycle_finished"]

    used = await watch_until_ended(orchestrator, 60)
    assert used < 30  # shown better long before the budget
    (record,) = orchestrator.manager.get_history()
    assert record.status is ChangeStatus.KEPT
    assert record.verification_result is not None
    assert record.verification_result["decision"] == "better"
    assert record.verification_result["cycle_id"] == cycle.cycle_id
    assert record.verification_result["new_baseline"] == ()  # detection keeps its baseline
    assert definitions(orchestrator) != before
    # the cycle's record shows the watch's verdict wherever cycles are read
    replayed = replay_cycle(orchestrator.store, cycle.cycle_id)
    assert replayed.status == "kept"
    assert bool(replayed)
    assert replayed.watch is not None
    assert replayed.watch.runs == used
    assert "kept: shown better" in replayed.summary()
    assert latest_cycles(orchestrator.store)[0].status == "kept"
    assert cycle_summaries(orchestrator.store)[0].status == "kept"
    shown = cycle_of_change(orchestrator.store, record.change_id)
    assert shown is not None
    assert shown.status == "kept"
    (settled,) = list_decisions(orchestrator.store, kind="watch_settled")
    assert settled.payload["state"] == "kept"


async def test_a_change_that_hurts_is_rolled_back_by_the_watch_as_soon_as_runs_show_it(
    build: Build,
) -> None:
    # a noisy healthy agent, and a change that cuts its answers off
    orchestrator = build(failure_rate=0.1, roles_runtime=improver_setting("max_tokens", 40))
    await runs(orchestrator, 60)
    before = definitions(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(issue_of(orchestrator))
    assert cycle.status == "watching", cycle.summary()
    assert not (await orchestrator.team.run(AGENT, "first after")).success  # it does hurt
    used = 1 + await watch_until_ended(orchestrator, 59)
    assert used < 20
    assert definitions(orchestrator) == before  # restored byte for byte
    (record,) = orchestrator.manager.get_history()
    assert record.status is ChangeStatus.ROLLED_BACK
    replayed = replay_cycle(orchestrator.store, cycle.cycle_id)
    assert (replayed.status, replayed.rolled_back) == ("rolled_back", True)
    assert replayed.watch is not None
    assert replayed.watch.decision == "hurts"
    assert orchestrator.team.spec(AGENT).max_tokens != 40  # the team runs the restored file


async def test_a_change_that_does_not_help_is_not_kept(build: Build) -> None:
    # today's sample-query check kept such lines on healthy noisy agents; the watch does not
    orchestrator = build(failure_rate=0.15, roles_runtime=improver_setting("temperature", 0.1))
    orchestrator.cycle.changes.watch_runs = 40
    await runs(orchestrator, 60)
    before = definitions(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(issue_of(orchestrator))
    assert cycle.status == "watching", cycle.summary()
    assert cycle.watch is not None
    assert cycle.watch.budget == 40
    used = await watch_until_ended(orchestrator, 60)
    assert used == 40  # the whole budget: never shown better, never shown to hurt
    assert definitions(orchestrator) == before
    (record,) = orchestrator.manager.get_history()
    assert record.status is ChangeStatus.ROLLED_BACK
    replayed = replay_cycle(orchestrator.store, cycle.cycle_id)
    assert replayed.status == "not_proven"
    assert replayed.watch is not None
    assert replayed.watch.decision in ("no_worse", "budget_spent")
    assert "not shown better" in (replayed.rollback_reason or "")


async def test_no_other_change_or_detected_cycle_for_an_agent_while_its_change_is_watched(
    build: Build,
) -> None:
    orchestrator = build(failure_rate=0.15, roles_runtime=improver_setting("temperature", 0.1))
    await runs(orchestrator, 60)
    first = await orchestrator.run_improvement_cycle(issue_of(orchestrator))
    assert first.status == "watching"
    # asked for directly: refused before anything is planned or gated
    second = await orchestrator.run_improvement_cycle(issue_of(orchestrator, "slow_response"))
    assert second.status == "watch_open"
    assert second.error is not None
    assert "being watched" in second.error
    assert second.outcomes == ()
    assert len(orchestrator.manager.get_history()) == 1
    # detected: the issue is held, no cycle is started
    sim(orchestrator).inject(AGENT, FaultKind.MODEL_RETIRED)
    task = await orchestrator.execute_task("a task while watching")
    assert task.issues
    assert all(c.issue.agent_name != AGENT for c in task.cycles)
    held = list_decisions(orchestrator.store, kind="issue_held_while_watched")
    assert held
    assert held[-1].agent_name == AGENT
    assert len(orchestrator.manager.get_history()) == 1


async def test_with_too_few_live_runs_the_weaker_sample_check_still_decides(
    build: Build,
) -> None:
    orchestrator = build()
    sim(orchestrator).inject(AGENT, FaultKind.TRUNCATION)
    await runs(orchestrator, 4)
    cycle = await orchestrator.run_improvement_cycle(issue_of(orchestrator))
    assert cycle.status == "kept"
    assert cycle.watch is None
    assert cycle.verification is not None
    assert cycle.verification.weaker


async def test_live_runs_that_all_succeeded_leave_nothing_for_a_watch_to_show(
    build: Build,
) -> None:
    orchestrator = build(roles_runtime=improver_setting("temperature", 0.1))
    for _ in range(30):
        orchestrator.monitor.record(AGENT, success=True, duration_ms=100.0)
    before = definitions(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(issue_of(orchestrator))
    assert cycle.status == "not_reproduced"
    assert cycle.error is not None
    assert "all succeeded" in cycle.error
    assert definitions(orchestrator) == before
    assert orchestrator.manager.get_history() == []


async def test_a_self_edit_without_a_suite_is_watched_and_kept_on_live_runs(
    build: Build,
) -> None:
    orchestrator = build()
    await runs(orchestrator, 20)
    sim(orchestrator).inject(AGENT, FaultKind.MODEL_RETIRED)
    assert await runs(orchestrator, 20, start=20) == 0
    current = orchestrator.team.spec(AGENT).model
    other = next(name for name in sorted(AVAILABLE_MODELS) if name != current)
    (tool,) = [t for t in orchestrator.self_edit_tools(AGENT) if t.name == "self_edit_model"]
    answer = await tool.handler(tool.validate_arguments({"model": other, "rationale": "gone"}))
    assert "watched on your live runs" in str(answer)
    (watch,) = orchestrator.watcher.open_watches(AGENT)
    assert watch.origin["cycle_id"]
    assert watch.origin["issue_id"] is None
    assert await watch_until_ended(orchestrator, 40) < 40
    (record,) = orchestrator.manager.get_history()
    assert record.status is ChangeStatus.KEPT
    assert record.applied_by == f"self-edit:{AGENT}"
    assert orchestrator.team.spec(AGENT).model == other


# -- a crash with the watch open ---------------------------------------------------------------

CHILD = Path(__file__).parents[1].joinpath("cycle_watch_child.py")


def run_child_until_killed(folder: Path) -> list[str]:
    """Run the child until it has recorded its runs with the watch open, SIGKILL it, and
    return what it printed."""
    return kill_at_marker([sys.executable, str(CHILD), str(folder)], "RAN")


async def test_a_process_killed_while_its_cycle_s_watch_is_open_is_continued_not_undone(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "ws"
    lines = run_child_until_killed(folder)
    fields = dict(line.split(" ", 1) for line in lines if " " in line)
    cycle_id, watch_id = fields["CYCLE"], fields["WATCH"]
    changed = (folder / "agents" / f"{AGENT}.md").read_bytes()

    from agentmend.faces.workspace import Workspace

    with Workspace.open(folder, settings=Settings(), create=False) as workspace:
        # recovery did not undo the watched change: its record owns it, and the open went on
        watch = ChangeWatcher(workspace.manager).get(watch_id)
        assert watch is not None
        assert (watch.state, watch.pairs) == ("watching", 5)  # the child's runs counted
        assert (workspace.team_dir / f"{AGENT}.md").read_bytes() == changed
        (record,) = workspace.manager.get_history()
        assert record.status is ChangeStatus.APPLIED
        assert replay_cycle(workspace.store, cycle_id).status == "watching"
        orchestrator = workspace.orchestrator(auto_improve=False)
        # the change still hurts: the watch goes on from the child's runs and rolls it back
        assert await watch_until_ended(orchestrator, 60) < 10
        ended = ChangeWatcher(workspace.manager).get(watch_id)
        assert ended is not None
        assert (ended.state, ended.decision) == ("rolled_back", "hurts")
        assert ended.pairs > 5
        assert replay_cycle(workspace.store, cycle_id).status == "rolled_back"
        (record,) = workspace.manager.get_history()
        assert record.status is ChangeStatus.ROLLED_BACK
        assert (workspace.team_dir / f"{AGENT}.md").read_bytes() != changed


def test_the_watch_and_its_outcome_are_public() -> None:
    import agentmend

    assert agentmend.ChangeWatcher is ChangeWatcher
    assert "WatchOutcome" in agentmend.__all__
    assert agentmend.WatchOutcome.__module__ == "agentmend.loop.cycle"


async def test_runs_recorded_straight_into_the_monitor_advance_the_watch_at_the_next_check(
    build: Build,
) -> None:
    """Runs an app records itself (``monitor.record``, or another process on the store) are
    judged at the orchestrator's next check or task, not only runs made through the team."""
    orchestrator = build(failure_rate=0.1, roles_runtime=improver_setting("max_tokens", 40))
    await runs(orchestrator, 60)
    before = definitions(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(issue_of(orchestrator))
    assert cycle.status == "watching"
    for _ in range(30):
        orchestrator.monitor.record(AGENT, success=False, duration_ms=100.0)
    orchestrator.monitor.flush()
    assert orchestrator.watcher.open_watches(AGENT)  # nothing judged them yet
    orchestrator.check_all_issues()
    assert orchestrator.watcher.open_watches(AGENT) == []
    assert definitions(orchestrator) == before
    assert replay_cycle(orchestrator.store, cycle.cycle_id).status == "rolled_back"
