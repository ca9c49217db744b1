"""One issue, one cycle, fleet-wide: a cycle claims its issue before any model call, so a
second process that sees the same issue (a session, the MCP server, the fleet checker) runs no
cycle for it while the first one's claim stands."""

from __future__ import annotations

import asyncio

from loop_scenarios import BASELINE, Build, build, faulty_issue, warm_up

from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.settings import Settings
from agentmend.loop.meta_orchestrator import MetaOrchestrator

__all__ = ["build"]  # the fixture, used by name


def _opened(orchestrator: MetaOrchestrator, issue: IssueReport) -> IssueReport:
    """``issue`` with a row in the store's ledger, as the detector opens one."""
    row, created = orchestrator.detector.ledger.open(
        issue.agent_name, issue.error_type, detector="test", context=issue.context, hold_runs=10
    )
    assert created
    return issue.model_copy(update={"issue_id": row.issue_id})


async def test_an_issue_claimed_by_another_process_runs_no_cycle_here(build: Build) -> None:
    orchestrator = build(settings=Settings(baseline_n=BASELINE, issue_claim_stale_s=0.5))
    await warm_up(orchestrator, 5)
    issue = _opened(orchestrator, await faulty_issue(orchestrator))
    elsewhere = IssueLedger(orchestrator.store)  # another process's ledger on the same store
    claim = elsewhere.claim(issue.issue_id or "", "host-b:4242:c0ffee", stale_after_s=0.5)
    assert claim is not None
    assert claim.mine

    calls = orchestrator.cycle.role_calls()
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "claimed_elsewhere"
    assert "host-b:4242:c0ffee" in (cycle.error or "")
    assert orchestrator.cycle.role_calls() == calls  # not one model call
    assert orchestrator.manager.get_history() == []
    row = elsewhere.get(issue.issue_id or "")
    assert row is not None
    assert (row.status, row.cycles) == ("open", 0)  # left to its claimant: not held from here

    await asyncio.sleep(0.6)  # the claimant died: its claim goes stale and the next cycle takes it
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status != "claimed_elsewhere"
    assert orchestrator.cycle.role_calls() > calls
    row = elsewhere.get(issue.issue_id or "")
    assert row is not None
    assert row.status != "open"  # the cycle moved it on: its claim ended with it
    assert elsewhere.claim(issue.issue_id or "", "host-b:1:x", stale_after_s=3600) is None


async def test_two_orchestrators_on_one_store_run_one_cycle_for_one_issue(build: Build) -> None:
    first, second = build(seed=1), build(seed=2)  # one team folder, one store
    await warm_up(first, 5)
    issue = _opened(first, await faulty_issue(first))
    results = await asyncio.gather(
        first.run_improvement_cycle(issue), second.run_improvement_cycle(issue)
    )
    statuses = sorted(r.status == "claimed_elsewhere" for r in results)
    assert statuses == [False, True]
    # one store: both see the one cycle's change, and there is no second
    changes = {c.change_id for o in (first, second) for c in o.manager.get_history()}
    assert len(changes) <= 1


def test_a_claim_needs_an_open_issue_and_ends_when_it_moves_on(build: Build) -> None:
    ledger = IssueLedger()  # in memory: the same rules
    row, _ = ledger.open("a", "slow", detector="t", context="", hold_runs=5)
    mine = ledger.claim(row.issue_id, "me", stale_after_s=60)
    assert mine is not None
    assert mine.mine
    theirs = ledger.claim(row.issue_id, "them", stale_after_s=60)
    assert theirs is not None
    assert (theirs.mine, theirs.claimed_by) == (False, "me")
    ledger.hold(row.issue_id, outcome="no_action", hold_runs=5)
    assert ledger.claim(row.issue_id, "them", stale_after_s=60) is None  # held: no cycle
    ledger.reopen(row.issue_id, context="again")
    again = ledger.claim(row.issue_id, "them", stale_after_s=60)
    assert again is not None
    assert again.mine  # the hold ended the first claim


async def test_a_held_issue_asked_for_again_runs_its_cycle(build: Build) -> None:
    # a person's "no" holds the issue; their later /improve is a request the hold yields to
    orchestrator = build()
    await warm_up(orchestrator, 5)
    issue = _opened(orchestrator, await faulty_issue(orchestrator))
    ledger = orchestrator.detector.ledger
    ledger.hold(issue.issue_id or "", outcome="declined", hold_runs=100)
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status != "claimed_elsewhere"
    row = ledger.get(issue.issue_id or "")
    assert row is not None
    assert row.outcome != "declined"  # the cycle ran and settled it


async def test_an_issue_its_ledger_does_not_know_runs_without_a_claim(build: Build) -> None:
    orchestrator = build()
    await warm_up(orchestrator, 5)
    issue = (await faulty_issue(orchestrator)).model_copy(update={"issue_id": "not-in-ledger"})
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status != "claimed_elsewhere"
