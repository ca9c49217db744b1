"""Settling code plans whose executing process is gone, at the start of every face.

A plan is executed under a lease of the executing process (``CodeUpdater``): the lease's id is
in the plan's payload from the moment it becomes ``executing``, and the plan's change group is
held by it. When that process dies (or stops past the lease's expiry) the plan is settled by
the next process that opens the store on the plan's host (``Workspace.open``, so the session,
the MCP server and the ``agentmend`` command alike, and ``CodeUpdater.recover``): its
change group is restored byte for byte (FAILED ``interrupted``, see
``agentmend.infrastructure.changes.protocol.abandoned``) and the plan becomes ``failed`` with a
reason starting ``interrupted``. A plan whose owner is gone but whose files live on another host
stays ``executing`` until a process there settles it; it is never reported as the active one
(:func:`plan_is_live`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.change_log import ChangeRow
from agentmend.infrastructure.changes.protocol.decisions import get_plan, list_plans, update_plan
from agentmend.infrastructure.code_update.plans import (
    PLAN_KIND,
    CodePlan,
    ExecutionResult,
    code_plan,
    stale_reason,
)
from agentmend.infrastructure.models import ChangeStatus
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["INTERRUPTED_REASON", "plan_is_live", "settle_interrupted_plans"]

log = get_logger(__name__)

INTERRUPTED_REASON = "interrupted: the process executing it stopped; its changes were undone"


def plan_is_live(manager: ImprovementManager, plan: CodePlan) -> bool:
    """Whether ``plan`` is ``executing`` under a live owner (so it may be reported active).

    A plan without a lease (executed by an older agentmend) counts as live: its root's lock
    decides, as before.
    """
    if plan.status != "executing":
        return False
    if plan.lease_id is None:
        return True
    lease = manager.leases.get(plan.lease_id)
    if lease is None or lease.state != "held":
        return False
    return manager.protocol.abandoned.owner_gone(lease) is None


def settle_interrupted_plans(
    manager: ImprovementManager, *, root: Path | None = None, wait: bool = False
) -> list[str]:
    """Settle the ``executing`` code plans whose owner is gone; returns their ids.

    Args:
        root: only this project's plans (default: every project's in the store).
        wait: wait for a root's lock (the caller holds it, or can afford to wait); without it
            a busy root is left for a later start.
    """
    match = {"kind": PLAN_KIND} if root is None else {"kind": PLAN_KIND, "root": str(root)}
    settled: list[str] = []
    for stored in list_plans(manager.store, status="executing", limit=None, payload=match):
        plan = code_plan(stored)
        if plan.lease_id is None or plan_is_live(manager, plan):
            continue
        if _settle(manager, plan, plan.lease_id, wait=wait):
            settled.append(plan.plan_id)
    return settled


def _settle(manager: ImprovementManager, plan: CodePlan, lease_id: str, *, wait: bool) -> bool:
    lease = manager.leases.get(lease_id)
    if lease is not None and manager.protocol.abandoned.settle_lease(lease, wait=wait) is None:
        return False  # another host's files, or a busy root: a later start settles it
    rows = [manager.changes.get(cid) for cid in manager.leases.changes_of(lease_id)]
    if any(row is not None and row.status is ChangeStatus.APPLIED for row in rows):
        return False
    restored = any(
        row is not None and row.status is ChangeStatus.FAILED and _info(row).get("restored")
        for row in rows
    )  # fmt: skip
    attention = sorted(
        path for row in rows if row is not None for path in _info(row).get("left_unchanged", [])
    )
    reason = INTERRUPTED_REASON
    if attention:
        reason += f"; needs attention: {', '.join(attention)} moved on and were left as they are"
    result = ExecutionResult(
        plan_id=plan.plan_id,
        success=False,
        status="failed",
        reason=reason,
        change_ids=tuple(row.change_id for row in rows if row is not None),
        rollback_performed=restored,
        restored_identical=not stale_reason(plan, Path(plan.root)),
    )
    with manager.store.transaction() as _:
        current = get_plan(manager.store, plan.plan_id)
        if current is None or current.status != "executing":
            return False  # settled meanwhile
        payload = {**current.payload, "result": result.model_dump(mode="json")}
        update_plan(manager.store, plan.plan_id, status="failed", payload=payload)
    log.warning("code_plan_recovered", plan_id=plan.plan_id, rolled_back=restored)
    return True


def _info(row: ChangeRow) -> Mapping[str, Any]:
    """The change's rollback information; empty when it has none."""
    return row.record.rollback_info or {}
