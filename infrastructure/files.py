"""Crash-safe file writes, file locks and path confinement, shared by every effector.

A write either leaves the old bytes or the new ones on disk, never a mix: the data goes to a
temporary file in the same directory, is fsynced, replaces the target with ``os.replace``, and
the directory is fsynced so the rename itself survives a power cut. Writers that must not
interleave (two processes changing one root, two appends to one audit chain) serialise on a
:func:`locked_file`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from infrastructure.errors import PathNotAllowed

__all__ = [
    "atomic_delete",
    "atomic_write",
    "atomic_write_or_delete",
    "fsync_directory",
    "locked_file",
    "read_if_exists",
    "remove_atomic_write_leftovers",
    "resolve_inside",
    "sha256_bytes",
]


_TMP_SUFFIX = ".tmp"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new content."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():
            # keep the file's permissions across the replace
            with contextlib.suppress(OSError):
                os.chmod(tmp_name, path.stat().st_mode & 0o7777)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    fsync_directory(path.parent)


def atomic_delete(path: Path) -> None:
    """Remove ``path`` (if present) and make the removal durable."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_directory(path.parent)


def atomic_write_or_delete(path: Path, data: bytes | None) -> None:
    """Make ``path`` hold ``data``, or not exist when it is None; crash-safe either way."""
    if data is None:
        atomic_delete(path)
    else:
        atomic_write(path, data)


def read_if_exists(path: Path) -> bytes | None:
    """``path``'s bytes, or None when it does not exist (the state :func:`atomic_delete` leaves)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def remove_atomic_write_leftovers(path: Path) -> None:
    """Remove the temp files a writer killed inside :func:`atomic_write` left beside ``path``."""
    if path.parent.is_dir():
        for stale in path.parent.glob(f".{path.name}.*{_TMP_SUFFIX}"):
            stale.unlink(missing_ok=True)


_held = threading.local()  # per thread: path -> [descriptor, depth] of the locks it holds


@contextlib.contextmanager
def locked_file(path: Path) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing); yields its descriptor.

    Re-entrant within a thread, so a rollback that cascades or a recovery inside ``apply`` can
    take the lock it already holds. Locks from different threads or processes exclude each
    other (each acquisition opens its own file description), and the kernel drops the lock
    when its holder dies, which is what lets recovery tell a dead writer from a live one.
    """
    held: dict[str, list[int]] = getattr(_held, "locks", None) or {}
    _held.locks = held
    key = os.fspath(path)
    entry = held.get(key)
    if entry is not None:
        entry[1] += 1
        try:
            yield entry[0]
        finally:
            entry[1] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held[key] = [fd, 1]
        try:
            yield fd
        finally:
            del held[key]
    finally:
        os.close(fd)  # closing the description releases the lock


def resolve_inside(
    root: str | Path,
    path: str | Path,
    *,
    allowed_suffixes: frozenset[str] | None = None,
    allow_absolute: bool = False,
) -> Path:
    """Resolve ``path`` against ``root`` and refuse anything that would leave it.

    Refuses ``..`` components, absolute paths (unless ``allow_absolute`` and already inside
    ``root``), and symlinks, at any depth, that point outside ``root``. With
    ``allowed_suffixes``, the file's suffix must be one of them.
    """
    root_resolved = Path(root).resolve()
    raw = Path(path)
    if ".." in raw.parts:
        raise PathNotAllowed(path, root_resolved, "'..' is not allowed")
    if raw.is_absolute():
        if not allow_absolute:
            raise PathNotAllowed(path, root_resolved, "absolute paths are not allowed")
        candidate = raw
    else:
        candidate = root_resolved / raw
    resolved = candidate.resolve()
    if resolved != root_resolved and root_resolved not in resolved.parents:
        raise PathNotAllowed(path, root_resolved, "it resolves through a symlink or outside")
    if allowed_suffixes is not None and resolved.suffix not in allowed_suffixes:
        allowed = " ".join(sorted(allowed_suffixes))
        raise PathNotAllowed(
            path, root_resolved, f"extension {resolved.suffix or '(none)'!r} not in {allowed}"
        )
    return resolved
