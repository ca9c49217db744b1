"""Recovering the work a dead process left unfinished on a root (see the protocol's docstring).

An interrupted apply is rolled back whole and its changes become FAILED; an interrupted rollback
is completed. The caller holds the root's lock, which is what makes "the owner is gone" certain:
the owner held the same lock, and the kernel drops it when the owner dies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentmend.infrastructure.changes.protocol.change_log import ChangeLog, ChangeRow
from agentmend.infrastructure.changes.protocol.files import backups_dir, sha
from agentmend.infrastructure.changes.protocol.rollback import Rollbacks
from agentmend.infrastructure.changes.protocol.team_registry import team_guard
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.models import ChangeRecord, ChangeStatus, utc_now
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["Recovery"]

log = get_logger(__name__)


class Recovery:
    """Settles the unfinished changes of one store; like the protocol, it keeps no state."""

    def __init__(self, store: Store, changes: ChangeLog, rollbacks: Rollbacks) -> None:
        self.store, self.changes, self.rollbacks = store, changes, rollbacks

    def recover(self) -> list[ChangeRecord]:
        """Settle the work crashed processes left unfinished; returns the changes settled."""
        settled: list[ChangeRecord] = []
        for root_text in self.changes.unfinished_roots():
            root = Path(root_text)
            if not root.is_dir():
                log.warning("recovery_root_missing", root=root_text)
                continue
            with team_guard(self.store, root):
                settled.extend(self.recover_root(root))
        return settled

    def recover_root(self, root: Path, reason: str = "interrupted") -> list[ChangeRecord]:
        """Settle ``root``'s unfinished changes; the caller holds the root's lock."""
        rows = self.changes.unfinished(str(root))
        if not rows:
            return []
        rolling = [r for r in rows if r.rollback_pending is not None]
        if rolling:
            request = rolling[0].rollback_pending or {}
            files = self.changes.files([r.change_id for r in rolling])
            self.rollbacks.finish(root, rolling, files, request, recovered=True)
        pending = [r for r in rows if r.rollback_pending is None]
        if pending:
            self._undo_interrupted(root, pending, reason)
        log.warning("recovered_unfinished_changes", root=str(root), count=len(rows))
        return [fresh.record for r in rows if (fresh := self.changes.get(r.change_id)) is not None]

    def settle_after_apply_error(self, root: Path, error: Exception) -> None:
        """Undo an apply that failed before it was acknowledged, now rather than on next open.

        If the store itself is failing this fails too; the original error is what the caller
        raises, and reopening retries the recovery.
        """
        try:
            self.recover_root(root, reason=f"apply failed: {type(error).__name__}: {error}")
        except Exception as exc:  # the original error matters more; reopening retries
            log.error("recovery_after_error_failed", root=str(root), error=str(exc))

    def settle_rollback_after_error(self, root: Path, change_id: str, error: Exception) -> bool:
        """Finish a rollback whose files may be restored but whose status did not commit.

        The recorded intent makes the change unfinished, so recovery completes it: now if the
        store works again (a passing error), else on the next open or the next apply or
        rollback on ``root``. True when the change is ROLLED_BACK now.
        """
        log.error(
            "rollback_incomplete",
            change_id=change_id,
            root=str(root),
            error=f"{type(error).__name__}: {error}",
        )
        try:
            self.recover_root(root)
        except Exception as exc:  # the original error matters more; reopening retries
            log.error("recovery_after_error_failed", root=str(root), error=str(exc))
            return False
        fresh = self.changes.get(change_id)
        return fresh is not None and fresh.status is ChangeStatus.ROLLED_BACK

    def _undo_interrupted(self, root: Path, rows: list[ChangeRow], reason: str) -> None:
        """Roll interrupted applies back whole; their backups go too (they never happened)."""
        restored: dict[str, list[str]] = {}
        left: dict[str, list[str]] = {}
        for file in self.changes.files([r.change_id for r in rows]):
            target = Path(file.path)
            current = sha(confined.read(root, target))
            if current == file.new_sha256 and current != file.old_sha256:
                confined.write_or_delete(root, target, file.old_bytes)
                restored.setdefault(file.change_id, []).append(file.path)
            elif current != file.old_sha256:
                left.setdefault(file.change_id, []).append(file.path)
            confined.remove_leftovers(root, target)
        for row in rows:
            confined.remove_named(root, backups_dir(root), f"_{row.change_id}.bak")
        now = utc_now().isoformat()
        with self.store.transaction(durable=True) as conn:
            for row in rows:
                info: dict[str, Any] = {
                    "reason": reason,
                    "rollback_time": now,
                    "restored": restored.get(row.change_id, []),
                }
                if row.change_id in left:
                    info["left_unchanged"] = left[row.change_id]
                    info["note"] = "changed outside agentmend since; left as it is"
                self.changes.set_status(
                    conn, [row.change_id], ChangeStatus.FAILED, rollback_info=info
                )
