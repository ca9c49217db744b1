"""Rolling changes back: by id, with the changes that build on them, or an unproven group in part.

:class:`~agentmend.infrastructure.changes.protocol.steps.ChangeProtocol` holds the root's lock,
settles unfinished work and checks the change is still live before calling :class:`Rollbacks`; these
steps check the files, record the rollback's intent (so recovery can finish what a crash
interrupts) and restore the old bytes. See the protocol module's docstring for the rules, in
particular how ``rollback_unproven`` leaves an agent whose file was edited since the apply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmend.infrastructure.changes.audit.log import AuditLog, AuditTransaction
from agentmend.infrastructure.changes.protocol.change_log import ChangeLog, ChangeRow, StoredFile
from agentmend.infrastructure.changes.protocol.files import backup, describe, sha
from agentmend.infrastructure.errors import RollbackConflict
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.models import ChangeStatus, utc_now
from agentmend.infrastructure.principal import ChangeAuthor
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection

__all__ = ["LIVE_STATUSES", "PartialRollback", "RollbackPlan", "Rollbacks", "restore_targets"]

LIVE_STATUSES = (ChangeStatus.APPLIED, ChangeStatus.KEPT)
"""The statuses of a change whose content is in force, and so can be rolled back."""


@dataclass(frozen=True)
class PartialRollback:
    """What a rollback of an unproven group did (see the protocol module's docstring).

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


@dataclass(frozen=True)
class RollbackPlan:
    """A rollback whose intent is recorded: what :meth:`Rollbacks.finish` restores next.

    Attributes:
        members: the changes to roll back, oldest first (empty when nothing is restored).
        files: their stored files, oldest change first.
        request: the recorded intent (reason, requested change, forced, user).
        dependents: the later changes a cascade takes along.
    """

    members: list[ChangeRow]
    files: list[StoredFile]
    request: dict[str, Any]
    dependents: tuple[str, ...] = ()


class Rollbacks:
    """The rollback steps of one store; like the protocol, it keeps no state of its own."""

    def __init__(self, store: Store, changes: ChangeLog, audit: AuditLog) -> None:
        self.store, self.changes, self.audit = store, changes, audit

    def plan(
        self,
        change_id: str,
        fresh: ChangeRow,
        reason: str,
        *,
        force: bool,
        cascade: bool,
        author: ChangeAuthor,
    ) -> RollbackPlan:
        """Check a rollback of live ``fresh`` (and its group) and record its intent.

        Raises:
            RollbackConflict: a file changed since (unless ``force``) or later live changes
                build on it (unless ``cascade``); nothing is recorded.
        """
        group = self.changes.live_group(fresh)
        selected = {m.change_id: m for m in self.changes.live_closure(group)}
        own = {m.change_id for m in group}
        dependents = tuple(c for c in selected if c not in own)
        files = self.changes.files(list(selected))
        if dependents and not cascade:
            raise RollbackConflict(
                change_id,
                f"later changes build on it ({', '.join(dependents)}); use cascade=True",
                paths=tuple(sorted({f.path for f in files})),
                dependents=dependents,
            )
        targets = restore_targets(files)
        root = _root_of(fresh)
        changed = tuple(
            p for p, (_, expected, _) in targets.items() if sha(confined.read(root, p)) != expected
        )
        if changed and not force:
            raise RollbackConflict(
                change_id, "files changed since it was applied; use force=True", paths=changed
            )
        request = {
            "reason": reason,
            "requested": change_id,
            "forced": force,
            "user_id": author.user_id,
            "user_name": author.user_name,
        }
        with self.store.transaction(durable=True) as conn:
            self.changes.mark_rolling_back(conn, selected, request)
        return RollbackPlan(list(selected.values()), files, request, dependents)

    def plan_unproven(
        self,
        change_id: str,
        fresh: ChangeRow,
        reason: str,
        *,
        author: ChangeAuthor,
        settle_as: ChangeStatus = ChangeStatus.ROLLED_BACK,
        release: Callable[[StoreConnection], None] | None = None,
    ) -> tuple[RollbackPlan, PartialRollback]:
        """Split live ``fresh``'s group into agents to restore and agents to leave as edited.

        The blocked changes become FAILED and the rollback's intent is recorded in one
        transaction, before any file is restored; the result says what the rollback will have
        done once :meth:`finish` restores the plan's members.

        Args:
            author: who the rollback is made for (their user in the request and audit rows).
            settle_as: the status the restored changes end in: ROLLED_BACK when the owner
                undoes its unproven change, FAILED when recovery settles an owner's
                interrupted one.
            release: called first inside that transaction (the owner's lease is released
                there, or the transaction fails with ``LeaseLost`` and nothing is recorded).
        """
        members = self.changes.live_group(fresh)
        root = _root_of(fresh)
        edited = {
            f.path
            for f in self.changes.files([m.change_id for m in members])
            if sha(confined.read(root, f.path)) != f.new_sha256
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
            "requested": rest[0].change_id if rest else change_id,
            "forced": False,
            "user_id": author.user_id,
            "user_name": author.user_name,
            "status": settle_as.value,
        }
        with self.audit.transaction(safety=True) as txn:
            if release is not None:
                release(txn.conn)
            self._mark_blocked(txn, blocked, reason, edited, conflict, author)
            self.changes.mark_rolling_back(txn.conn, [m.change_id for m in rest], request)
        outcome = PartialRollback(
            rolled_back=tuple(m.change_id for m in rest),
            blocked=tuple(m.change_id for m in blocked),
            left=tuple(f.path for m in blocked for f in m.record.files),
            edited=tuple(sorted(edited)),
            rolled_back_agents=tuple(dict.fromkeys(map(_agent, rest))),
            blocked_agents=tuple(dict.fromkeys(map(_agent, blocked))),
            conflict=conflict if blocked else None,
        )
        return RollbackPlan(rest, files, request), outcome

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
        restore_targets(files)
        return files

    def _mark_blocked(
        self,
        txn: AuditTransaction,
        members: list[ChangeRow],
        reason: str,
        edited: set[str],
        conflict: str | None,
        author: ChangeAuthor,
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
                "note": "a file of this agent was edited after the change was applied ("
                + ", ".join(p for p in paths if p in edited or not edited)
                + "); the rollback left its files as they are rather than overwrite that edit",
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
                user_id=author.audit_user(member.record.applied_by),
                user_name=author.user_name,
                change_id=member.change_id,
            )

    def finish(
        self,
        root: Path,
        members: list[ChangeRow],
        files: list[StoredFile],
        request: dict[str, Any],
        *,
        recovered: bool = False,
    ) -> None:
        """Restore every file to its target, then mark ``members`` ROLLED_BACK with audit rows.

        Recovery calls this too (``recovered``) to complete a rollback a crash interrupted.
        """
        now = utc_now()
        replaced: dict[str, bytes | None] = {}
        targets = restore_targets(files)
        for path, (data, _, change_id) in targets.items():
            target = Path(path)
            current = replaced[path] = confined.read(root, target)
            if current is not None and sha(current) != sha(data):
                rel = "/".join(confined.relative_parts(root, target))
                backup(root, rel, change_id, current, now, ".rolled-back")
            confined.write_or_delete(root, target, data)
            if sha(confined.read(root, target)) != sha(data):
                raise RollbackConflict(change_id, f"{path} did not read back as restored")
            if recovered:
                confined.remove_leftovers(root, target)
        by_change: dict[str, list[StoredFile]] = {}
        newest = {file.path: file.change_id for file in files}  # files are oldest first
        for file in files:
            by_change.setdefault(file.change_id, []).append(file)
        requested = request["requested"]
        own_group = _group_of(members, requested)
        # FAILED when recovery undid an owner's interrupted change; a rollback otherwise
        settled = ChangeStatus(request.get("status", ChangeStatus.ROLLED_BACK.value))
        with self.audit.transaction(safety=True) as txn:
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
                self.changes.set_status(txn.conn, [member.change_id], settled, rollback_info=info)
                txn.append(
                    agent_name=action.target_agent,
                    edit_type="rollback",
                    old_value=describe(
                        action.new_value,
                        _undone_bytes(mine, newest, replaced, targets, member.change_id),
                        absent=not mine,
                    ),
                    new_value=describe(
                        action.old_value, mine[0].old_bytes if mine else None, absent=not mine
                    ),
                    user_id=request.get("user_id") or member.record.applied_by,
                    user_name=request.get("user_name"),
                    change_id=member.change_id,
                )


def restore_targets(files: list[StoredFile]) -> dict[str, tuple[bytes | None, str | None, str]]:
    """Per path: (bytes to restore, hash expected now, change to name in backups).

    ``files`` are in change order: the oldest change's old bytes are what the path held before
    any selected change; the newest change's new hash is what it holds if nothing else wrote.

    Raises:
        RollbackConflict: the stored old bytes of a path fail their hash.
    """
    out: dict[str, tuple[bytes | None, str | None, str]] = {}
    for file in files:
        if file.path in out:
            data, _, first = out[file.path]
            out[file.path] = (data, file.new_sha256, first)
        else:
            out[file.path] = (file.old_bytes, file.new_sha256, file.change_id)
    for path, (data, _, change_id) in out.items():
        if sha(data) != next(f.old_sha256 for f in files if f.path == path):
            raise RollbackConflict(change_id, f"the stored old bytes of {path} fail their hash")
    return out


def _root_of(row: ChangeRow) -> str:
    assert row.root is not None, "a change without files rolls back as a status change"
    return row.root


def _agent(row: ChangeRow) -> str:
    return row.record.action.target_agent


def _edited_conflict(edited: set[str]) -> str:
    return f"{', '.join(sorted(edited))} changed since it was applied"


def _group_of(members: list[ChangeRow], change_id: str) -> str | None:
    for member in members:
        if member.change_id == change_id:
            return member.record.group_id
    return None


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
        restored = sha(targets[file.path][0])
        # A rollback finished by recovery may find its files restored already: what it undid
        # is then known by hash only, not by the bytes it found.
        if sha(current) != restored or restored == file.new_sha256:
            return current
    return "(absent)" if file.new_sha256 is None else f"(sha256 {file.new_sha256})"
