"""A release that widens what an agent may do needs an administrator to publish it or to start
it as a canary, and says so in its audit row; each rollout routes by a secret no caller sees.
On both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.errors import PermissionRequired
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.releases.content import read_team_files, release_widening
from agentmend.infrastructure.releases.follower import ReleaseFollower
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.releases.routing import choose_arm
from agentmend.infrastructure.simulation import copy_team
from agentmend.infrastructure.store.api import Store

OPS = Principal("ops", "Operator", frozenset({ADMIN}))
DEV = Principal("dev", "Developer")


def _widen(team: Path) -> None:
    """research-agent: the open profile and the shell, as a non-administrator might try."""
    path = team / "research-agent.md"
    text = path.read_text().replace("  - WebSearch\n", "  - WebSearch\n  - Bash\n", 1)
    path.write_text(text.replace("permission_profile: standard", "permission_profile: open", 1))


def _audit(store: Store, edit_type: str) -> list[dict[str, object]]:
    rows = store.connection().execute(
        "SELECT new_value FROM audit_log WHERE edit_type = ? ORDER BY id", (edit_type,)
    )
    return [json.loads(value) for (value,) in rows]


def test_widening_is_named_per_agent_and_narrowing_is_not_widening(tmp_path: Path) -> None:
    team = copy_team(tmp_path / "team")
    before = read_team_files(team)
    _widen(team)
    (line,) = release_widening(before, read_team_files(team))
    assert line.startswith("research-agent: ")
    assert "permission profile open" in line
    assert "Bash" in line
    assert release_widening(read_team_files(team), before) == []  # back to narrower


def test_a_widening_release_needs_an_administrator_to_publish_or_canary(
    store_url: str, tmp_path: Path
) -> None:
    team = copy_team(tmp_path / "team")
    with Store(store_url, files_dir=tmp_path / "files") as store:
        log = ReleaseLog(store, "team-w", audit=AuditLog(store))
        rollouts = Rollouts(log)
        log.publish_directory(team, by=OPS)
        _widen(team)
        heads, rows = log.heads(), len(_audit(store, "release_published"))
        with pytest.raises(PermissionRequired, match=r"widens research-agent: .*Bash"):
            log.publish_directory(team, by=DEV)
        assert (log.heads(), len(_audit(store, "release_published"))) == (heads, rows)
        widened = log.publish_directory(team, by=OPS).version
        assert "research-agent" in str(_audit(store, "release_published")[-1]["widens"])
        with pytest.raises(PermissionRequired, match="start a canary that widens"):
            rollouts.start(widened, by=DEV)
        assert log.heads().canary is None
        record = rollouts.start(widened, by=OPS)
        started = _audit(store, "rollout_started")[-1]
        assert "Bash" in str(started["widens"])
        # the rollout's routing key is a secret: in no record, status or audit row
        secret = rollouts.routing_key_of(record.rollout_id)
        assert secret != record.rollout_id
        assert len(secret) == 32
        dump = json.dumps([_audit(store, kind) for kind in ("rollout_started",)])
        assert secret not in dump
        assert secret not in repr(rollouts.get(record.rollout_id))


def test_workers_route_by_the_rollouts_secret_and_agree(store_url: str, tmp_path: Path) -> None:
    team = copy_team(tmp_path / "team")
    with Store(store_url, files_dir=tmp_path / "files") as store:
        log = ReleaseLog(store, "team-r", audit=AuditLog(store))
        log.publish_directory(team, by=OPS)
        path = team / "research-agent.md"
        path.write_text(path.read_text() + "\nAnswer briefly.\n")
        record = Rollouts(log).start(log.publish_directory(team, by=DEV).version, by=DEV, share=0.3)
        workers = [
            ReleaseFollower(log, tmp_path / f"worker-{n}", advance_rollouts=False) for n in (1, 2)
        ]
        for worker in workers:
            worker.poll()
        keys = [f"user-{n}" for n in range(400)]
        arms = [[worker.choose(key).arm for key in keys] for worker in workers]
        assert arms[0] == arms[1]  # every worker routes a user alike
        secret = Rollouts(log).routing_key_of(record.rollout_id)
        assert arms[0] == [choose_arm(key, 0.3, secret) for key in keys]
        # the id, which callers see, does not tell which keys draw the canary
        assert arms[0] != [choose_arm(key, 0.3, record.rollout_id) for key in keys]
        assert secret not in json.dumps(workers[0].status().__repr__())
