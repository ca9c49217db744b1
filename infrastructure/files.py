"""Crash-safe file writes and path confinement, shared by every effector.

A write either leaves the old bytes or the new ones on disk, never a mix: the data goes to a
temporary file in the same directory, is fsynced, replaces the target with ``os.replace``, and
the directory is fsynced so the rename itself survives a power cut.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

from infrastructure.errors import PathNotAllowed

__all__ = ["atomic_delete", "atomic_write", "fsync_directory", "resolve_inside", "sha256_bytes"]


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
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
