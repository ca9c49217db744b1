"""Breaks in the audit chain: a head file that disagrees with the database, and what follows.

The head file is the only witness of the chain's newest rows that lives outside the database,
so an append must never paper over a disagreement by linking to whatever the database now ends
with and rewriting the head: an edit, deletion, insertion or re-hash of the newest rows done to
the database alone would vanish. The rules:

- *In step*: the head names the newest row and that row's content matches its hash. An empty
  log with an empty head is in step. (On a keyed PostgreSQL store, where several hosts append,
  a head behind rows that verify under the key is in step too: see
  :mod:`agentmend.infrastructure.changes.audit.fleet_head`.)
- *Crash state*: the head is exactly one commit behind (see "Crash order" in
  :mod:`agentmend.infrastructure.changes.audit.log`) and that commit's rows verify. The only
  automatic repair.
- Anything else is a *break*: the head names another row or hash, the head file is missing or
  empty while rows exist, the head file cannot be read, or the newest row's content no longer
  matches its hash. A missing or unreadable head counts: the head file is the witness, and
  whoever can delete or garble it must not thereby reset it. (On a keyed PostgreSQL fleet a
  missing head file is a host joining, which checks every row under the key instead.)

On a break, applies and keeps are refused with :class:`AuditChainBroken`. Rollbacks, recovery
and acknowledgements are never refused (refusing them would leave unproven changes live): their
commit starts a new *segment* whose first row (``edit_type`` ``audit_chain_break``) records the
expected head (the file's) and the found one (the database's), links to the found newest row,
and may follow a gap in row ids.
:meth:`~agentmend.infrastructure.changes.audit.log.AuditLog.verify_chain` reports each break row as
a ``chain_break`` problem until a principal with admin rights acknowledges it
(:meth:`~agentmend.infrastructure.changes.audit.log.AuditLog.acknowledge_breaks`), which appends an
``audit_break_acknowledged`` row naming the break rows; from then on the break is a note. Rows
found altered further back (``ACKNOWLEDGEABLE``: edited, unlinked, missing, unkeyed) are named in
the same acknowledgement and become notes too: the way back to a chain that verifies. Without an
HMAC key, a writer of the database alone can still append one well-formed commit that looks like the
crash state; with a key such rows fail their hash and are a break.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentmend.infrastructure.changes.audit.entry import (
    ACK_EDIT_TYPE,
    AUDIT_AGENT,
    BREAK_EDIT_TYPE,
    AuditEntry,
)
from agentmend.infrastructure.changes.audit.verification import GENESIS_HASH, ChainProblem
from agentmend.infrastructure.errors import AuditChainError

__all__ = [
    "ACKNOWLEDGEABLE",
    "ACK_EDIT_TYPE",
    "AUDIT_AGENT",
    "BREAK_EDIT_TYPE",
    "AuditChainBroken",
    "HeadBreak",
    "acknowledged_ids",
    "break_findings",
    "find_break",
    "row_findings",
]

ACKNOWLEDGEABLE = frozenset({"edited", "broken_link", "missing_rows", "unkeyed"})
"""Row problems an administrator may acknowledge after checking the rows: the way back to a
chain that verifies once a row was edited or removed in the database. (A row keyed under a
key the verifier lacks is not among them: the answer to that is the key.)"""


@dataclass(frozen=True, slots=True)
class HeadBreak:
    """A disagreement between the head file and the database: what each says."""

    expected: str  # what the head file names (or why it names nothing usable)
    found: str  # what the database ends with

    def describe(self) -> str:
        return f"the head file names {self.expected}; the database ends with {self.found}"


class AuditChainBroken(AuditChainError):
    """The head file and the database disagree: applies and keeps wait for an acknowledgement.

    Rollbacks, recovery and acknowledgements still run and record the break; an administrator
    acknowledges it with ``agentmend audit acknowledge`` (or ``AuditLog.acknowledge_breaks``).
    """

    def __init__(self, expected: str, found: str) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            f"the audit chain is broken ({HeadBreak(expected, found).describe()}); new applies "
            "and keeps are refused until an administrator acknowledges the break "
            "(agentmend audit acknowledge)"
        )


def _row(row: AuditEntry) -> str:
    return f"row {row.id} ({row.row_hash[:16]})"


def find_break(
    head: tuple[int, str] | None,
    unreadable: str | None,
    tail: Sequence[AuditEntry],
    verifies: Callable[[AuditEntry], bool],
) -> HeadBreak | None:
    """None when the head is in step or exactly one commit behind; else what disagrees.

    Args:
        head: the (row id, hash) the head file names, None when it is empty or missing.
        unreadable: why the head file could not be read, if it could not.
        tail: the newest commit's rows (sharing the newest ``batch``), preceded by the row
            before that commit when there is one; oldest first.
        verifies: whether a row's content matches its hash under the log's key.
    """
    last = tail[-1] if tail else None
    last_verifies = last is not None and verifies(last)  # asked once: it may hash the row
    in_step = last is not None and last_verifies and head == (last.id, last.row_hash)
    if in_step and unreadable is None:
        return None  # the head names the newest row: every append but the first after a crash
    found = "no rows" if last is None else _row(last)
    if last is not None and not last_verifies:
        found += ", whose content does not match its hash"
    if unreadable is not None:
        return HeadBreak(f"nothing readable ({unreadable})", found)
    if last is None:
        return None if head is None else HeadBreak(f"row {head[0]} ({head[1][:16]})", found)
    commit: list[AuditEntry] = []
    for row in reversed(tail):
        if row.batch != last.batch:
            break
        commit.insert(0, row)
    before = tail[-len(commit) - 1] if len(tail) > len(commit) else None
    crashed = (
        commit[0].id == commit[0].batch
        and last_verifies
        and all(verifies(r) for r in commit[:-1])
        and head == ((before.id, before.row_hash) if before else None)
        and commit[0].prev_hash == (before.row_hash if before else GENESIS_HASH)
        and (before is None or commit[0].timestamp >= before.timestamp)
    )
    if crashed:
        return None
    expected = "no row (missing or empty)" if head is None else f"row {head[0]} ({head[1][:16]})"
    return HeadBreak(expected, found)


def acknowledged_ids(rows: Sequence[AuditEntry], bad: set[int]) -> dict[int, AuditEntry]:
    """Break row ids acknowledged by an acknowledgement row that itself verifies."""
    acked: dict[int, AuditEntry] = {}
    for row in rows:
        if row.edit_type != ACK_EDIT_TYPE or row.id in bad:
            continue
        try:
            ids = json.loads(row.new_value or "[]")
        except ValueError:
            continue
        if isinstance(ids, list):
            acked.update({int(i): row for i in ids if isinstance(i, int) and i < row.id})
    return acked


def row_findings(
    rows: Sequence[AuditEntry], problems: Sequence[ChainProblem], bad: set[int]
) -> tuple[list[ChainProblem], list[str]]:
    """``problems`` less the row problems an administrator acknowledged, and a note for each.

    Args:
        rows: the whole table, oldest first.
        problems: the rows' problems (from ``verification.check_rows``).
        bad: rows that do not verify, whose acknowledgements count for nothing.
    """
    acked = acknowledged_ids(rows, bad)
    kept: list[ChainProblem] = []
    notes: list[str] = []
    for problem in problems:
        ack = acked.get(problem.row_id) if problem.row_id is not None else None
        if ack is None or problem.kind not in ACKNOWLEDGEABLE:
            kept.append(problem)
            continue
        by = ack.user_name or ack.user_id
        notes.append(
            f"row {problem.row_id} {problem.kind} ({problem.detail}) acknowledged by {by} "
            f"in row {ack.id}"
        )
    return kept, notes


def break_findings(
    rows: Sequence[AuditEntry], bad: set[int]
) -> tuple[list[ChainProblem], list[str]]:
    """Break rows: a ``chain_break`` problem each until acknowledged, a note after."""
    acked = acknowledged_ids(rows, bad)
    problems: list[ChainProblem] = []
    notes: list[str] = []
    for row in rows:
        if row.edit_type != BREAK_EDIT_TYPE:
            continue
        what = f"the head file named {row.old_value}; the database ended with {row.new_value}"
        ack = acked.get(row.id)
        if ack is None:
            problems.append(
                ChainProblem(
                    row.id,
                    "chain_break",
                    f"{what} (found at {row.timestamp:%Y-%m-%d %H:%M:%S}); rows were changed "
                    "in the database alone: check them, then an administrator acknowledges "
                    "with `agentmend audit acknowledge`",
                )
            )
        else:
            by = ack.user_name or ack.user_id
            notes.append(f"break at row {row.id} ({what}) acknowledged by {by} in row {ack.id}")
    return problems, notes
