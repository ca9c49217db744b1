"""The loop publishes what it keeps: a kept change becomes a canary release, a rollback a stable
one (rolling a running canary back first), and a team that follows releases serves them per run
(the MetaOrchestrator path). The tests run on both backends (a SQLite file, a PostgreSQL
database of the test server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from release_followers import FollowingWorkers

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.releases.follower import ReleaseFollower
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime, copy_team
from agentmend.infrastructure.store.api import Store
from agentmend.loop.meta_orchestrator import MetaOrchestrator
from agentmend.loop.release_publishing import ReleasePublisher
from agentmend.roles.team import AgentTeam

AGENT = "research-agent"


@pytest.fixture
def store(store_url: str, tmp_path: Path) -> Iterator[Store]:
    with Store(store_url, files_dir=tmp_path / "files") as opened:
        yield opened


async def test_a_kept_change_is_published_as_a_canary_and_a_rollback_as_stable(
    tmp_path: Path, store: Store
) -> None:
    team_dir = copy_team(tmp_path / "team")
    releases = ReleaseLog(store, "team-a", audit=AuditLog(store))
    releases.publish_directory(team_dir, by=Principal("ops", "Ops"))
    orchestrator = MetaOrchestrator.offline_simulated(
        team_dir,
        seed=3,
        store=store,
        settings=Settings(baseline_n=20, detection_mode="rules"),
        publisher=ReleasePublisher(releases),
    )
    try:
        runtime = orchestrator.team.runtime
        assert isinstance(runtime, SimulatedRuntime)
        runtime.inject(AGENT, FaultKind.TRUNCATION)
        for n in range(4):
            await orchestrator.team.run(AGENT, f"topic {n}")
        metrics = orchestrator.monitor.get_agent_metrics(AGENT)
        assert metrics is not None
        issue = IssueReport(
            agent_name=AGENT,
            error_type="consecutive_failures",
            metrics=metrics.model_dump(),
            error_logs=list(metrics.recent_errors),
            available_agents=orchestrator.team.names,
        )
        result = await orchestrator.run_improvement_cycle(issue)
        assert result.status == "kept"
        release = releases.get(2)
        assert release.change_ids == result.change_ids
        heads = releases.heads()
        assert heads.stable == 1
        assert heads.canary == 2
        rollout = Rollouts(releases).active()
        assert rollout is not None
        assert rollout.claimed_fix
        # the canary's changes are owned by the rollout record
        assert rollout.lease_id is not None
        assert orchestrator.manager.leases.changes_of(rollout.lease_id) == list(result.change_ids)
        before = (team_dir / f"{AGENT}.md").read_bytes()
        # the canary is rolled back (here by an administrator; live runs do it the same way):
        # the loop takes the change out of the team folder too, and publishes that as stable
        Rollouts(releases).abort(2, by=Principal("ops", "Ops", frozenset({"admin"})))
        assert orchestrator.follow_rollouts() == [result.change_ids[0]]
        assert (team_dir / f"{AGENT}.md").read_bytes() != before
        back = releases.get(3)
        assert releases.heads().stable == 3
        assert back.content_hash == releases.get(1).content_hash
        assert orchestrator.follow_rollouts() == []  # once
    finally:
        orchestrator.close()


async def test_execute_task_serves_one_release_per_routing_key(
    tmp_path: Path, store: Store
) -> None:
    source = copy_team(tmp_path / "team")
    releases = ReleaseLog(store, "team-b")
    releases.publish_directory(source, by=Principal("ops", "Ops"))
    path = source / f"{AGENT}.md"
    path.write_text(path.read_text().replace("max_tokens: 2048", "max_tokens: 3000", 1))
    releases.publish_directory(source, by=Principal("ops", "Ops"))
    Rollouts(releases).start(2, by=Principal("ops", "Ops"), share=0.5)
    follower = ReleaseFollower(releases, tmp_path / "worker", advance_rollouts=False)
    follower.poll()
    team = AgentTeam.following(follower, SimulatedRuntime(1))
    with MetaOrchestrator.for_team(
        team,
        roles_runtime=SimulatedRuntime(2),
        store=store,
        settings=Settings(baseline_n=20, detection_mode="rules"),
    ) as served:
        for user in range(16):
            await served.execute_task("Explain limits", routing_key=f"user-{user}")
        served.monitor.flush()
    rows = [
        json.loads(r[0])
        for r in store.connection().execute("SELECT extra FROM executions ORDER BY id")
    ]
    by_task: dict[int, set[int]] = {}
    for i, tags in enumerate(rows):
        by_task.setdefault(i // 6, set()).add(tags["release"])
    assert len(rows) == 16 * 6
    assert all(len(releases_of_task) == 1 for releases_of_task in by_task.values())
    assert {tags["release"] for tags in rows} == {1, 2}  # both arms served at share 0.5 (16 keys)


async def _kept_as_a_canary(
    tmp_path: Path, store: Store, team_id: str
) -> tuple[MetaOrchestrator, ReleaseLog, AuditLog, list[str]]:
    """A loop with a publisher whose kept change (its ids returned) is release 2's canary."""
    team_dir = copy_team(tmp_path / "team")
    audit = AuditLog(store)
    releases = ReleaseLog(store, team_id, audit=audit)
    releases.publish_directory(team_dir, by=Principal("ops", "Ops"))
    orchestrator = MetaOrchestrator.offline_simulated(
        team_dir,
        seed=3,
        store=store,
        settings=Settings(baseline_n=20, detection_mode="rules"),
        publisher=ReleasePublisher(releases),
    )
    runtime = orchestrator.team.runtime
    assert isinstance(runtime, SimulatedRuntime)
    runtime.inject(AGENT, FaultKind.TRUNCATION)
    for n in range(4):
        await orchestrator.team.run(AGENT, f"topic {n}")
    metrics = orchestrator.monitor.get_agent_metrics(AGENT)
    assert metrics is not None
    issue = IssueReport(
        agent_name=AGENT,
        error_type="consecutive_failures",
        metrics=metrics.model_dump(),
        error_logs=list(metrics.recent_errors),
        available_agents=orchestrator.team.names,
    )
    result = await orchestrator.run_improvement_cycle(issue)
    assert result.status == "kept"
    assert releases.heads().canary == 2
    return orchestrator, releases, audit, list(result.change_ids)


def _superseded_row(audit: AuditLog) -> dict[str, object]:
    rows = [e.new_value for e in audit.entries() if e.edit_type == "rollout_rolled_back"]
    (row,) = [json.loads(str(value)) for value in rows]
    assert isinstance(row, dict)
    return row


@pytest.mark.slow
async def test_a_rollback_through_the_loop_rolls_its_running_canary_back_first(
    tmp_path: Path, store: Store, store_url: str
) -> None:
    orchestrator, releases, audit, change_ids = await _kept_as_a_canary(tmp_path, store, "team-r")
    workers = FollowingWorkers(store_url, "team-r", tmp_path, tmp_path / "files")
    try:
        rollout = Rollouts(releases).active()
        assert rollout is not None
        workers.start(1)
        workers.wait("the worker on the canary", lambda s: s.get("canary") == 2)
        # an operator rolls the kept change back while its canary is being judged: the
        # rollback is published as stable, and the canary is rolled back first, audited
        orchestrator.rollback(change_ids[0], reason="operator asked")
        assert releases.heads().stable == 3
        assert releases.get(3).content_hash == releases.get(1).content_hash
        settled = Rollouts(releases).get(rollout.rollout_id)
        assert (settled.state, settled.reason) == ("rolled_back", "superseded")
        lease = orchestrator.manager.leases.get(str(settled.lease_id))
        assert lease is not None
        assert lease.state == "released"
        row = _superseded_row(audit)
        assert (row["rollout"], row["canary"], row["stable"], row["superseded_by"]) == (
            rollout.rollout_id,
            2,
            1,
            3,
        )
        workers.wait("the worker on 3", lambda s: s.get("stable") == 3 and s.get("canary") is None)
        assert orchestrator.follow_rollouts() == []  # the change is rolled back already
    finally:
        workers.stop()
        orchestrator.close()


@pytest.mark.slow
async def test_rolling_back_another_change_takes_the_running_canarys_change_out_first(
    tmp_path: Path, store: Store, store_url: str
) -> None:
    from agentmend.infrastructure.changes.effectors import group_entries, plan_change
    from agentmend.infrastructure.models import ChangeStatus, ChangeType, ImprovementAction

    orchestrator, releases, audit, change_ids = await _kept_as_a_canary(tmp_path, store, "team-o")
    workers = FollowingWorkers(store_url, "team-o", tmp_path, tmp_path / "files")
    try:
        canary_text = releases.files(2)[f"{AGENT}.md"]
        # a change of another agent, kept in the team folder but not published yet
        docs = ImprovementAction(
            target_agent="quality-agent",
            action_type=ChangeType.DOCS_EDIT,
            target_field="docs/checks.md",
            new_value="Check every formula twice.\n",
            confidence_score=0.9,
        )
        change = plan_change(
            docs,
            root=orchestrator.team.directory,
            specs=orchestrator.team.reload(),
            available_models=orchestrator.available_models,
        )
        (other,) = orchestrator.manager.apply_group(group_entries(change), root=change.root)
        orchestrator.manager.mark_kept(other.change_id, {})
        workers.start(1)
        workers.wait("the worker on the canary", lambda s: s.get("canary") == 2)
        # publishing the folder without the other change would ship the canary's change to
        # every worker: it leaves the folder first, and that publication settles the canary
        orchestrator.rollback(other.change_id, reason="operator asked")
        status = {c: orchestrator.manager.get_change(c) for c in [*change_ids, other.change_id]}
        assert all(r is not None and r.status is ChangeStatus.ROLLED_BACK for r in status.values())
        heads = releases.heads()
        assert (heads.stable, heads.canary) == (4, None)
        assert releases.files(4)[f"{AGENT}.md"] != canary_text
        assert releases.get(4).content_hash == releases.get(1).content_hash
        row = _superseded_row(audit)
        assert (row["canary"], row["stable"], row["superseded_by"]) == (2, 1, 3)
        workers.wait("the worker on 4", lambda s: s.get("stable") == 4 and s.get("canary") is None)
    finally:
        workers.stop()
        orchestrator.close()
