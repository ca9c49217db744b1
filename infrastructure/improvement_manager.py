"""Change history with real rollback: apply a change to agent files, log it, undo it exactly.

Seed 003's ``ImprovementManager`` API on top of the one store. Where the seed only flipped a
status, a rollback here restores the old bytes of every file the change touched and checks
their hash; where the seed rewrote a JSON file on every change, logging is one INSERT.

Sessions and history
--------------------
``manager.history`` is the list of changes made through *this* manager (its session), as they
are now in the store; ``get_history()`` is the whole durable history. The session budget
(``max_improvements_per_session``) counts the changes this session applied, whatever became of
them later (kept or rolled back); FAILED and PENDING changes never count.
``can_make_improvement`` also refuses after 3 or more rollbacks among the 5 newest changes of
the durable history: instability outlives a process.

The apply protocol (crash-safe)
-------------------------------
Under an exclusive ``flock`` on ``<root>/.agent/agentmend.lock``, held from the hash check to
the last write so two processes (or threads) never interleave on a root's files:

1. finish any unfinished work a dead process left on this root (see recovery);
2. read each file's old bytes and hash;
3. record the intent: the changes as PENDING with the old bytes, committed and synced;
4. write a human backup ``<root>/.agent/backups/<path>_<time>_<change id>.bak`` (seed 001);
5. write the new bytes with ``files.atomic_write`` (or ``atomic_delete``);
6. mark the changes APPLIED and append their audit rows in one synced transaction.

``apply`` returns only after step 6, so an acknowledged change is APPLIED on disk and is never
lost. A rollback follows the same pattern: check, record the rollback intent, restore, mark
ROLLED_BACK with audit rows.

Recovery
--------
On open (and before any apply or rollback on a root) unfinished work whose owner is gone is
settled; "gone" is certain because the owner held the root's lock, which the kernel drops
when it dies. The rule: an interrupted *apply* is rolled back whole (each file still holding
the change's new bytes gets its old bytes back, created files are removed, temp files are
cleaned) and its changes become FAILED with ``rollback_info["reason"] == "interrupted"``; a
file that holds neither the old nor the new bytes was changed outside agentmend and is left as
it is (noted). An interrupted *rollback* was asked for and acknowledged nothing, so it is
completed: each file gets the bytes the rollback aimed for.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import structlog

from infrastructure.audit import (
    AuditLog,
    ChainVerification,
    durable_transaction,
    locked_file,
)
from infrastructure.change_log import ChangeLog, ChangeRow, StoredFile
from infrastructure.errors import (
    ChangeNotFound,
    ChangeStateError,
    ConfigurationError,
    PathNotAllowed,
    RollbackConflict,
)
from infrastructure.files import atomic_delete, atomic_write, resolve_inside, sha256_bytes
from infrastructure.models import (
    ChangeRecord,
    ChangeStatus,
    ChangeType,
    FileChange,
    ImprovementAction,
    utc_now,
)
from infrastructure.store import Store

__all__ = [
    "DEFAULT_HISTORY_FILE",
    "ChangeRecord",
    "ChangeStatus",
    "ChangeType",
    "ImprovementAction",
    "ImprovementManager",
]

log = structlog.get_logger(__name__)

DEFAULT_HISTORY_FILE = Path(".agent") / "agentmend.db"
_AGENT_DIR = ".agent"
_LIVE = (ChangeStatus.APPLIED, ChangeStatus.KEPT)
_COUNTS_AS_APPLIED = (ChangeStatus.APPLIED, ChangeStatus.KEPT, ChangeStatus.ROLLED_BACK)

Content = bytes | str | None


def _lock_path(root: Path) -> Path:
    return root / _AGENT_DIR / "agentmend.lock"


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _sha(data: bytes | None) -> str | None:
    return None if data is None else sha256_bytes(data)


def _put(path: Path, data: bytes | None) -> None:
    if data is None:
        atomic_delete(path)
    else:
        atomic_write(path, data)


def _describe(value: Any, data: bytes | str | None, *, absent: bool = False) -> Any:
    """What the audit row shows: the action's value, else the file's text."""
    if value is not None or absent:
        return value
    if isinstance(data, str):
        return data
    return "(absent)" if data is None else data.decode("utf-8", errors="replace")


def _undone_bytes(
    mine: list[StoredFile], newest: dict[str, str], replaced: dict[str, bytes | None], cid: str
) -> bytes | str | None:
    """The content a rolled-back change had written, as far as it is still known."""
    if not mine:
        return None
    file = mine[0]
    if newest.get(file.path) == cid:
        return replaced.get(file.path)
    return "(absent)" if file.new_sha256 is None else f"(sha256 {file.new_sha256})"


class _Item:
    """One file of an apply, prepared and validated before anything is written."""

    def __init__(self, action: ImprovementAction, target: Path, rel: str, new: bytes | None):
        self.action, self.target, self.rel, self.new = action, target, rel, new
        self.change_id = ChangeLog.new_id()
        self.old: bytes | None = None
        self.seq = 0


class ImprovementManager:
    """Tracks, applies and rolls back changes to agent files; see the module docstring.

    Args:
        history_file: the SQLite store to open, whatever its suffix (seed 003 passes
            ``*.json`` paths). Defaults to ``.agent/agentmend.db``.
        store: an open store to use instead (not closed by :meth:`close`).
        audit_hmac_key: key for HMAC-keyed audit rows (the caller reads
            ``AGENTMEND_AUDIT_HMAC_KEY``; see ``infrastructure.audit``).
        max_improvements_per_session: the session budget seed 003 calls the same.
        applied_by: who the changes are attributed to by default.
        recover: settle work that crashed processes left unfinished, on open.
    """

    def __init__(
        self,
        history_file: str | Path | None = None,
        *,
        store: Store | None = None,
        audit_hmac_key: bytes | str | None = None,
        max_improvements_per_session: int = 5,
        applied_by: str = "self-improver",
        recover: bool = True,
    ) -> None:
        if store is not None and history_file is not None:
            raise ConfigurationError("give history_file or store, not both")
        self._owns_store = store is None
        self.store = store if store is not None else Store(history_file or DEFAULT_HISTORY_FILE)
        self.history_file = self.store.path
        self.changes = ChangeLog(self.store)
        self.audit = AuditLog(self.store, hmac_key=audit_hmac_key)
        self.session_id = uuid4().hex
        self.max_improvements_per_session = max_improvements_per_session
        self.session_improvement_count = 0
        self.applied_by = applied_by
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
        with self._count_lock:
            self.session_improvement_count += n

    # -- seed 003's API --------------------------------------------------------------------

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
        applied_by: str | None = None,
        user_id: str | None = None,
        user_name: str | None = None,
    ) -> str:
        """Record a change made elsewhere (no file behind it); returns its id.

        One INSERT, plus an audit row when the change counts as applied. Such a change rolls
        back as a status change only.
        """
        change_id = ChangeLog.new_id()
        by = applied_by or self.applied_by
        with self.audit.transaction() as txn:
            self.changes.insert(
                txn.conn,
                change_id=change_id,
                action=action,
                status=status,
                applied_by=by,
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
                    user_id=user_id or by,
                    user_name=user_name,
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
        user_id: str | None = None,
        user_name: str | None = None,
    ) -> ChangeRecord | None:
        """Roll back the newest APPLIED change (KEPT ones only by id); None if there is none."""
        for _ in range(10):  # another process may roll the same change back first
            row = self.changes.latest_applied()
            if row is None:
                return None
            if self._rollback(row, reason, force, cascade, user_id, user_name):
                return self.get_change(row.change_id)
        return None

    def rollback_by_id(
        self,
        change_id: str,
        *,
        reason: str = "manual_rollback_by_id",
        force: bool = False,
        cascade: bool = False,
        user_id: str | None = None,
        user_name: str | None = None,
    ) -> bool:
        """Roll back one change (and its whole group); False if unknown or not APPLIED/KEPT.

        Raises:
            RollbackConflict: a file changed since the change (``force`` overwrites it, after
                backing it up) or later live changes build on it (``cascade`` rolls them back
                too, newest first).
        """
        row = self.changes.get(change_id)
        return row is not None and self._rollback(row, reason, force, cascade, user_id, user_name)

    def get_history(self, agent_name: str | None = None, limit: int = 50) -> list[ChangeRecord]:
        """The newest ``limit`` changes of the durable history, oldest first."""
        return [row.record for row in self.changes.history(agent_name, limit)]

    def get_change(self, change_id: str) -> ChangeRecord | None:
        row = self.changes.get(change_id)
        return row.record if row else None

    def can_make_improvement(self) -> tuple[bool, str]:
        """(allowed, reason): the session budget, then recent rollbacks in the durable history."""
        if self.session_improvement_count >= self.max_improvements_per_session:
            return False, f"Max improvements ({self.max_improvements_per_session}) reached"
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

    def verify_audit_chain(self, *, repair: bool = True) -> ChainVerification:
        return self.audit.verify_chain(repair=repair)

    # -- state changes without files -------------------------------------------------------

    def _require(self, change_id: str) -> ChangeRow:
        row = self.changes.get(change_id)
        if row is None:
            raise ChangeNotFound(change_id)
        return row

    def mark_kept(
        self, change_id: str, verification_result: dict[str, Any] | None = None
    ) -> ChangeRecord:
        """APPLIED -> KEPT (the whole group): verification showed the change helped."""
        with durable_transaction(self.store) as conn:
            row = self._require(change_id)
            if row.status is not ChangeStatus.APPLIED:
                raise ChangeStateError(change_id, row.status.value, "kept")
            members = [m.change_id for m in self.changes.live_group(row)]
            self.changes.set_status(
                conn, members, ChangeStatus.KEPT, verification=verification_result
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
        with durable_transaction(self.store) as conn:
            row = self._require(change_id)
            if row.status is not ChangeStatus.PENDING or row.root is not None:
                problem = "roll it back instead" if row.status in _LIVE else ""
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
        applied_by: str | None = None,
        user_id: str | None = None,
        user_name: str | None = None,
    ) -> ChangeRecord:
        """Change one file under ``root`` and log it (``new_content=None`` deletes it).

        Raises:
            PathNotAllowed: ``path`` leaves ``root``, is a directory or lies in ``.agent/``;
                nothing is written or recorded.
        """
        items = self._prepare([(action, path, new_content)], root)
        return self._apply(items, Path(root).resolve(), None, applied_by, user_id, user_name)[0]

    def apply_group(
        self,
        actions_and_files: Sequence[tuple[ImprovementAction, str | Path, Content]],
        *,
        root: str | Path,
        applied_by: str | None = None,
        user_id: str | None = None,
        user_name: str | None = None,
    ) -> list[ChangeRecord]:
        """Apply several file changes as one group that commits or rolls back whole."""
        if not actions_and_files:
            raise ConfigurationError("apply_group needs at least one change")
        items = self._prepare(actions_and_files, root)
        group_id = "g-" + ChangeLog.new_id()
        return self._apply(items, Path(root).resolve(), group_id, applied_by, user_id, user_name)

    def _prepare(
        self, entries: Sequence[tuple[ImprovementAction, str | Path, Content]], root: str | Path
    ) -> list[_Item]:
        root_path = Path(root).resolve()
        if not root_path.is_dir():
            raise PathNotAllowed(root, root_path, "the root is not an existing directory")
        items: list[_Item] = []
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
            items.append(_Item(action, target, rel.as_posix(), data))
        return items

    def _apply(
        self,
        items: list[_Item],
        root: Path,
        group_id: str | None,
        applied_by: str | None,
        user_id: str | None,
        user_name: str | None,
    ) -> list[ChangeRecord]:
        by = applied_by or self.applied_by
        with locked_file(_lock_path(root)):
            self._recover_root(root)
            for item in items:
                item.old = _read(item.target)
            created = utc_now()
            with durable_transaction(self.store) as conn:
                for item in items:
                    item.seq = self.changes.insert(
                        conn,
                        change_id=item.change_id,
                        action=item.action,
                        status=ChangeStatus.PENDING,
                        applied_by=by,
                        session_id=self.session_id,
                        created=created,
                        group_id=group_id,
                        root=str(root),
                    )
                    self.changes.insert_file(conn, self._stored(item))
            try:
                for item in items:
                    if item.old is not None:
                        self._backup(root, item.rel, item.change_id, item.old, created)
                for item in items:
                    _put(item.target, item.new)
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
                            user_id=user_id or by,
                            user_name=user_name,
                            change_id=item.change_id,
                        )
            except Exception as exc:
                # Not acknowledged: put back what was written and mark it FAILED now rather
                # than on the next open (if the store itself is failing, reopening does it).
                self._settle_after_error(root, exc)
                raise
        self._count(len(items))
        return [
            ChangeRecord(
                change_id=item.change_id,
                timestamp=created,
                action=item.action,
                status=ChangeStatus.APPLIED,
                applied_by=by,
                group_id=group_id,
                files=(FileChange(path=str(item.target), old_sha256=_sha(item.old),
                                  new_sha256=_sha(item.new)),),
            )
            for item in items
        ]  # fmt: skip

    @staticmethod
    def _stored(item: _Item) -> StoredFile:
        return StoredFile(
            item.change_id, item.seq, str(item.target), item.rel, _sha(item.old), _sha(item.new),
            item.old,
        )  # fmt: skip

    @staticmethod
    def _backup(
        root: Path, rel: str, change_id: str, data: bytes, when: datetime, tag: str = ""
    ) -> None:
        """Seed 001's human backup of the bytes about to be replaced.

        The path and change id are in the name, so two files or two changes in one second
        never collide. The backup is a hard link to the file, which the caller then replaces
        with ``atomic_write`` (a new inode), so the backup keeps the old bytes without a copy;
        it also makes the replace ten times cheaper on ext4, which otherwise frees the old
        blocks synchronously (~1 ms). A copy is written where links are not possible.
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

    def _settle_after_error(self, root: Path, error: Exception) -> None:
        try:
            self._recover_root(root, reason=f"apply failed: {type(error).__name__}: {error}")
        except Exception as exc:  # the original error matters more; reopening retries
            log.error("recovery_after_error_failed", root=str(root), error=str(exc))

    # -- rollback --------------------------------------------------------------------------

    def _rollback(
        self,
        row: ChangeRow,
        reason: str,
        force: bool,
        cascade: bool,
        user_id: str | None,
        user_name: str | None,
    ) -> bool:
        if row.status not in _LIVE:
            return False
        if row.root is None:
            return self._rollback_logged(row, reason, user_id, user_name)
        root = Path(row.root)
        with locked_file(_lock_path(root)):
            self._recover_root(root)
            fresh = self.changes.get(row.change_id)
            if fresh is None or fresh.status not in _LIVE:
                return False
            selected = self._closure(fresh)
            own = {m.change_id for m in self.changes.live_group(fresh)}
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
                p for p, (_, expected, _) in targets.items() if _sha(_read(Path(p))) != expected
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
            with durable_transaction(self.store) as conn:
                self.changes.mark_rolling_back(conn, selected, request)
            self._finish_rollback(root, [selected[c] for c in selected], files, request)
        log.info("rolled_back_change", change_id=row.change_id, cascade=list(dependents))
        return True

    def _closure(self, row: ChangeRow) -> dict[str, ChangeRow]:
        """``row``'s live group plus every live change built on it, with their groups."""
        selected: dict[str, ChangeRow] = {}
        frontier = self.changes.live_group(row)
        while frontier:
            for member in frontier:
                selected[member.change_id] = member
            found: list[ChangeRow] = []
            for file in self.changes.files([m.change_id for m in frontier]):
                for later in self.changes.live_changes_on(file.path, file.seq):
                    if later.change_id not in selected:
                        found.extend(self.changes.live_group(later))
            frontier = [f for f in {f.change_id: f for f in found}.values()
                        if f.change_id not in selected]  # fmt: skip
        return dict(sorted(selected.items(), key=lambda kv: kv[1].seq))

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
        for path, (data, _, change_id) in _targets(files).items():
            target = Path(path)
            current = replaced[path] = _read(target)
            if current is not None and _sha(current) != _sha(data):
                rel = target.relative_to(root).as_posix()
                self._backup(root, rel, change_id, current, now, ".rolled-back")
            _put(target, data)
            if _sha(_read(target)) != _sha(data):
                raise RollbackConflict(change_id, f"{path} did not read back as restored")
            if recovered:
                _clean_temp_files(target)
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
                        _undone_bytes(mine, newest, replaced, member.change_id),
                        absent=not mine,
                    ),
                    new_value=_describe(
                        action.old_value, mine[0].old_bytes if mine else None, absent=not mine
                    ),
                    user_id=request.get("user_id") or member.record.applied_by,
                    user_name=request.get("user_name"),
                    change_id=member.change_id,
                )

    def _rollback_logged(
        self, row: ChangeRow, reason: str, user_id: str | None, user_name: str | None
    ) -> bool:
        with self.audit.transaction() as txn:
            fresh = self.changes.get(row.change_id)
            if fresh is None or fresh.status not in _LIVE:
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
                user_id=user_id or row.record.applied_by,
                user_name=user_name,
                change_id=row.change_id,
            )
        return True

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
        return [rec for r in rows if (rec := self.get_change(r.change_id)) is not None]

    def _undo_interrupted(self, root: Path, rows: list[ChangeRow], reason: str) -> None:
        """Roll interrupted applies back whole; their backups go too (they never happened)."""
        restored: dict[str, list[str]] = {}
        left: dict[str, list[str]] = {}
        for file in self.changes.files([r.change_id for r in rows]):
            target = Path(file.path)
            current = _sha(_read(target))
            if current == file.new_sha256 and current != file.old_sha256:
                _put(target, file.old_bytes)
                restored.setdefault(file.change_id, []).append(file.path)
            elif current != file.old_sha256:
                left.setdefault(file.change_id, []).append(file.path)
            _clean_temp_files(target)
        backups = root / _AGENT_DIR / "backups"
        for row in rows:
            for stale in backups.glob(f"*_{row.change_id}.bak"):
                stale.unlink(missing_ok=True)
        now = utc_now().isoformat()
        with durable_transaction(self.store) as conn:
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


def _clean_temp_files(target: Path) -> None:
    """Remove temp files ``atomic_write`` left beside ``target`` when its writer died."""
    if target.parent.is_dir():
        for stale in target.parent.glob(f".{target.name}.*.tmp"):
            stale.unlink(missing_ok=True)
