"""A fleet checker's requests to run a cycle for an issue, and the answers people give.

With ``--on-issue ask`` the checker does not run a cycle by itself: it asks, and goes on judging.
The question is a row here (the issue's report kept with it, so any checker that holds the seat
later can run the cycle), answered by a person from any face (``agentmend issue approve``, the
session, the MCP server); the answer is an audit row naming who gave it, written in the same
transaction. With ``--on-issue improve`` the checker approves its own requests, unattended, and
the audit row says so. A request moves once along::

    asked -> approved -> started -> done        (the checker ran the cycle: its status)
          -> declined -> done                   (the checker held the issue)

Each move is a compare-and-set on the row's state, so two checkers never both start a cycle for
one approval and a question is answered once. A request ``started`` by a checker that died
mid-cycle goes back to ``approved`` once it is as old as a stale claim, for the next checker.
Plain SQL that SQLite and PostgreSQL both accept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Literal

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.errors import AgentmendError, NotFound
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.snapshot import read_snapshot
from agentmend.infrastructure.store.sql import has_table

__all__ = [
    "COMPONENT",
    "MIGRATIONS",
    "AlreadyAnswered",
    "CycleRequest",
    "CycleRequests",
    "RequestState",
    "read_requests",
]

RequestState = Literal["asked", "approved", "declined", "started", "done"]

COMPONENT = "cycle_requests"
MIGRATIONS = [
    """
    CREATE TABLE cycle_requests (
        issue_id TEXT PRIMARY KEY,
        team_id TEXT NOT NULL,
        agent TEXT NOT NULL,
        kind TEXT NOT NULL,
        report TEXT NOT NULL,
        asked_by TEXT NOT NULL,
        asked_at REAL NOT NULL,
        state TEXT NOT NULL,
        answered_by TEXT,
        answered_at REAL,
        started_at REAL,
        outcome TEXT
    )
    """
]
_COLUMNS = (
    "issue_id, team_id, agent, kind, report, asked_by, asked_at, state, answered_by,"
    " answered_at, started_at, outcome"
)
UNATTENDED = "unattended (AGENTMEND_YOLO_MODE)"
"""Who ``answered_by`` names for a request the checker approved itself under ``improve``."""


class AlreadyAnswered(AgentmendError):
    """The request was answered already (or was never a question: ``improve`` approved it)."""

    def __init__(self, issue_id: str, state: str, by: str | None) -> None:
        self.issue_id, self.state, self.by = issue_id, state, by
        super().__init__(
            f"the question about issue {issue_id} was answered already"
            + (f" by {by}" if by else "")
            + f" (it is {state} now)"
        )


@dataclass(frozen=True, slots=True)
class CycleRequest:
    """One request: the checker's question about an issue, and where it stands."""

    issue_id: str
    team_id: str
    agent: str
    kind: str
    report: str  # the IssueReport as JSON: the cycle runs on it
    asked_by: str
    asked_at: float
    state: RequestState
    answered_by: str | None
    answered_at: float | None
    started_at: float | None
    outcome: str | None

    @property
    def issue(self) -> IssueReport:
        return IssueReport.model_validate_json(self.report)

    def as_json(self) -> dict[str, Any]:
        return {
            "issue_id": self.issue_id,
            "team_id": self.team_id,
            "agent": self.agent,
            "kind": self.kind,
            "asked_by": self.asked_by,
            "asked_at": self.asked_at,
            "state": self.state,
            "answered_by": self.answered_by,
            "answered_at": self.answered_at,
            "started_at": self.started_at,
            "outcome": self.outcome,
        }


class CycleRequests:
    """The cycle requests of ``store`` (every team's; the checker reads its own team's)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        store.migrate(COMPONENT, MIGRATIONS)

    def ask(
        self, team_id: str, issue: IssueReport, *, by: Principal, approved: bool = False
    ) -> tuple[CycleRequest, bool]:
        """Ask (or, ``approved``, approve unattended) a cycle for ``issue``.

        Returns ``(request, True)`` when this call made it; ``(existing, False)`` when the issue
        was asked about before (an issue raised again after its hold is asked about again once
        its earlier request is done).
        """
        if issue.issue_id is None:
            raise ValueError("only an issue the detector opened (with an issue_id) is asked")
        now = time.time()
        state: RequestState = "approved" if approved else "asked"
        with self.store.transaction() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM cycle_requests WHERE issue_id = ?", (issue.issue_id,)
            ).fetchone()
            if row is not None and _request(row).state != "done":
                return _request(row), False
            conn.execute("DELETE FROM cycle_requests WHERE issue_id = ?", (issue.issue_id,))
            fresh = CycleRequest(
                issue.issue_id,
                team_id,
                issue.agent_name,
                issue.error_type,
                issue.model_dump_json(),
                by.user_id,
                now,
                state,
                UNATTENDED if approved else None,
                now if approved else None,
                None,
                None,
            )
            conn.execute(
                f"INSERT INTO cycle_requests ({_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _values(fresh),
            )
        return fresh, True

    def answer(
        self, issue_id: str, *, approve: bool, by: Principal, audit: AuditLog
    ) -> CycleRequest:
        """A person's answer to the checker's question, audited with who gave it.

        Raises:
            NotFound: no request for ``issue_id``; nothing is written.
            AlreadyAnswered: it was answered (or approved unattended) before; nothing is
                written.
            AuditChainBroken: the audit chain is broken; nothing is written.
        """
        now = time.time()
        state: RequestState = "approved" if approve else "declined"
        with audit.transaction() as txn:
            row = txn.conn.execute(
                f"SELECT {_COLUMNS} FROM cycle_requests WHERE issue_id = ?", (issue_id,)
            ).fetchone()
            if row is None:
                asked = [
                    str(r[0])
                    for r in txn.conn.execute(
                        "SELECT issue_id FROM cycle_requests WHERE state = 'asked'"
                        " ORDER BY asked_at"
                    ).fetchall()
                ]
                waiting = f"(waiting: {', '.join(asked)})" if asked else "(none is waiting)"
                raise NotFound("question about issue", issue_id, waiting)
            current = _request(row)
            done = txn.conn.execute(
                "UPDATE cycle_requests SET state = ?, answered_by = ?, answered_at = ?"
                " WHERE issue_id = ? AND state = 'asked'",
                (state, by.user_id, now, issue_id),
            )
            if int(done.rowcount) != 1:
                raise AlreadyAnswered(issue_id, current.state, current.answered_by)
            txn.append(
                agent_name=current.agent,
                edit_type=f"issue_cycle_{state}",
                old_value=f"{current.kind} (issue {issue_id}), asked by {current.asked_by}",
                new_value=f"a cycle for issue {issue_id} {state} by {by.name}",
                user_id=by.user_id,
                user_name=by.name,
            )
        return replace(current, state=state, answered_by=by.user_id, answered_at=now)

    def start(self, issue_id: str) -> bool:
        """Take an approved request to run its cycle: False if another checker took it."""
        with self.store.transaction() as conn:
            done = conn.execute(
                "UPDATE cycle_requests SET state = 'started', started_at = ?"
                " WHERE issue_id = ? AND state = 'approved'",
                (time.time(), issue_id),
            )
            return int(done.rowcount) == 1

    def restart_stale(self, team_id: str, *, older_than_s: float) -> list[str]:
        """Approve again the team's requests started more than ``older_than_s`` ago (call it
        with none of this process's cycles running): their checker is gone, and the next one
        runs their cycles. Their cycles' claims on the issues are as old, so the new cycle
        takes them over. Returns the issue ids approved again."""
        cutoff = time.time() - older_than_s
        again: list[str] = []
        with self.store.transaction() as conn:
            for (issue_id,) in conn.execute(
                "SELECT issue_id FROM cycle_requests"
                " WHERE team_id = ? AND state = 'started' AND started_at < ?",
                (team_id, cutoff),
            ).fetchall():
                conn.execute(
                    "UPDATE cycle_requests SET state = 'approved', started_at = NULL"
                    " WHERE issue_id = ? AND state = 'started'",
                    (issue_id,),
                )
                again.append(str(issue_id))
        return again

    def finish(self, issue_id: str, outcome: str) -> bool:
        """The cycle ran (``outcome``: its status), or the declined issue was held."""
        with self.store.transaction() as conn:
            done = conn.execute(
                "UPDATE cycle_requests SET state = 'done', outcome = ?"
                " WHERE issue_id = ? AND state IN ('started', 'declined')",
                (outcome, issue_id),
            )
            return int(done.rowcount) == 1

    def of_team(self, team_id: str, *states: RequestState) -> list[CycleRequest]:
        """The team's requests in ``states`` (every state when none is given), oldest first."""
        return read_requests(self.store, team_id=team_id, states=states)


def read_requests(
    store: Store,
    *,
    team_id: str | None = None,
    states: tuple[RequestState, ...] = (),
    limit: int = 200,
) -> list[CycleRequest]:
    """The newest ``limit`` cycle requests (of ``team_id``, in ``states``), oldest first."""
    where: list[str] = []
    params: list[object] = []
    if team_id is not None:
        where.append("team_id = ?")
        params.append(team_id)
    if states:
        where.append(f"state IN ({', '.join('?' for _ in states)})")
        params.extend(states)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    with read_snapshot(store) as conn:
        if not has_table(conn, "cycle_requests"):
            return []
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM cycle_requests{clause} ORDER BY asked_at DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
    return [_request(row) for row in reversed(rows)]


def _request(row: tuple[Any, ...]) -> CycleRequest:
    (issue, team, agent, kind, report, asked_by, asked_at, state, by, at, started, outcome) = row
    return CycleRequest(
        str(issue),
        str(team),
        str(agent),
        str(kind),
        str(report),
        str(asked_by),
        float(asked_at),
        state,
        None if by is None else str(by),
        None if at is None else float(at),
        None if started is None else float(started),
        None if outcome is None else str(outcome),
    )


def _values(r: CycleRequest) -> tuple[object, ...]:
    return (
        r.issue_id,
        r.team_id,
        r.agent,
        r.kind,
        r.report,
        r.asked_by,
        r.asked_at,
        r.state,
        r.answered_by,
        r.answered_at,
        r.started_at,
        r.outcome,
    )
