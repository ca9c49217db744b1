"""Every write, rename, delete, directory creation and snapshot read under a root, race-free.

A path is checked once and used later; between the two another process can swap a file or a
directory for a symlink that points outside the root. Resolving the path again does not help
(the swap can happen after that check too), so nothing here follows a path by name. Each call
opens the root (or starts from the one :func:`root_held` keeps open), walks to the file one
component at a time from the descriptor it holds (``openat`` with ``O_NOFOLLOW |
O_DIRECTORY``), refuses any symlink on the way, opens the last component with ``O_NOFOLLOW``,
and renames within the directory descriptor it opened. A swap made at any instant then makes
the call fail with :class:`PathNotAllowed`; it never redirects it. This is how
``openat``-based tools (coreutils ``rm``, ``rsync``) avoid the same race.

Writes are crash-safe as :func:`agentmend.infrastructure.files.atomic.atomic_write` promises: a
temporary file in the same directory, fsynced, renamed over the target, then the directory fsynced.
Reads open only regular files, and open them non-blocking, so a FIFO or a device never hangs a read.

Odd paths (NUL bytes, undecodable names, names over 255 bytes, paths over 4096 bytes, ``..``)
are refused before any system call, with the path and the reason. A full disk, a read-only
file system or a denied permission is a :class:`FileOperationError` naming the file and the
cause; the temporary file is removed, so nothing is half-written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from agentmend.infrastructure.errors import FileOperationError, FileTooLarge, PathNotAllowed
from agentmend.infrastructure.files.lock_wait import LockWait, flock_within

__all__ = [
    "NAME_MAX",
    "PATH_MAX",
    "PathArg",
    "check_path_text",
    "delete",
    "hold_flock",
    "is_directory",
    "is_locked",
    "link_or_copy",
    "list_names",
    "locked",
    "make_dirs",
    "open_resolved",
    "read",
    "relative_parts",
    "remove_leftovers",
    "remove_named",
    "root_held",
    "write",
    "write_or_delete",
]

PathArg = str | Path | bytes
"""A path under a root: relative, or absolute and spelled under the root; bytes must be UTF-8."""

NAME_MAX = 255
"""Bytes in one path component, the limit of every common Linux file system."""

PATH_MAX = 4096
"""Bytes in a whole path, counting the terminating NUL (Linux ``PATH_MAX``)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TMP_SUFFIX = ".tmp"
_TMP_NAME_BYTES = 200  # room left in NAME_MAX for the dot, the token and the suffix

# Errors that say something about the path (refused), not about the machine (failed).
_PATH_ERRNOS = {
    errno.ELOOP: "a symlink loop or a symlink on the way",
    errno.ENOTDIR: "a component on the way is not a directory",
    errno.EISDIR: "it is a directory, not a file",
    errno.ENAMETOOLONG: "a name or the path is too long",
    errno.ENXIO: "it is not a regular file (a socket or a device)",
    errno.ENOTEMPTY: "it is a directory, not a file",
}


# -- paths ---------------------------------------------------------------------------------


def relative_parts(root: str | Path, path: str | Path | bytes) -> tuple[str, ...]:
    """The components of ``path`` below ``root``, checked without touching the disk.

    ``path`` is relative to ``root``, or absolute and spelled under ``root`` (as the store
    records targets). Nothing is resolved: a symlink is refused later, by the walk.

    Raises:
        PathNotAllowed: a NUL byte, undecodable bytes, ``..``, a name over 255 bytes, a path
            over 4096 bytes, the root itself, or an absolute path outside ``root``.
    """
    text = check_path_text(root, path)
    # split as PurePosixPath would (empty and "." names dropped), without building one: this
    # runs for every file operation
    names = [name for name in text.split("/") if name not in ("", ".")]
    if ".." in names:
        raise PathNotAllowed(text, root, "'..' is not allowed")
    if text.startswith("/"):
        base_text = os.fspath(root)
        base = [name for name in base_text.split("/") if name not in ("", ".")]
        if _anchor(base_text) != _anchor(text) or names[: len(base)] != base:
            raise PathNotAllowed(text, root, "it lies outside the root")
        names = names[len(base) :]
    if not names:
        raise PathNotAllowed(text, root, "it is the root itself")
    return tuple(names)


def _anchor(text: str) -> str:
    """The root PurePosixPath gives ``text``: "//" for exactly two leading slashes (POSIX
    leaves their meaning to the system), "/" for one or more than two, "" when relative."""
    if not text.startswith("/"):
        return ""
    return "//" if text.startswith("//") and not text.startswith("///") else "/"


def check_path_text(root: str | Path, path: str | Path | bytes) -> str:
    """``path`` as text, refused when no file system could hold it.

    Raises:
        PathNotAllowed: a NUL byte, undecodable bytes, a name over 255 bytes or a path over
            4096 bytes (with the root in front of a relative path).
    """
    # the common case, settled without encoding: short ASCII text holds no name over NAME_MAX
    # bytes, nor a path over PATH_MAX with the root (at most 4 bytes a character) in front
    if (
        type(path) is str
        and path.isascii()
        and len(path) <= NAME_MAX
        and "\x00" not in path
        and (path.startswith("/") or len(path) + 4 * len(os.fspath(root)) + 2 <= PATH_MAX)
    ):
        return path
    text = _decoded(root, path)
    if "\x00" in text:
        raise PathNotAllowed(repr(text), root, "it contains a NUL byte")
    for part in text.split("/"):  # the names PurePosixPath would find, and empty ones
        if len(part) * 4 > NAME_MAX and len(part.encode("utf-8")) > NAME_MAX:
            raise PathNotAllowed(
                f"{text[:80]}...", root, f"a name is over {NAME_MAX} bytes ({part[:40]}...)"
            )
    full = text if text.startswith("/") else f"{os.fspath(root)}/{text}"
    if len(full.encode("utf-8")) + 1 > PATH_MAX:
        raise PathNotAllowed(f"{text[:80]}...", root, f"the path is over {PATH_MAX} bytes")
    return text


def _decoded(root: str | Path, path: str | Path | bytes) -> str:
    if isinstance(path, bytes):
        try:
            return path.decode("utf-8")
        except UnicodeDecodeError:
            raise PathNotAllowed(repr(path), root, "its bytes are not UTF-8") from None
    text = os.fspath(path)
    try:
        text.encode("utf-8")  # lone surrogates: undecodable bytes from the file system
    except UnicodeEncodeError:
        raise PathNotAllowed(repr(text), root, "its bytes are not UTF-8") from None
    return text


def _display(root: str | Path, parts: tuple[str, ...]) -> str:
    return "/".join(parts)


# -- errors --------------------------------------------------------------------------------


def _failure(exc: OSError, root: str | Path, where: str, operation: str) -> Exception:
    """``exc`` as a refusal of the path or as a failed operation, naming the file."""
    reason = _PATH_ERRNOS.get(exc.errno or 0)
    if reason is not None:
        return PathNotAllowed(where, root, reason)
    return FileOperationError(os.path.join(os.fspath(root), where), operation, exc)


def _refuse_kind(mode: int, root: str | Path, where: str) -> PathNotAllowed:
    if stat.S_ISLNK(mode):
        return PathNotAllowed(where, root, "it is a symlink")
    if stat.S_ISDIR(mode):
        return PathNotAllowed(where, root, "it is a directory, not a file")
    if stat.S_ISFIFO(mode):
        return PathNotAllowed(where, root, "it is a FIFO, not a regular file")
    if stat.S_ISSOCK(mode):
        return PathNotAllowed(where, root, "it is a socket, not a regular file")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return PathNotAllowed(where, root, "it is a device, not a regular file")
    return PathNotAllowed(where, root, "it is not a regular file")


# -- the walk ------------------------------------------------------------------------------


def _open_root(root: str | Path) -> int:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise PathNotAllowed(root, root, f"the root cannot be opened: {exc.strerror}") from None
    except OSError as exc:
        raise FileOperationError(root, "open the root", exc) from None


def open_resolved(root: str | Path) -> tuple[int, str] | None:
    """``root`` opened as a directory (following symlinks on the way, as resolving its path
    does) and the path the system names it by, or None when the system will not say (no
    ``/proc``) or ``root`` cannot be opened: resolve it then by name.

    One ``open`` and one ``readlink`` instead of an ``lstat`` per name of the path; and the
    path is that of the directory opened, even if names on the way change meanwhile.
    """
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        text = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        text = ""
    # a directory removed meanwhile is named "<path> (deleted)"; one outside the process's
    # root directory is not named by an absolute path
    if not text.startswith("/") or text.endswith(" (deleted)"):
        os.close(fd)
        return None
    return fd, text


class _HeldRoot:
    """A root :func:`root_held` opened, and the directories below it walks reached since."""

    __slots__ = ("dirs", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.dirs: dict[tuple[str, ...], int] = {}  # names below the root -> descriptor

    def close(self) -> None:
        _close_all(self.dirs)
        os.close(self.fd)


_held_roots = threading.local()  # per thread: root text -> what root_held opened


def root_held(root: str | Path, *, opened: int | None = None) -> AbstractContextManager[None]:
    """Open ``root`` once for every walk this thread makes from it (``root`` spelled the same)
    inside the block, instead of once per call: the steps of one apply start from the same
    directory, and each saves an ``open`` and a ``close``. Nested blocks share the outer one's.

    The directories below the root that walks reach stay open until the block ends too (an
    apply reads, backs up and writes in the same folder), so the next walk to one starts from
    it: like the root, a directory once reached is used wherever it is moved meanwhile, and a
    name swapped for a symlink is never followed. Each is closed with the root.

    ``opened``: ``root``'s descriptor, opened already (:func:`open_resolved`); the block
    owns it and closes it.

    Raises:
        PathNotAllowed: ``root`` is not a directory that can be opened.
    """
    return _RootHold(root, opened)


class _RootHold:
    """:func:`root_held`'s block (a class: every apply holds one)."""

    __slots__ = ("_key", "_opened", "_root")

    def __init__(self, root: str | Path, opened: int | None) -> None:
        self._root, self._opened = root, opened
        self._key: str | None = None  # set when this block opened the root (not an outer one)

    def __enter__(self) -> None:
        held: dict[str, _HeldRoot] | None = getattr(_held_roots, "fds", None)
        if held is None:
            held = _held_roots.fds = {}
        key = os.fspath(self._root)
        if key in held:
            if self._opened is not None:
                os.close(self._opened)  # the outer block's serves
            return
        held[key] = _HeldRoot(_open_root(self._root) if self._opened is None else self._opened)
        self._key = key

    def __exit__(self, *exc_info: object) -> None:
        if self._key is not None:
            _held_roots.fds.pop(self._key).close()


def _shared_root(root: str | Path) -> _HeldRoot | None:
    held: dict[str, _HeldRoot] | None = getattr(_held_roots, "fds", None)
    return held.get(os.fspath(root)) if held else None


def _forget_walked(root: str | Path) -> None:
    """Close the directories a held ``root`` kept from its walks: one is about to be renamed
    or removed (the next walk opens each again by name)."""
    held = _shared_root(root)
    if held is not None:
        _close_all(held.dirs)


def _close_all(dirs: dict[tuple[str, ...], int]) -> None:
    for fd in dirs.values():
        os.close(fd)
    dirs.clear()


class _Directory:
    """The descriptor of the directory ``parts`` names under ``root``, walked without symlinks
    (the walk is made when the block is entered; a class rather than a generator, as each
    file operation makes one or two).

    Yields None when a directory on the way does not exist and ``create`` is False. A
    descriptor a held root keeps (:func:`root_held`) stays open after the block.
    """

    __slots__ = ("_fd", "_owned", "_parts", "_root", "create", "operation")

    def __init__(
        self, root: str | Path, parts: tuple[str, ...], *, create: bool, operation: str
    ) -> None:
        self._root, self._parts, self.create, self.operation = root, parts, create, operation
        self._fd: int | None = None
        self._owned = False

    def __enter__(self) -> int | None:
        root, parts = self._root, self._parts
        held = _shared_root(root)
        if held is not None:
            kept = held.dirs.get(parts) if parts else held.fd
            if kept is not None:
                self._fd = kept
                return kept
        current = _open_root(root) if held is None else held.fd
        shared = None if held is None else held.fd
        try:
            for depth, name in enumerate(parts):
                try:
                    following = os.open(name, _DIR_FLAGS, dir_fd=current)
                except FileNotFoundError:
                    if not self.create:
                        if current != shared:
                            os.close(current)
                        return None
                    following = self._make(current, name, parts[: depth + 1])
                except OSError as exc:
                    where = _display(root, parts[: depth + 1])
                    raise _walk_failure(exc, current, name, root, where, self.operation) from None
                if current != shared:
                    os.close(current)
                current = following
        except BaseException:
            if current != shared:
                os.close(current)
            raise
        if held is not None and parts:
            held.dirs[parts] = current  # the held root keeps it for the next walk
        else:
            self._owned = current != shared
        self._fd = current
        return current

    def _make(self, parent: int, name: str, parts: tuple[str, ...]) -> int:
        where = _display(self._root, parts)
        try:
            os.mkdir(name, 0o777, dir_fd=parent)
        except FileExistsError:
            pass  # made by someone else meanwhile; the open below checks what it is
        except OSError as exc:
            raise _failure(exc, self._root, where, "create the directory") from None
        return _open_component(parent, name, self._root, where, self.operation)

    def __exit__(self, *exc_info: object) -> None:
        if self._owned and self._fd is not None:
            os.close(self._fd)


def _open_component(parent: int, name: str, root: str | Path, where: str, operation: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise _walk_failure(exc, parent, name, root, where, operation) from None


def _walk_failure(
    exc: OSError, parent: int, name: str, root: str | Path, where: str, operation: str
) -> Exception:
    # O_DIRECTORY | O_NOFOLLOW on a symlink fails with ENOTDIR: say which it was.
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        with contextlib.suppress(OSError):
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                return PathNotAllowed(where, root, "a symlink is on the way")
            return PathNotAllowed(where, root, "it is not a directory")
    return _failure(exc, root, where, operation)


# -- reads ---------------------------------------------------------------------------------


def read(root: str | Path, path: PathArg, *, max_bytes: int | None = None) -> bytes | None:
    """The bytes of regular file ``path`` under ``root``, or None when there is none.

    Never opens anything but a regular file: the name is checked first, then the opened
    descriptor (the name may be swapped in between). Opened non-blocking, so a FIFO cannot
    hang the read.

    Raises:
        PathNotAllowed: a symlink on the way or at the end, a directory, FIFO, socket or
            device, or an odd path. FileTooLarge: over ``max_bytes``.
        FileOperationError: the file system refused (permissions, I/O error).
    """
    parts = relative_parts(root, path)
    where = _display(root, parts)
    with _Directory(root, parts[:-1], create=False, operation="read") as parent:
        if parent is None:
            return None
        try:
            mode = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _failure(exc, root, where, "read") from None
        if not stat.S_ISREG(mode):
            raise _refuse_kind(mode, root, where)
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _walk_failure(exc, parent, parts[-1], root, where, "read") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _refuse_kind(info.st_mode, root, where)
            if max_bytes is not None and info.st_size > max_bytes:
                raise FileTooLarge(os.path.join(os.fspath(root), where), info.st_size, max_bytes)
            return _read_all(fd, max_bytes, root, where)
        finally:
            os.close(fd)


def _read_all(fd: int, max_bytes: int | None, root: str | Path, where: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    try:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:  # it grew while being read
                raise FileTooLarge(os.path.join(os.fspath(root), where), total, max_bytes)
    except OSError as exc:
        raise _failure(exc, root, where, "read") from None
    return b"".join(chunks)


def is_directory(root: str | Path, path: PathArg) -> bool:
    """True when ``path`` is a directory reached without symlinks (False when absent)."""
    parts = relative_parts(root, path)
    with _Directory(root, parts[:-1], create=False, operation="inspect") as parent:
        if parent is None:
            return False
        try:
            mode = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _failure(exc, root, _display(root, parts), "inspect") from None
        return stat.S_ISDIR(mode)


def list_names(root: str | Path, directory: str | Path) -> list[str]:
    """The entry names of ``directory`` under ``root`` (empty when it does not exist)."""
    parts = relative_parts(root, directory)
    with _Directory(root, parts, create=False, operation="list") as fd:
        if fd is None:
            return []
        try:
            return sorted(os.listdir(fd))
        except OSError as exc:
            raise _failure(exc, root, _display(root, parts), "list") from None


# -- writes --------------------------------------------------------------------------------


def write(root: str | Path, path: PathArg, data: bytes | str) -> None:
    """Replace regular file ``path`` under ``root`` with ``data``; a crash leaves old or new.

    Missing directories on the way are created (without following symlinks). The file keeps
    its permissions. A symlink swapped in at the name is replaced, never followed.

    Raises:
        PathNotAllowed: a symlink or a file on the way, a directory at the name, an odd path.
        FileOperationError: a full disk, a read-only file system, a denied permission; the
            temporary file is removed and the target keeps its old bytes.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    parts = relative_parts(root, path)
    where = _display(root, parts)
    name = parts[-1]
    with _Directory(root, parts[:-1], create=True, operation="write") as parent:
        assert parent is not None  # create=True never yields None
        mode = _existing_mode(parent, name, root, where)
        tmp = f".{_clip(name)}.{secrets.token_hex(8)}{_TMP_SUFFIX}"
        try:
            fd = os.open(tmp, _TMP_FLAGS, 0o666, dir_fd=parent)
        except OSError as exc:
            raise _failure(exc, root, where, "write") from None
        try:
            try:
                _write_all(fd, payload)
                if mode is not None:
                    os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            if isinstance(exc, OSError):
                raise _failure(exc, root, where, "write") from None
            raise
        _fsync_dir(parent, root, where)


def _existing_mode(parent: int, name: str, root: str | Path, where: str) -> int | None:
    """The permissions to keep (None: a new file), refusing a directory at the name."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _failure(exc, root, where, "write") from None
    if stat.S_ISDIR(mode):
        raise PathNotAllowed(where, root, "it is a directory, not a file")
    return stat.S_IMODE(mode) if stat.S_ISREG(mode) else None


def _write_all(fd: int, payload: bytes) -> None:
    if not payload:
        return
    written = os.write(fd, payload)  # all of it, but for a full disk or a huge payload
    if written == len(payload):
        return
    view = memoryview(payload)[written:]
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(fd: int, root: str | Path, where: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise _failure(exc, root, where, "sync the directory of") from None


def _clip(name: str) -> str:
    return name.encode("utf-8")[:_TMP_NAME_BYTES].decode("utf-8", errors="ignore")


def delete(root: str | Path, path: PathArg) -> None:
    """Remove ``path`` under ``root`` (if present) durably; a symlink there is removed itself.

    Raises:
        PathNotAllowed: a directory at the name, a symlink on the way, an odd path.
        FileOperationError: the file system refused.
    """
    parts = relative_parts(root, path)
    where = _display(root, parts)
    with _Directory(root, parts[:-1], create=False, operation="delete") as parent:
        if parent is None:
            return
        try:
            os.unlink(parts[-1], dir_fd=parent)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _failure(exc, root, where, "delete") from None
        _fsync_dir(parent, root, where)


def write_or_delete(root: str | Path, path: PathArg, data: bytes | None) -> None:
    """Make ``path`` hold ``data``, or not exist when it is None; crash-safe either way."""
    if data is None:
        delete(root, path)
    else:
        write(root, path, data)


def make_dirs(root: str | Path, path: str | Path) -> None:
    """Create directory ``path`` under ``root`` and its parents, following no symlink."""
    parts = relative_parts(root, path)
    with _Directory(root, parts, create=True, operation="create the directory"):
        pass


def remove_leftovers(root: str | Path, path: PathArg) -> None:
    """Remove the temporary files a writer killed inside :func:`write` left beside ``path``."""
    parts = relative_parts(root, path)
    prefix = f".{_clip(parts[-1])}."
    with _Directory(root, parts[:-1], create=False, operation="clean") as parent:
        if parent is None:
            return
        for entry in os.listdir(parent):
            if entry.startswith(prefix) and entry.endswith(_TMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(entry, dir_fd=parent)


def remove_named(root: str | Path, directory: str | Path, suffix: str) -> int:
    """Remove the files of ``directory`` whose names end with ``suffix``; returns how many."""
    parts = relative_parts(root, directory)
    removed = 0
    with _Directory(root, parts, create=False, operation="clean") as fd:
        if fd is None:
            return 0
        for entry in os.listdir(fd):
            if entry.endswith(suffix):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(entry, dir_fd=fd)
                    removed += 1
    return removed


def link_or_copy(root: str | Path, source: str | Path, target: str | Path, data: bytes) -> None:
    """Make ``target`` hold ``data`` by hard-linking ``source`` to it, or by writing a copy.

    The link saves a copy when ``source`` is about to be replaced by :func:`write` (a new
    inode), so ``target`` keeps the old bytes. What got linked is checked afterwards (the name
    may have been swapped): unless it is a regular file of ``data``'s size it is replaced by
    a copy. An existing ``target`` is kept (a retried step in the same second).

    The link's folder is not synced: ``target`` is a copy for people, whose bytes the caller
    keeps durably elsewhere (a change's old bytes are in the store), so losing it to a power
    cut loses no data, and the sync would cost an apply about a tenth of its time. Where a
    journal keeps metadata in order (ext4 with its journal, XFS) the caller's next sync carries
    the link anyway; on ext4 without one it may not. A copy, where links are not possible, is
    written durably as any file.
    """
    src = relative_parts(root, source)
    dst = relative_parts(root, target)
    with (
        _Directory(root, src[:-1], create=False, operation="back up") as src_dir,
        _Directory(root, dst[:-1], create=True, operation="back up") as dst_dir,
    ):
        assert dst_dir is not None
        if src_dir is not None:
            try:
                os.link(
                    src[-1], dst[-1], src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False
                )
            except FileExistsError:
                return
            except OSError:
                pass  # no links here (another file system, a refusing one): copy below
            else:
                info = os.stat(dst[-1], dir_fd=dst_dir, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_size == len(data):
                    return
                os.unlink(dst[-1], dir_fd=dst_dir)
    write(root, target, data)


def locked(
    root: str | Path, path: str | Path, wait: LockWait | None = None
) -> AbstractContextManager[int]:
    """Hold an exclusive ``flock`` on lock file ``path`` under ``root`` (created if missing).

    Re-entrant within a thread (:func:`hold_flock`), shared with
    :func:`agentmend.infrastructure.files.atomic.locked_file` (same key for the same path). The file
    is reached without symlinks and only flocked, never written. ``wait`` bounds the wait for
    another holder (:class:`~agentmend.infrastructure.files.lock_wait.LockWait`).
    """
    parts = relative_parts(root, path)
    where = _display(root, parts)

    def open_lock() -> int:
        with _Directory(root, parts[:-1], create=True, operation="lock") as parent:
            assert parent is not None
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(parts[-1], flags, 0o644, dir_fd=parent)
            except OSError as exc:
                raise _walk_failure(exc, parent, parts[-1], root, where, "lock") from None
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                os.close(fd)
                raise _refuse_kind(mode, root, where)
            return fd

    return hold_flock(os.path.join(os.fspath(root), *parts), open_lock, wait)


def is_locked(root: str | Path, path: str | Path) -> bool:
    """Whether someone holds the ``flock`` on lock file ``path`` under ``root`` now.

    This thread too, if it holds it: the probe opens its own descriptor. False when the file
    (or a directory on the way) does not exist; nothing is created or written.
    """
    parts = relative_parts(root, path)
    with _Directory(root, parts[:-1], create=False, operation="inspect") as parent:
        if parent is None:
            return False
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            return False
        except OSError as exc:
            where = _display(root, parts)
            raise _walk_failure(exc, parent, parts[-1], root, where, "inspect") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own lock, if it got one
    return False


_held = threading.local()  # per thread: lock path -> [descriptor, depth] of the locks it holds


def hold_flock(
    key: str, open_lock: Callable[[], int], wait: LockWait | None = None
) -> AbstractContextManager[int]:
    """Hold an exclusive ``flock`` on the descriptor ``open_lock`` returns, re-entrantly.

    ``wait`` bounds the wait for another holder (forever without it); a thread that holds
    the lock already never waits.

    ``key`` names the lock file; a thread that already holds it gets the same descriptor, so
    a rollback that cascades or a recovery inside ``apply`` can take the lock it holds. Locks
    from different threads or processes exclude each other (each acquisition opens its own
    file description), and the kernel drops the lock when its holder dies, which is what
    lets recovery tell a dead writer from a live one.
    """
    return _FlockHold(key, open_lock, wait)


class _FlockHold:
    """:func:`hold_flock`'s block (a class: every apply takes three such locks)."""

    __slots__ = ("_entry", "_key", "_open_lock", "_wait")

    def __init__(self, key: str, open_lock: Callable[[], int], wait: LockWait | None) -> None:
        self._key, self._open_lock, self._wait = key, open_lock, wait
        self._entry: list[int] | None = None  # [descriptor, depth] of the lock held

    def __enter__(self) -> int:
        held: dict[str, list[int]] | None = getattr(_held, "locks", None)
        if held is None:
            held = _held.locks = {}
        entry = held.get(self._key)
        if entry is not None:  # this thread holds it already
            entry[1] += 1
            self._entry = entry
            return entry[0]
        fd = self._open_lock()
        try:
            flock_within(fd, self._wait, self._key)
        except BaseException:
            os.close(fd)
            raise
        self._entry = held[self._key] = [fd, 1]
        return fd

    def __exit__(self, *exc_info: object) -> None:
        entry = self._entry
        assert entry is not None
        entry[1] -= 1
        if entry[1] == 0:
            del _held.locks[self._key]
            os.close(entry[0])  # closing the description releases the lock
