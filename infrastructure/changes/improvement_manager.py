"""Change history with real rollback: apply a change to agent files, log it, undo it exactly.

The long-standing ``ImprovementManager`` API on top of the one store. Where a rollback could
just flip a status, a rollback here restores the old bytes of every file the change touched and
checks their hash; where a JSON history would be rewritten on every change, logging is one INSERT.

Sessions and history
--------------------
``manager.history`` is the list of changes made through *this* manager (its session), as they
are now in the store; ``get_history()`` is the whole durable history. The session budget
(``max_improvements_per_session``) counts the changes this session applied, whatever became of
them later (kept or rolled back); FAILED and PENDING changes never count.
``can_make_improvement`` also refuses after 3 or more rollbacks among the 5 newest changes of
the durable history: instability outlives a process.

Who made a change
-----------------
``log_change``, ``apply``, ``apply_group`` and the rollbacks take an ``author``
(:class:`~agentmend.infrastructure.principal.ChangeAuthor`): how the change was made, recorded as
its ``applied_by`` (the manager's ``applied_by`` when the author names none), and the user its
audit rows name (without one, an apply's rows name its ``applied_by``, a rollback's the
``applied_by`` of the change it undoes).

Files ----- ``apply``, ``apply_group`` and the rollback of a change with files go through
:class:`~agentmend.infrastructure.changes.protocol.steps.ChangeProtocol`: under the root's lock,
the intent is recorded and synced before any file is written, so a process killed at any instant
loses no acknowledged change and leaves no file half-written; the next open settles what it left. A
change logged with ``log_change`` has no file behind it and rolls back as a status change.

Unproven changes
----------------
A change applied in order to verify it (the cycle, a self-edit, a code plan) is held by a lease
(``hold_lease``, :mod:`agentmend.infrastructure.changes.protocol.leases`): its owner's host, pid and
pid start time, and an expiry the owner renews. It stays APPLIED, and is live but not yet proven,
until its owner keeps it (``mark_kept``) or undoes it (``rollback_unproven``), each of which
releases the lease in the same transaction. Opening a manager settles the changes whose owner is
gone (:mod:`agentmend.infrastructure.changes.protocol.abandoned`): restored byte for byte and FAILED
with the reason ``interrupted``, or FAILED needing attention when their files moved on. Changes
applied by hand hold no lease and are never undone by recovery.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

from agentmend.infrastructure.changes.audit.log import AuditEntry, AuditLog, ChainVerification
from agentmend.infrastructure.changes.protocol.change_log import ChangeLog, ChangeRow
from agentmend.infrastructure.changes.protocol.leases import LeaseKeeper, LeaseLost, Leases
from agentmend.infrastructure.changes.protocol.owners import HostIdentity, LeaseTerms
from agentmend.infrastructure.changes.protocol.steps import (
    LIVE_STATUSES,
    ChangeProtocol,
    Content,
    FileEntry,
    PartialRollback,
)
from agentmend.infrastructure.errors import ChangeNotFound, ChangeStateError, ConfigurationError
from agentmend.infrastructure.limits import InputLimits
from agentmend.infrastructure.models import (
    ChangeRecord,
    ChangeStatus,
    ChangeType,
    ImprovementAction,
    utc_now,
)
from agentmend.infrastructure.principal import ChangeAuthor, Principal
from agentmend.infrastructure.store.api import Store

__all__ = [
    "DEFAULT_HISTORY_FILE",
    "ChangeRecord",
    "ChangeStatus",
    "ChangeType",
    "ImprovementAction",
    "ImprovementManager",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseTerms",
    "PartialRollback",
]

DEFAULT_HISTORY_FILE = Path(".agent") / "agentmend.db"
_COUNTS_AS_APPLIED = (ChangeStatus.APPLIED, ChangeStatus.KEPT, ChangeStatus.ROLLED_BACK)


class ImprovementManager:
    """Tracks, applies and rolls back changes to agent files; see the module docstring.

    Args:
        history_file: the SQLite store to open, whatever its suffix (older callers pass
            ``*.json`` paths). Defaults to ``.agent/agentmend.db``.
        store: an open store to use instead (not closed by :meth:`close`).
        audit_hmac_key: key for HMAC-keyed audit rows (the caller reads
            ``AGENTMEND_AUDIT_HMAC_KEY``; see ``agentmend.infrastructure.changes.audit.log``).
        max_improvements_per_session: the session budget (changes per session); it applies
            when ``improvement_window_s`` is None (the interactive session).
        improvement_window_s: for a process that runs for days (a library user's service,
            the MCP server), a rolling budget instead: at most ``max_improvements_per_window``
            changes applied in any such window, so improving resumes as old changes age out.
        max_improvements_per_window: the rolling budget's size.
        applied_by: how a change is recorded as made when its ``author`` names no ``via``.
        recover: settle work that crashed processes left unfinished, on open, and the
            unproven changes whose owner is gone (see "Unproven changes" above).
        lease_terms: how long a verification's lease lasts and how often it is renewed
            (default ``LeaseTerms()``: 30 s, renewed every 5 s, 5 s of clock skew).
        host: the host this process claims in leases (default: read from the system).
        limits: the bounds on rationales, reasons, file contents and files per group
            (``InputLimits.of(settings)``; the documented defaults when None). Over one is an
            ``InputTooLarge`` and nothing is written or recorded.
    """

    def __init__(
        self,
        history_file: str | Path | None = None,
        *,
        store: Store | None = None,
        audit_hmac_key: bytes | str | None = None,
        max_improvements_per_session: int = 5,
        improvement_window_s: float | None = None,
        max_improvements_per_window: int = 5,
        applied_by: str = "self-improver",
        recover: bool = True,
        lease_terms: LeaseTerms | None = None,
        host: HostIdentity | None = None,
        limits: InputLimits | None = None,
    ) -> None:
        if store is not None and history_file is not None:
            raise ConfigurationError("give history_file or store, not both")
        if improvement_window_s is not None and not improvement_window_s > 0:
            raise ConfigurationError(
                f"improvement_window_s must be > 0 or None, got {improvement_window_s}"
            )
        self._owns_store = store is None
        self.store = store if store is not None else Store(history_file or DEFAULT_HISTORY_FILE)
        self.history_file = self.store.path
        self.changes = ChangeLog(self.store)
        self.audit = AuditLog(self.store, hmac_key=audit_hmac_key)
        self.lease_terms = lease_terms if lease_terms is not None else LeaseTerms()
        self.leases = Leases(self.store)
        self.protocol = ChangeProtocol(
            self.store,
            self.changes,
            self.audit,
            leases=self.leases,
            host=host,
            terms=self.lease_terms,
        )
        self.session_id = uuid4().hex
        self.max_improvements_per_session = max_improvements_per_session
        self.session_improvement_count = 0
        self.improvement_window_s = improvement_window_s
        self.max_improvements_per_window = max_improvements_per_window
        self._applied_at: deque[float] = deque()  # wall-clock times of applied changes
        self.applied_by = applied_by
        self._default_author: ChangeAuthor | None = None
        self.limits = limits if limits is not None else InputLimits()
        self._count_lock = threading.Lock()
        if recover:
            self.recover()

    def close(self) -> None:
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> ImprovementManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _count(self, n: int) -> None:
        now = time.time()
        with self._count_lock:
            self.session_improvement_count += n
            self._applied_at.extend([now] * n)

    def _in_window(self, now: float) -> int:
        """Changes applied in the rolling window ending at ``now`` (drops older ones)."""
        assert self.improvement_window_s is not None
        with self._count_lock:
            while self._applied_at and self._applied_at[0] <= now - self.improvement_window_s:
                self._applied_at.popleft()
            return len(self._applied_at)

    def improvements_left(self) -> int:
        """How many more changes the budget allows now (session or rolling window)."""
        if self.improvement_window_s is None:
            return self.max_improvements_per_session - self.session_improvement_count
        return self.max_improvements_per_window - self._in_window(time.time())

    def budget_frees_up_at(self) -> datetime | None:
        """When the rolling budget allows another change; None when it allows one now.

        Always None for the session budget, which never frees up within the session.
        """
        if self.improvement_window_s is None or self.improvements_left() > 0:
            return None
        with self._count_lock:
            # the oldest change that must age out for one more to fit
            index = len(self._applied_at) - self.max_improvements_per_window
            oldest = self._applied_at[max(index, 0)] if self._applied_at else time.time()
        return datetime.fromtimestamp(oldest + self.improvement_window_s, UTC)

    def _author(self, author: ChangeAuthor | None) -> ChangeAuthor:
        """``author`` (nobody named when None), made by this manager's ``applied_by`` unless
        it names its own ``via``."""
        if author is not None:
            return author.via_or(self.applied_by)
        default = self._default_author  # made once, not per apply (while applied_by stays)
        if default is None or default.via != self.applied_by:
            default = self._default_author = ChangeAuthor(via=self.applied_by)
        return default

    # -- the long-standing API ---------------------------------------------------------------

    @property
    def history(self) -> list[ChangeRecord]:
        """The changes made through this manager, oldest first, as the store holds them now."""
        return [row.record for row in self.changes.by_session(self.session_id)]

    def log_change(
        self,
        action: ImprovementAction,
        status: ChangeStatus = ChangeStatus.APPLIED,
        verification_result: dict[str, Any] | None = None,
        *,
        author: ChangeAuthor | None = None,
    ) -> str:
        """Record a change made elsewhere (no file behind it); returns its id.

        One INSERT, plus an audit row when the change counts as applied. Such a change rolls
        back as a status change only.
        """
        self.limits.action(action)
        change_id = ChangeLog.new_id()
        author = self._author(author)
        # Only a change that counts as applied is refused over a broken audit head.
        with self.audit.transaction(safety=status not in _COUNTS_AS_APPLIED) as txn:
            self.changes.insert(
                txn.conn,
                change_id=change_id,
                action=action,
                status=status,
                applied_by=author.applied_by,
                session_id=self.session_id,
                created=utc_now(),
                verification=verification_result,
            )
            if status in _COUNTS_AS_APPLIED:
                txn.append(
                    agent_name=action.target_agent,
                    edit_type=action.action_type.value,
                    old_value=action.old_value,
                    new_value=action.new_value,
                    user_id=author.audit_user(author.applied_by),
                    user_name=author.user_name,
                    change_id=change_id,
                )
        if status in _COUNTS_AS_APPLIED:
            self._count(1)
        return change_id

    def rollback_last(
        self,
        *,
        reason: str = "manual_rollback",
        force: bool = False,
        cascade: bool = False,
        author: ChangeAuthor | None = None,
    ) -> ChangeRecord | None:
        """Roll back the newest APPLIED change (KEPT ones only by id); None if there is none."""
        for _ in range(10):  # another process may roll the same change back first
            row = self.changes.latest_applied()
            if row is None:
                return None
            if self._rollback(row, reason, force, cascade, author):
                return self.get_change(row.change_id)
        return None

    def rollback_by_id(
        self,
        change_id: str,
        *,
        reason: str = "manual_rollback_by_id",
        force: bool = False,
        cascade: bool = False,
        author: ChangeAuthor | None = None,
    ) -> bool:
        """Roll back one change (and its whole group); False if unknown or not APPLIED/KEPT.

        Raises:
            RollbackConflict: a file changed since the change (``force`` overwrites it, after
                backing it up) or later live changes build on it (``cascade`` rolls them back
                too, newest first).
        """
        row = self.changes.get(change_id)
        return row is not None and self._rollback(row, reason, force, cascade, author)

    def rollback_unproven(
        self,
        change_id: str,
        *,
        reason: str,
        author: ChangeAuthor | None = None,
        lease: str | None = None,
    ) -> PartialRollback:
        """Undo a group that was not proven, except what someone edited since the apply.

        Agent by agent (an agent's files stay together): an agent whose files still hold what
        the change wrote gets its old bytes back (ROLLED_BACK); an agent with a file edited
        since keeps its files as they are, its changes become FAILED with ``rollback_info``
        saying why (``needs_attention``, ``left_unchanged``, ``edited_since_apply``,
        ``conflict``) and a ``rollback_blocked`` audit row. All of it under the root's lock;
        see ``agentmend.infrastructure.changes.protocol.steps``. Nothing happens when ``change_id``
        is unknown or no longer APPLIED or KEPT (an empty result).

        ``lease`` is the verifying owner's lease, released with the rollback's intent.

        Raises:
            LeaseLost: ``lease`` is no longer held: recovery settled the change; nothing is
                written.
            AgentmendError: the store or a file failed; what committed stays so, and the next
                open completes an interrupted restore.
        """
        if lease is not None:
            self.leases.require_held(lease)
        row = self.changes.get(change_id)
        if row is None or row.status not in LIVE_STATUSES:
            return PartialRollback()
        author = self._author(author)
        if row.root is None:  # logged only: nothing on disk that someone could have edited
            done = self._rollback_logged(row, reason, author)
            agent = row.record.action.target_agent
            return (
                PartialRollback((change_id,), rolled_back_agents=(agent,))
                if done
                else PartialRollback()
            )
        return self.protocol.rollback_unproven(row, reason, author=author, lease_id=lease)

    def rollback_closure(self, change_id: str) -> list[ChangeRow]:
        """The changes a cascade rollback of ``change_id`` would undo now, newest first.

        Its live group plus every live change built on its files (with their groups), in the
        order a cascade undoes them; empty when the change is no longer APPLIED or KEPT. A
        rollback without ``cascade`` undoes just the group, or is refused when this holds more.

        Raises:
            ChangeNotFound: ``change_id`` is unknown.
        """
        row = self._require(change_id)
        if row.status not in LIVE_STATUSES:
            return []
        return self.changes.live_closure(self.changes.live_group(row))[::-1]

    def get_history(self, agent_name: str | None = None, limit: int = 50) -> list[ChangeRecord]:
        """The newest ``limit`` changes of the durable history, oldest first."""
        return [row.record for row in self.changes.history(agent_name, limit)]

    def get_change(self, change_id: str) -> ChangeRecord | None:
        row = self.changes.get(change_id)
        return row.record if row else None

    def can_make_improvement(self) -> tuple[bool, str]:
        """(allowed, reason): the session budget, then recent rollbacks in the durable history."""
        if self.improvement_window_s is None:
            if self.session_improvement_count >= self.max_improvements_per_session:
                return False, f"Max improvements ({self.max_improvements_per_session}) reached"
        else:
            frees_up_at = self.budget_frees_up_at()
            if frees_up_at is not None:
                return False, (
                    f"Max improvements ({self.max_improvements_per_window} per "
                    f"{_duration(self.improvement_window_s)}) reached; the budget frees up at "
                    f"{frees_up_at:%Y-%m-%d %H:%M:%S} UTC"
                )
        recent = self.changes.recent_statuses(5)
        if sum(1 for s in recent if s is ChangeStatus.ROLLED_BACK) >= 3:
            return False, "Too many recent rollbacks (3+ in last 5 changes)"
        return True, "OK"

    def get_statistics(self) -> dict[str, Any]:
        """Counts over the durable history; ``success_rate`` = (applied + kept) / total."""
        by_status, by_agent = self.changes.statistics()
        total = sum(by_status.values())
        applied = by_status.get(ChangeStatus.APPLIED, 0)
        kept = by_status.get(ChangeStatus.KEPT, 0)
        return {
            "total_changes": total,
            "applied": applied,
            "kept": kept,
            "rolled_back": by_status.get(ChangeStatus.ROLLED_BACK, 0),
            "failed": by_status.get(ChangeStatus.FAILED, 0),
            "pending": by_status.get(ChangeStatus.PENDING, 0),
            "success_rate": (applied + kept) / total if total else 0,
            "by_agent": by_agent,
            "session_count": self.session_improvement_count,
        }

    def verify_audit_chain(
        self, *, repair: bool = True, head_wait_s: float | None = None
    ) -> ChainVerification:
        """See :meth:`AuditLog.verify_chain`."""
        return self.audit.verify_chain(repair=repair, head_wait_s=head_wait_s)

    def acknowledge_audit_breaks(
        self, principal: Principal, *, note: str | None = None
    ) -> AuditEntry | None:
        """An administrator acknowledges the audit chain's breaks; see ``AuditLog``."""
        return self.audit.acknowledge_breaks(principal, note=note)

    # -- state changes without files -------------------------------------------------------

    def _require(self, change_id: str) -> ChangeRow:
        row = self.changes.get(change_id)
        if row is None:
            raise ChangeNotFound(change_id)
        return row

    def mark_kept(
        self,
        change_id: str,
        verification_result: dict[str, Any] | None = None,
        *,
        lease: str | None = None,
    ) -> ChangeRecord:
        """APPLIED -> KEPT (the whole group): verification showed the change helped.

        Args:
            lease: the verifying owner's lease, released in the same transaction.

        Raises:
            LeaseLost: ``lease`` is no longer held: recovery settled the change; nothing is
                written.
            AuditChainBroken: the audit head and the database disagree; nothing changes.
        """
        with self.audit.transaction() as txn:  # refused over a broken audit head
            if lease is not None:
                self.leases.release(txn.conn, lease, "kept")
            row = self._require(change_id)
            if row.status is not ChangeStatus.APPLIED:
                raise ChangeStateError(change_id, row.status.value, "kept")
            members = [m.change_id for m in self.changes.live_group(row)]
            self.changes.set_status(
                txn.conn, members, ChangeStatus.KEPT, verification=verification_result
            )
        return self._require(change_id).record

    def mark_applied(self, change_id: str) -> ChangeRecord:
        """PENDING -> APPLIED for a change logged as PENDING (no file behind it)."""
        with self.audit.transaction() as txn:
            row = self._require(change_id)
            if row.status is not ChangeStatus.PENDING or row.root is not None:
                raise ChangeStateError(change_id, row.status.value, "applied")
            self.changes.set_status(txn.conn, [change_id], ChangeStatus.APPLIED)
            action = row.record.action
            txn.append(
                agent_name=action.target_agent,
                edit_type=action.action_type.value,
                old_value=action.old_value,
                new_value=action.new_value,
                user_id=row.record.applied_by,
                change_id=change_id,
            )
        if any(r.change_id == change_id for r in self.changes.by_session(self.session_id)):
            self._count(1)
        return self._require(change_id).record

    def mark_failed(self, change_id: str, reason: str = "failed") -> ChangeRecord:
        """PENDING -> FAILED for a logged change; an applied one must be rolled back instead."""
        with self.store.transaction(durable=True) as conn:
            row = self._require(change_id)
            if row.status is not ChangeStatus.PENDING or row.root is not None:
                problem = "roll it back instead" if row.status in LIVE_STATUSES else ""
                if row.root is not None and row.status is ChangeStatus.PENDING:
                    problem = "it is being applied; recovery settles it"
                raise ChangeStateError(change_id, row.status.value, "failed", problem)
            info = {"reason": reason, "time": utc_now().isoformat()}
            self.changes.set_status(conn, [change_id], ChangeStatus.FAILED, rollback_info=info)
        return self._require(change_id).record

    # -- apply -----------------------------------------------------------------------------

    def apply(
        self,
        action: ImprovementAction,
        *,
        path: str | Path,
        new_content: Content,
        root: str | Path,
        author: ChangeAuthor | None = None,
        lease: str | None = None,
    ) -> ChangeRecord:
        """Change one file under ``root`` and log it (``new_content=None`` deletes it).

        Without ``lease`` the change is simply in force (APPLIED) and recovery never undoes
        it. With the lease of a :meth:`hold_lease` it is live but not yet proven: its owner
        keeps (``mark_kept``) or undoes (``rollback_unproven``) it, and if the owner goes
        first recovery undoes it.

        Raises:
            PathNotAllowed: ``path`` leaves ``root``, is a directory or lies in ``.agent/``;
                nothing is written or recorded.
            LeaseLost: ``lease`` is no longer held; nothing is written or recorded.
        """
        entry = (action, path, new_content)
        return self._apply([entry], root, None, author, lease)[0]

    def apply_group(
        self,
        actions_and_files: Sequence[FileEntry],
        *,
        root: str | Path,
        author: ChangeAuthor | None = None,
        lease: str | None = None,
    ) -> list[ChangeRecord]:
        """Apply several file changes as one group that commits or rolls back whole.

        ``lease``: as for :meth:`apply`, the group is then live but not yet proven.
        """
        if not actions_and_files:
            raise ConfigurationError("apply_group needs at least one change")
        group_id = "g-" + ChangeLog.new_id()
        return self._apply(actions_and_files, root, group_id, author, lease)

    def _apply(
        self,
        entries: Sequence[FileEntry],
        root: str | Path,
        group_id: str | None,
        author: ChangeAuthor | None,
        lease: str | None,
    ) -> list[ChangeRecord]:
        self.limits.files("change group", entries)
        self.limits.contents("change group", [content for _, _, content in entries])
        for action, _, _ in entries:
            self.limits.action(action)
        records = self.protocol.apply(
            entries,
            root,
            group_id=group_id,
            session_id=self.session_id,
            author=self._author(author),
            lease_id=lease,
        )
        self._count(len(records))
        return records

    # -- rollback --------------------------------------------------------------------------

    def _rollback(
        self,
        row: ChangeRow,
        reason: str,
        force: bool,
        cascade: bool,
        author: ChangeAuthor | None,
    ) -> bool:
        self.limits.text("reason", reason)
        if row.status not in LIVE_STATUSES:
            return False
        author = self._author(author)
        if row.root is None:
            return self._rollback_logged(row, reason, author)
        return self.protocol.rollback(row, reason, force=force, cascade=cascade, author=author)

    def _rollback_logged(self, row: ChangeRow, reason: str, author: ChangeAuthor) -> bool:
        with self.audit.transaction(safety=True) as txn:
            fresh = self.changes.get(row.change_id)
            if fresh is None or fresh.status not in LIVE_STATUSES:
                return False
            info = {
                "rollback_time": utc_now().isoformat(),
                "reason": reason,
                "restored": [],
                "note": "logged only: no file was changed, so only the status changed",
            }
            self.changes.set_status(
                txn.conn, [row.change_id], ChangeStatus.ROLLED_BACK, rollback_info=info
            )
            action = row.record.action
            txn.append(
                agent_name=action.target_agent,
                edit_type="rollback",
                old_value=action.new_value,
                new_value=action.old_value,
                user_id=author.audit_user(row.record.applied_by),
                user_name=author.user_name,
                change_id=row.change_id,
            )
        return True

    # -- ownership and recovery ------------------------------------------------------------

    def hold_lease(self) -> LeaseKeeper:
        """A lease owned by this process, renewed from a thread until the keeper is stopped.

        Pass its ``lease_id`` to ``apply``/``apply_group`` and to ``mark_kept`` or
        ``rollback_unproven``; use the keeper as a context manager around the verification.
        """
        return LeaseKeeper(self.leases, self.lease_terms)

    def release_lease(self, lease: str, reason: str) -> bool:
        """Release ``lease`` after its owner settled its changes some other way; False if lost.

        For an owner that undid its changes with a plain rollback (``rollback_by_id``) while
        holding the root's lock, so no recovery could interleave.
        """
        try:
            with self.store.transaction(durable=True) as conn:
                self.leases.release(conn, lease, reason)
        except LeaseLost:
            return False
        return True

    def recover(self) -> list[ChangeRecord]:
        """Settle the work crashed processes left unfinished; returns the changes settled."""
        return self.protocol.recover()


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        hours = int(seconds // 3600)
        return "hour" if hours == 1 else f"{hours} hours"
    if seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"
