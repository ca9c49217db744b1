"""The confined layer's directory operations: the one symlink it makes, renames, tree removal.

A worker serves a team from a link (``agents -> .releases/v7-1a2b...``) so that switching to a
new release is one ``rename(2)``: a reader sees the old directory or the new one, never a mix.
Everything else in the confined layer refuses symlinks, and so does this module, with one
exception: :func:`swap_link` replaces a link that points, by a relative name without ``..``, to a
directory beside it under the same root, which is the only kind of link it ever makes. A link
anyone else made (absolute, pointing elsewhere, or a real directory at the name) is refused.

As in :mod:`agentmend.infrastructure.files.confined`, every call walks from the root by directory
descriptors with ``O_NOFOLLOW``, so a swap made at any instant makes the call fail, never redirects
it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import PurePosixPath

from agentmend.infrastructure.errors import PathNotAllowed
from agentmend.infrastructure.files.confined import (
    _Directory,
    _display,
    _failure,
    _forget_walked,
    _fsync_dir,
    relative_parts,
)

__all__ = [
    "READ_ONLY_FILE",
    "READ_ONLY_FOLDER",
    "link_target",
    "open_tree",
    "remove_tree",
    "rename_directory",
    "seal_tree",
    "swap_link",
    "write_new_tree",
]

READ_ONLY_FILE = 0o444
READ_ONLY_FOLDER = 0o555
_OWN_FOLDER = 0o755


def link_target(root: str, link: str) -> str | None:
    """The relative target of the link ``link`` under ``root`` (None when there is none).

    Raises:
        PathNotAllowed: something other than a link this layer could have made is there.
    """
    parts = relative_parts(root, link)
    with _Directory(root, parts[:-1], create=False, operation="read the link") as parent:
        if parent is None:
            return None
        return _own_link(parent, parts[-1], root, _display(root, parts))


def swap_link(root: str, link: str, target: str) -> None:
    """Make ``link`` under ``root`` a symlink to ``target``, atomically (``rename(2)``).

    ``target`` is relative to the link's directory, has no ``..`` and names a directory that
    exists there (reached without symlinks). Readers see the old target or the new one.

    Raises:
        PathNotAllowed: ``target`` is not such a directory, or something other than a link
            made here occupies ``link``. FileOperationError: the file system refused.
    """
    parts = relative_parts(root, link)
    where = _display(root, parts)
    goal = PurePosixPath(target)
    if goal.is_absolute() or ".." in goal.parts or not goal.parts:
        raise PathNotAllowed(target, root, "a link target must be relative, without '..'")
    with _Directory(root, (*parts[:-1], *goal.parts), create=False, operation="link") as found:
        if found is None:
            raise PathNotAllowed(target, root, "the link target is not an existing directory")
    with _Directory(root, parts[:-1], create=True, operation="link") as parent:
        assert parent is not None
        _own_link(parent, parts[-1], root, where)
        tmp = f".{parts[-1]}.{secrets.token_hex(8)}.link"
        try:
            os.symlink(str(goal), tmp, dir_fd=parent)
            os.rename(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise _failure(exc, root, where, "switch the link") from None
        _fsync_dir(parent, root, where)


def _own_link(parent: int, name: str, root: str, where: str) -> str | None:
    """The target of the link ``name`` if it is one this layer makes; None when absent."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _failure(exc, root, where, "inspect") from None
    if not stat.S_ISLNK(mode):
        raise PathNotAllowed(where, root, "it is not a link made by agentmend (a real entry)")
    target = os.readlink(name, dir_fd=parent)
    path = PurePosixPath(target)
    if path.is_absolute() or ".." in path.parts:
        raise PathNotAllowed(where, root, f"it is a link agentmend did not make (to {target})")
    return target


def rename_directory(root: str, source: str, target: str) -> None:
    """Rename directory ``source`` to the absent name ``target`` (same parent), durably.

    Raises:
        PathNotAllowed: they are not in one directory, or ``source`` is not a directory.
        FileOperationError: ``target`` exists, or the file system refused.
    """
    src = relative_parts(root, source)
    dst = relative_parts(root, target)
    if src[:-1] != dst[:-1]:
        raise PathNotAllowed(target, root, "a directory is renamed within its own parent only")
    where = _display(root, dst)
    _forget_walked(root)  # a held root's walks must not reach it under its old name
    with _Directory(root, src[:-1], create=False, operation="rename") as parent:
        if parent is None:
            raise PathNotAllowed(source, root, "its parent directory does not exist")
        try:
            mode = os.stat(src[-1], dir_fd=parent, follow_symlinks=False).st_mode
            if not stat.S_ISDIR(mode):
                raise PathNotAllowed(source, root, "it is not a directory")
            os.mkdir(dst[-1], dir_fd=parent)  # claims the name: rename would replace an empty dir
            os.rename(src[-1], dst[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except OSError as exc:
            raise _failure(exc, root, where, "rename") from None
        _fsync_dir(parent, root, where)


def remove_tree(root: str, path: str) -> None:
    """Remove directory ``path`` under ``root`` and everything in it, following no symlink.

    A symlink inside is removed itself, never followed (as ``rm -r`` does with ``openat``).
    """
    parts = relative_parts(root, path)
    where = _display(root, parts)
    _forget_walked(root)  # nor reach a removed one
    with _Directory(root, parts[:-1], create=False, operation="remove") as parent:
        if parent is None:
            return
        try:
            _remove_entry(parent, parts[-1])
        except OSError as exc:
            raise _failure(exc, root, where, "remove") from None
        _fsync_dir(parent, root, where)


def _remove_entry(parent: int, name: str) -> None:
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        os.unlink(name, dir_fd=parent)
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        if not mode & stat.S_IWUSR:  # a sealed folder (see seal_tree): its entries go first
            os.fchmod(fd, _OWN_FOLDER)
        for entry in os.listdir(fd):
            _remove_entry(fd, entry)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def seal_tree(root: str, path: str) -> None:
    """Make every file under directory ``path`` read-only (0444) and every folder in it
    unwritable (0555), following no symlink (one inside is left as it is).

    A sealed tree cannot be edited in place, nor a file in it replaced by a rename, nor one
    added, by anyone but root or its owner changing a mode first (which changes its ctime).

    Raises:
        PathNotAllowed: a symlink on the way to ``path``. FileOperationError: refused.
    """
    _set_modes(root, path, READ_ONLY_FILE, READ_ONLY_FOLDER)


def open_tree(root: str, path: str) -> None:
    """Make the folders of a sealed tree writable by their owner again (0755), its files
    staying read-only: for a repair, which renames files into them and removes files.

    Raises:
        as :func:`seal_tree`.
    """
    _set_modes(root, path, None, _OWN_FOLDER)


def _set_modes(root: str, path: str, file_mode: int | None, folder_mode: int) -> None:
    parts = relative_parts(root, path)
    where = _display(root, parts)
    with _Directory(root, parts, create=False, operation="set modes") as top:
        if top is None:
            raise PathNotAllowed(path, root, "the directory does not exist")
        try:
            _set_modes_below(top, file_mode, folder_mode)
        except OSError as exc:
            raise _failure(exc, root, where, "set modes") from None


def _set_modes_below(folder: int, file_mode: int | None, folder_mode: int) -> None:
    """Set the modes of the entries of the open ``folder``, then of ``folder`` itself."""
    for name in os.listdir(folder):
        mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            below = os.open(name, flags, dir_fd=folder)
            try:
                _set_modes_below(below, file_mode, folder_mode)
            finally:
                os.close(below)
        elif stat.S_ISREG(mode) and file_mode is not None and stat.S_IMODE(mode) != file_mode:
            # by descriptor, opened without following: a link swapped in is never chmodded
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(name, flags, dir_fd=folder)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.fchmod(fd, file_mode)
            finally:
                os.close(fd)
    if stat.S_IMODE(os.fstat(folder).st_mode) != folder_mode:  # a chmod changes the ctime
        os.fchmod(folder, folder_mode)


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_new_tree(
    root: str,
    directory: str,
    files: Mapping[str, bytes],
    *,
    same_as: Mapping[str, str] | None = None,
    mode: int = 0o644,
) -> None:
    """Fill the new, private directory ``directory`` with ``files``, durably, for one rename.

    Meant for a directory nobody reads until it is renamed into place (a release being
    materialized): files are created with ``O_EXCL`` and written in place (no temporary file,
    no per-file rename), each file is synced, and each directory is synced once at the end.
    A file whose bytes are known to equal an existing file under ``root`` (``same_as``: path ->
    that file's path) is hard-linked to it instead of written, after checking its size.
    New files are created with ``mode`` (less the umask; :data:`READ_ONLY_FILE` for a tree to
    be sealed: the descriptor that creates a file writes it whatever its mode).

    Raises:
        PathNotAllowed: a symlink on the way, an odd path. FileOperationError: the disk
            refused, or a file already exists (the directory was not new).
    """
    base = relative_parts(root, directory)
    folders: set[tuple[str, ...]] = {base}
    for path, data in files.items():
        parts = (*base, *relative_parts(root, path))
        where = _display(root, parts)
        folders.add(parts[:-1])
        with _Directory(root, parts[:-1], create=True, operation="write") as parent:
            assert parent is not None
            source = (same_as or {}).get(path)
            if source is not None and _linked(root, source, parent, parts[-1], len(data)):
                continue
            try:
                fd = os.open(parts[-1], _NEW_FILE, mode, dir_fd=parent)
            except OSError as exc:
                raise _failure(exc, root, where, "write") from None
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as exc:
                raise _failure(exc, root, where, "write") from None
            finally:
                os.close(fd)
    for folder in sorted(folders, key=len, reverse=True):
        with _Directory(root, folder, create=True, operation="sync") as folder_fd:
            assert folder_fd is not None
            _fsync_dir(folder_fd, root, _display(root, folder))


def _linked(root: str, source: str, parent: int, name: str, size: int) -> bool:
    """Hard-link ``source`` (under ``root``) to ``name`` in ``parent``; False: write instead."""
    src = relative_parts(root, source)
    with _Directory(root, src[:-1], create=False, operation="link") as src_dir:
        if src_dir is None:
            return False
        try:
            info = os.stat(src[-1], dir_fd=src_dir, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                return False
            os.link(src[-1], name, src_dir_fd=src_dir, dst_dir_fd=parent, follow_symlinks=False)
        except OSError:
            return False  # another file system, a refusing one: write a copy
    return True
