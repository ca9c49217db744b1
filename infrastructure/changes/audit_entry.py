"""One audit row as stored: what the log appends, the checks verify and callers read."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["AuditEntry"]


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
