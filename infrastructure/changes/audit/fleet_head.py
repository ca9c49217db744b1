"""A head file on a chain many hosts append to: it vouches for a prefix, the key for the rest.

On SQLite one host appends, so its head file names the chain's newest row and any other newest
row is a break. On a PostgreSQL store with an HMAC key (the documented fleet configuration)
every host keeps a head file of its own, and another host's appends move the chain past it. A
host's head file then vouches for the chain *up to the row it names*: that row must still exist
with that hash and verify, and every row after it must verify under the key and link to the row
before it (only a key holder can write such rows). When they do, the host's head moves forward
to the newest row, under its lock. A head row missing or changed, a broken link, or a row after
the head that fails the key is a break, handled as on one host (see
:mod:`agentmend.infrastructure.changes.audit.breaks`).

A host whose head file has never been written (missing or empty: a host joining the fleet)
vouches for nothing yet: it accepts the chain when every row from the first verifies under the
key and links, and starts its head at the newest row. A head file that exists but holds a blank
or garbled record is still a break. So whoever deletes a host's head file (write access to that
host, not only to the database) makes the host join again, accepting a cut made after its last
look; the other hosts' heads still catch that cut.

What a writer of the database without the key can and cannot do: they cannot forge, edit,
insert, reorder or re-hash rows, nor delete a row below the newest, without a break at a row
id. They can cut rows off the end. Hosts whose heads name a row at or below the cut accept the
shorter chain; each host whose head names a row that is gone finds the cut when it next appends
or verifies, and rows appended after the cut leave a gap in the ids that verification reports
(unless the writer also reset the id sequence). The host that appended a row names it in its
head at once, so the residual risk is this: rows appended after every other host last looked
can be cut, and only the hosts that appended or saw them can tell; if those hosts have left the
fleet or lost their head files (or crashed between a commit and its head write), nothing does.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence

from agentmend.infrastructure.changes.audit.breaks import HeadBreak
from agentmend.infrastructure.changes.audit.entry import AuditEntry
from agentmend.infrastructure.changes.audit.verification import GENESIS_HASH, ChainProblem

__all__ = ["check_fleet_head", "follow_head"]


def _row(row: AuditEntry) -> str:
    return f"row {row.id} ({row.row_hash[:16]})"


def _named(head: tuple[int, str] | None) -> str:
    return "no row (missing or empty)" if head is None else f"row {head[0]} ({head[1][:16]})"


def follow_head(
    head: tuple[int, str] | None,
    fresh: bool,
    unreadable: str | None,
    rows: Sequence[AuditEntry],
    newest: AuditEntry | None,
    verifies: Callable[[AuditEntry], bool],
) -> tuple[HeadBreak | None, AuditEntry | None]:
    """Whether this host's head vouches for the chain now: (break, row to move the head to).

    Args:
        head: the (row id, hash) this host's head file names; None when it names nothing.
        fresh: the head file has never been written (a host joining the fleet).
        unreadable: why the head file could not be read, if it could not.
        rows: the rows from the one the head names on (every row when the head is None),
            oldest first.
        newest: the chain's newest row (None: no rows).
        verifies: whether a row's content matches its hash under the log's key.

    Returns:
        (None, row) when the head vouches for the chain: ``row`` is the newest row to move the
        head to, or None when the head is in step already (or the log is empty); (break, None)
        when it does not.
    """
    found = "no rows" if newest is None else _row(newest)
    if unreadable is not None:
        return HeadBreak(f"nothing readable ({unreadable})", found), None
    if head is None and not fresh:
        return (None, None) if newest is None else (HeadBreak(_named(head), found), None)
    if head is not None:
        first = rows[0] if rows else None
        if (
            first is None
            or first.id != head[0]
            or not hmac.compare_digest(first.row_hash, head[1])
            or not verifies(first)
        ):
            what = "is gone" if first is None or first.id != head[0] else "no longer matches"
            return HeadBreak(_named(head), f"{found}; the row the head names {what}"), None
        prev, following = first, rows[1:]
    else:
        prev, following = None, rows
    for row in following:
        prev_hash = prev.row_hash if prev is not None else GENESIS_HASH
        if not verifies(row):
            what = f"{_row(row)} does not match its hash under the key"
            return HeadBreak(_named(head), f"{found}; {what}"), None
        if row.prev_hash != prev_hash:
            before = f"row {prev.id}" if prev is not None else "the start"
            return HeadBreak(_named(head), f"{found}; {_row(row)} does not link to {before}"), None
        prev = row
    if newest is not None and (prev is None or prev.id != newest.id):
        return HeadBreak(_named(head), f"{found}; the rows read end elsewhere"), None
    ahead = prev if prev is not None and (head is None or prev.id != head[0]) else None
    return None, ahead


def check_fleet_head(
    head: tuple[int, str] | None,
    fresh: bool,
    head_path: str,
    rows: Sequence[AuditEntry],
    row_problems: Sequence[ChainProblem],
    repair: bool,
) -> tuple[list[ChainProblem], list[str], bool]:
    """The head file against the whole table on a fleet: (problems, notes, needs rewriting).

    ``rows`` is the whole table, already checked row by row (``row_problems``): rows after the
    head need no check of their own here beyond having no problems.
    """
    last = rows[-1] if rows else None
    if head is None:
        if last is None:
            return [], [], False
        if not fresh:
            return [ChainProblem(None, "head_missing", f"{head_path} is empty")], [], False
        if row_problems:
            detail = f"{head_path} was never written and the rows do not verify"
            return [ChainProblem(None, "head_missing", detail)], [], False
        done = "started" if repair else "not started"
        return [], [f"this host's head file joins the chain at row {last.id}, {done}"], True
    if last is None or head[0] > last.id:
        ends = f"row {last.id}" if last else "no rows"
        detail = f"head names row {head[0]} but the table ends at {ends}: rows cut off"
        return [ChainProblem(None, "cut_off", detail)], [], False
    named = next((r for r in rows if r.id == head[0]), None)
    if named is None or not hmac.compare_digest(named.row_hash, head[1]):
        what = "is gone" if named is None else "has another hash"
        detail = f"head names row {head[0]}, which {what}"
        return [ChainProblem(None, "head_mismatch", detail)], [], False
    if named is last:
        return [], [], False
    after = [p for p in row_problems if p.row_id is not None and p.row_id >= head[0]]
    if after:
        detail = f"rows after the head's row {head[0]} do not verify under the key"
        return [ChainProblem(None, "head_mismatch", detail)], [], False
    moved = "moved forward" if repair else "not moved"
    count = sum(1 for r in rows if r.id > head[0])
    note = f"head at row {head[0]}; {count} row(s) appended since verify under the key, {moved}"
    return [], [note], True
