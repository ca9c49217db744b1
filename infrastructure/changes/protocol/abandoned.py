"""Settling the unproven changes whose owner is gone (recovery's second half).

A change applied to be verified is held by a lease
(:mod:`agentmend.infrastructure.changes.protocol.leases`). At every open, recovery looks at the open
leases:

- a process owner is gone when, seen from a process sharing its kernel boot and pid namespace,
  its pid no longer runs the process that took the lease; or when its lease has expired (on
  another host, ``LeaseTerms.clock_skew_s`` after its expiry). A stopped owner whose lease
  expired is gone too: when it resumes it finds the lease lost and stops;
- a live owner's lease (alive, or not expired where its pid cannot be seen) is left alone;
- a record owner (a watch or rollout record) is left to its record's own logic, which
  continues the change rather than rolling it back.

A gone owner's lease is revoked (held -> lost, a compare-and-set the owner's own settlement
races against). Then, only on the host where the files live (``HostIdentity.same_host``) and
only with the root there, its changes still APPLIED are settled under the root's lock, as an
unproven group is undone: agent by agent, files restored byte for byte and the changes FAILED
with ``rollback_info["reason"] == "interrupted"``; an agent with a file that moved on since the
change keeps its files as they are and its changes become FAILED needing attention, naming the
files (``left_unchanged``, ``edited_since_apply``). Then the lease is settled. Any other
process only revokes: the change stays marked (its lease lost) until a process on its host
settles it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from agentmend.infrastructure.changes.protocol.change_log import ChangeLog, ChangeRow
from agentmend.infrastructure.changes.protocol.files import root_busy
from agentmend.infrastructure.changes.protocol.leases import Lease, Leases
from agentmend.infrastructure.changes.protocol.owners import HostIdentity, LeaseTerms, ProcessOwner
from agentmend.infrastructure.models import ChangeRecord, ChangeStatus
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["INTERRUPTED", "AbandonedWork"]

log = get_logger(__name__)

INTERRUPTED = "interrupted"
"""``rollback_info["reason"]`` of a change settled because its owner stopped."""

SettleGroup = Callable[[ChangeRow], object]
"""Undo one unproven group as FAILED ``interrupted`` (the protocol's, under the root's lock)."""


class AbandonedWork:
    """Finds open leases whose owner is gone and settles their changes; keeps no state."""

    def __init__(
        self,
        leases: Leases,
        changes: ChangeLog,
        settle_group: SettleGroup,
        *,
        host: HostIdentity,
        terms: LeaseTerms,
    ) -> None:
        self.leases, self.changes, self.settle_group = leases, changes, settle_group
        self.host, self.terms = host, terms

    def settle(self) -> list[ChangeRecord]:
        """Revoke the leases of gone owners and settle what this host can; returns the settled.

        A root whose lock is held now is skipped (its changes wait for the next open): the
        holder is live work, or a stopped process whose open must not hang this one.
        """
        settled: list[ChangeRecord] = []
        for lease in self.leases.open_leases():
            settled.extend(self.settle_lease(lease, wait=False) or [])
        return settled

    def settle_lease(self, lease: Lease, *, wait: bool = True) -> list[ChangeRecord] | None:
        """Settle ``lease`` if its owner is gone; returns what it settled.

        None when nothing could be settled now: the owner is live (or a record owns the
        lease), the files live on another host, or (without ``wait``) the root is busy.
        """
        owner = lease.owner
        if not isinstance(owner, ProcessOwner):
            return None  # a watch or rollout continues under its record's own logic
        if lease.state == "held" and not self._revoke_if_gone(lease, owner):
            return None
        if lease.state in ("released", "settled"):
            return []
        return self._settle(lease, owner, wait=wait)

    def owner_gone(self, lease: Lease) -> str | None:
        """Why ``lease``'s owner counts as gone now (None: it is live, or a record owns it)."""
        if not isinstance(lease.owner, ProcessOwner) or lease.state != "held":
            return None if lease.state == "held" else f"lease {lease.state}"
        alive = lease.owner.alive_seen_from(self.host)
        if alive is False:
            return "owner_dead"
        slack = 0.0 if self.host.same_boot(lease.owner.host) else self.terms.clock_skew_s
        return "lease_expired" if lease.expired(time.time(), slack=slack) else None

    def _revoke_if_gone(self, lease: Lease, owner: ProcessOwner) -> bool:
        why = self.owner_gone(lease)
        if why is None:
            return False
        slack = 0.0 if self.host.same_boot(owner.host) else self.terms.clock_skew_s
        before = math.inf if why == "owner_dead" else time.time() - slack
        revoked = self.leases.revoke(lease, by=self.host, reason=why, expired_before=before)
        if revoked:
            log.warning("lease_revoked", lease_id=lease.lease_id, owner=str(owner), reason=why)
        return revoked

    def _settle(
        self, lease: Lease, owner: ProcessOwner, *, wait: bool
    ) -> list[ChangeRecord] | None:
        rows = [row for cid in self.leases.changes_of(lease.lease_id)
                if (row := self.changes.get(cid)) is not None]  # fmt: skip
        live = [row for row in rows if row.status is ChangeStatus.APPLIED]
        roots = {row.root for row in live}
        here = self.host.same_host(owner.host) and all(
            root is not None and Path(root).is_dir() for root in roots
        )
        if live and not here:
            log.warning(
                "abandoned_change_elsewhere",
                lease_id=lease.lease_id,
                owner=str(owner),
                changes=[row.change_id for row in live],
                note="a process on the owner's host settles them",
            )
            return None
        if not wait and any(root_busy(Path(str(root))) for root in roots):
            log.info(
                "abandoned_change_root_busy", lease_id=lease.lease_id, roots=sorted(map(str, roots))
            )
            return None
        done: set[str] = set()
        for row in live:
            if row.change_id not in done:
                self.settle_group(row)
                group = row.record.group_id
                done.update(r.change_id for r in live if group is not None and
                            r.record.group_id == group)  # fmt: skip
                done.add(row.change_id)
        with self.leases.store.transaction() as conn:
            self.leases.mark_settled(conn, lease.lease_id)
        log.warning("abandoned_changes_settled", lease_id=lease.lease_id, count=len(live))
        return [fresh.record for row in live if (fresh := self.changes.get(row.change_id))]
