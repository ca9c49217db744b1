"""A cycle whose change could not be applied ends before its questions: nothing is asked of the
agents or of a person when the audit chain refuses applies, and the one line says what to do."""

from __future__ import annotations

from loop_scenarios import Build, build, faulty_issue, warm_up

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.proposal import ProposedChange

__all__ = ["build"]  # the fixture, used by name


async def test_a_broken_audit_chain_ends_the_cycle_before_any_question(build: Build) -> None:
    asked: list[ProposedChange] = []

    async def approve(change: ProposedChange) -> bool:
        asked.append(change)
        return True

    orchestrator = build(yolo_mode=False, approval_callback=approve)
    await warm_up(orchestrator, 5)
    issue = await faulty_issue(orchestrator)
    audit: AuditLog = orchestrator.manager.audit
    audit.head_path.write_text("not a head record\n")  # the head and the database disagree

    calls = orchestrator.cycle.role_calls()
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "error"
    assert "no change can be applied" in (cycle.error or "")
    assert "acknowledge" in (cycle.error or "")  # the way out, named
    assert orchestrator.cycle.role_calls() == calls  # no question asked of the agents
    assert asked == []  # nor of a person
    assert cycle.questions == ()
    assert orchestrator.manager.get_history() == []
