"""Applying a group of file changes: steps 2 to 6 of the change protocol.

:mod:`agentmend.infrastructure.changes.protocol.steps` holds the root's lock and settles unfinished
work (step 1) before calling these, and hands any error after the intent is recorded to recovery, so
an apply is either acknowledged APPLIED or undone; see that module's docstring for the steps.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path, PurePath
from types import TracebackType

from agentmend.infrastructure.changes.audit.log import AuditLog, AuditTransaction, TailMoved
from agentmend.infrastructure.changes.protocol.change_log import ChangeLog, StoredFile
from agentmend.infrastructure.changes.protocol.files import AGENT_DIR, backup, describe, sha
from agentmend.infrastructure.errors import PathNotAllowed, StoreError
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.atomic import resolve_inside
from agentmend.infrastructure.models import (
    ChangeRecord,
    ChangeStatus,
    FileChange,
    ImprovementAction,
    utc_now,
)
from agentmend.infrastructure.principal import ChangeAuthor
from agentmend.infrastructure.store.sql import StoreConnection

__all__ = [
    "Content",
    "FileEntry",
    "PreparedFile",
    "UnfinishedWork",
    "applied_records",
    "prepare",
    "prepare_under",
    "record_intent",
    "resolved_root",
    "root_opened",
    "write_and_commit",
]

Content = bytes | str | None
"""A file's new content: text is written as UTF-8, None deletes the file."""

FileEntry = tuple[ImprovementAction, str | Path, Content]
"""One file of an apply: the action it carries out, its path under the root, its new content."""


class PreparedFile:
    """One file of an apply, validated before anything is written; step 2 fills ``old``.

    ``target`` is the file's path as the store records it (the resolved root, then ``rel``).
    """

    def __init__(self, action: ImprovementAction, target: str, rel: str, new: bytes | None):
        self.action, self.target, self.rel, self.new = action, target, rel, new
        self.change_id = ChangeLog.new_id()
        self.old: bytes | None = None
        self.seq = 0
        self.new_sha = sha(new)
        self.old_sha: str | None = None  # set with ``old`` (the record and the reply need it)

    def stored(self) -> StoredFile:
        return StoredFile(
            self.change_id, self.seq, self.target, self.rel, self.old_sha, self.new_sha, self.old
        )


def prepare(entries: Sequence[FileEntry], root: str | Path) -> list[PreparedFile]:
    """Check every target before anything is written, so bad input leaves no trace.

    Raises:
        PathNotAllowed: a path leaves ``root``, is a directory, lies in ``.agent/`` or appears
            twice, or ``root`` is not an existing directory.
    """
    return prepare_under(entries, resolved_root(root))


def resolved_root(root: str | Path) -> Path:
    """``root`` resolved, as every step records and walks it.

    Raises:
        PathNotAllowed: ``root`` is not an existing directory.
    """
    root_path = Path(root).resolve()
    if not root_path.is_dir():
        raise PathNotAllowed(root, root_path, "the root is not an existing directory")
    return root_path


def root_opened(root: str | Path) -> AbstractContextManager[str]:
    """``root`` resolved, as every step records and walks it, and held open for the block
    (:func:`~agentmend.infrastructure.files.confined.root_held`): the directory opened is
    the one whose path is recorded.

    Raises:
        PathNotAllowed: ``root`` is not an existing directory.
        FileOperationError: it cannot be opened (permissions).
    """
    return _RootOpened(root)


class _RootOpened:
    """:func:`root_opened`'s block (a class: every apply opens one)."""

    __slots__ = ("_hold", "_root")

    def __init__(self, root: str | Path) -> None:
        self._root = root
        self._hold: AbstractContextManager[None] | None = None

    def __enter__(self) -> str:
        opened = confined.open_resolved(self._root)
        if opened is None:  # a system without /proc, or a root that is not a directory
            text = str(resolved_root(self._root))
            hold = confined.root_held(text)
        else:
            fd, text = opened
            hold = confined.root_held(text, opened=fd)
        hold.__enter__()
        self._hold = hold
        return text

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._hold is not None
        self._hold.__exit__(kind, exc, traceback)


def prepare_under(entries: Sequence[FileEntry], root_path: str | Path) -> list[PreparedFile]:
    """:func:`prepare` under a root :func:`resolved_root` returned (resolved once per apply).

    Raises:
        PathNotAllowed: as :func:`prepare`.
    """
    root = os.fspath(root_path)
    items: list[PreparedFile] = []
    seen: set[str] = set()
    for action, path, content in entries:
        found = _plain_target(root, path)
        if found is None:  # a link on the way or an odd answer from the disk: resolve in full
            found = _resolved_target(Path(root), path)
        target, rel, blocked = found
        if blocked is not None:
            raise PathNotAllowed(path, root, blocked)
        if rel.partition("/")[0] == AGENT_DIR:
            raise PathNotAllowed(path, root, "'.agent/' is reserved for agentmend")
        if target in seen:
            raise PathNotAllowed(path, root, "it appears twice in one group")
        seen.add(target)
        data = content.encode("utf-8") if isinstance(content, str) else content
        items.append(PreparedFile(action, target, rel, data))
    return items


_Target = tuple[str, str, str | None]
"""A file's path, its path below the root, and why it cannot be written (None: it can)."""


def _plain_target(root: str, path: str | Path) -> _Target | None:
    """The target of ``path`` when no name on its way is a symlink (else None), in one
    ``lstat`` per name below the resolved ``root`` and no other look-up.

    What :func:`_resolved_target` answers for such a path: each name's ``lstat`` also says
    whether it is a directory (the target must not be, the folders on the way must be).

    Raises:
        PathNotAllowed: ``..``, an absolute path, or odd text.
    """
    if isinstance(path, str):
        text = path
    elif isinstance(path, PurePath):
        text = str(path)
    else:
        return None  # not a path's type: the full resolve says what is wrong with it
    names = [name for name in text.split("/") if name and name != "."]  # as Path parses it
    if ".." in names:
        raise PathNotAllowed(path, root, "'..' is not allowed")
    if text.startswith("/"):
        raise PathNotAllowed(path, root, "absolute paths are not allowed")
    confined.check_path_text(root, path)
    rel = "/".join(names)
    target = f"{root.rstrip('/')}/{rel}" if names else root
    if not names:
        return target, rel, "it is a directory"
    current = root.rstrip("/")
    last = len(names) - 1
    for depth, name in enumerate(names):
        current = f"{current}/{name}"
        try:
            mode = os.lstat(current).st_mode
        except OSError as exc:
            if exc.errno in _NOT_THERE:
                break  # nothing below it can be looked up either
            return None
        if stat.S_ISLNK(mode):
            return None
        if depth == last:
            if stat.S_ISDIR(mode):
                return target, rel, "it is a directory"
        elif not stat.S_ISDIR(mode):
            return target, rel, f"{current} is a file, not a directory"
    return target, rel, None


def _resolved_target(root_path: Path, path: str | Path) -> _Target:
    """:func:`_plain_target` for any path: resolved in full (symlinks inside the root are
    followed to where they lead)."""
    target = resolve_inside(root_path, path, root_resolved=True)
    rel = target.relative_to(root_path)
    if target == root_path or _is_dir(target):
        return str(target), rel.as_posix(), "it is a directory"
    # the folders between the root and the file (the root's own are folders: it is one)
    within = (root_path / d for d in list(rel.parents)[:-1])
    blocked = next((d for d in within if _is_file_not_dir(d)), None)
    if blocked is not None:
        return str(target), rel.as_posix(), f"{blocked} is a file, not a directory"
    return str(target), rel.as_posix(), None


def _is_dir(path: Path) -> bool:
    """``path.is_dir()`` in one ``stat`` (following links, as the resolved path has none)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno in _ABSENT:
            return False
        raise


def _is_file_not_dir(path: Path) -> bool:
    """``path.exists() and not path.is_dir()`` in one ``stat``."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno in _ABSENT:
            return False
        raise


_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)
"""What ``Path.exists`` and ``Path.is_dir`` take for "not there" (others they raise)."""

_NOT_THERE = (errno.ENOENT, errno.ENOTDIR)
"""An ``lstat`` that says the name is absent (ENOTDIR: a file on the way, reported by the
name before it)."""


class UnfinishedWork(StoreError):
    """The root holds work a dead process left unfinished: settle it, then record the intent
    (raised to the caller only when recovery could not settle it)."""

    def __init__(self, root: str) -> None:
        super().__init__(f"{root} holds unfinished changes that recovery did not settle")


def record_intent(
    changes: ChangeLog,
    audit: AuditLog,
    items: list[PreparedFile],
    root_path: str | Path,
    *,
    team: str,
    group_id: str | None,
    session_id: str,
    author: ChangeAuthor,
    link: Callable[[StoreConnection, list[str], str], None] | None = None,
) -> datetime:
    """Steps 2 and 3: read the old bytes, record the changes PENDING; returns their time.

    The caller holds the root's lock, so the old bytes read here are what the apply replaces.
    The changes are recorded as made by ``author.applied_by`` for team ``team``. ``link`` puts
    the changes under their owner's lease in the same transaction.

    One durable transaction that also checks, before it commits, that the root has no
    unfinished work and that the audit head and the database agree (what recovery and
    ``ensure_appendable`` would ask first); on PostgreSQL its statements and both questions
    share one round trip between ``BEGIN`` and ``COMMIT``.

    Raises:
        UnfinishedWork: a dead process left work on the root; nothing is recorded.
        AuditChainBroken: the audit head and the database disagree; nothing is recorded.
    """
    root = os.fspath(root_path)
    for item in items:
        item.old = confined.read(root, item.rel)  # relative: no prefix to strip again
        item.old_sha = sha(item.old)
    created = utc_now()

    def intent(conn: StoreConnection) -> Callable[[], None]:
        unfinished = changes.ask_unfinished(conn, root)
        for item in items:
            changes.add(
                conn,
                change_id=item.change_id,
                action=item.action,
                status=ChangeStatus.PENDING,
                applied_by=author.applied_by,
                session_id=session_id,
                created=created,
                group_id=group_id,
                root=root,
                team_id=team,
            )
            changes.insert_file_of_new(conn, item.stored())
        if link is not None:
            link(conn, [item.change_id for item in items], team)

        def check() -> None:
            if unfinished():
                raise UnfinishedWork(root)

        return check

    with audit.transaction(prelude=intent):
        pass  # the intent appends no audit row: its prelude is all of it
    return created


def write_and_commit(
    changes: ChangeLog,
    audit: AuditLog,
    items: list[PreparedFile],
    root: str | Path,
    created: datetime,
    *,
    author: ChangeAuthor,
) -> None:
    """Steps 4 to 6: backups, the new bytes, then APPLIED with audit rows in one transaction
    (on PostgreSQL: ``BEGIN``, the writes with the chain's tail read beside them, ``COMMIT``;
    one more, reading the tail first, when another writer moved it since the intent).

    The audit rows name ``author``'s user, else how the change was made.

    An error leaves the recorded intent unfinished; the caller hands it to recovery.
    """
    for item in items:
        if item.old is not None:
            backup(root, item.rel, item.change_id, item.old, created)
    for item in items:
        confined.write_or_delete(root, item.rel, item.new)

    def commit(txn: AuditTransaction) -> None:
        changes.set_status(txn.conn, [i.change_id for i in items], ChangeStatus.APPLIED)
        for item in items:
            txn.append(
                agent_name=item.action.target_agent,
                edit_type=item.action.action_type.value,
                old_value=describe(item.action.old_value, item.old),
                new_value=describe(item.action.new_value, item.new),
                user_id=author.audit_user(author.applied_by),
                user_name=author.user_name,
                change_id=item.change_id,
            )

    try:  # the chain's tail where the intent found it: one round trip fewer
        with audit.transaction(batched=True, speculate=True) as txn:
            commit(txn)
    except TailMoved:  # another writer appended since: nothing was written, read it first
        with audit.transaction(batched=True) as txn:
            commit(txn)


def applied_records(
    items: list[PreparedFile], created: datetime, *, author: ChangeAuthor, group_id: str | None
) -> list[ChangeRecord]:
    """One APPLIED record per file of an acknowledged apply."""
    return [
        ChangeRecord(
            change_id=item.change_id,
            timestamp=created,
            action=item.action,
            status=ChangeStatus.APPLIED,
            applied_by=author.applied_by,
            group_id=group_id,
            files=(FileChange(path=item.target, old_sha256=item.old_sha,
                              new_sha256=item.new_sha),),
        )
        for item in items
    ]  # fmt: skip
