"""What the change protocol keeps under a root's ``.agent/``, and the small helpers it shares.

Apply, rollback and recovery all take the same lock, write the same human backups and compare
files by the same hashes; keeping these in one place keeps the three in step.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any

from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.atomic import sha256_bytes
from agentmend.infrastructure.files.lock_wait import LockWait

__all__ = [
    "AGENT_DIR", "backup", "backups_dir", "describe", "lock_path", "root_busy", "root_lock", "sha"
]  # fmt: skip

AGENT_DIR = ".agent"
"""The directory under a root reserved for agentmend: the lock and the backups live there."""


_LOCK_FILE = f"{AGENT_DIR}/agentmend.lock"
_BACKUPS = f"{AGENT_DIR}/backups"


def lock_path(root: Path) -> Path:
    """The root's lock file, held from a step's hash check to its last write."""
    return root / _LOCK_FILE


def root_busy(root: Path) -> bool:
    """Whether someone holds ``root``'s lock now (this thread too, if it holds it).

    Recovery at open asks before settling work on a root, so that a process stopped while
    holding the lock (SIGSTOP in the middle of a step) never hangs the next open; the work
    waits for a later open instead.
    """
    return confined.is_locked(root, lock_path(root))


def root_lock(root: str | Path, wait: LockWait | None = None) -> AbstractContextManager[int]:
    """Hold the root's lock (:func:`lock_path`), reached from the root without symlinks;
    ``wait`` bounds the wait for another holder."""
    return confined.locked(root, _LOCK_FILE, wait)  # named below the root: nothing to strip


def backups_dir(root: Path) -> Path:
    """Where the human backups of a root's replaced files go."""
    return root / _BACKUPS


def sha(data: bytes | None) -> str | None:
    """The hash the store records for ``data``; None stands for an absent file."""
    return None if data is None else sha256_bytes(data)


def backup(
    root: str | Path, rel: str, change_id: str, data: bytes, when: datetime, tag: str = ""
) -> None:
    """A human-readable backup of the bytes about to be replaced.

    The path and change id are in the name, so two files or two changes in one second never
    collide. The backup is a hard link to the file, which the caller then replaces with
    ``atomic_write`` (a new inode), so the backup keeps the old bytes without a copy; it also
    makes the replace ten times cheaper on ext4, which otherwise frees the old blocks
    synchronously (~1 ms). A copy is written where links are not possible. A retried step
    (recovery) in the same second keeps the first backup.

    The link is not synced on its own (see ``confined.link_or_copy``): recovery and rollback
    never read a backup, they use the store (an apply's old bytes are recorded, synced, before
    any file is touched; the bytes a rollback replaces are its change's new bytes, whose hash
    the store keeps and whose text its audit row shows).
    """
    name = f"{rel.replace('/', '__')}_{_second(when)}_{change_id}{tag}.bak"
    name = name[-confined.NAME_MAX :]  # a deep path: keep the end, which holds the change id
    confined.link_or_copy(root, rel, f"{_BACKUPS}/{name}", data)


def _second(when: datetime) -> str:
    """``when.strftime('%Y%m%dT%H%M%S')``, from ``isoformat`` (a third of the cost)."""
    if when.year < 1000:  # isoformat pads the year, strftime does not
        return when.strftime("%Y%m%dT%H%M%S")
    return when.isoformat(timespec="seconds")[:19].replace("-", "").replace(":", "")


def describe(value: Any, data: bytes | str | None, *, absent: bool = False) -> Any:
    """What the audit row shows: the action's value, else the file's text."""
    if value is not None or absent:
        return value
    if isinstance(data, str):
        return data
    return "(absent)" if data is None else data.decode("utf-8", errors="replace")
