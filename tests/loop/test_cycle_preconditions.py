"""A cycle whose change could not be applied ends before its questions: nothing is asked of the
agents or of a person when the audit chain refuses applies, and the one line says what to do.
What breaks while the questions run (the audit chain, the store) is found again before the gates:
a person is never asked to approve a change that could not be applied."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest
from loop_scenarios import Build, build, faulty_issue, warm_up
from pg_server import PgServer

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.proposal import ProposedChange
from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.store.api import Store
from agentmend.loop.cycle import CycleEvent

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


def _break_the_head_once_proposed(audit: AuditLog) -> Callable[[CycleEvent], None]:
    def on_progress(event: CycleEvent) -> None:
        if event.step == "actions_proposed":  # after the questions, before any gate
            audit.head_path.write_text("not a head record\n")

    return on_progress


async def test_a_chain_broken_during_the_questions_ends_the_cycle_before_approval(
    build: Build,
) -> None:
    asked: list[ProposedChange] = []

    async def approve(change: ProposedChange) -> bool:
        asked.append(change)
        return True

    progress: list[Callable[[CycleEvent], None]] = []
    orchestrator = build(
        yolo_mode=False,
        approval_callback=approve,
        on_progress=lambda event: [step(event) for step in progress],
    )
    await warm_up(orchestrator, 5)
    issue = await faulty_issue(orchestrator)
    progress.append(_break_the_head_once_proposed(orchestrator.manager.audit))
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "error", cycle
    assert "no change can be applied" in (cycle.error or "")
    assert cycle.questions  # the questions were asked while the chain held
    assert asked == []  # the person was not
    assert orchestrator.manager.get_history() == []


@pytest.mark.slow
async def test_a_store_gone_during_the_questions_ends_the_cycle_before_approval(
    build: Build, own_pg_server: PgServer, tmp_path: Path
) -> None:
    asked: list[ProposedChange] = []

    async def approve(change: ProposedChange) -> bool:
        asked.append(change)
        return True

    def stop_the_server(event: CycleEvent) -> None:
        if event.step == "actions_proposed":  # after the questions, before any gate
            own_pg_server.stop()

    progress: list[Callable[[CycleEvent], None]] = []
    store = Store(own_pg_server.create_database(), files_dir=tmp_path / "files")
    orchestrator = build(
        yolo_mode=False,
        approval_callback=approve,
        store=store,
        on_progress=lambda event: [step(event) for step in progress],
    )
    try:
        await warm_up(orchestrator, 5)
        issue = await faulty_issue(orchestrator)
        team = {p.name: p.read_bytes() for p in (tmp_path / "team").glob("*.md")}
        progress.append(stop_the_server)
        with pytest.raises(StoreError, match=r"postgresql://postgres@127\.0\.0\.1"):
            await orchestrator.run_improvement_cycle(issue)
        assert asked == []  # nobody is asked to approve what could not be applied
        assert {p.name: p.read_bytes() for p in (tmp_path / "team").glob("*.md")} == team
    finally:
        # the runs recorded since the stop cannot be written: closing says so, and is done
        with contextlib.suppress(StoreError):
            orchestrator.close()
        store.close()
