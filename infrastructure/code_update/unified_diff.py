"""Unified diffs as change plans: parse one, and apply it to a file's text exactly or not at all.

A code update may be given as a unified diff (``diff -u`` or ``git diff``) instead of whole file
contents. The diff is turned into the same file operations a plan holds (create, modify,
delete with the full new content), so everything downstream (path checks, review, backups,
rollback) sees one kind of plan. Application is strict: every hunk's context and removed lines
must match the file, at the line the hunk names or, if the file moved a little, at the nearest
place after the previous hunk; a hunk that matches nowhere fails the whole diff, naming the file
and the hunk, and nothing is written. Renames, copies and binary patches are refused: a plan
states what each path becomes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from agentmend.infrastructure.errors import AgentmendError

__all__ = ["DiffError", "FilePatch", "Hunk", "apply_patch", "parse_unified_diff"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_DEV_NULL = "/dev/null"
_NO_NEWLINE = "\\ No newline at end of file"


class DiffError(AgentmendError):
    """A diff that cannot be read or does not apply; names the file (and hunk) when known."""

    def __init__(self, problem: str, *, path: str | None = None, hunk: int | None = None):
        self.path = path
        self.hunk = hunk
        self.problem = problem
        where = ""
        if path is not None:
            where = f"{path}: " if hunk is None else f"{path}: hunk {hunk}: "
        super().__init__(f"diff: {where}{problem}")


@dataclass(frozen=True, slots=True)
class Hunk:
    """One ``@@`` block: the lines it expects (``old``) and the lines it leaves (``new``)."""

    old_start: int
    old_count: int
    new_start: int
    new_count: int
    old: tuple[str, ...]
    new: tuple[str, ...]

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"


@dataclass(frozen=True, slots=True)
class FilePatch:
    """The hunks for one file; ``old_path``/``new_path`` are None for ``/dev/null``."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        path = self.new_path if self.new_path is not None else self.old_path
        assert path is not None  # the parser refuses a patch with neither
        return path

    @property
    def operation(self) -> Literal["create", "modify", "delete"]:
        if self.old_path is None:
            return "create"
        if self.new_path is None:
            return "delete"
        return "modify"


def _split_lines(text: str) -> list[str]:
    """Lines with their ``\\n`` kept; only ``\\n`` ends a line (a ``\\r`` stays in the line)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _header_path(line: str, marker: str) -> str | None:
    raw = line[len(marker) :].rstrip("\n").rstrip("\r")
    raw = raw.split("\t", 1)[0].strip()  # `diff -u` puts a timestamp after a tab
    if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
        raw = raw[1:-1]
    if not raw:
        raise DiffError(f"the {marker.strip()} line names no file")
    return None if raw == _DEV_NULL else raw


def _strip_prefixes(old: str | None, new: str | None) -> tuple[str | None, str | None]:
    """Drop git's ``a/`` and ``b/`` prefixes when the diff uses them."""
    git_style = (old is None or old.startswith("a/")) and (new is None or new.startswith("b/"))
    if not git_style:
        return old, new
    return (old[2:] if old else None), (new[2:] if new else None)


def parse_unified_diff(text: str) -> list[FilePatch]:
    """The file patches of a unified diff, in order.

    Raises:
        DiffError: the text holds no file patch, a hunk's line counts do not add up, a file
            appears twice, or the diff renames, copies or carries a binary patch.
    """
    lines = _split_lines(text)
    patches: list[FilePatch] = []
    seen: set[str] = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("GIT binary patch", "Binary files ")):
            raise DiffError("binary patches are not supported")
        if line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            raise DiffError("renames and copies are not supported: delete and create instead")
        if not (line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old, new = _strip_prefixes(_header_path(line, "--- "), _header_path(lines[i + 1], "+++ "))
        if old is None and new is None:
            raise DiffError("a file patch goes from /dev/null to /dev/null")
        if old is not None and new is not None and old != new:
            raise DiffError(f"renames are not supported ({old} -> {new}): delete and create")
        path = new if new is not None else old
        assert path is not None
        if path in seen:
            raise DiffError("the file appears twice in the diff", path=path)
        seen.add(path)
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            hunk, i = _parse_hunk(lines, i, path, len(hunks) + 1)
            hunks.append(hunk)
        if not hunks:
            raise DiffError("the file patch has no hunk", path=path)
        patches.append(FilePatch(old, new, tuple(hunks)))
    if not patches:
        raise DiffError("no file patch found (expected '--- a/<path>' and '+++ b/<path>' lines)")
    return patches


def _parse_hunk(lines: list[str], i: int, path: str, number: int) -> tuple[Hunk, int]:
    match = _HUNK.match(lines[i])
    if match is None:
        raise DiffError(f"malformed hunk header {lines[i].rstrip()!r}", path=path, hunk=number)
    old_start, new_start = int(match.group(1)), int(match.group(3))
    old_count = int(match.group(2)) if match.group(2) is not None else 1
    new_count = int(match.group(4)) if match.group(4) is not None else 1
    old: list[str] = []
    new: list[str] = []
    i += 1
    last: str | None = None  # which side(s) the previous line belonged to
    while i < len(lines) and (len(old) < old_count or len(new) < new_count):
        line = lines[i]
        tag, body = (line[0], line[1:]) if line not in ("\n", "") else (" ", line)
        if line.rstrip("\r\n") == _NO_NEWLINE:
            _drop_newline(old, new, last)
            i += 1
            continue
        if tag == " ":
            old.append(body)
            new.append(body)
        elif tag == "-":
            old.append(body)
        elif tag == "+":
            new.append(body)
        else:
            break
        last = tag
        i += 1
    if i < len(lines) and lines[i].rstrip("\r\n") == _NO_NEWLINE:
        _drop_newline(old, new, last)
        i += 1
    if len(old) != old_count or len(new) != new_count:
        raise DiffError(
            f"the hunk promises {old_count} old and {new_count} new lines but holds "
            f"{len(old)} and {len(new)}",
            path=path,
            hunk=number,
        )
    hunk = Hunk(old_start, old_count, new_start, new_count, tuple(old), tuple(new))
    return hunk, i


def _drop_newline(old: list[str], new: list[str], last: str | None) -> None:
    """``\\ No newline at end of file`` applies to the line just before it."""
    targets = {" ": (old, new), "-": (old,), "+": (new,)}.get(last or "", ())
    for side in targets:
        if side and side[-1].endswith("\n"):
            side[-1] = side[-1][:-1]


def apply_patch(original: str | None, patch: FilePatch) -> str | None:
    """The file's content after ``patch`` (None: the patch deletes it).

    Args:
        original: the file's current text, None when it does not exist.

    Raises:
        DiffError: the file's existence does not fit the patch, or a hunk does not match.
    """
    path = patch.path
    if patch.operation == "create" and original is not None:
        raise DiffError("the diff creates the file but it already exists", path=path)
    if patch.operation != "create" and original is None:
        raise DiffError("the diff changes the file but it does not exist", path=path)
    lines = _split_lines(original or "")
    cursor = 0
    for number, hunk in enumerate(patch.hunks, start=1):
        at = _locate(lines, hunk, cursor)
        if at is None:
            raise DiffError(
                f"{hunk.header} does not match the file (its context or removed lines differ)",
                path=path,
                hunk=number,
            )
        lines[at : at + len(hunk.old)] = hunk.new
        cursor = at + len(hunk.new)
    result = "".join(lines)
    if patch.operation == "delete":
        if result:
            raise DiffError(
                "the diff deletes the file but its removed lines are not the whole file",
                path=path,
            )
        return None
    return result


def _locate(lines: list[str], hunk: Hunk, cursor: int) -> int | None:
    """Where the hunk's old lines start: the stated line, else the nearest match after cursor."""
    want = list(hunk.old)
    size = len(want)
    # a hunk that removes nothing inserts *after* line old_start
    stated = hunk.old_start if hunk.old_count == 0 else hunk.old_start - 1
    stated = max(cursor, stated)
    last = len(lines) - size
    if last < cursor:
        return None
    candidates = sorted(range(cursor, last + 1), key=lambda at: (abs(at - stated), at))
    for at in candidates:
        if lines[at : at + size] == want:
            return at
    return None
