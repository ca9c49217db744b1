"""The fleet checker's seat: the one process that judges a team's runs, and since when.

Many processes record a team's runs (OTLP receivers, span processors, SDK hooks, monitors on
other hosts); one checker judges them all, so an alarm is seen once, fleet-wide, and acted on by
one process. The seat is one row per team, taken by compare-and-set inside one store transaction
(the store's write lock orders the takers, on SQLite and PostgreSQL alike): a free seat, one the
taker already holds, or one whose holder has not renewed it for longer than its term (the holder
died or froze) goes to the taker; otherwise the taker stands by. The holder renews at each check,
and a standby asks at the same pace, so a dead checker is replaced within a term and a check.

Times are wall-clock seconds (``time.time()``) written by the hosts themselves, so a host whose
clock runs ahead takes over early by its skew: keep the term well above the skew (the default
term is 15 s).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import astuple, dataclass, replace
from typing import Any

from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.snapshot import read_snapshot
from agentmend.infrastructure.store.sql import has_table

__all__ = ["CheckerSeat", "SeatHolder", "read_checkers"]

COMPONENT = "fleet_checker"
MIGRATIONS = [
    """
    CREATE TABLE fleet_checker (
        team_id TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        principal TEXT NOT NULL,
        since REAL NOT NULL,
        renewed_at REAL NOT NULL,
        term_s REAL NOT NULL,
        last_check REAL,
        checks INTEGER NOT NULL,
        issues_opened INTEGER NOT NULL
    )
    """
]
_COLUMNS = (
    "team_id, holder, host, pid, principal, since, renewed_at, term_s, last_check, checks,"
    " issues_opened"
)


@dataclass(frozen=True, slots=True)
class SeatHolder:
    """Who holds a team's checker seat, as last written."""

    team_id: str
    holder: str
    host: str
    pid: int
    principal: str
    since: float
    renewed_at: float
    term_s: float
    last_check: float | None
    checks: int
    issues_opened: int

    def lapsed(self, now: float) -> bool:
        """Not renewed for longer than its term: the holder is gone or frozen."""
        return now - self.renewed_at > self.term_s

    def as_json(self) -> dict[str, Any]:
        return {
            "team_id": self.team_id,
            "holder": self.holder,
            "host": self.host,
            "pid": self.pid,
            "principal": self.principal,
            "since": self.since,
            "renewed_at": self.renewed_at,
            "term_s": self.term_s,
            "last_check": self.last_check,
            "checks": self.checks,
            "issues_opened": self.issues_opened,
        }


class CheckerSeat:
    """This process's claim on ``team_id``'s checker seat in ``store``.

    Args:
        store: the store the team's runs are recorded in.
        team_id: the team whose runs the checker judges.
        principal: who the checker acts as (shown in ``agentmend status``).
        term_s: how long a holder may go without renewing before a standby takes over.
        clock: wall-clock seconds (tests pass their own).
    """

    def __init__(
        self,
        store: Store,
        team_id: str,
        *,
        principal: str,
        term_s: float = 15.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if term_s <= 0:
            raise ValueError(f"term_s must be positive, not {term_s}")
        self.store = store
        self.team_id = team_id
        self.principal = principal
        self.term_s = term_s
        self.holder_id = uuid.uuid4().hex[:16]
        self._clock = clock
        store.migrate(COMPONENT, MIGRATIONS)

    def take(self) -> SeatHolder:
        """Take or renew the seat if it is free, ours or lapsed; the seat's holder after."""
        now = self._clock()
        with self.store.transaction() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM fleet_checker WHERE team_id = ?", (self.team_id,)
            ).fetchone()
            current = _holder(row) if row is not None else None
            if current is not None and current.holder == self.holder_id:
                conn.execute(
                    "UPDATE fleet_checker SET renewed_at = ? WHERE team_id = ? AND holder = ?",
                    (now, self.team_id, self.holder_id),
                )
                return replace(current, renewed_at=now)
            if current is not None and not current.lapsed(now):
                return current
            mine = SeatHolder(
                self.team_id,
                self.holder_id,
                socket.gethostname(),
                os.getpid(),
                self.principal,
                now,
                now,
                self.term_s,
                None,
                0,
                0,
            )
            conn.execute("DELETE FROM fleet_checker WHERE team_id = ?", (self.team_id,))
            conn.execute(
                f"INSERT INTO fleet_checker ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                astuple(mine),
            )
            return mine

    def checked(self, issues_opened: int) -> bool:
        """Note a check (and renew): False if the seat is no longer ours."""
        now = self._clock()
        with self.store.transaction() as conn:
            done = conn.execute(
                "UPDATE fleet_checker SET renewed_at = ?, last_check = ?, checks = checks + 1,"
                " issues_opened = issues_opened + ? WHERE team_id = ? AND holder = ?",
                (now, now, issues_opened, self.team_id, self.holder_id),
            )
            return int(done.rowcount) == 1

    def leave(self) -> None:
        """Give the seat up (a standby takes it at its next ask, without waiting a term)."""
        with self.store.transaction() as conn:
            conn.execute(
                "DELETE FROM fleet_checker WHERE team_id = ? AND holder = ?",
                (self.team_id, self.holder_id),
            )


def read_checkers(store: Store) -> list[SeatHolder]:
    """Every team's checker seat, as last written (none before a checker ever ran)."""
    with read_snapshot(store) as conn:
        if not has_table(conn, "fleet_checker"):
            return []
        rows = conn.execute(f"SELECT {_COLUMNS} FROM fleet_checker ORDER BY team_id").fetchall()
    return [_holder(row) for row in rows]


def _holder(row: tuple[Any, ...]) -> SeatHolder:
    (team, holder, host, pid, principal, since, renewed, term, last, checks, opened) = row
    return SeatHolder(
        str(team),
        str(holder),
        str(host),
        int(pid),
        str(principal),
        float(since),
        float(renewed),
        float(term),
        None if last is None else float(last),
        int(checks),
        int(opened),
    )
