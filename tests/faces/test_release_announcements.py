"""What a face serving releases announces between two looks, each change once."""

from __future__ import annotations

from dataclasses import replace

from agentmend.faces.release_serving import ReleaseChanges, release_change_lines
from agentmend.infrastructure.releases.follower import FollowerStatus

STABLE = FollowerStatus("team", stable=1, canary=None, share=0.0, rollout_id=None, connected=True)
CANARY = replace(STABLE, canary=2, share=0.1, rollout_id="rollout-ab")


def test_each_change_of_what_is_served_is_one_line() -> None:
    assert release_change_lines(STABLE, STABLE) == []
    assert release_change_lines(STABLE, CANARY) == ["canary v2 started on 10% of runs (rollout-ab)"]
    promoted = release_change_lines(CANARY, replace(STABLE, stable=2))
    assert promoted == ["canary v2 was promoted: every run is now served release v2"]
    (gone,) = release_change_lines(CANARY, STABLE)
    assert gone.startswith("canary v2 left service without promotion")
    assert "agentmend release show 2" in gone
    assert release_change_lines(STABLE, replace(STABLE, stable=3)) == [
        "release v3 is now stable (was v1)"
    ]
    first = replace(STABLE, stable=None)
    assert release_change_lines(first, STABLE) == ["release v1 is now stable"]


class _Follower:
    def __init__(self) -> None:
        self.now = CANARY

    def status(self) -> FollowerStatus:
        return self.now


def test_a_change_is_announced_once() -> None:
    follower = _Follower()
    changes = ReleaseChanges(follower)  # type: ignore[arg-type]
    assert changes.since_last_look() == []
    follower.now = replace(STABLE, stable=2)
    assert changes.since_last_look() == [
        "canary v2 was promoted: every run is now served release v2"
    ]
    assert changes.since_last_look() == []
