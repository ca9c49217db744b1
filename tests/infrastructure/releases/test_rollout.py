"""Rollouts on live runs: a harmful canary rolled back, a good one promoted, limits, steering.

The runs are real runs of the simulated team through ``AgentTeam`` (routed per run by the
follower), recorded by a real ``PerformanceMonitor`` into the store the rollout reads; every
test with a store runs on both backends (a SQLite file, a PostgreSQL database).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.errors import (
    InvalidArgument,
    NotFound,
    PermissionRequired,
    WrongArgumentType,
)
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.monitoring.run_reader import runs_after
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.releases.errors import RolloutConflict
from agentmend.infrastructure.releases.follower import ReleaseFollower
from agentmend.infrastructure.releases.log import Release, ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.releases.rollout_evidence import Evidence, RolloutLimits, decide
from agentmend.infrastructure.releases.settlement import RolloutRecord, canary_change_in
from agentmend.infrastructure.simulation import SimulatedRuntime, copy_team
from agentmend.infrastructure.simulation.faults import Fault, FaultKind
from agentmend.infrastructure.store.api import Store
from agentmend.roles.team import AgentTeam

CYCLE = Principal("cycle", "improvement cycle")
OPS = Principal("ops", "Operator", frozenset({ADMIN}))
AGENT = "research-agent"


class Fleet:
    """One worker in-process: a store, a release log, a follower, a team and its monitor."""

    def __init__(self, tmp_path: Path, store_url: str) -> None:
        self.source = copy_team(tmp_path / "team")
        self.store = Store(store_url, files_dir=tmp_path / "files")
        self.audit = AuditLog(self.store)
        self.log = ReleaseLog(self.store, "team-1", audit=self.audit)
        self.rollouts = Rollouts(self.log)
        self.log.publish_directory(self.source, by=CYCLE)
        self.follower = ReleaseFollower(self.log, tmp_path / "worker")
        self.follower.poll()
        self.monitor = PerformanceMonitor(self.store, flush_interval_s=60)
        self.runtime = SimulatedRuntime(7)
        self.team = AgentTeam.following(self.follower, self.runtime, monitor=self.monitor)

    def publish_edit(self, old: str, new: str) -> int:
        path = self.source / f"{AGENT}.md"
        path.write_text(path.read_text().replace(old, new, 1))
        return self.log.publish_directory(self.source, by=CYCLE, change_ids=("chg-x",)).version

    async def serve(self, runs: int, *, step: int = 50) -> dict[int, int]:
        """Serve ``runs`` runs, flushing and letting the follower poll every ``step``."""
        served: dict[int, int] = {}
        for i in range(runs):
            # each run its own user: the arms are drawn the same way in every test run (a
            # random run id would make the guard's verdict on a good canary a draw of luck)
            await self.team.run(AGENT, f"Explain concept {i}", routing_key=f"user-{i}")
            if (i + 1) % step == 0:
                self.monitor.flush()
                self.follower.poll()
        for row in self.store.connection().execute("SELECT extra FROM executions"):
            release = json.loads(row[0])["release"]
            served[release] = served.get(release, 0) + 1
        return served

    def start(self, version: int, **options: Any) -> RolloutRecord:
        """Start ``version`` as the canary with a known routing secret, so that which users
        draw the canary, and so the live verdict, is the same in every test run."""
        record = self.rollouts.start(version, by=CYCLE, **options)
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE rollout_secrets SET secret = ? WHERE rollout_id = ?",
                ("a known secret", record.rollout_id),
            )
        return record

    def close(self) -> None:
        self.monitor.close()
        self.store.close()


@pytest.fixture
def fleet(tmp_path: Path, store_url: str) -> Iterator[Fleet]:
    made = Fleet(tmp_path, store_url)
    yield made
    made.close()


async def test_a_harmful_canary_is_rolled_back_on_live_runs(fleet: Fleet) -> None:
    # max_tokens trimmed below what half of the answers need: no eval case is that long
    harmful = fleet.publish_edit("max_tokens: 2048", "max_tokens: 950")
    record = fleet.start(harmful)
    served = await fleet.serve(3000)
    settled = fleet.rollouts.get(record.rollout_id)
    assert settled.state == "rolled_back"
    assert settled.reason == "worse"
    assert fleet.log.heads().stable == 1
    assert fleet.log.heads().canary is None
    assert served[1] > 5 * served.get(harmful, 0)  # stable served most runs
    assert fleet.follower.status().canary is None
    edits = [e.edit_type for e in fleet.audit.entries()]
    assert edits[-1] == "rollout_rolled_back"
    evidence = json.loads(fleet.audit.entries()[-1].new_value or "{}")
    assert evidence["reason"] == "worse"
    assert evidence["canary"] == harmful  # the version, the evidence beside it
    # the guard decided (its failure test, spending 0.7 of the 0.2 budget: boundary 1/0.14)
    assert evidence["decided_by"] == "failure_guard"
    guard = evidence["evidence"]["guard"]
    assert guard["failures"] >= guard["failure_boundary"] == round(1 / 0.14, 3)
    assert settled.evidence.decided_by == "failure_guard"
    assert fleet.audit.entries()[-1].user_id == "agentmend"


async def test_a_canary_that_fixes_a_fault_is_promoted(fleet: Fleet) -> None:
    fleet.runtime.inject(AGENT, Fault(FaultKind.TRUNCATION, token_factor=2.6))
    fixed = fleet.publish_edit("max_tokens: 2048", "max_tokens: 4096")
    record = fleet.start(fixed, claimed_fix=True, share=0.2)
    await fleet.serve(2000)
    settled = fleet.rollouts.get(record.rollout_id)
    assert settled.state == "promoted"
    assert settled.reason == "better"
    assert fleet.log.heads().stable == fixed
    assert fleet.follower.status().stable == fixed
    assert "max_tokens: 4096" in (fleet.follower.team_dir / f"{AGENT}.md").read_text()
    assert fleet.team.spec(AGENT).max_tokens == 4096  # the team follows the new stable


def test_limits_roll_back_as_not_proven() -> None:
    limits = RolloutLimits(max_canary_runs=100)
    evidence = Evidence()
    for i in range(100):  # equal arms: neither worse nor shown within a tiny margin
        evidence.add("stable", i % 2 == 0, 10.0)
        evidence.add("canary", i % 2 == 1, 10.0)
    assert decide(evidence, limits, claimed_fix=True, age_hours=1.0)[:2] == (
        "roll_back",
        "not_proven",
    )
    young = Evidence(canary_runs=3)
    assert decide(young, RolloutLimits(), claimed_fix=False, age_hours=25.0)[:2] == (
        "roll_back",
        "not_proven",
    )
    assert decide(young, RolloutLimits(), claimed_fix=False, age_hours=1.0)[0] == "continue"


def test_a_slower_canary_is_rolled_back_by_the_slow_run_guard() -> None:
    evidence = Evidence()
    decision: tuple[str, str, str] = ("continue", "", "")
    for step in range(20):  # a poll every 10 runs: 9 stable, 1 canary twice as slow
        if decision[0] != "continue":
            break
        evidence.add_all(
            [("stable", True, 100.0 + step + i) for i in range(9)] + [("canary", True, 200.0)]
        )
        decision = decide(evidence, RolloutLimits(), claimed_fix=True, age_hours=0.1)
    assert decision == ("roll_back", "slower", "slowness_guard")
    assert evidence.canary_runs <= 8  # a handful of canary runs, not 50 as the mean rule took


def test_within_the_slow_tolerance_a_canary_is_not_rolled_back() -> None:
    evidence = Evidence()
    for _ in range(100):
        stable = [("stable", True, 100.0 + i) for i in range(9)]
        evidence.add_all([*stable, ("canary", True, 114.0)])
    assert decide(evidence, RolloutLimits(), claimed_fix=True, age_hours=0.1)[0] == "continue"


def test_a_fix_that_completes_answers_cut_short_is_not_rolled_back_as_slower() -> None:
    """Stable's truncated runs fail early; the fix's complete answers take their full time.
    Failures' durations say when they stopped, so the slow-run guard ranks successes only."""
    evidence = Evidence()
    for _ in range(100):  # stable: 6 of 9 runs cut off at 40 ms, the rest take 100-102 ms;
        # the canary completes every answer in 118 ms: within the 1.2x tolerance of stable's
        stable = [("stable", i >= 6, 40.0 if i < 6 else 94.0 + i) for i in range(9)]
        evidence.add_all([*stable, ("canary", True, 118.0)])
    assert evidence.slowness_guard
    assert decide(evidence, RolloutLimits(), claimed_fix=True, age_hours=0.1)[2] != (
        "slowness_guard"
    )
    assert max(evidence.slowness_guard) <= 0.0  # no evidence of slowness at all


def test_a_record_from_before_the_guard_still_reads() -> None:
    old = '{"margin": 0.02, "alpha": 0.05, "max_hours": 24.0, "max_canary_runs": 5000,'
    old += ' "latency_factor": 1.5, "latency_min_runs": 50}'
    assert RolloutLimits.from_json(old) == RolloutLimits()
    assert Evidence.from_json('{"canary_runs": 3, "pairs": ""}').windows == 0


def test_pairing_never_looks_at_outcomes() -> None:
    a, b = Evidence(), Evidence()
    for arm in ["stable", "stable", "canary", "stable", "canary", "canary", "canary"]:
        a.add(arm, True, 1.0)
        b.add(arm, False, 1.0)
    assert len(a.pairs) == len(b.pairs) == 6
    assert Evidence.from_json(a.to_json()) == a


async def test_promote_abort_pause_need_an_admin_and_the_current_canary(fleet: Fleet) -> None:
    v2 = fleet.publish_edit("max_tokens: 2048", "max_tokens: 3000")
    with pytest.raises(RolloutConflict, match="not the current canary"):
        fleet.rollouts.promote(v2, by=OPS)
    record = fleet.rollouts.start(v2, by=CYCLE)
    with pytest.raises(RolloutConflict, match="is the canary now"):
        fleet.rollouts.start(v2, by=CYCLE)
    with pytest.raises(PermissionRequired):
        fleet.rollouts.promote(v2, by=CYCLE)
    with pytest.raises(PermissionRequired):
        fleet.rollouts.pause(v2, by=CYCLE)
    with pytest.raises(RolloutConflict, match="not the current canary"):
        fleet.rollouts.promote(1, by=OPS)
    paused = fleet.rollouts.pause(v2, by=OPS)
    assert paused.state == "paused"
    assert fleet.log.heads().share == 0.0
    fleet.follower.poll()
    assert {fleet.follower.choose(f"u{i}").arm for i in range(200)} == {"stable"}
    resumed = fleet.rollouts.pause(v2, by=OPS, resume=True)
    assert resumed.state == "canary"
    assert fleet.log.heads().share == pytest.approx(0.1)
    promoted = fleet.rollouts.promote(v2, by=OPS)
    assert promoted.state == "promoted"
    assert promoted.reason == "by_hand"
    assert fleet.log.heads().stable == v2
    assert record.rollout_id == promoted.rollout_id
    # abort of the stable release: the parent's content, published as a new stable release
    back = fleet.rollouts.abort(v2, by=OPS)
    assert isinstance(back, Release)
    assert fleet.log.heads().stable == back.version == 3
    assert fleet.log.get(3).content_hash == fleet.log.get(1).content_hash
    edits = [e.edit_type for e in fleet.audit.entries()]
    assert edits[-5:] == [
        "rollout_started",
        "rollout_paused",
        "rollout_resumed",
        "rollout_promoted",
        "release_published",
    ]
    assert {e.user_id for e in fleet.audit.entries()[-4:-1]} == {"ops"}
    # every rollout step names the rollout and both versions; the evidence sits beside them
    for entry in fleet.audit.entries()[-5:-1]:
        row = json.loads(entry.new_value or "{}")
        assert (row["rollout"], row["canary"], row["stable"]) == (record.rollout_id, v2, 1)
    promoted_row = json.loads(fleet.audit.entries()[-2].new_value or "{}")
    assert promoted_row["evidence"] == {"canary": [0, 0], "stable": [0, 0], "pairs": 0}


async def test_bad_rollout_input(fleet: Fleet) -> None:
    v2 = fleet.publish_edit("max_tokens: 2048", "max_tokens: 3000")
    for share in (0.0, 1.0, 2.0):
        with pytest.raises(InvalidArgument, match="canary share"):
            fleet.rollouts.start(v2, by=CYCLE, share=share)
    with pytest.raises(NotFound):
        fleet.rollouts.start(99, by=CYCLE)
    with pytest.raises(RolloutConflict, match="already the stable"):
        fleet.rollouts.start(1, by=CYCLE)
    assert fleet.log.heads().canary is None  # nothing started
    with pytest.raises(WrongArgumentType, match="routing key"):
        await fleet.team.run(AGENT, "x", routing_key=42)  # type: ignore[arg-type]


async def test_the_rollout_record_owns_its_changes_and_recovery_leaves_them(fleet: Fleet) -> None:
    from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
    from agentmend.infrastructure.changes.protocol.change_log import ChangeLog
    from agentmend.infrastructure.changes.protocol.leases import Leases
    from agentmend.infrastructure.changes.protocol.owners import RecordOwner

    # a workspace has its change log (on PostgreSQL the lease lists its changes in their order)
    ChangeLog(fleet.store)
    v2 = fleet.publish_edit("max_tokens: 2048", "max_tokens: 3000")
    record = fleet.rollouts.start(v2, by=CYCLE)
    leases = Leases(fleet.store)
    assert record.lease_id is not None
    lease = leases.get(record.lease_id)
    assert lease is not None
    assert lease.owner == RecordOwner("rollout", record.rollout_id)
    assert leases.changes_of(record.lease_id) == ["chg-x"]
    ImprovementManager(store=fleet.store)  # recovery at open
    after = leases.get(record.lease_id)
    assert after is not None
    assert after.state == "held"
    assert fleet.rollouts.get(record.rollout_id).state == "canary"  # continued, not undone
    fleet.rollouts.promote(v2, by=OPS)
    released = leases.get(record.lease_id)
    assert released is not None
    assert released.state == "released"
    assert released.end_reason == "rollout promoted: by_hand"


@pytest.mark.parametrize(
    ("new", "carried"),
    [
        ({"a.md": b"x\ny\n", "b.md": b"b\n"}, None),  # the stable as it was
        ({"a.md": b"x\ny\n", "b.md": b"b2\n"}, None),  # another file changed
        ({"a.md": b"x\nY\n", "b.md": b"b\n"}, "a.md"),  # the canary's file
        ({"a.md": b"x0\nY\n", "b.md": b"b\n"}, "a.md"),  # its added line beside another edit
        ({"a.md": b"x0\n", "b.md": b"b\n"}, "a.md"),  # its removed line gone with another edit
        ({"a.md": b"x\ny\n", "b.md": b"b\n", "c.md": b"c\n"}, "c.md"),  # the file it added
        ({"a.md": b"x\ny\n"}, "b.md"),  # the file it removed
    ],
)
def test_what_counts_as_carrying_a_canarys_change(
    new: dict[str, bytes], carried: str | None
) -> None:
    stable = {"a.md": b"x\ny\n", "b.md": b"b\n"}
    canary = {"a.md": b"x\nY\n", "c.md": b"c\n"}  # y became Y, b.md removed, c.md added
    assert canary_change_in(stable, canary, new) == carried


def _tagged(fleet: Fleet, rollout_id: str, version: int, *, up_to: int) -> int:
    """The canary runs of ``rollout_id`` at or below the cursor ``up_to``."""
    rows = runs_after(fleet.store.connection(), 0, 1_000_000)
    tags = [json.loads(str(r.extra)) for r in rows if r.id <= up_to and r.extra]
    return sum(t.get("rollout") == rollout_id and t.get("release") == version for t in tags)


def _readable(fleet: Fleet) -> None:
    """Wait until every stored run is below the readers' horizon: on PostgreSQL a run is read
    once every write transaction older than its own has ended, and the tests' server is
    shared with other tests' writes."""
    conn = fleet.store.connection()
    stored = conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    for _ in range(400):  # at most 20 s
        if len(runs_after(conn, 0, 1_000_000)) >= stored:
            return
        time.sleep(0.05)
    raise AssertionError("stored runs never became readable")


def _serve_tagged(fleet: Fleet, rollout_id: str, version: int, runs: int) -> None:
    for _ in range(runs):
        fleet.monitor.record(
            AGENT, success=True, duration_ms=10.0, release=version, arm="canary",
            rollout=rollout_id,
        )  # fmt: skip
        fleet.monitor.record(
            AGENT, success=True, duration_ms=10.0, release=1, arm="stable", rollout=rollout_id
        )
    fleet.monitor.flush()
    _readable(fleet)


def test_a_settlement_never_overwrites_a_step_another_worker_took(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker A reads runs and decides to roll back; before it settles, worker B steps over more
    runs. A's settlement must not write its older evidence over B's step (the evidence would
    count fewer runs than the cursor has passed): the step and the settlement commit together,
    and A, whose step lost, settles nothing."""
    import agentmend.infrastructure.releases.rollout as rollout_module

    harmful = fleet.publish_edit("max_tokens: 2048", "max_tokens: 950")
    undecided = RolloutLimits(margin=0.0, alpha=1e-6, guard_alpha=1e-9)
    record = fleet.rollouts.start(harmful, by=CYCLE, limits=undecided)
    worker_a, worker_b = Rollouts(fleet.log), Rollouts(fleet.log)
    _serve_tagged(fleet, record.rollout_id, harmful, 20)
    real_decide = decide  # the one the rollout module imported

    def worker_b_steps_in_between(*args: object, **kwargs: object) -> object:
        monkeypatch.setattr(rollout_module, "decide", real_decide)
        _serve_tagged(fleet, record.rollout_id, harmful, 20)
        stepped = worker_b.advance()  # B steps over all 40 pairs: no harm, "continue"
        assert stepped is not None
        assert stepped.state == "canary"
        return ("rollback", "worse", "failure_guard")  # A's decision, on its 20 pairs

    monkeypatch.setattr(rollout_module, "decide", worker_b_steps_in_between)
    worker_a.advance()
    now = fleet.rollouts.get(record.rollout_id)
    assert now.evidence.canary_runs == _tagged(fleet, record.rollout_id, harmful, up_to=now.cursor)
    assert now.evidence.canary_runs == 40
    assert now.state == "canary"  # A's step lost, so A's decision settled nothing
