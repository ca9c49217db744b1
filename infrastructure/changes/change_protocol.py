"""The crash-safe protocol that changes files under a root and puts their old bytes back.

:class:`~infrastructure.changes.improvement_manager.ImprovementManager` is the API; this module is
what makes its file changes safe to kill at any instant. Every step that touches a root runs under
an exclusive ``flock`` on ``<root>/.agent/agentmend.lock``, held from the hash check to the last
write so two processes (or threads) never interleave on a root's files.

Apply
-----
1. finish any unfinished work a dead process left on this root (see recovery);
2. read each file's old bytes and hash;
3. record the intent: the changes as PENDING with the old bytes, committed and synced;
4. write a human backup ``<root>/.agent/backups/<path>_<time>_<change id>.bak`` (seed 001);
5. write the new bytes with ``files.atomic_write`` (or ``atomic_delete``);
6. mark the changes APPLIED and append their audit rows in one synced transaction.

An apply returns only after step 6, so an acknowledged change is APPLIED on disk and is never
lost. A rollback follows the same pattern: check, record the rollback intent, restore, mark
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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from infrastructure.changes.audit import AuditLog, AuditTransaction
from infrastructure.changes.change_log import ChangeLog, ChangeRow, StoredFile
from infrastructure.errors import PathNotAllowed, RollbackConflict
from infrastructure.files import (
    atomic_write,
    atomic_write_or_delete,
    locked_file,
    read_if_exists,
    remove_atomic_write_leftovers,
    resolve_inside,
    sha256_bytes,
)
from infrastructure.models import ChangeRecord, ChangeStatus, FileChange, ImprovementAction, utc_now
from infrastructure.store import Store

__all__ = ["LIVE_STATUSES", "ChangeProtocol", "Content", "FileEntry", "PartialRollback"]

log = structlog.get_logger(__name__)

LIVE_STATUSES = (ChangeStatus.APPLIED, ChangeStatus.KEPT)
"""The statuses of a change whose content is in force, and so can be rolled back."""

Content = bytes | str | None
"""A file's new content: text is written as UTF-8, None deletes the file."""

FileEntry = tuple[ImprovementAction, str | Path, Content]
"""One file of an apply: the action it carries out, its path under the root, its new content."""

_AGENT_DIR = ".agent"


@dataclass(frozen=True)
class PartialRollback:
    """What a rollback of an unproven group did (see the module docstring).

    Attributes:
        rolled_back: the changes whose files got their old bytes back (ROLLED_BACK).
        blocked: the changes left in place because a file of their agent was edited since the
            apply, or the rollback could not restore them (FAILED, needing attention).
        left: every file of ``blocked``, left as it is now.
        edited: the files of the group someone edited since the apply.
        rolled_back_agents: the agents of ``rolled_back``; ``blocked_agents``: of ``blocked``.
        conflict: why ``left`` could not be restored (None when nothing was blocked).
    """

    rolled_back: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    edited: tuple[str, ...] = ()
    rolled_back_agents: tuple[str, ...] = ()
    blocked_agents: tuple[str, ...] = ()
    conflict: str | None = None


class _PreparedFile:
    """One file of an apply, validated before anything is written; step 2 fills ``old``."""

    def __init__(self, action: ImprovementAction, target: Path, rel: str, new: bytes | None):
        self.action, self.target, self.rel, self.new = action, target, rel, new
        self.change_id = ChangeLog.new_id()
        self.old: bytes | None = None
        self.seq = 0

    def stored(self) -> StoredFile:
        return StoredFile(
            self.change_id, self.seq, str(self.target), self.rel, _sha(self.old), _sha(self.new),
            self.old,
        )  # fmt: skip


def _prepare(entries: Sequence[FileEntry], root: str | Path) -> list[_PreparedFile]:
    """Check every target before anything is written, so bad input leaves no trace."""
    root_path = Path(root).resolve()
    if not root_path.is_dir():
        raise PathNotAllowed(root, root_path, "the root is not an existing directory")
    items: list[_PreparedFile] = []
    seen: set[Path] = set()
    for action, path, content in entries:
        target = resolve_inside(root_path, path)
        rel = target.relative_to(root_path)
        if target == root_path or target.is_dir():
            raise PathNotAllowed(path, root_path, "it is a directory")
        blocked = next((d for d in target.parents if d.exists() and not d.is_dir()), None)
        if blocked is not None:
            raise PathNotAllowed(path, root_path, f"{blocked} is a file, not a directory")
        if rel.parts[0] == _AGENT_DIR:
            raise PathNotAllowed(path, root_path, "'.agent/' is reserved for agentmend")
        if target in seen:
            raise PathNotAllowed(path, root_path, "it appears twice in one group")
        seen.add(target)
        data = content.encode("utf-8") if isinstance(content, str) else content
        items.append(_PreparedFile(action, target, rel.as_posix(), data))
    return items


class ChangeProtocol:
    """Applies, rolls back and recovers file changes of one store; see the module docstring.

    The caller owns the objects passed in; this class keeps no state of its own, so any
    number of them (in any number of processes) can work on one store and one root.
    """

    def __init__(self, store: Store, changes: ChangeLog, audit: AuditLog) -> None:
        self.store, self.changes, self.audit = store, changes, audit

    # -- apply -----------------------------------------------------------------------------

    def apply(
        self,
        entries: Sequence[FileEntry],
        root: str | Path,
        *,
        group_id: str | None,
        session_id: str,
        applied_by: str,
        user_id: str | None,
        user_name: str | None,
    ) -> list[ChangeRecord]:
        """Steps 1 to 6 for ``entries``, all under ``root``; one APPLIED record per file.

        Raises:
            PathNotAllowed: a path leaves ``root``, is a directory, lies in ``.agent/`` or
                appears twice, or ``root`` is not an existing directory; nothing is written
                or recorded.
        """
        items = _prepare(entries, root)
        root = Path(root).resolve()
        with locked_file(_lock_path(root)):
            self._recover_root(root)
            for item in items:
                item.old = read_if_exists(item.target)
            created = utc_now()
            with self.store.transaction(durable=True) as conn:
                for item in items:
                    item.seq = self.changes.insert(
                        conn,
                        change_id=item.change_id,
                        action=item.action,
                        status=ChangeStatus.PENDING,
                        applied_by=applied_by,
                        session_id=session_id,
                        created=created,
                        group_id=group_id,
                        root=str(root),
                    )
                    self.changes.insert_file(conn, item.stored())
            try:
                for item in items:
                    if item.old is not None:
                        _backup(root, item.rel, item.change_id, item.old, created)
                for item in items:
                    atomic_write_or_delete(item.target, item.new)
                with self.audit.transaction() as txn:
                    self.changes.set_status(
                        txn.conn, [i.change_id for i in items], ChangeStatus.APPLIED
                    )
                    for item in items:
                        txn.append(
                            agent_name=item.action.target_agent,
                            edit_type=item.action.action_type.value,
                            old_value=_describe(item.action.old_value, item.old),
                            new_value=_describe(item.action.new_value, item.new),
                            user_id=user_id or applied_by,
                            user_name=user_name,
                            change_id=item.change_id,
                        )
            except Exception as exc:
                # Not acknowledged: put back what was written and mark it FAILED now rather
                # than on the next open (if the store itself is failing, reopening does it).
                self._settle_after_error(root, exc)
                raise
        return [
            ChangeRecord(
                change_id=item.change_id,
                timestamp=created,
                action=item.action,
                status=ChangeStatus.APPLIED,
                applied_by=applied_by,
                group_id=group_id,
                files=(FileChange(path=str(item.target), old_sha256=_sha(item.old),
                                  new_sha256=_sha(item.new)),),
            )
            for item in items
        ]  # fmt: skip

    def _settle_after_error(self, root: Path, error: Exception) -> None:
        try:
            self._recover_root(root, reason=f"apply failed: {type(error).__name__}: {error}")
        except Exception as exc:  # the original error matters more; reopening retries
            log.error("recovery_after_error_failed", root=str(root), error=str(exc))

    # -- rollback --------------------------------------------------------------------------

    def rollback(
        self,
        row: ChangeRow,
        reason: str,
        *,
        force: bool,
        cascade: bool,
        user_id: str | None,
        user_name: str | None,
    ) -> bool:
        """Restore the files of ``row`` (a change with a root); False if it is no longer live.

        Raises:
            RollbackConflict: a file changed since (unless ``force``) or later live changes
                build on it (unless ``cascade``).
        """
        assert row.root is not None, "a change without files rolls back as a status change"
        root = Path(row.root)
        with locked_file(_lock_path(root)):
            self._recover_root(root)
            fresh = self.changes.get(row.change_id)
            if fresh is None or fresh.status not in LIVE_STATUSES:
                return False
            group = self.changes.live_group(fresh)
            selected = {m.change_id: m for m in self.changes.live_closure(group)}
            own = {m.change_id for m in group}
            dependents = tuple(c for c in selected if c not in own)
            files = self.changes.files(list(selected))
            if dependents and not cascade:
                raise RollbackConflict(
                    row.change_id,
                    f"later changes build on it ({', '.join(dependents)}); use cascade=True",
                    paths=tuple(sorted({f.path for f in files})),
                    dependents=dependents,
                )
            targets = _targets(files)
            changed = tuple(
                p
                for p, (_, expected, _) in targets.items()
                if _sha(read_if_exists(Path(p))) != expected
            )
            if changed and not force:
                raise RollbackConflict(
                    row.change_id, "files changed since it was applied; use force=True",
                    paths=changed,
                )  # fmt: skip
            request = {
                "reason": reason,
                "requested": row.change_id,
                "forced": force,
                "user_id": user_id,
                "user_name": user_name,
            }
            with self.store.transaction(durable=True) as conn:
                self.changes.mark_rolling_back(conn, selected, request)
            try:
                self._finish_rollback(root, [selected[c] for c in selected], files, request)
            except Exception as exc:
                if not self._settle_rollback_after_error(root, row.change_id, exc):
                    raise
        log.info("rolled_back_change", change_id=row.change_id, cascade=list(dependents))
        return True

    def rollback_unproven(
        self, row: ChangeRow, reason: str, *, user_id: str | None, user_name: str | None
    ) -> PartialRollback:
        """Undo ``row``'s live group except the agents with a file edited since the apply.

        An empty result when the change is no longer live (settled meanwhile).

        Raises:
            AgentmendError: the store or a file failed; what committed stays so, and recovery
                completes the restore on the next open (or apply or rollback on the root).
        """
        assert row.root is not None, "a change without files rolls back as a status change"
        root = Path(row.root)
        with locked_file(_lock_path(root)):
            self._recover_root(root)
            fresh = self.changes.get(row.change_id)
            if fresh is None or fresh.status not in LIVE_STATUSES:
                return PartialRollback()
            members = self.changes.live_group(fresh)
            edited = {
                f.path
                for f in self.changes.files([m.change_id for m in members])
                if _sha(read_if_exists(Path(f.path))) != f.new_sha256
            }
            left = {_agent(m) for m in members if any(f.path in edited for f in m.record.files)}
            rest = [m for m in members if _agent(m) not in left]
            conflict = _edited_conflict(edited) if edited else None
            files: list[StoredFile] = []
            if rest:
                try:
                    files = self._restorable(rest, {m.change_id for m in members})
                except RollbackConflict as exc:  # not explained by the hashes: leave them all
                    conflict, rest = str(exc), []
                    left = {_agent(m) for m in members}
            blocked = [m for m in members if _agent(m) in left]
            request = {
                "reason": reason,
                "requested": rest[0].change_id if rest else row.change_id,
                "forced": False,
                "user_id": user_id,
                "user_name": user_name,
            }
            with self.audit.transaction() as txn:
                self._mark_blocked(txn, blocked, reason, edited, conflict, user_id, user_name)
                self.changes.mark_rolling_back(txn.conn, [m.change_id for m in rest], request)
            if rest:
                try:
                    self._finish_rollback(root, rest, files, request)
                except Exception as exc:
                    if not self._settle_rollback_after_error(root, rest[0].change_id, exc):
                        raise
        log.info(
            "rolled_back_unproven_change",
            change_id=row.change_id,
            rolled_back=[m.change_id for m in rest],
            blocked=[m.change_id for m in blocked],
        )
        return PartialRollback(
            rolled_back=tuple(m.change_id for m in rest),
            blocked=tuple(m.change_id for m in blocked),
            left=tuple(f.path for m in blocked for f in m.record.files),
            edited=tuple(sorted(edited)),
            rolled_back_agents=tuple(dict.fromkeys(map(_agent, rest))),
            blocked_agents=tuple(dict.fromkeys(map(_agent, blocked))),
            conflict=conflict if blocked else None,
        )

    def _restorable(self, rest: list[ChangeRow], group: set[str]) -> list[StoredFile]:
        """The files that restore ``rest``, checked as a rollback checks them.

        Raises:
            RollbackConflict: later live changes build on them, or their stored old bytes
                fail their hash.
        """
        dependents = tuple(
            m.change_id for m in self.changes.live_closure(rest) if m.change_id not in group
        )
        files = self.changes.files([m.change_id for m in rest])
        if dependents:
            raise RollbackConflict(
                rest[0].change_id,
                f"later changes build on it ({', '.join(dependents)})",
                paths=tuple(sorted({f.path for f in files})),
                dependents=dependents,
            )
        _targets(files)
        return files

    def _mark_blocked(
        self,
        txn: AuditTransaction,
        members: list[ChangeRow],
        reason: str,
        edited: set[str],
        conflict: str | None,
        user_id: str | None,
        user_name: str | None,
    ) -> None:
        """Live ``members`` -> FAILED with the conflict recorded, and an audit row each.

        FAILED, not left APPLIED: the change was not kept and must not look like one still
        being verified, or be picked by a later "roll back the last change"; the audit row says
        the rollback was blocked, so the trail shows the change was never undone.
        """
        stamp = utc_now().isoformat()
        for member in members:
            paths = [f.path for f in member.record.files]
            info = {
                "reason": reason,
                "rollback_time": stamp,
                "restored": [],
                "needs_attention": True,
                "left_unchanged": paths,
                "edited_since_apply": [path for path in paths if path in edited],
                "conflict": conflict,
                "note": "a file of this agent was edited after the change was applied; the "
                "rollback left its files as they are rather than overwrite that edit",
            }
            self.changes.set_status(
                txn.conn, [member.change_id], ChangeStatus.FAILED, rollback_info=info
            )
            action = member.record.action
            txn.append(
                agent_name=action.target_agent,
                edit_type="rollback_blocked",
                old_value=action.new_value,
                new_value=f"(left as edited since the change: {', '.join(paths)})",
                user_id=user_id or member.record.applied_by,
                user_name=user_name,
                change_id=member.change_id,
            )

    def _settle_rollback_after_error(self, root: Path, change_id: str, error: Exception) -> bool:
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
            self._recover_root(root)
        except Exception as exc:  # the original error matters more; reopening retries
            log.error("recovery_after_error_failed", root=str(root), error=str(exc))
            return False
        fresh = self.changes.get(change_id)
        return fresh is not None and fresh.status is ChangeStatus.ROLLED_BACK

    def _finish_rollback(
        self,
        root: Path,
        members: list[ChangeRow],
        files: list[StoredFile],
        request: dict[str, Any],
        *,
        recovered: bool = False,
    ) -> None:
        """Restore every file to its target, then mark ``members`` ROLLED_BACK with audit rows."""
        now = utc_now()
        replaced: dict[str, bytes | None] = {}
        targets = _targets(files)
        for path, (data, _, change_id) in targets.items():
            target = Path(path)
            current = replaced[path] = read_if_exists(target)
            if current is not None and _sha(current) != _sha(data):
                rel = target.relative_to(root).as_posix()
                _backup(root, rel, change_id, current, now, ".rolled-back")
            atomic_write_or_delete(target, data)
            if _sha(read_if_exists(target)) != _sha(data):
                raise RollbackConflict(change_id, f"{path} did not read back as restored")
            if recovered:
                remove_atomic_write_leftovers(target)
        by_change: dict[str, list[StoredFile]] = {}
        newest = {file.path: file.change_id for file in files}  # files are oldest first
        for file in files:
            by_change.setdefault(file.change_id, []).append(file)
        requested = request["requested"]
        own_group = _group_of(members, requested)
        with self.audit.transaction() as txn:
            for member in reversed(members):  # newest first, as a cascade undoes them
                action = member.record.action
                mine = by_change.get(member.change_id, [])
                own = member.change_id == requested or (
                    own_group is not None and member.record.group_id == own_group
                )
                info = {
                    "rollback_time": now.isoformat(),
                    "reason": request["reason"],
                    "restored": [f.path for f in mine],
                    "forced": request["forced"],
                    "requested": requested,
                    "cascade": not own,
                    "group_id": member.record.group_id,
                }
                if recovered:
                    info["recovered"] = True
                self.changes.set_status(
                    txn.conn, [member.change_id], ChangeStatus.ROLLED_BACK, rollback_info=info
                )
                txn.append(
                    agent_name=action.target_agent,
                    edit_type="rollback",
                    old_value=_describe(
                        action.new_value,
                        _undone_bytes(mine, newest, replaced, targets, member.change_id),
                        absent=not mine,
                    ),
                    new_value=_describe(
                        action.old_value, mine[0].old_bytes if mine else None, absent=not mine
                    ),
                    user_id=request.get("user_id") or member.record.applied_by,
                    user_name=request.get("user_name"),
                    change_id=member.change_id,
                )

    # -- recovery --------------------------------------------------------------------------

    def recover(self) -> list[ChangeRecord]:
        """Settle the work crashed processes left unfinished; returns the changes settled."""
        settled: list[ChangeRecord] = []
        for root_text in self.changes.unfinished_roots():
            root = Path(root_text)
            if not root.is_dir():
                log.warning("recovery_root_missing", root=root_text)
                continue
            with locked_file(_lock_path(root)):
                settled.extend(self._recover_root(root))
        return settled

    def _recover_root(self, root: Path, reason: str = "interrupted") -> list[ChangeRecord]:
        """Settle ``root``'s unfinished changes; the caller holds the root's lock."""
        rows = self.changes.unfinished(str(root))
        if not rows:
            return []
        rolling = [r for r in rows if r.rollback_pending is not None]
        if rolling:
            request = rolling[0].rollback_pending or {}
            files = self.changes.files([r.change_id for r in rolling])
            self._finish_rollback(root, rolling, files, request, recovered=True)
        pending = [r for r in rows if r.rollback_pending is None]
        if pending:
            self._undo_interrupted(root, pending, reason)
        log.warning("recovered_unfinished_changes", root=str(root), count=len(rows))
        return [fresh.record for r in rows if (fresh := self.changes.get(r.change_id)) is not None]

    def _undo_interrupted(self, root: Path, rows: list[ChangeRow], reason: str) -> None:
        """Roll interrupted applies back whole; their backups go too (they never happened)."""
        restored: dict[str, list[str]] = {}
        left: dict[str, list[str]] = {}
        for file in self.changes.files([r.change_id for r in rows]):
            target = Path(file.path)
            current = _sha(read_if_exists(target))
            if current == file.new_sha256 and current != file.old_sha256:
                atomic_write_or_delete(target, file.old_bytes)
                restored.setdefault(file.change_id, []).append(file.path)
            elif current != file.old_sha256:
                left.setdefault(file.change_id, []).append(file.path)
            remove_atomic_write_leftovers(target)
        backups = root / _AGENT_DIR / "backups"
        for row in rows:
            for stale in backups.glob(f"*_{row.change_id}.bak"):
                stale.unlink(missing_ok=True)
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


def _agent(row: ChangeRow) -> str:
    return row.record.action.target_agent


def _edited_conflict(edited: set[str]) -> str:
    return f"{', '.join(sorted(edited))} changed since it was applied"


def _lock_path(root: Path) -> Path:
    return root / _AGENT_DIR / "agentmend.lock"


def _sha(data: bytes | None) -> str | None:
    return None if data is None else sha256_bytes(data)


def _backup(
    root: Path, rel: str, change_id: str, data: bytes, when: datetime, tag: str = ""
) -> None:
    """Seed 001's human backup of the bytes about to be replaced.

    The path and change id are in the name, so two files or two changes in one second never
    collide. The backup is a hard link to the file, which the caller then replaces with
    ``atomic_write`` (a new inode), so the backup keeps the old bytes without a copy; it also
    makes the replace ten times cheaper on ext4, which otherwise frees the old blocks
    synchronously (~1 ms). A copy is written where links are not possible.
    """
    backups = root / _AGENT_DIR / "backups"
    name = f"{rel.replace('/', '__')}_{when.strftime('%Y%m%dT%H%M%S')}_{change_id}{tag}.bak"
    backups.mkdir(parents=True, exist_ok=True)
    try:
        os.link(root / rel, backups / name)
    except FileExistsError:
        pass  # a retried step (recovery) in the same second: keep the first backup
    except OSError:
        atomic_write(backups / name, data)


def _targets(files: list[StoredFile]) -> dict[str, tuple[bytes | None, str | None, str]]:
    """Per path: (bytes to restore, hash expected now, change to name in backups).

    ``files`` are in change order: the oldest change's old bytes are what the path held before
    any selected change; the newest change's new hash is what it holds if nothing else wrote.
    """
    out: dict[str, tuple[bytes | None, str | None, str]] = {}
    for file in files:
        if file.path in out:
            data, _, first = out[file.path]
            out[file.path] = (data, file.new_sha256, first)
        else:
            out[file.path] = (file.old_bytes, file.new_sha256, file.change_id)
    for path, (data, _, change_id) in out.items():
        if _sha(data) != next(f.old_sha256 for f in files if f.path == path):
            raise RollbackConflict(change_id, f"the stored old bytes of {path} fail their hash")
    return out


def _group_of(members: list[ChangeRow], change_id: str) -> str | None:
    for member in members:
        if member.change_id == change_id:
            return member.record.group_id
    return None


def _describe(value: Any, data: bytes | str | None, *, absent: bool = False) -> Any:
    """What the audit row shows: the action's value, else the file's text."""
    if value is not None or absent:
        return value
    if isinstance(data, str):
        return data
    return "(absent)" if data is None else data.decode("utf-8", errors="replace")


def _undone_bytes(
    mine: list[StoredFile],
    newest: dict[str, str],
    replaced: dict[str, bytes | None],
    targets: dict[str, tuple[bytes | None, str | None, str]],
    cid: str,
) -> bytes | str | None:
    """The content a rolled-back change had written, as far as it is still known."""
    if not mine:
        return None
    file = mine[0]
    if newest.get(file.path) == cid:
        current = replaced.get(file.path)
        restored = _sha(targets[file.path][0])
        # A rollback finished by recovery may find its files restored already: what it undid
        # is then known by hash only, not by the bytes it found.
        if _sha(current) != restored or restored == file.new_sha256:
            return current
    return "(absent)" if file.new_sha256 is None else f"(sha256 {file.new_sha256})"
