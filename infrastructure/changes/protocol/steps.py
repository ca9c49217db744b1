"""The crash-safe protocol that changes files under a root and puts their old bytes back.

:class:`~agentmend.infrastructure.changes.improvement_manager.ImprovementManager` is the API; this
module is what makes its file changes safe to kill at any instant. Every step that touches a root
runs under an exclusive ``flock`` on ``<root>/.agent/agentmend.lock``, held from the hash check to
the last write so two processes (or threads) never interleave on a root's files.

Apply
-----
1. finish any unfinished work a dead process left on this root (see recovery);
2. read each file's old bytes and hash;
3. record the intent: the changes as PENDING with the old bytes, committed and synced;
4. link a human backup ``<root>/.agent/backups/<path>_<time>_<change id>.bak`` (for people:
   not synced on its own, as nothing reads it back);
5. write the new bytes with ``confined.write`` (or ``confined.delete``), which reach the file
   from the root's descriptor without following any symlink;
6. mark the changes APPLIED and append their audit rows in one synced transaction.

An apply returns only after step 6, so an acknowledged change is APPLIED on disk and is never
lost. Step 3's transaction also asks, before it commits, whether a dead process left work on the
root (then it rolls back, recovery settles that work and step 2 is taken again) and whether the
audit head and the database agree (else the apply is refused with nothing recorded): the
questions step 1 and an ``ensure_appendable`` would ask on their own. On PostgreSQL each of
steps 3 and 6 is then three round trips (``BEGIN``, the statements and the questions together,
``COMMIT``), whatever the number of files: step 6 takes the audit chain's tail to be where
step 3 found it and reads the real one with its writes, committing only if they match (else it
runs again reading the tail first). With the team lock's two, an apply makes eight.

A rollback follows the same pattern: check, record the rollback intent, restore, mark
ROLLED_BACK with audit rows.

Rolling back an unproven change
-------------------------------
A group whose verification failed is undone agent by agent (``rollback_unproven``), under the
root's lock from the hash check to the last status: someone may have edited one of its files
while it was being verified, and that edit is never overwritten. An agent whose files all still
hold what the change wrote gets its old bytes back (ROLLED_BACK, as a rollback); an agent with a
file edited since keeps all its files as they are, and its changes become FAILED with
``rollback_info`` saying so (``needs_attention``, ``left_unchanged``, ``edited_since_apply``,
``conflict``) and a ``rollback_blocked`` audit row. Both outcomes, and the rollback's intent,
commit in one transaction before any file is restored, so recovery finishes what a crash
interrupts.

Recovery
--------
On open (and before any apply or rollback on a root) unfinished work whose owner is gone is
settled; "gone" is certain because the owner held the root's lock, which the kernel drops
when it dies. The rule: an interrupted *apply* is rolled back whole (each file still holding
the change's new bytes gets its old bytes back, created files are removed, temp files are
cleaned) and its changes become FAILED with ``rollback_info["reason"] == "interrupted"``; a
file that holds neither the old nor the new bytes was changed outside agentmend and is left as
it is (noted). An interrupted *rollback* was asked for and acknowledged nothing, so it is
completed: each file gets the bytes the rollback aimed for. That covers a rollback whose files
were restored but whose status and audit commit failed (the store reported an error, the head
file could not be written, the process died): its recorded intent keeps the change unfinished,
so the failing ``rollback`` retries the recovery at once and, if the store still fails, the
next open (or the next apply or rollback on the root) completes it. Between the two the store
shows the change APPLIED with its rollback pending, and no new work on the root can start
before recovery has run.

Unproven changes
----------------
An apply may carry a lease (``lease_id``): the changes are linked to it in the intent's
transaction, so from the first byte written they are live but not yet proven, owned by the
lease. The root's lock cannot own them: verification runs without it, for minutes. The owner
releases the lease with its keep or rollback; ``recover`` settles the changes of a lease whose
owner is gone (:mod:`~agentmend.infrastructure.changes.protocol.abandoned`) by ``rollback_unproven``
with the reason ``interrupted``, ending FAILED rather than ROLLED_BACK.

Modules
-------
:class:`ChangeProtocol` is the one entry point; it holds the root's lock and runs the steps that
live with their concept: :mod:`~agentmend.infrastructure.changes.protocol.apply` (steps 2 to 6),
:mod:`~agentmend.infrastructure.changes.protocol.rollback` (by id, cascade, and
``rollback_unproven``), :mod:`~agentmend.infrastructure.changes.protocol.recovery` (settling
interrupted work) and :mod:`~agentmend.infrastructure.changes.protocol.files` (the lock, backups and
hashes they share).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.protocol.abandoned import INTERRUPTED, AbandonedWork
from agentmend.infrastructure.changes.protocol.apply import (
    Content,
    FileEntry,
    UnfinishedWork,
    applied_records,
    prepare_under,
    record_intent,
    root_opened,
    write_and_commit,
)
from agentmend.infrastructure.changes.protocol.change_log import ChangeLog, ChangeRow
from agentmend.infrastructure.changes.protocol.leases import Leases
from agentmend.infrastructure.changes.protocol.owners import HostIdentity, LeaseTerms
from agentmend.infrastructure.changes.protocol.recovery import Recovery
from agentmend.infrastructure.changes.protocol.rollback import (
    LIVE_STATUSES,
    PartialRollback,
    RollbackPlan,
    Rollbacks,
)
from agentmend.infrastructure.changes.protocol.team_registry import team_guard
from agentmend.infrastructure.models import ChangeRecord, ChangeStatus
from agentmend.infrastructure.principal import ChangeAuthor
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["LIVE_STATUSES", "ChangeProtocol", "Content", "FileEntry", "PartialRollback"]

log = get_logger(__name__)

# The first intent finds what a dead process left on the root and recovery settles it under the
# root's lock, so the second finds nothing more; a third would mean recovery cannot settle it.
_INTENT_ATTEMPTS = 2


class ChangeProtocol:
    """Applies, rolls back and recovers file changes of one store; see the module docstring.

    The caller owns the objects passed in; this class keeps no state of its own, so any
    number of them (in any number of processes) can work on one store and one root.
    """

    def __init__(
        self,
        store: Store,
        changes: ChangeLog,
        audit: AuditLog,
        *,
        leases: Leases | None = None,
        host: HostIdentity | None = None,
        terms: LeaseTerms | None = None,
    ) -> None:
        self.store, self.changes, self.audit = store, changes, audit
        self.leases = leases if leases is not None else Leases(store)
        self.rollbacks = Rollbacks(store, changes, audit)
        self.recovery = Recovery(store, changes, self.rollbacks)
        self.abandoned = AbandonedWork(
            self.leases,
            changes,
            self._settle_interrupted,
            host=host if host is not None else HostIdentity.current(),
            terms=terms if terms is not None else LeaseTerms(),
        )

    def apply(
        self,
        entries: Sequence[FileEntry],
        root: str | Path,
        *,
        group_id: str | None,
        session_id: str,
        author: ChangeAuthor,
        lease_id: str | None = None,
    ) -> list[ChangeRecord]:
        """Steps 1 to 6 for ``entries``, all under ``root``; one APPLIED record per file.

        ``author`` is recorded as who made the changes (``applied_by``) and named by their
        audit rows.

        With ``lease_id`` the changes are recorded, from their intent on, as held by that
        lease: live but not yet proven, settled by recovery if the lease's owner goes.

        Raises:
            PathNotAllowed: a path leaves ``root``, is a directory, lies in ``.agent/`` or
                appears twice, or ``root`` is not an existing directory; nothing is written
                or recorded.
            LeaseLost: ``lease_id`` is no longer held; nothing is written or recorded.
            AuditChainBroken: the audit head and the database disagree (an administrator
                acknowledges the break first); nothing is written or recorded.
        """
        link = None if lease_id is None else self._linker(lease_id)
        # every step walks from one opened root: the lock, the reads, backups and writes
        with root_opened(root) as resolved:
            items = prepare_under(entries, resolved)
            with team_guard(self.store, resolved) as team:
                for attempt in range(_INTENT_ATTEMPTS):
                    try:  # the intent also asks whether recovery or the audit head object
                        created = record_intent(
                            self.changes,
                            self.audit,
                            items,
                            resolved,
                            team=team,
                            group_id=group_id,
                            session_id=session_id,
                            author=author,
                            link=link,
                        )
                        break
                    except UnfinishedWork:
                        if attempt == _INTENT_ATTEMPTS - 1:
                            raise
                        self.recovery.recover_root(Path(resolved))  # then read the old bytes
                try:
                    write_and_commit(
                        self.changes, self.audit, items, resolved, created, author=author
                    )
                except Exception as exc:
                    # Not acknowledged: put back what was written and mark it FAILED now
                    # rather than on the next open (if the store itself is failing,
                    # reopening does it).
                    self.recovery.settle_after_apply_error(Path(resolved), exc)
                    raise
        return applied_records(items, created, author=author, group_id=group_id)

    def rollback(
        self,
        row: ChangeRow,
        reason: str,
        *,
        force: bool,
        cascade: bool,
        author: ChangeAuthor,
    ) -> bool:
        """Restore the files of ``row`` (a change with a root); False if it is no longer live.

        The audit rows name ``author``'s user, else who made each change undone.

        Raises:
            RollbackConflict: a file changed since (unless ``force``) or later live changes
                build on it (unless ``cascade``).
        """
        assert row.root is not None, "a change without files rolls back as a status change"
        root = Path(row.root)
        with team_guard(self.store, root):
            self.recovery.recover_root(root)
            fresh = self.changes.get(row.change_id)
            if fresh is None or fresh.status not in LIVE_STATUSES:
                return False
            plan = self.rollbacks.plan(
                row.change_id,
                fresh,
                reason,
                force=force,
                cascade=cascade,
                author=author,
            )
            self._finish(root, plan, row.change_id)
        log.info("rolled_back_change", change_id=row.change_id, cascade=list(plan.dependents))
        return True

    def rollback_unproven(
        self,
        row: ChangeRow,
        reason: str,
        *,
        author: ChangeAuthor,
        lease_id: str | None = None,
        settle_as: ChangeStatus = ChangeStatus.ROLLED_BACK,
    ) -> PartialRollback:
        """Undo ``row``'s live group except the agents with a file edited since the apply.

        An empty result when the change is no longer live (settled meanwhile).

        Args:
            author: who the rollback is made for, as for ``rollback``.
            lease_id: the owner's lease, released with the rollback's intent.
            settle_as: ROLLED_BACK, or FAILED when recovery settles an interrupted change.

        Raises:
            LeaseLost: ``lease_id`` is no longer held (recovery settled the change); nothing
                is written.
            AgentmendError: the store or a file failed; what committed stays so, and recovery
                completes the restore on the next open (or apply or rollback on the root).
        """
        assert row.root is not None, "a change without files rolls back as a status change"
        root = Path(row.root)
        release = None
        if lease_id is not None:
            release = partial(self.leases.release, lease_id=lease_id, reason="rolled_back")
        with team_guard(self.store, root):
            self.recovery.recover_root(root)
            if lease_id is not None:
                self.leases.require_held(lease_id)
            fresh = self.changes.get(row.change_id)
            if fresh is None or fresh.status not in LIVE_STATUSES:
                return PartialRollback()
            plan, outcome = self.rollbacks.plan_unproven(
                row.change_id,
                fresh,
                reason,
                author=author,
                settle_as=settle_as,
                release=release,
            )
            if plan.members:
                self._finish(root, plan, plan.members[0].change_id)
        log.info(
            "rolled_back_unproven_change",
            change_id=row.change_id,
            rolled_back=list(outcome.rolled_back),
            blocked=list(outcome.blocked),
        )
        return outcome

    def _finish(self, root: Path, plan: RollbackPlan, change_id: str) -> None:
        """Restore ``plan``; on an error let recovery complete it, raising if it could not."""
        try:
            self.rollbacks.finish(root, plan.members, plan.files, plan.request)
        except Exception as exc:
            if not self.recovery.settle_rollback_after_error(root, change_id, exc):
                raise

    def recover(self) -> list[ChangeRecord]:
        """Settle the work crashed processes left unfinished, then the unproven changes whose
        owner is gone (:mod:`~agentmend.infrastructure.changes.protocol.abandoned`); returns the
        changes settled."""
        return self.recovery.recover() + self.abandoned.settle()

    def _linker(self, lease_id: str) -> Callable[[StoreConnection, list[str], str], None]:
        def link(conn: StoreConnection, change_ids: list[str], team_id: str) -> None:
            self.leases.link(conn, lease_id, change_ids, team_id)

        return link

    def _settle_interrupted(self, row: ChangeRow) -> PartialRollback:
        return self.rollback_unproven(
            row, INTERRUPTED, author=ChangeAuthor(), settle_as=ChangeStatus.FAILED
        )
