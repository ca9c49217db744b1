"""Crash-safe file writes, file locks and path confinement, shared by every effector.

A write either leaves the old bytes or the new ones on disk, never a mix: the data goes to a
temporary file in the same directory, is fsynced, is renamed over the target, and the directory
is fsynced so the rename itself survives a power cut. The writes here are those of a single
file whose folder the caller names (a saved definition, a workspace file); everything written
under a root on an agent's behalf goes through :mod:`agentmend.infrastructure.files.confined`, which
these delegate to for the last component. Writers that must not interleave (two processes changing
one root, two appends to one audit chain) serialise on a :func:`locked_file`.
:func:`resolve_inside` is the check made when a path is planned, not when it is written.
"""

from __future__ import annotations

import hashlib
import os
import stat
from contextlib import AbstractContextManager
from pathlib import Path

from agentmend.infrastructure.errors import FileOperationError, PathNotAllowed
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.confined import hold_flock
from agentmend.infrastructure.files.lock_wait import LockWait

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


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new content.

    The parent directories are created; the file itself is written by
    :func:`agentmend.infrastructure.files.confined.write` from its opened parent directory, so a
    symlink swapped in at the name is replaced, never followed.
    """
    path = Path(path)
    _make_parent(path)
    confined.write(path.parent, path.name, data)


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise PathNotAllowed(path, path.parent, "a file is where a directory should be") from None
    except OSError as exc:
        raise FileOperationError(path.parent, "create the directory", exc) from None


def atomic_delete(path: Path) -> None:
    """Remove ``path`` (if present) and make the removal durable."""
    path = Path(path)
    if path.parent.is_dir():
        confined.delete(path.parent, path.name)


def atomic_write_or_delete(path: Path, data: bytes | None) -> None:
    """Make ``path`` hold ``data``, or not exist when it is None; crash-safe either way."""
    if data is None:
        atomic_delete(path)
    else:
        atomic_write(path, data)


def read_if_exists(path: Path) -> bytes | None:
    """``path``'s bytes, or None when it does not exist (the state :func:`atomic_delete` leaves).

    Only a regular file is read, and a symlink at the name is refused
    (:func:`agentmend.infrastructure.files.confined.read`).
    """
    path = Path(path)
    if not path.parent.is_dir():
        return None
    return confined.read(path.parent, path.name)


def remove_atomic_write_leftovers(path: Path) -> None:
    """Remove the temp files a writer killed inside :func:`atomic_write` left beside ``path``."""
    path = Path(path)
    if path.parent.is_dir():
        confined.remove_leftovers(path.parent, path.name)


def locked_file(path: Path, wait: LockWait | None = None) -> AbstractContextManager[int]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing); yields its descriptor.

    Re-entrant within a thread, so a rollback that cascades or a recovery inside ``apply`` can
    take the lock it already holds. Locks from different threads or processes exclude each
    other (each acquisition opens its own file description), and the kernel drops the lock
    when its holder dies, which is what lets recovery tell a dead writer from a live one.
    ``wait`` bounds the wait for another holder (forever without it).
    """
    key = os.fspath(path if isinstance(path, Path) else Path(path))  # spelled as Path does

    def open_lock() -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                return os.open(key, flags, 0o644)
            except (FileNotFoundError, NotADirectoryError):  # no directory yet (or a file there)
                _make_parent(Path(path))
                return os.open(key, flags, 0o644)
        except OSError as exc:
            raise FileOperationError(Path(path), "open the lock file", exc) from None

    return hold_flock(key, open_lock, wait)


def resolve_inside(
    root: str | Path,
    path: str | Path,
    *,
    allowed_suffixes: frozenset[str] | None = None,
    allow_absolute: bool = False,
    root_resolved: bool = False,
) -> Path:
    """Resolve ``path`` against ``root`` and refuse anything that would leave it.

    Refuses ``..`` components, absolute paths (unless ``allow_absolute`` and already inside
    ``root``), symlinks, at any depth, that point outside ``root``, symlink loops, and odd
    text (NUL or undecodable bytes, names over 255 bytes, paths over 4096 bytes). This is the
    check made when a change is planned; the write itself goes through
    :mod:`agentmend.infrastructure.files.confined`, which holds however the tree changes in between.
    With ``allowed_suffixes``, the file's suffix must be one of them. With ``root_resolved``
    the caller has resolved ``root`` already (it is not resolved again).
    """
    root_path = Path(root) if root_resolved else Path(root).resolve()
    raw = Path(path)
    if ".." in raw.parts:
        raise PathNotAllowed(path, root_path, "'..' is not allowed")
    if raw.is_absolute():
        if not allow_absolute:
            raise PathNotAllowed(path, root_path, "absolute paths are not allowed")
        candidate = raw
    else:
        candidate = root_path / raw
    confined.check_path_text(root_path, path)
    resolved = _free_of_links(root_path, raw) if root_resolved and candidate is not raw else None
    if resolved is None:
        try:
            resolved = candidate.resolve()
        except RuntimeError:  # Python 3.11 reports a symlink loop so
            raise PathNotAllowed(path, root_path, "a symlink loop") from None
        except OSError as exc:
            raise PathNotAllowed(
                path, root_path, f"it cannot be resolved: {exc.strerror}"
            ) from None
        if resolved != root_path and root_path not in resolved.parents:
            raise PathNotAllowed(path, root_path, "it resolves through a symlink or outside")
    if allowed_suffixes is not None and resolved.suffix not in allowed_suffixes:
        allowed = " ".join(sorted(allowed_suffixes))
        raise PathNotAllowed(
            path, root_path, f"extension {resolved.suffix or '(none)'!r} not in {allowed}"
        )
    return resolved


def _free_of_links(root: Path, rel: Path) -> Path | None:
    """``root / rel`` when no name of ``rel`` is a symlink, else None (resolve it in full).

    What ``resolve`` returns for a resolved ``root`` and a ``rel`` of plain names (no ``..``)
    when it meets no link, in one ``lstat`` per name below the root instead of one per name
    from ``/``. A name that cannot be looked up (absent, or a file on the way) ends the walk,
    as it ends ``resolve``'s: nothing below it is looked up either.
    """
    current = os.fspath(root)
    for name in rel.parts:
        current = os.path.join(current, name)
        try:
            mode = os.lstat(current).st_mode
        except OSError:
            break
        if stat.S_ISLNK(mode):
            return None
    return root / rel
