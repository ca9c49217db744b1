"""``CyclePolicy`` as a library object, on the offline simulated team: a declined question holds
its issue and runs nothing, an approved one runs exactly one cycle on the policy's own thread,
and its end is recorded on the request. On both backends.
(A real checker process: ``tests/faces/test_checker_policies.py``.)"""

from __future__ import annotations

import time
from pathlib import Path

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.cycle_requests import CycleRequests, read_requests
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.store.api import Store
from agentmend.loop.checker_policies import CyclePolicy, PolicyNote
from agentmend.loop.cycle import list_cycle_ids
from agentmend.loop.meta_orchestrator import MetaOrchestrator

CHECKER = Principal.fleet_checker("team-1")
ANA = Principal("ana", "Ana Ops")


def test_a_declined_issue_is_held_and_an_approved_one_gets_one_cycle(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        orchestrator = MetaOrchestrator.offline_simulated(
            tmp_path / "team",
            store=store,
            settings=Settings(baseline_n=30, min_baseline_n=30),
            principal=CHECKER,
            auto_improve=False,
        )
        requests = CycleRequests(store)
        policy = CyclePolicy("ask", requests, "team-1", CHECKER, orchestrator)
        try:
            ledger = orchestrator.detector.ledger
            reports = {}
            for kind in ("low_success_rate", "performance_regression"):
                row, _ = ledger.open(
                    "research-agent", kind, detector="cusum", context="test", hold_runs=50
                )
                reports[kind] = IssueReport(
                    agent_name="research-agent", error_type=kind, issue_id=row.issue_id
                )
                note = policy.opened(reports[kind])
                assert note is not None
                assert f"agentmend issue approve {row.issue_id}" in note.text
            declined, approved = (reports[k].issue_id for k in reports)
            assert declined is not None
            assert approved is not None
            assert policy.act() == []  # nobody answered: nothing to do, nothing waited for

            audit = AuditLog(store)
            requests.answer(declined, approve=False, by=ANA, audit=audit)
            requests.answer(approved, approve=True, by=ANA, audit=audit)
            notes = policy.act()
            assert [n.text for n in notes] == [
                f"issue {declined}: declined by ana; held, no cycle",
                f"issue {approved}: cycle for research-agent started (approved by ana)",
            ]
            held = ledger.get(declined)
            assert held is not None
            assert held.status == "held"

            ended: list[PolicyNote] = []
            deadline = time.monotonic() + 120
            while not ended and time.monotonic() < deadline:
                ended = policy.act()  # a turn returns while the cycle runs on its thread
                time.sleep(0.05)
            (note,) = ended
            assert note.result is not None
            assert note.text.startswith(f"issue {approved}: cycle for research-agent ended")
            assert policy.act() == []  # one cycle per approval
        finally:
            policy.close()
            orchestrator.close()
        assert len(list_cycle_ids(store)) == 1
        outcomes = {r.issue_id: (r.state, r.outcome) for r in read_requests(store)}
        assert outcomes == {
            declined: ("done", "declined"),
            approved: ("done", note.result.status),
        }
