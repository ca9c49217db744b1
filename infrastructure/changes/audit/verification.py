"""Checking the audit chain: what can be wrong with its rows and its head file, and how to say so.

:meth:`~agentmend.infrastructure.changes.audit.log.AuditLog.verify_chain` reads the rows and the
head under the head file's lock and hands them to :func:`check_rows` and :func:`check_head`; the
outcome is a :class:`ChainVerification`, truthy when the chain verifies, that names every problem by
row id (or by the head file). The crash rules these checks encode are in the module docstring
of :mod:`agentmend.infrastructure.changes.audit.log` ("Crash order").
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentmend.infrastructure.changes.audit.entry import BREAK_EDIT_TYPE, AuditEntry
from agentmend.infrastructure.changes.audit.head import read_head
from agentmend.infrastructure.errors import AuditChainError

__all__ = ["GENESIS_HASH", "ChainProblem", "ChainVerification", "check_head", "check_rows"]

GENESIS_HASH = "0" * 64
"""The ``prev_hash`` of the first row: the hash of "no row before"."""


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """One thing wrong with the chain; ``row_id`` is None for problems with the head file.

    ``kind`` is one of: edited, broken_link, missing_rows, unkeyed, keyed_without_key (rows);
    head_missing, head_unreadable, head_mismatch, cut_off (the head file now);
    head_was_unreadable (a write found the head unreadable and rewrote it; reported until a
    ``repair`` run has reported it, a note after); chain_break (a segment started over a
    broken head, reported until an administrator acknowledges it, a note after; see
    :mod:`agentmend.infrastructure.changes.audit.breaks`).
    """

    row_id: int | None
    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class ChainVerification:
    """The outcome of :meth:`AuditLog.verify_chain`; truthy when the chain verifies."""

    rows_checked: int
    problems: tuple[ChainProblem, ...] = ()
    notes: tuple[str, ...] = ()
    repaired: bool = False
    head_unchecked: str | None = None
    """Why the head file was not checked (a writer held its lock past the wait), if it was not."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    @property
    def problem_row_ids(self) -> tuple[int, ...]:
        return tuple(p.row_id for p in self.problems if p.row_id is not None)

    def raise_for_problems(self) -> None:
        """For callers that want strictness: raise ``AuditChainError`` listing the problems."""
        if self.problems:
            listed = "; ".join(
                f"row {p.row_id}: {p.kind}: {p.detail}"
                if p.row_id is not None
                else f"{p.kind}: {p.detail}"
                for p in self.problems
            )
            raise AuditChainError(f"audit chain does not verify: {listed}")


def check_rows(
    rows: Sequence[AuditEntry], *, keyed: bool, expected_hash: Callable[[AuditEntry], str]
) -> list[ChainProblem]:
    """Every row's hash and link to the row before it; problems carry the row id.

    Args:
        rows: the whole table, oldest first.
        keyed: whether the log has an HMAC key (then every row must be keyed, and only then).
        expected_hash: the hash a row's content should have under the log's key.
    """
    problems: list[ChainProblem] = []
    prev_id, prev_hash = 0, GENESIS_HASH
    for row in rows:
        if row.keyed and not keyed:
            problems.append(
                ChainProblem(row.id, "keyed_without_key", "row is HMAC-keyed; give the key")
            )
        elif keyed and not row.keyed:
            problems.append(
                ChainProblem(row.id, "unkeyed", "row is not authenticated by the HMAC key")
            )
        elif not hmac.compare_digest(expected_hash(row), row.row_hash):
            problems.append(
                ChainProblem(row.id, "edited", "content does not match its hash (or key)")
            )
        if row.prev_hash != prev_hash:
            gap = f"rows {prev_id + 1}..{row.id - 1} are missing" if row.id > prev_id + 1 else ""
            detail = gap or f"does not link to row {prev_id} (deleted, reordered or edited)"
            problems.append(ChainProblem(row.id, "broken_link", detail))
        # A break row may follow a gap: the rows cut off the end that it records and reports.
        elif row.id != prev_id + 1 and row.edit_type != BREAK_EDIT_TYPE:
            problems.append(
                ChainProblem(row.id, "missing_rows", f"rows {prev_id + 1}..{row.id - 1} gone")
            )
        prev_id, prev_hash = row.id, row.row_hash
    return problems


def check_head(
    fd: int,
    head_path: Path,
    rows: Sequence[AuditEntry],
    row_problems: Sequence[ChainProblem],
    repair: bool,
) -> tuple[list[ChainProblem], list[str], bool]:
    """The head file against the table: (problems, notes, whether the head needs rewriting).

    The one tolerated disagreement, the head exactly one commit behind after a crash, is a
    note; ``repair`` only changes its wording (the caller does the rewrite).
    """
    try:
        head = read_head(fd, head_path)
    except AuditChainError as exc:
        return [ChainProblem(None, "head_unreadable", str(exc))], [], False
    last = rows[-1] if rows else None
    if head is None and last is None:
        return [], [], False
    if head is not None and last is not None and head == (last.id, last.row_hash):
        return [], [], False
    # The crash between a commit and its head write: the head names the row just before
    # the newest commit (whose rows share a batch id), and that commit's rows verify, link
    # to the row the head names, and are no older than it.
    assert last is not None or head is not None
    tail: list[AuditEntry] = []
    for row in reversed(rows):
        if row.batch != rows[-1].batch:
            break
        tail.insert(0, row)
    before = rows[-len(tail) - 1] if len(rows) > len(tail) else None
    bad = {p.row_id for p in row_problems}
    if (
        tail
        and tail[0].id == tail[0].batch
        and not any(r.id in bad for r in tail)
        and head == ((before.id, before.row_hash) if before else None)
        and tail[0].prev_hash == (before.row_hash if before else GENESIS_HASH)
        and (before is None or tail[0].timestamp >= before.timestamp)
    ):
        done = "repaired" if repair else "not repaired"
        return [], [f"head behind by one commit ({len(tail)} row(s)), {done}"], True
    if head is None:
        return [ChainProblem(None, "head_missing", f"{head_path} is missing")], [], False
    if last is None or head[0] > last.id:
        ends = f"row {last.id}" if last else "no rows"
        detail = f"head names row {head[0]} but the table ends at {ends}: rows cut off"
        return [ChainProblem(None, "cut_off", detail)], [], False
    detail = f"head names row {head[0]} but the newest row is {last.id} with another hash"
    return [ChainProblem(None, "head_mismatch", detail)], [], False
