"""Heads rewritten after being unreadable by earlier versions: how verification reports them.

Writes now treat an unreadable head as a break (see
:mod:`agentmend.infrastructure.changes.audit.breaks`) and record it in the chain itself; databases
written before keep their events here, and
:meth:`~agentmend.infrastructure.changes.audit.log.AuditLog.verify_chain` goes on reporting them.
Earlier, a write that found the head unparseable logged ``audit_head_unreadable``, carried on, and
its post-commit head write rewrote it, keeping the event in ``audit_head_events``.
:meth:`~agentmend.infrastructure.changes.audit.log.AuditLog.verify_chain` reports each event as a
``head_was_unreadable`` problem until a ``repair`` run whose rows all verify has reported it; from
then on it is a note ("head was rewritten after being unreadable at <time>: <reason naming the
file>"), on every run, for good.

The events share the ``audit`` migration component with the audit table
(:mod:`agentmend.infrastructure.changes.audit.log` creates ``audit_head_events``); callers hold the
head file's lock.
"""

from __future__ import annotations

from pathlib import Path

from agentmend.infrastructure.changes.audit.verification import ChainProblem
from agentmend.infrastructure.models import utc_now
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection

__all__ = ["head_event_findings", "record_head_event"]


def record_head_event(
    conn: StoreConnection, head_path: Path, reason: str, row_id: int | None, *, reported: bool
) -> None:
    """Keep, in ``conn``'s transaction, that the head at ``head_path`` was found unreadable.

    Args:
        reason: why it could not be read (names the file).
        row_id: the row the rewritten head names (None: the log is empty).
        reported: whether a verification has already reported it (it is rewriting the head).
    """
    now = utc_now().isoformat()
    conn.execute(
        "INSERT INTO audit_head_events (timestamp, head_path, reason, row_id, reported)"
        " VALUES (?,?,?,?,?)",
        (now, str(head_path), reason, row_id, now if reported else None),
    )


def head_event_findings(
    store: Store, conn: StoreConnection, *, acknowledge: bool
) -> tuple[list[ChainProblem], list[str]]:
    """Heads rewritten after being unreadable: problems until reported, notes after.

    With ``acknowledge`` (a ``repair`` run whose rows all verify) the events reported now are
    marked reported, in their own durable transaction of ``store``.
    """
    problems: list[ChainProblem] = []
    notes: list[str] = []
    fresh: list[int] = []
    for event_id, stamp, reason, row_id, reported in conn.execute(
        "SELECT id, timestamp, reason, row_id, reported FROM audit_head_events ORDER BY id"
    ):
        at = f" (to name row {row_id})" if row_id is not None else ""
        text = f"head was rewritten{at} after being unreadable at {stamp}: {reason}"
        if reported is None:
            detail = f"{text}; rows cut off before then cannot be detected through the head"
            problems.append(ChainProblem(None, "head_was_unreadable", detail))
            fresh.append(int(event_id))
        else:
            notes.append(text)
    if acknowledge and fresh:
        with store.transaction(durable=True) as wconn:
            wconn.executemany(
                "UPDATE audit_head_events SET reported = ? WHERE id = ?",
                [(utc_now().isoformat(), i) for i in fresh],
            )
    return problems, notes
