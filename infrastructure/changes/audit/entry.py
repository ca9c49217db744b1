"""One audit row as stored: what the log appends, the checks verify and callers read."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["ACK_EDIT_TYPE", "AUDIT_AGENT", "BREAK_EDIT_TYPE", "AuditEntry"]

BREAK_EDIT_TYPE = "audit_chain_break"
"""The first row of a segment started over a broken head (it may follow a gap in row ids)."""
ACK_EDIT_TYPE = "audit_break_acknowledged"
"""An administrator's acknowledgement of break rows (their ids, as JSON, in ``new_value``)."""
AUDIT_AGENT = "(audit)"
"""The ``agent_name`` of the chain's own rows (breaks and acknowledgements)."""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit row as stored."""

    id: int
    timestamp: datetime
    agent_name: str
    edit_type: str
    old_value: str | None
    new_value: str | None
    user_id: str
    user_name: str | None
    change_id: str | None
    prev_hash: str
    row_hash: str
    keyed: bool
    batch: int  # id of the first row committed in the same transaction
    db_role: str | None = field(default=None, compare=False)
    """The PostgreSQL role that wrote the row, recorded by the server (``session_user``);
    None on SQLite, for rows from before it was recorded, and for a row just appended (the
    server fills it in as it stores the row, so it is not part of what makes rows equal)."""
