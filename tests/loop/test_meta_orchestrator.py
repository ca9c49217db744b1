"""MetaOrchestrator: tasks, issues, approvals, and a cycle that records and replays itself."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_runtimes import Call, HookedSimulation, RoutedRuntime, offline_roles, scripted_improver
from log_capture import captured_records
from loop_scenarios import cooler_research_agent, faulty_issue, sim

from agentmend.infrastructure.changes.protocol.decisions import list_decisions
from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.llm.offline import OfflineRuntime
from agentmend.infrastructure.llm.testing import ScriptedRuntime, Step
from agentmend.infrastructure.models import ChangeStatus, ChangeType, ImprovementAction, IssueReport
from agentmend.infrastructure.monitoring.performance_monitor import VERIFICATION
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime, copy_team
from agentmend.loop.cycle import CycleEvent, cycle_events, list_cycle_ids, replay_cycle
from agentmend.loop.meta_orchestrator import MetaOrchestrator
from agentmend.roles.playbooks import offline_policies
from agentmend.roles.schemas import MediatorReport, ProposedAction
from agentmend.roles.team import AgentTeam

Build = Callable[..., MetaOrchestrator]


@pytest.fixture
def build(tmp_path: Path) -> Iterator[Build]:
    made: list[MetaOrchestrator] = []

    def make(**options: Any) -> MetaOrchestrator:
        options.setdefault("settings", Settings(baseline_n=20, detection_mode="rules"))
        orchestrator = MetaOrchestrator.offline_simulated(tmp_path / "team", seed=3, **options)
        made.append(orchestrator)
        return orchestrator

    yield make
    for orchestrator in made:
        orchestrator.close()


def baseline_epoch(orchestrator: MetaOrchestrator, agent: str = "research-agent") -> int:
    """The epoch of the agent's current detection baseline."""
    baseline = orchestrator.monitor.baseline(agent)
    assert baseline is not None
    return baseline.epoch


def definitions(orchestrator: MetaOrchestrator) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(orchestrator.team.directory.glob("*.md"))}


async def test_execute_task_runs_every_agent_and_records_it(build: Build) -> None:
    orchestrator = build()
    task = await orchestrator.execute_task("Pythagorean theorem")
    assert sorted(task.results) == orchestrator.team.names
    assert set(task.answers) == set(task.results)
    assert "### research-agent" in task.text
    assert str(task) == task.text
    assert task.issues == []
    assert task.cycles == []
    assert orchestrator.monitor.agents() == orchestrator.team.names
    assert orchestrator.principal == orchestrator.settings.default_principal
    assert not orchestrator.principal.is_admin
    assert not orchestrator.principal.is_admin


async def test_without_auto_improve_an_issue_waits_for_the_caller(build: Build) -> None:
    orchestrator = build(auto_improve=False)
    sim(orchestrator).inject("research-agent", FaultKind.TRUNCATION)
    tasks = [await orchestrator.execute_task(f"topic {n}") for n in range(4)]
    assert all(task.cycles == [] for task in tasks)
    issue = orchestrator.check_performance_issues()
    assert issue is not None
    assert issue.agent_name == "research-agent"
    assert issue.error_type == "consecutive_failures"
    assert orchestrator.check_all_issues() == [issue]  # still open until handled
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "kept"
    assert orchestrator.check_performance_issues() is None


async def test_a_declined_or_unanswered_confirmation_runs_no_cycle(build: Build) -> None:
    answers: list[IssueReport] = []

    async def decline(issue: IssueReport) -> bool:
        answers.append(issue)
        return False

    orchestrator = build(auto_improve=False, confirm_cycle=decline)
    sim(orchestrator).inject("research-agent", FaultKind.TRUNCATION)
    declined = []
    for n in range(4):
        declined += (await orchestrator.execute_task(f"topic {n}")).declined
    assert [issue.agent_name for issue in declined] == ["research-agent"]
    assert answers == declined
    assert orchestrator.check_performance_issues() is None
    (decision,) = list_decisions(orchestrator.store, kind="issue_declined")
    assert decision.agent_name == "research-agent"
    assert orchestrator.manager.get_history() == []


async def test_a_confirmation_that_never_comes_is_a_no(build: Build) -> None:
    async def silent(issue: IssueReport) -> bool:
        await asyncio.sleep(30)
        return True

    settings = Settings(baseline_n=20, detection_mode="rules", auto_decision_timeout=0.05)
    orchestrator = build(auto_improve=False, confirm_cycle=silent, settings=settings)
    sim(orchestrator).inject("research-agent", FaultKind.TRUNCATION)
    tasks = [await orchestrator.execute_task(f"topic {n}") for n in range(4)]
    assert sum(len(task.declined) for task in tasks) == 1
    assert all(task.cycles == [] for task in tasks)


async def test_a_confirmed_issue_runs_the_cycle(build: Build) -> None:
    async def accept(issue: IssueReport) -> bool:
        return True

    orchestrator = build(auto_improve=False, confirm_cycle=accept)
    sim(orchestrator).inject("research-agent", FaultKind.TRUNCATION)
    cycles = []
    for n in range(4):
        cycles += (await orchestrator.execute_task(f"topic {n}")).cycles
    assert [c.status for c in cycles] == ["kept"]


async def test_every_step_is_shown_logged_stored_and_replayable(build: Build) -> None:
    shown: list[CycleEvent] = []
    orchestrator = build(on_progress=shown.append)
    issue = await faulty_issue(orchestrator)
    with captured_records("agentmend", logging.INFO) as records:
        cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "kept"
    steps = [event.step for event in shown]
    questions = steps.count("question_asked")
    assert 1 <= questions <= 10
    assert steps == [
        "cycle_started",
        *["question_asked"] * questions,
        "analysis_completed",
        "actions_proposed",
        *["gate_checked"] * 6,
        "change_applied",
        "verification_completed",
        "change_kept",
        "cycle_finished",
    ]
    assert [event.seq for event in shown] == list(range(len(shown)))
    assert {event.cycle_id for event in shown} == {cycle.cycle_id}
    assert cycle_events(orchestrator.store, cycle.cycle_id) == shown
    assert replay_cycle(orchestrator.store, cycle.cycle_id) == cycle
    assert orchestrator.replay(cycle.cycle_id) == cycle
    assert list_cycle_ids(orchestrator.store) == [cycle.cycle_id]
    logged = {
        (getattr(record, "event", None), getattr(record, "cycle_id", None)) for record in records
    }
    for step in (
        "cycle_started",
        "question_asked",
        "analysis_completed",
        "gate_checked",
        "change_applied",
        "verification_completed",
        "change_kept",
    ):
        assert (step, cycle.cycle_id) in logged
    with pytest.raises(KeyError, match="no cycle with id 'nope'"):
        replay_cycle(orchestrator.store, "nope")


@pytest.mark.parametrize(
    ("design", "runs", "rule"),
    [
        # 3 cases failing by majority before, passing after. Sequential: 4 runs show it reproduces
        # (a round and one more), then pairs until the test decides; fixed: 3 repeats each side
        ("sequential", 10, "sequential"),
        ("fixed", 18, "all_failures_fixed"),
    ],
)
async def test_a_kept_change_records_verification_apart_and_starts_a_new_baseline(
    build: Build, design: str, runs: int, rule: str
) -> None:
    orchestrator = build(
        settings=Settings(baseline_n=20, detection_mode="rules", verification_design=design)
    )
    issue = await faulty_issue(orchestrator)
    epoch = orchestrator.monitor.baseline("research-agent")
    assert epoch is not None
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "kept"
    production = orchestrator.monitor.get_agent_metrics("research-agent")
    verification = orchestrator.monitor.get_agent_metrics("research-agent", source=VERIFICATION)
    assert production is not None
    assert production.executions == 4
    assert verification is not None
    assert verification.executions == runs
    baseline = orchestrator.monitor.baseline("research-agent")
    assert baseline is not None
    assert baseline.epoch == epoch.epoch + 1
    (record,) = orchestrator.manager.get_history()
    assert record.status is ChangeStatus.KEPT
    assert record.verification_result is not None
    assert record.verification_result["cycle_id"] == cycle.cycle_id
    verdict = cycle.verification
    assert verdict is not None
    assert not verdict.weaker
    assert verdict.rule == rule


async def test_without_an_eval_suite_and_too_few_runs_to_watch_the_weaker_check_decides(
    build: Build,
) -> None:
    """4 production runs are too few to watch a change on (``MIN_WATCH_RUNS``): the sample
    query judges it (with more traffic the change is watched: tests/loop/test_cycle_watch.py)."""
    orchestrator = build()
    (orchestrator.team.directory / "research-agent.evals.yaml").unlink()
    cycle = await orchestrator.run_improvement_cycle(await faulty_issue(orchestrator))
    assert cycle.status == "kept"
    verdict = cycle.verification
    assert verdict is not None
    assert verdict.weaker
    assert verdict.rule == "sample_query"


@pytest.mark.parametrize("fault", [FaultKind.SLOW, FaultKind.MODEL_RETIRED])
async def test_without_a_suite_a_fix_is_judged_against_the_sample_query_before_it(
    build: Build, fault: FaultKind
) -> None:
    """Too few runs to watch, so the sample query judges. The fault broke the agent's speed
    baseline: the right fix (a longer timeout, another model) is slower than the healthy agent
    was, and must be kept all the same."""
    orchestrator = build()
    await orchestrator.execute_task("a healthy task")
    (orchestrator.team.directory / "research-agent.evals.yaml").unlink()
    healthy = baseline_epoch(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(await faulty_issue(orchestrator, fault=fault))
    assert cycle.status == "kept", cycle.summary()
    verdict = cycle.verification
    assert verdict is not None
    assert verdict.weaker
    assert (verdict.before_score, verdict.after_score) == (0.0, 1.0)
    assert verdict.latency_ratio is None  # the run before failed: no speed to compare with
    assert "latency not judged" in verdict.reason
    verification = orchestrator.monitor.get_agent_metrics("research-agent", source=VERIFICATION)
    assert verification is not None
    assert verification.executions == 2  # the sample query, before and after
    assert verification.failures == 1
    for n in range(5):
        assert (await orchestrator.team.run("research-agent", f"after {n}")).success
    # one query is thin evidence: detection keeps judging against the agent before the fault
    assert baseline_epoch(orchestrator) == healthy
    kept = next(
        e for e in cycle_events(orchestrator.store, cycle.cycle_id) if e.step == "change_kept"
    )
    assert kept.data["new_baseline"] == ()
    assert "weaker check only" in kept.message
    (record,) = orchestrator.manager.get_history()
    assert record.verification_result is not None
    assert record.verification_result["new_baseline"] == ()
    # so a rollback has no newer baseline to undo: the one from before the fault stays
    assert orchestrator.rollback(reason="undo") is not None
    assert baseline_epoch(orchestrator) == healthy


async def test_without_a_suite_an_issue_the_sample_query_does_not_show_changes_nothing(
    build: Build,
) -> None:
    # one production run: too few to watch a change on, so the sample query decides
    orchestrator = build(roles_runtime=cooler_research_agent())
    await orchestrator.execute_task("a healthy task")
    (orchestrator.team.directory / "research-agent.evals.yaml").unlink()
    issue = IssueReport(
        agent_name="research-agent",
        error_type="low_success_rate",
        error_logs=["overloaded_error: Overloaded"],
        available_agents=orchestrator.team.names,
    )
    before = definitions(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "not_reproduced"  # the improver's temperature change is not made
    assert cycle.error is not None
    assert "sample query (no eval suite) of research-agent passes before any change" in cycle.error
    assert cycle.outcomes == ()
    assert definitions(orchestrator) == before
    assert orchestrator.manager.get_history() == []
    verification = orchestrator.monitor.get_agent_metrics("research-agent", source=VERIFICATION)
    assert verification is not None
    assert verification.executions == 1  # the sample query ran once, before, recorded apart


async def test_without_a_suite_a_fix_that_does_not_help_is_rolled_back(build: Build) -> None:
    # too few production runs to watch: the sample query decides (the watch: test_cycle_watch)
    orchestrator = build(roles_runtime=cooler_research_agent())
    (orchestrator.team.directory / "research-agent.evals.yaml").unlink()
    issue = await faulty_issue(orchestrator)
    before = definitions(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "rolled_back"
    verdict = cycle.verification
    assert verdict is not None
    assert verdict.weaker
    assert verdict.failures == ("sample_query",)
    assert definitions(orchestrator) == before


async def test_a_broken_eval_suite_stops_the_cycle_before_any_change(build: Build) -> None:
    orchestrator = build()
    (orchestrator.team.directory / "research-agent.evals.yaml").write_text("cases: 3\n")
    before = definitions(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(await faulty_issue(orchestrator))
    assert cycle.status == "error"
    assert cycle.error is not None
    assert cycle.error.startswith("cannot load an eval suite:")
    assert "research-agent.evals.yaml" in cycle.error
    assert definitions(orchestrator) == before
    assert orchestrator.manager.get_history() == []


async def test_an_exception_after_the_apply_rolls_back_and_propagates(build: Build) -> None:
    def explode(event: CycleEvent) -> None:
        if event.step == "verification_completed":
            raise RuntimeError("the screen fell off")

    orchestrator = build(on_progress=explode)
    issue = await faulty_issue(orchestrator)
    before = definitions(orchestrator)
    with pytest.raises(RuntimeError, match="the screen fell off"):
        await orchestrator.run_improvement_cycle(issue)
    assert definitions(orchestrator) == before
    (record,) = orchestrator.manager.get_history()
    assert record.status is ChangeStatus.ROLLED_BACK
    (cycle_id,) = list_cycle_ids(orchestrator.store)
    replayed = replay_cycle(orchestrator.store, cycle_id)
    assert replayed.status == "rolled_back"
    assert replayed.rolled_back
    assert replayed.rollback_reason is not None
    assert "RuntimeError: the screen fell off" in replayed.rollback_reason
    assert replayed.error == "RuntimeError: the screen fell off"
    assert orchestrator.team.spec("research-agent").max_tokens == 2048


def responsible_elsewhere() -> RoutedRuntime:
    """The offline roles, with a mediator that blames the quality agent's configuration."""
    report = MediatorReport(
        responsible_agent="quality-agent",
        cause_category="truncation",
        identified_cause="the quality agent's review is cut off",
        confidence=0.8,
        evidence=["response stopped at max_tokens=2048"],
    )
    return offline_roles(socratic_mediator=ScriptedRuntime([Step.output(report)]))


async def test_the_responsible_agent_may_differ_from_the_one_that_raised_the_issue(
    build: Build,
) -> None:
    orchestrator = build(roles_runtime=responsible_elsewhere())
    issue = await faulty_issue(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.analysis is not None
    assert cycle.analysis.agent_name == "quality-agent"
    assert cycle.actions
    assert all(action.target_agent == "quality-agent" for action in cycle.actions)
    assert cycle.issue.agent_name == "research-agent"


async def test_a_store_is_made_in_the_workspace_and_closed(tmp_path: Path) -> None:
    team = AgentTeam(copy_team(tmp_path / "team"), SimulatedRuntime(1))
    orchestrator = MetaOrchestrator.for_team(
        team,
        roles_runtime=OfflineRuntime(offline_policies()),
        workspace=tmp_path / "ws",
        settings=Settings(baseline_n=20),
    )
    with orchestrator:
        await orchestrator.execute_task("topic")
        assert (tmp_path / "ws" / "agentmend.db").is_file()
        assert team.monitor is orchestrator.monitor
    orchestrator.close()  # idempotent


def two_agent_max_tokens() -> RoutedRuntime:
    """An improver that raises max_tokens of two agents at once (one change group)."""
    return scripted_improver(
        [
            ProposedAction(
                action_type=ChangeType.PARAMETER_ADJUSTMENT,
                target_agent=name,
                target_field="max_tokens",
                new_value=16384,
                rationale="answers are cut off",
                confidence=0.9,
            )
            for name in ("research-agent", "knowledge-builder")
        ]
    )


async def test_an_issue_the_eval_suite_does_not_reproduce_changes_nothing(build: Build) -> None:
    shown: list[CycleEvent] = []
    orchestrator = build(roles_runtime=cooler_research_agent(), on_progress=shown.append)
    await orchestrator.execute_task("a healthy task")
    metrics = orchestrator.monitor.get_agent_metrics("research-agent")
    assert metrics is not None
    issue = IssueReport(
        agent_name="research-agent",
        error_type="low_success_rate",
        error_logs=["overloaded_error: Overloaded"],
        available_agents=orchestrator.team.names,
    )
    before = definitions(orchestrator)
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "not_reproduced"
    assert cycle.error is not None
    assert "passes before any change" in cycle.error
    assert cycle.outcomes == ()  # not even gated: no human is asked about it
    assert "gate_checked" not in [event.step for event in shown]
    assert definitions(orchestrator) == before
    assert orchestrator.manager.get_history() == []
    verification = orchestrator.monitor.get_agent_metrics("research-agent", source=VERIFICATION)
    assert verification is not None
    assert verification.executions == 9  # the suite ran once, before


async def test_issue_for_returns_a_requested_report_when_nothing_is_open(build: Build) -> None:
    orchestrator = build()
    await orchestrator.execute_task("limits")
    issue = await orchestrator.issue_for("quality-agent", requested_by="the session")
    assert issue.detector == "request"
    assert "requested by the session" in issue.context
    assert "its eval cases pass now" in issue.context
    assert issue.metrics["executions"] == 1  # the reproduction runs are recorded apart
    with pytest.raises(KeyError, match="no agent named 'nobody'"):
        await orchestrator.issue_for("nobody")


async def test_a_requested_issue_reproduces_the_fault_before_diagnosis(build: Build) -> None:
    orchestrator = build(settings=Settings(baseline_n=20, detection_mode="rules", yolo_mode=True))
    sim(orchestrator).inject("research-agent", FaultKind.TRUNCATION)
    issue = await orchestrator.issue_for("research-agent", requested_by="the session")
    assert "reproduced" in issue.context
    assert issue.error_logs
    assert all("truncated" in e for e in issue.error_logs)
    verification = orchestrator.monitor.get_agent_metrics("research-agent", source=VERIFICATION)
    assert verification is not None
    assert verification.failures == len(issue.error_logs)
    result = await orchestrator.run_improvement_cycle(issue)
    assert result.status == "kept"
    assert result.analysis is not None
    assert result.analysis.cause_category == "truncation"


async def test_rollback_on_request_restores_bytes_and_the_old_baseline(build: Build) -> None:
    orchestrator = build()
    before = definitions(orchestrator)
    result = await orchestrator.run_improvement_cycle(await faulty_issue(orchestrator))
    assert result.status == "kept"
    assert definitions(orchestrator) != before
    baseline_after_keep = orchestrator.monitor.baseline("research-agent")

    record = orchestrator.rollback(reason="the owner prefers the old prompt")

    assert record is not None
    assert record.status is ChangeStatus.ROLLED_BACK
    assert definitions(orchestrator) == before
    assert orchestrator.team.spec("research-agent").max_tokens == (
        AgentSpec.from_file(orchestrator.team.directory / "research-agent.md").max_tokens
    )
    assert orchestrator.monitor.baseline("research-agent") != baseline_after_keep
    kinds = [d.kind for d in list_decisions(orchestrator.store)]
    assert "change_rolled_back_on_request" in kinds
    assert orchestrator.rollback() is None  # nothing applied or kept is left


async def test_another_teams_change_is_rolled_back_only_by_an_administrator(
    tmp_path: Path,
) -> None:
    from agentmend.infrastructure.errors import PermissionRequired
    from agentmend.infrastructure.principal import ADMIN, Principal
    from agentmend.infrastructure.store.api import Store

    settings = Settings(baseline_n=20, detection_mode="rules")
    with Store(tmp_path / "shared.db") as store:
        team_a = MetaOrchestrator.offline_simulated(
            tmp_path / "a", seed=3, settings=settings, store=store
        )
        team_b = MetaOrchestrator.offline_simulated(
            tmp_path / "b", seed=3, settings=settings, store=store
        )
        admin_b = MetaOrchestrator.offline_simulated(
            tmp_path / "b",
            seed=3,
            settings=settings,
            store=store,
            principal=Principal("ops", "Operator", frozenset({ADMIN})),
        )
        try:
            result = await team_a.run_improvement_cycle(await faulty_issue(team_a))
            assert result.status == "kept"
            (change_id,) = result.change_ids
            before = definitions(team_a)
            with pytest.raises(PermissionRequired, match="roll back a change of team"):
                team_b.rollback(change_id)
            assert definitions(team_a) == before
            kept = team_a.manager.get_change(change_id)
            assert kept is not None
            assert kept.status is ChangeStatus.KEPT
            record = admin_b.rollback(change_id)
            assert record is not None
            assert record.status is ChangeStatus.ROLLED_BACK
            assert definitions(team_a) != before
        finally:
            for orchestrator in (team_a, team_b, admin_b):
                orchestrator.close()


async def test_rollback_of_a_kept_group_restores_every_members_baseline(build: Build) -> None:
    orchestrator = build(roles_runtime=two_agent_max_tokens())
    await orchestrator.execute_task("a healthy task")
    agents = ("research-agent", "knowledge-builder")
    old = {name: baseline_epoch(orchestrator, name) for name in agents}
    sim(orchestrator).inject("knowledge-builder", FaultKind.TRUNCATION)
    cycle = await orchestrator.run_improvement_cycle(await faulty_issue(orchestrator))
    assert cycle.status == "kept", cycle.summary()
    assert sorted(cycle.verifications) == sorted(agents)
    assert {name: baseline_epoch(orchestrator, name) for name in agents} == {
        name: old[name] + 1 for name in agents
    }

    # roll back by the id of the group's *second* member: both agents get their baseline back
    record = orchestrator.rollback(cycle.change_ids[1], reason="undo both")

    assert record is not None
    assert [r.status for r in orchestrator.manager.get_history()] == [ChangeStatus.ROLLED_BACK] * 2
    assert {name: baseline_epoch(orchestrator, name) for name in agents} == old


async def test_rollback_of_an_unknown_change_names_it(build: Build) -> None:
    from agentmend.infrastructure.errors import ChangeNotFound

    orchestrator = build()
    with pytest.raises(ChangeNotFound, match="'nope'"):
        orchestrator.rollback("nope")


async def test_cancelling_a_cycle_after_apply_rolls_the_change_back(build: Build) -> None:
    runtime = HookedSimulation(seed=3)
    orchestrator = build(runtime=runtime)
    original_max_tokens = orchestrator.team.spec("research-agent").max_tokens
    stalled = asyncio.Event()

    async def stall_once_changed(call: Call) -> None:
        # research-agent hangs once its definition has changed, until the cycle is cancelled
        if call.spec.name == "research-agent" and call.spec.max_tokens != original_max_tokens:
            stalled.set()
            await asyncio.Event().wait()

    runtime.before = stall_once_changed
    issue = await faulty_issue(orchestrator)
    before = definitions(orchestrator)

    cycle = asyncio.create_task(orchestrator.run_improvement_cycle(issue))
    await asyncio.wait_for(stalled.wait(), timeout=30)  # applied, now verifying
    assert definitions(orchestrator) != before
    cycle.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cycle

    assert definitions(orchestrator) == before
    history = orchestrator.manager.get_history()
    assert [r.status for r in history] == [ChangeStatus.ROLLED_BACK]
    steps = [
        e.step for e in cycle_events(orchestrator.store, list_cycle_ids(orchestrator.store)[-1])
    ]
    assert "change_rolled_back" in steps


# -- a file edited while the change is being verified ------------------------------------------


class _OwnerEdit:
    """research-agent's owner edits its definition file while the changed definition is being
    verified; the run then raises (``outage``) or goes on."""

    NOTE = b"\n<!-- a note the owner added -->\n"

    def __init__(self, original: AgentSpec, *, outage: bool) -> None:
        self.original = original
        self.outage = outage
        self.left: bytes | None = None  # the file as the owner left it

    def __call__(self, call: Call) -> None:
        spec = call.spec
        if spec.name == "research-agent" and self.left is None and spec != self.original:
            assert spec.source_path is not None
            self.left = spec.source_path.read_bytes() + self.NOTE
            spec.source_path.write_bytes(self.left)
            if self.outage:
                raise RuntimeError("provider outage")


def _edited_during_verification(build: Build, *, outage: bool, **options: Any) -> Any:
    runtime = HookedSimulation(seed=3)
    orchestrator = build(runtime=runtime, **options)
    edit = _OwnerEdit(orchestrator.team.spec("research-agent"), outage=outage)
    runtime.before = edit
    return orchestrator, edit


def _assert_left_for_attention(
    orchestrator: MetaOrchestrator, runtime: _OwnerEdit, cycle_id: str
) -> CycleEvent:
    """research-agent.md is as its owner left it, its change FAILED with the conflict recorded
    (and audited), and the cycle says so."""
    path = orchestrator.team.directory / "research-agent.md"
    assert path.read_bytes() == runtime.left  # the owner's edit is not overwritten
    (record,) = orchestrator.manager.get_history(agent_name="research-agent")
    assert record.status is ChangeStatus.FAILED
    info = record.rollback_info
    assert info is not None
    assert info["needs_attention"] is True
    assert info["left_unchanged"] == (str(path.resolve()),)
    assert "changed since it was applied" in info["conflict"]
    rows = orchestrator.manager.audit.entries(agent_name="research-agent")
    assert [row.edit_type for row in rows][-1] == "rollback_blocked"
    assert orchestrator.manager.verify_audit_chain()
    events = cycle_events(orchestrator.store, cycle_id)
    (blocked,) = [event for event in events if event.step == "change_rollback_blocked"]
    assert blocked.data["paths"] == (str(path.resolve()),)
    assert blocked.data["change_ids"] == (record.change_id,)
    assert "research-agent.md" in blocked.message
    replayed = replay_cycle(orchestrator.store, cycle_id)
    assert replayed.status == "rollback_blocked"
    assert replayed.rollback_blocked == (str(path.resolve()),)
    assert "rollback blocked" in replayed.summary()
    return blocked


async def test_an_error_after_an_edit_during_verification_leaves_the_edit_and_says_so(
    build: Build,
) -> None:
    orchestrator, runtime = _edited_during_verification(build, outage=True)
    issue = await faulty_issue(orchestrator)
    with pytest.raises(RuntimeError, match="provider outage") as caught:  # the original error
        await orchestrator.run_improvement_cycle(issue)
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "research-agent.md" in notes
    assert "edited since" in notes
    (cycle_id,) = list_cycle_ids(orchestrator.store)
    _assert_left_for_attention(orchestrator, runtime, cycle_id)
    replayed = replay_cycle(orchestrator.store, cycle_id)
    assert replayed.error == "RuntimeError: provider outage"
    assert not replayed.rolled_back  # nothing of the group was restored
    assert orchestrator.team.spec("research-agent").system_prompt.endswith(
        "<!-- a note the owner added -->"
    )


async def test_a_failed_verification_after_an_edit_during_it_leaves_the_edit_and_says_so(
    build: Build,
) -> None:
    orchestrator, runtime = _edited_during_verification(
        build, outage=False, roles_runtime=cooler_research_agent()
    )
    cycle = await orchestrator.run_improvement_cycle(await faulty_issue(orchestrator))
    assert cycle.status == "rollback_blocked"
    verdict = cycle.verification
    assert verdict is not None
    assert not verdict.accepted  # a normal verification failure
    blocked = _assert_left_for_attention(orchestrator, runtime, cycle.cycle_id)
    assert "verification failed" in blocked.data["reason"]
    assert cycle.rollback_blocked == tuple(blocked.data["paths"])


async def test_an_edit_during_verification_of_a_group_rolls_back_the_untouched_agents(
    build: Build,
) -> None:
    orchestrator, runtime = _edited_during_verification(
        build, outage=True, roles_runtime=two_agent_max_tokens()
    )
    sim(orchestrator).inject("knowledge-builder", FaultKind.TRUNCATION)
    before = definitions(orchestrator)
    issue = await faulty_issue(orchestrator)
    with pytest.raises(RuntimeError, match="provider outage"):
        await orchestrator.run_improvement_cycle(issue)
    after = definitions(orchestrator)
    assert after["knowledge-builder.md"] == before["knowledge-builder.md"]  # rolled back
    assert {name for name in before if after[name] != before[name]} == {"research-agent.md"}
    statuses = {r.action.target_agent: r.status for r in orchestrator.manager.get_history()}
    assert statuses == {
        "research-agent": ChangeStatus.FAILED,
        "knowledge-builder": ChangeStatus.ROLLED_BACK,
    }
    (cycle_id,) = list_cycle_ids(orchestrator.store)
    _assert_left_for_attention(orchestrator, runtime, cycle_id)
    replayed = replay_cycle(orchestrator.store, cycle_id)
    assert replayed.rolled_back  # knowledge-builder's part was undone
    assert orchestrator.team.spec("knowledge-builder").max_tokens != 16384


# -- detection baselines after a rollback --------------------------------------------------------


async def _two_kept_fixes(orchestrator: MetaOrchestrator) -> tuple[str, str]:
    """A kept max_tokens fix, then a kept model fix, both on research-agent."""
    first = await orchestrator.run_improvement_cycle(await faulty_issue(orchestrator))
    assert first.status == "kept", first.summary()
    second = await orchestrator.run_improvement_cycle(
        await faulty_issue(orchestrator, fault=FaultKind.MODEL_RETIRED)
    )
    assert second.status == "kept", second.summary()
    return first.change_ids[0], second.change_ids[0]


async def test_a_cascade_rollback_restores_the_baseline_of_every_group_it_undoes(
    build: Build,
) -> None:
    orchestrator = build()
    await orchestrator.execute_task("a healthy task")
    original, files = baseline_epoch(orchestrator), definitions(orchestrator)
    first, _ = await _two_kept_fixes(orchestrator)
    assert baseline_epoch(orchestrator) != original

    orchestrator.rollback(first, cascade=True, reason="undo the first fix")

    assert [r.status for r in orchestrator.manager.get_history()] == [ChangeStatus.ROLLED_BACK] * 2
    assert definitions(orchestrator) == files
    assert baseline_epoch(orchestrator) == original


async def test_a_rollback_that_would_undo_a_newer_baseline_is_refused(build: Build) -> None:
    from agentmend.infrastructure.changes.effectors import group_entries, plan_change
    from agentmend.infrastructure.errors import RollbackConflict

    orchestrator = build()
    await orchestrator.execute_task("a healthy task")
    original = baseline_epoch(orchestrator)
    first = await orchestrator.run_improvement_cycle(await faulty_issue(orchestrator))
    assert first.status == "kept"
    after_first = baseline_epoch(orchestrator)
    # a later kept change to research-agent in another file (its docs): it restarted the
    # baseline too, and no file of the first change is one of its files
    docs = ImprovementAction(
        target_agent="research-agent",
        action_type=ChangeType.DOCS_EDIT,
        target_field="docs/sources.md",
        new_value="Cite two sources.\n",
        confidence_score=0.9,
    )
    change = plan_change(
        docs,
        root=orchestrator.team.directory,
        specs=orchestrator.team.reload(),
        available_models=orchestrator.available_models,
    )
    (later,) = orchestrator.manager.apply_group(group_entries(change), root=change.root)
    orchestrator.manager.mark_kept(later.change_id, {"new_baseline": ["research-agent"]})
    orchestrator.detector.on_change_kept("research-agent", orchestrator.monitor)
    newest = baseline_epoch(orchestrator)
    files = definitions(orchestrator)

    for cascade in (False, True):  # the docs change does not build on the first one's file
        with pytest.raises(RollbackConflict, match=later.change_id) as caught:
            orchestrator.rollback(first.change_ids[0], cascade=cascade)
        assert "newer detection baseline for research-agent" in str(caught.value)
        assert caught.value.dependents == (later.change_id,)
        assert baseline_epoch(orchestrator) == newest  # nothing was changed
        assert definitions(orchestrator) == files
        assert [r.status for r in orchestrator.manager.get_history()] == [ChangeStatus.KEPT] * 2

    # newest first, each rollback gives back the baseline its change replaced
    orchestrator.rollback(later.change_id)
    assert baseline_epoch(orchestrator) == after_first
    orchestrator.rollback(first.change_ids[0])
    assert baseline_epoch(orchestrator) == original
