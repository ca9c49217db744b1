"""Settling a rollout: once, with its changes released and an audit row, whoever settles it.

A rollout is settled by a worker's poll (the evidence decided), by an administrator (promote,
abort), or by a publication that supersedes it (a stable release, a fleet-wide rollback). Every
one of them goes through :func:`settle_in`, inside the caller's write transaction: a
compare-and-set on the record's state (of two settlers, one wins), the release of the lease
that held the canary's changes (recovery owns them again), the heads moved off the canary only
when they still name this rollout (a rollout stranded by older code is settled without
touching what workers serve), and one audit row naming the rollout, the canary's version and
the stable's, the reason, the test or person that decided (``decided_by``, also kept in the
record's evidence), and the evidence beside them.

:func:`canary_change_in` is the rule that keeps a stable release from carrying a change only a
running canary carries: the files the canary changed, compared with the stable it was started
on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from agentmend.infrastructure.changes.audit.log import AuditTransaction
from agentmend.infrastructure.changes.protocol.leases import Leases
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.releases.rollout_evidence import Evidence, RolloutLimits
from agentmend.infrastructure.store.sql import StoreConnection
from agentmend.infrastructure.structured_logger import get_logger

__all__ = [
    "ACTIVE",
    "RELEASE_AGENT",
    "ROLLOUT_COLUMNS",
    "RolloutRecord",
    "TeamHeads",
    "canary_change_in",
    "read_record",
    "record_of",
    "settle_in",
]

log = get_logger(__name__)

RELEASE_AGENT = "(release)"
"""The ``agent_name`` of audit rows about releases and rollouts (they span the team)."""

ACTIVE = ("canary", "paused")
"""States of a rollout that is not settled."""

ROLLOUT_COLUMNS = (
    "rollout_id, team_id, canary, stable, share, claimed_fix, state, reason, limits, evidence, "
    "cursor, started_at, settled_at, lease_id"
)


class TeamHeads(Protocol):
    """What settling needs of a team's release log (:class:`ReleaseLog` is one)."""

    @property
    def leases(self) -> Leases: ...

    def rollout_of_heads(self, conn: StoreConnection) -> str | None:
        """The rollout the team's heads name, locked (inside a write transaction)."""
        ...

    def set_heads(
        self,
        conn: StoreConnection,
        *,
        stable: int | None,
        canary: int | None,
        share: float,
        rollout_id: str | None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """A rollout as stored: the record that owns it."""

    rollout_id: str
    team_id: str
    canary: int
    stable: int
    share: float
    claimed_fix: bool
    state: str
    reason: str | None
    limits: RolloutLimits
    evidence: Evidence
    cursor: int
    started_at: float
    settled_at: float | None
    lease_id: str | None  # its lease in the ownership records (owner: this record)


def read_record(conn: StoreConnection, team_id: str, rollout_id: str) -> RolloutRecord | None:
    """The rollout ``rollout_id`` of ``team_id`` as ``conn`` sees it (None: no such rollout)."""
    row = conn.execute(
        f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ? AND team_id = ?",
        (rollout_id, team_id),
    ).fetchone()
    return record_of(row) if row is not None else None


def record_of(row: tuple[object, ...]) -> RolloutRecord:
    """A row of ``ROLLOUT_COLUMNS`` as a record."""
    (rollout_id, team_id, canary, stable, share, claimed_fix, state, reason, limits, evidence,
     cursor, started_at, settled_at, lease_id) = row  # fmt: skip
    return RolloutRecord(
        rollout_id=str(rollout_id),
        team_id=str(team_id),
        canary=int(str(canary)),
        stable=int(str(stable)),
        share=float(str(share)),
        claimed_fix=bool(claimed_fix),
        state=str(state),
        reason=str(reason) if reason is not None else None,
        limits=RolloutLimits.from_json(str(limits)),
        evidence=Evidence.from_json(str(evidence)),
        cursor=int(str(cursor)),
        started_at=float(str(started_at)),
        settled_at=float(str(settled_at)) if settled_at is not None else None,
        lease_id=str(lease_id) if lease_id is not None else None,
    )


def settle_in(
    releases: TeamHeads,
    conn: StoreConnection,
    txn: AuditTransaction | None,
    record: RolloutRecord,
    outcome: str,
    reason: str,
    evidence: Mapping[str, object],
    *,
    by: Principal | None,
    superseded_by: int | None = None,
    decided_by: str | None = None,
) -> bool:
    """Promote or roll back ``record`` inside the caller's write transaction, once.

    Args:
        outcome: ``promoted`` or ``rolled_back``.
        reason: why (``worse``, ``better``, ``by_hand``, ``aborted``, ``superseded``, ...).
        evidence: the evidence summary the audit row keeps beside the versions.
        by: the principal who settled it (None: a worker's poll on the evidence).
        superseded_by: the release whose publication settles it, if any.
        decided_by: the test that decided (``failure_guard``, ``slowness_guard``,
            ``two_sample``, ``limits``); by default ``publication`` when superseded, else
            ``administrator`` when ``by`` is given, else ``evidence``. Kept in the record's
            evidence and in the audit row.

    Returns:
        False when the rollout was settled already (by another worker): nothing written.
    """
    # the heads first, as every writer of them does: one lock order for all
    serving = releases.rollout_of_heads(conn) == record.rollout_id
    if decided_by is None:
        decided_by = (
            "publication"
            if superseded_by is not None
            else "administrator"
            if by is not None
            else "evidence"
        )
    settled = replace(record.evidence, decided_by=decided_by)
    updated = conn.execute(
        "UPDATE rollouts SET state = ?, reason = ?, settled_at = ?, evidence = ? "
        "WHERE rollout_id = ? AND state IN (?, ?)",
        (outcome, reason, time.time(), settled.to_json(), record.rollout_id, *ACTIVE),
    ).rowcount
    if updated != 1:
        return False
    if record.lease_id is not None:
        lease = releases.leases.get(record.lease_id)
        if lease is not None and lease.state == "held":
            releases.leases.release(conn, lease.lease_id, f"rollout {outcome}: {reason}")
    if serving:
        stable = record.canary if outcome == "promoted" else record.stable
        releases.set_heads(conn, stable=stable, canary=None, share=0.0, rollout_id=None)
    if txn is not None:
        row: dict[str, object] = {
            "rollout": record.rollout_id,
            "canary": record.canary,
            "stable": record.stable,
            "reason": reason,
            "decided_by": decided_by,
        }
        if superseded_by is not None:
            row["superseded_by"] = superseded_by
        row["evidence"] = dict(evidence)
        txn.append(
            agent_name=RELEASE_AGENT,
            edit_type=f"rollout_{outcome}",
            old_value=record.stable,
            new_value=json.dumps(row, separators=(",", ":")),
            user_id=by.user_id if by else "agentmend",
            user_name=by.name if by else "rollout",
        )
    log.info(
        "rollout_settled",
        rollout=record.rollout_id,
        canary=record.canary,
        outcome=outcome,
        reason=reason,
        decided_by=decided_by,
        by=by.user_id if by else "rollout",
    )
    return True


def canary_change_in(
    stable: Mapping[str, bytes], canary: Mapping[str, bytes], new: Mapping[str, bytes]
) -> str | None:
    """The first file through which ``new`` carries the canary's change (None: it carries none).

    The canary's change is what it differs in from the stable it was started on: files it adds,
    removes or rewrites. ``new`` carries it when, at such a file, it has the canary's bytes
    (its added file, its removal, its version of the file), any line the canary added there
    that the stable does not have, or lacks a line only the canary removed (the canary's edit
    merged with other edits of the file).
    """
    for path in sorted(set(stable) | set(canary)):
        before, after = stable.get(path), canary.get(path)
        if before == after:
            continue
        if path in new and after is not None and new[path] == after:
            return path
        if after is None and path not in new:
            return path  # the canary removed it, and so does the new release
        if after is not None and path in new and before is not None:
            old, now = _lines(before), _lines(new[path])
            added, removed = _lines(after) - old, old - _lines(after)
            if added & (now - old) or (removed and not removed & now):
                return path
    return None


def _lines(data: bytes) -> set[bytes]:
    return {line.strip() for line in data.splitlines() if line.strip()}
