"""The fleet checker's identity may publish canaries and settle rollouts, nothing else: no
stable release (a team's first, a rollback, a fleet-wide one), no promotion, abort or pause, no
acknowledgement of an audit break, even when its permissions name ``admin``. Each refusal
writes nothing. On both backends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.errors import PermissionRequired
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.simulation import copy_team
from agentmend.infrastructure.store.api import Store

OPS = Principal("ops", "Operator", frozenset({ADMIN}))
CHECKER = Principal.fleet_checker("team-1")


def _audit_rows(store: Store) -> int:
    return int(store.connection().execute("SELECT COUNT(*) FROM audit_log").fetchone()[0])


def test_the_checker_publishes_a_canary_and_is_refused_everything_else(
    store_url: str, tmp_path: Path
) -> None:
    team = copy_team(tmp_path / "team")
    with Store(store_url, files_dir=tmp_path / "files") as store:
        audit = AuditLog(store)
        log = ReleaseLog(store, "team-1", audit=audit)
        rollouts = Rollouts(log)
        with pytest.raises(PermissionRequired, match="publish_stable"):
            log.publish_directory(team, by=CHECKER)  # a team's first release is stable
        assert log.heads().stable is None
        log.publish_directory(team, by=OPS)
        path = team / "research-agent.md"
        path.write_text(path.read_text() + "\nAnswer briefly.\n")
        canary = log.publish_directory(team, by=CHECKER, change_ids=("chg-1",)).version
        record = rollouts.start(canary, by=CHECKER, claimed_fix=True)
        assert record.canary == canary
        before = (log.heads(), _audit_rows(store))

        admin_checker = replace(CHECKER, permissions=frozenset({ADMIN}))
        for who in (CHECKER, admin_checker):
            refusals: list[Callable[[Principal], object]] = [
                lambda p: rollouts.promote(canary, by=p),
                lambda p: rollouts.abort(canary, by=p),
                lambda p: rollouts.pause(canary, by=p),
                lambda p: log.publish_directory(team, by=p, stable=True),
                lambda p: log.publish_rollback(canary, by=p),
                lambda p: audit.acknowledge_breaks(p, note="not mine to give"),
            ]
            for refused in refusals:
                with pytest.raises(PermissionRequired, match=r"fleet-checker:team-1"):
                    refused(who)
        assert (log.heads(), _audit_rows(store)) == before  # nothing written
        assert rollouts.advance() is not None  # settling by the evidence needs no one's right
        assert rollouts.promote(canary, by=OPS).state == "promoted"  # an admin still may
