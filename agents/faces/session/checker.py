"""The session beside a fleet checker: the issues it leaves to it, and the questions it answers.

While a checker (``agentmend watch``) holds the team, a question's issues are left to it
(:attr:`TaskResult.left_to_checker`); ``/status`` says which checker holds the team and what it
asks, and ``/issue approve ID`` or ``/issue decline ID`` answers, audited as the person at the
keyboard. ``/improve AGENT`` still runs a cycle: the issue's claim decides between the two.
"""

from __future__ import annotations

from rich.text import Text

from agentmend.infrastructure.changes.cycle_requests import (
    AlreadyAnswered,
    CycleRequests,
    read_requests,
)
from agentmend.infrastructure.detection.checker_seat import SeatHolder
from agentmend.infrastructure.errors import NotFound
from agentmend.loop.cycle import TaskResult
from agentmend.loop.meta_orchestrator import MetaOrchestrator

__all__ = ["answer_checker", "checker_status", "left_to_checker"]


def holder_text(holder: SeatHolder) -> str:
    return f"{holder.principal} on {holder.host} pid {holder.pid}"


def left_to_checker(task: TaskResult) -> list[Text]:
    """A line for each issue of ``task`` left to the team's checker."""
    if task.checker is None:
        return []
    return [
        Text(
            f"issue {issue.issue_id} of {issue.agent_name} ({issue.error_type}) left to the "
            f"fleet checker, {holder_text(task.checker)}; /improve {issue.agent_name} runs a "
            "cycle now",
            style="yellow",
        )
        for issue in task.left_to_checker
    ]


def checker_status(orchestrator: MetaOrchestrator) -> list[Text]:
    """Which fleet checker holds the team, and the questions it waits on (none: no lines).

    Raises:
        StoreError: the store cannot be reached.
    """
    holder = orchestrator.fleet_checker()
    if holder is None:
        return []
    lines = [
        Text(
            f"the team is held by its fleet checker, {holder_text(holder)}: its issues are "
            "left to it (/improve AGENT runs a cycle now)"
        )
    ]
    for request in read_requests(orchestrator.store, team_id=holder.team_id, states=("asked",)):
        lines.append(
            Text(
                f"  it asks: a cycle for issue {request.issue_id} of {request.agent} "
                f"({request.kind})? /issue approve {request.issue_id} or /issue decline "
                f"{request.issue_id}",
                style="yellow",
            )
        )
    return lines


def answer_checker(orchestrator: MetaOrchestrator, args: list[str]) -> list[Text]:
    """``/issue``: the waiting questions; ``/issue approve|decline ID``: answer one."""
    if not args:
        asked = read_requests(orchestrator.store, states=("asked",))
        if not asked:
            return [Text("no question from a fleet checker is waiting")]
        return [
            Text(f"issue {r.issue_id}: a cycle for {r.agent} ({r.kind}), asked by {r.asked_by}")
            for r in asked
        ]
    if len(args) != 2 or args[0] not in ("approve", "decline"):
        return [Text("usage: /issue [approve|decline ID]", "red")]
    approve = args[0] == "approve"
    try:
        request = CycleRequests(orchestrator.store).answer(
            args[1], approve=approve, by=orchestrator.principal, audit=orchestrator.manager.audit
        )
    except (NotFound, AlreadyAnswered) as exc:
        return [Text(str(exc), "red")]
    done = (
        "approved: the fleet checker runs it at its next check"
        if approve
        else "declined: the checker holds the issue"
    )
    return [Text(f"issue {request.issue_id}: a cycle for {request.agent} {done}", "green")]
