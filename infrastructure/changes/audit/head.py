"""The audit chain's head file: the newest row's id and hash, kept outside the database.

A database alone cannot vouch for rows cut off its end, so
:class:`~agentmend.infrastructure.changes.audit.log.AuditLog` also keeps the head in
``<db>.audit-head``. The file is never replaced: it is one fixed-size record rewritten in place at
offset 0 and synced (a record this small is written whole; its checksum catches a torn one), because
replacing a file by rename costs about a millisecond on ext4, twice the budget of a whole
durable ``log_change``. The caller holds the file's ``flock`` around every read and write.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from agentmend.infrastructure.errors import AuditChainError

__all__ = ["clear_head", "never_written", "read_head", "write_head"]

_HEAD_SIZE = 256  # one record well inside a 512-byte sector
_HEAD_MAGIC = "agentmend-audit-head v1"


def _head_record(row_id: int, row_hash: str) -> bytes:
    body = f"{_HEAD_MAGIC} {row_id} {row_hash}"
    check = hashlib.sha256(body.encode("ascii")).hexdigest()[:16]
    return f"{body} {check}\n".encode("ascii").ljust(_HEAD_SIZE, b" ")


# The last record this process wrote or read and what it names: every append reads the head
# it (or the append before) left, which then needs no parsing and no checksum.
_last: tuple[bytes, tuple[int, str]] | None = None


def write_head(fd: int, row_id: int, row_hash: str) -> None:
    """Make the head name row ``row_id`` with hash ``row_hash``, durably."""
    global _last
    record = _head_record(row_id, row_hash)
    os.pwrite(fd, record, 0)
    os.fdatasync(fd)
    _last = (record, (row_id, row_hash))


def clear_head(fd: int) -> None:
    """The head of an empty log: a blank record, which reads as "no row yet"."""
    os.pwrite(fd, b" " * _HEAD_SIZE, 0)
    os.fdatasync(fd)


def never_written(fd: int) -> bool:
    """Whether the head file has never held a record (just created: no head was ever kept)."""
    return os.fstat(fd).st_size == 0


def read_head(fd: int, path: Path) -> tuple[int, str] | None:
    """The (row id, hash) the head file names; None when it is empty (no row yet).

    Raises:
        AuditChainError: the file is not a head record or fails its checksum; names ``path``.
    """
    global _last
    try:
        record = os.pread(fd, _HEAD_SIZE, 0)
    except OSError as exc:
        raise AuditChainError(f"audit head file {path} cannot be read: {exc}") from exc
    last = _last
    if last is not None and last[0] == record:  # the same bytes name the same row
        return last[1]
    raw = record.decode("ascii", errors="replace").strip()
    if not raw:
        return None
    parts = raw.split(" ")
    if len(parts) != 5 or " ".join(parts[:2]) != _HEAD_MAGIC or not parts[2].isdigit():
        raise AuditChainError(f"audit head file {path} is not an agentmend audit head")
    body = " ".join(parts[:4])
    if hashlib.sha256(body.encode("ascii")).hexdigest()[:16] != parts[4]:
        raise AuditChainError(
            f"audit head file {path}: its checksum does not match (torn or edited)"
        )
    named = int(parts[2]), parts[3]
    _last = (record, named)
    return named
