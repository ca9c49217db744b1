"""Every publication that meets a running rollout has one rule, on both backends, with real
worker processes following the team.

| publication                         | rollout serving or paused                              |
|-------------------------------------|--------------------------------------------------------|
| stable, carrying none of the canary | the rollout is rolled back first (``superseded``)      |
| stable, carrying the canary's change| refused, naming the canary; nothing written            |
| fleet-wide abort of the stable      | the rollout is rolled back first, then the rollback    |
| a second canary                     | refused, naming the running canary; no lease left      |
| a release to be canaried (the loop) | not published, naming the running canary               |

Settling is one transaction with the publication: its audit row names the rollout, the
canary's version and the stable's, the release that superseded it, and the evidence beside
them; the lease that held the canary's changes is released (recovery owns them again).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from release_followers import FollowingWorkers

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.protocol.leases import Leases
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.releases.errors import RolloutConflict
from agentmend.infrastructure.releases.log import Release, ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.releases.rollout_evidence import RolloutLimits
from agentmend.infrastructure.simulation import copy_team
from agentmend.infrastructure.store.api import Store
from agentmend.loop.release_publishing import ReleasePublisher

pytestmark = pytest.mark.slow  # each test starts a worker process (about 2 s)

CYCLE = Principal("cycle", "improvement cycle")
OPS = Principal("ops", "Operator", frozenset({ADMIN}))
AGENT = "research-agent.md"
OTHER = "quality-agent.md"
TEAM = "team-pub"
CANARY_LINE = "max_tokens: 3000"


class Team:
    """A store with releases 1, 2 (stable, its parent 1) and 3 (a canary changing
    research-agent.md, serving or paused), and one worker process following them."""

    def __init__(self, tmp_path: Path, store_url: str, state: str) -> None:
        self.source = copy_team(tmp_path / "team")
        files_dir = tmp_path / "files"
        self.store = Store(store_url, files_dir=files_dir)
        self.audit = AuditLog(self.store)
        self.log = ReleaseLog(self.store, TEAM, audit=self.audit)
        self.rollouts = Rollouts(self.log)
        self.log.publish_directory(self.source, by=CYCLE)
        self.edit(OTHER, "maxTurns:", "x_stable: 1\nmaxTurns:")
        self.stable = self.log.publish_directory(self.source, by=CYCLE, stable=True).version
        self.edit(AGENT, "max_tokens: 2048", CANARY_LINE)
        self.canary = self.log.publish_directory(
            self.source, by=CYCLE, change_ids=("chg-canary",)
        ).version
        self.record = self.rollouts.start(self.canary, by=CYCLE)
        if state == "paused":
            self.rollouts.pause(self.canary, by=OPS)
        self.workers = FollowingWorkers(store_url, TEAM, tmp_path, files_dir)
        self.workers.start(1)
        self.workers.wait("the worker on the canary", lambda s: s.get("canary") == self.canary)

    def edit(self, name: str, old: str, new: str) -> None:
        path = self.source / name
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))

    def files(self, version: int) -> dict[str, bytes]:
        return self.log.files(version)

    def held_leases(self) -> list[str]:
        leases = Leases(self.store).open_leases()
        return [lease.lease_id for lease in leases if lease.state == "held"]

    def audit_rows(self, edit_type: str) -> list[dict[str, object]]:
        return [
            json.loads(str(e.new_value)) for e in self.audit.entries() if e.edit_type == edit_type
        ]

    def close(self) -> None:
        self.workers.stop()
        self.store.close()


@pytest.fixture(params=["canary", "paused"])
def team(request: pytest.FixtureRequest, tmp_path: Path, store_url: str) -> Iterator[Team]:
    made = Team(tmp_path, store_url, request.param)
    try:
        yield made
    finally:
        made.close()


def wait_until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _assert_superseded(team: Team, by_release: int, stable_before: int) -> None:
    """The rollout rolled back as superseded by ``by_release``, its lease released, audited."""
    settled = team.rollouts.get(team.record.rollout_id)
    assert (settled.state, settled.reason) == ("rolled_back", "superseded")
    assert team.held_leases() == []
    lease = Leases(team.store).get(str(settled.lease_id))
    assert lease is not None
    assert (lease.state, lease.end_reason) == ("released", "rollout rolled_back: superseded")
    (row,) = team.audit_rows("rollout_rolled_back")
    assert row["rollout"] == team.record.rollout_id
    assert (row["canary"], row["stable"], row["superseded_by"]) == (
        team.canary,
        stable_before,
        by_release,
    )
    assert row["evidence"] == {"canary": [0, 0], "stable": [0, 0], "pairs": 0}
    assert team.audit.verify_chain().ok
    team.workers.wait(
        "the worker on the new stable, no canary",
        lambda s: s.get("stable") == by_release and s.get("canary") is None,
    )


def test_a_stable_publication_rolls_the_running_canary_back_first(team: Team) -> None:
    files = team.files(team.stable)
    files[OTHER] += b"\nA stable fix of the quality agent.\n"
    published = team.log.publish(files, by=CYCLE, reason="a fix", stable=True)
    assert team.log.heads().stable == published.version == 4
    assert published.parent == team.stable
    _assert_superseded(team, 4, team.stable)
    assert CANARY_LINE.encode() not in team.files(4)[AGENT]


@pytest.mark.parametrize("merged", [False, True], ids=["its-file", "its-line-merged"])
def test_a_stable_publication_carrying_the_canarys_change_is_refused(
    team: Team, merged: bool
) -> None:
    if merged:  # the canary's line beside another edit of the same file
        team.edit(AGENT, "timeout_s: 90", "timeout_s: 120")
    heads = team.log.heads()
    with pytest.raises(RolloutConflict) as refused:
        team.log.publish_directory(team.source, by=CYCLE, reason="a rollback", stable=True)
    message = str(refused.value)
    assert "\n" not in message
    assert f"release {team.canary}:" in message
    assert team.record.rollout_id in message
    assert AGENT in message
    assert team.log.heads() == heads  # nothing written
    assert [r.version for r in team.log.list()] == [3, 2, 1]
    assert team.rollouts.get(team.record.rollout_id).state in ("canary", "paused")
    assert team.held_leases() == [team.record.lease_id]
    team.workers.wait("the worker still on the canary", lambda s: s.get("canary") == team.canary)


def test_a_fleet_wide_abort_rolls_the_running_canary_back_first(team: Team) -> None:
    back = team.rollouts.abort(team.stable, by=OPS)
    assert isinstance(back, Release)
    assert (back.version, back.parent) == (4, team.stable)
    assert back.content_hash == team.log.get(1).content_hash
    _assert_superseded(team, 4, team.stable)


def test_a_second_canary_is_refused_naming_the_running_one(team: Team) -> None:
    team.edit(OTHER, "maxTurns:", "x_second: 1\nmaxTurns:")
    second = team.log.publish_directory(team.source, by=CYCLE).version
    with pytest.raises(RolloutConflict) as refused:
        team.rollouts.start(second, by=CYCLE)
    assert str(refused.value) == (
        f"release {second}: release {team.canary} is the canary now ({team.record.rollout_id})"
    )
    assert team.held_leases() == [team.record.lease_id]  # the refused start left no lease
    assert team.log.heads().canary == team.canary
    # the loop's kept change: not published beside the running canary
    publisher = ReleasePublisher(team.log)
    assert publisher.kept(team.source, ["chg-second"], by=CYCLE, reason="kept") is None
    assert [r.version for r in team.log.list()] == [second, 3, 2, 1]
    assert team.rollouts.get(team.record.rollout_id).state in ("canary", "paused")
    team.workers.wait("the worker still on the canary", lambda s: s.get("canary") == team.canary)


def test_abort_settles_a_rollout_a_publication_left_behind(team: Team) -> None:
    # what a stable publication left before it settled rollouts: heads moved on, record not
    with team.log.write() as (conn, _):
        team.log.set_heads(conn, stable=team.stable, canary=None, share=0.0, rollout_id=None)
    team.workers.wait("the worker off the canary", lambda s: s.get("canary") is None)
    generation = team.log.heads().generation
    aborted = team.rollouts.abort(team.canary, by=OPS)
    assert not isinstance(aborted, Release)
    assert (aborted.state, aborted.reason) == ("rolled_back", "aborted")
    assert team.log.heads().generation == generation  # what workers serve is left alone
    assert team.held_leases() == []
    (row,) = team.audit_rows("rollout_rolled_back")
    assert (row["rollout"], row["canary"], row["stable"]) == (team.record.rollout_id, 3, 2)
    with pytest.raises(RolloutConflict, match="neither the canary nor the stable"):
        team.rollouts.abort(team.canary, by=OPS)  # settled now


def test_a_worker_poll_that_settles_a_rollout_is_audited(tmp_path: Path, store_url: str) -> None:
    source = copy_team(tmp_path / "team")
    files_dir = tmp_path / "files"
    with Store(store_url, files_dir=files_dir) as store:
        audit = AuditLog(store)
        log = ReleaseLog(store, TEAM, audit=audit)
        log.publish_directory(source, by=CYCLE)
        path = source / AGENT
        path.write_text(path.read_text().replace("max_tokens: 2048", CANARY_LINE, 1))
        v2 = log.publish_directory(source, by=CYCLE).version
        # undecided past its time limit: the worker's next poll rolls it back as not proven
        record = Rollouts(log).start(v2, by=CYCLE, limits=RolloutLimits(max_hours=1e-4))
        with FollowingWorkers(store_url, TEAM, tmp_path, files_dir) as workers:
            workers.start(1)  # its ReleaseLog is built without an audit log, as in the README
            workers.wait(
                "the rollout settled", lambda s: s.get("stable") == 1 and s.get("canary") is None
            )
            wait_until(lambda: Rollouts(log).get(record.rollout_id).state == "rolled_back")
        settled = Rollouts(log).get(record.rollout_id)
        assert (settled.state, settled.reason) == ("rolled_back", "not_proven")
        (entry,) = [e for e in audit.entries() if e.edit_type == "rollout_rolled_back"]
        assert (entry.user_id, entry.user_name) == ("agentmend", "rollout")
        row = json.loads(str(entry.new_value))
        assert row == {
            "rollout": record.rollout_id,
            "canary": v2,
            "stable": 1,
            "reason": "not_proven",
            "decided_by": "limits",
            "evidence": row["evidence"],
        }
        assert set(row["evidence"]) >= {"canary", "stable", "pairs", "wealth", "boundary", "guard"}
        assert audit.verify_chain().ok
