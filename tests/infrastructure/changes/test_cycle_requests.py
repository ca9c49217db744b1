"""A fleet checker's cycle requests: asked once per issue, answered once (audited, with who
answered), started by one checker only; a refused answer writes nothing. On both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.cycle_requests import (
    UNATTENDED,
    AlreadyAnswered,
    CycleRequests,
    read_requests,
)
from agentmend.infrastructure.errors import NotFound
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.store.api import Store

CHECKER = Principal.fleet_checker("team-1")
ANA = Principal("ana", "Ana Ops")


def _issue(issue_id: str, agent: str = "research-agent") -> IssueReport:
    return IssueReport(agent_name=agent, error_type="low_success_rate", issue_id=issue_id)


def _audit(store: Store) -> list[tuple[str, str]]:
    rows = store.connection().execute("SELECT edit_type, user_id FROM audit_log ORDER BY id")
    return [(str(r[0]), str(r[1])) for r in rows.fetchall()]


def test_a_request_is_asked_once_answered_once_and_started_once(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        audit = AuditLog(store)
        requests = CycleRequests(store)
        asked, created = requests.ask("team-1", _issue("i-1"), by=CHECKER)
        assert created
        assert (asked.state, asked.asked_by) == ("asked", CHECKER.user_id)
        again, created = requests.ask("team-1", _issue("i-1"), by=CHECKER)
        assert (again, created) == (asked, False)  # raised again while asked: one question
        assert asked.issue == _issue("i-1").model_copy(update={"timestamp": asked.issue.timestamp})

        with pytest.raises(NotFound, match="waiting: i-1"):
            requests.answer("i-9", approve=True, by=ANA, audit=audit)
        assert _audit(store) == []  # refused: nothing written
        answered = requests.answer("i-1", approve=True, by=ANA, audit=audit)
        assert (answered.state, answered.answered_by) == ("approved", "ana")
        with pytest.raises(AlreadyAnswered, match="answered already by ana"):
            requests.answer("i-1", approve=False, by=ANA, audit=audit)
        assert _audit(store) == [("issue_cycle_approved", "ana")]
        assert audit.verify_chain().ok

        other = CycleRequests(store)  # a second checker on the same store
        assert requests.start("i-1")
        assert not other.start("i-1")  # one cycle per approval
        assert other.restart_stale("team-1", older_than_s=3600) == []  # started just now
        # its checker died mid-cycle: once as old as a stale claim, the next checker runs it
        assert other.restart_stale("team-1", older_than_s=-1) == ["i-1"]
        assert other.start("i-1")
        assert requests.finish("i-1", "kept")
        (done,) = read_requests(store, team_id="team-1")
        assert (done.state, done.outcome) == ("done", "kept")
        # the issue raised again after its cycle is asked about again
        fresh, created = requests.ask("team-1", _issue("i-1"), by=CHECKER)
        assert created
        assert fresh.state == "asked"


def test_improve_approves_its_own_requests_unattended_and_a_decline_is_held(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        audit = AuditLog(store)
        requests = CycleRequests(store)
        unattended, _ = requests.ask("team-1", _issue("i-1"), by=CHECKER, approved=True)
        assert (unattended.state, unattended.answered_by) == ("approved", UNATTENDED)
        with pytest.raises(AlreadyAnswered):  # nobody answers a question never asked
            requests.answer("i-1", approve=False, by=ANA, audit=audit)
        requests.ask("team-2", _issue("i-2", "writer"), by=Principal.fleet_checker("team-2"))
        requests.answer("i-2", approve=False, by=ANA, audit=audit)
        assert [r.issue_id for r in requests.of_team("team-1", "approved")] == ["i-1"]
        assert [r.issue_id for r in requests.of_team("team-2", "declined")] == ["i-2"]
        assert requests.finish("i-2", "declined")
        assert requests.of_team("team-2", "declined") == []
        assert _audit(store) == [("issue_cycle_declined", "ana")]
