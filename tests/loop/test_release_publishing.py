"""The loop publishes what it keeps: a kept change becomes a canary release, a rollback a stable
one, and a team that follows releases serves them per run (the MetaOrchestrator path). Both
tests run on both backends (a SQLite file, a PostgreSQL database of the test server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

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
