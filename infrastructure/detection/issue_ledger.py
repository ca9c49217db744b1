"""Open issues and detector state, kept in the store: one alarm per condition, across processes.

Without a record of open issues, a condition no fix can cure (a provider's rate-limit storm, an
outage) raises an alarm, the cycle ends with no change, the statistic restarts against the same
baseline, and the alarm fires again a few runs later, forever; and two workers on one store each
start a cycle for the same alarm. So an issue is a row here, opened once by whichever process
first sees the alarm (a unique index on the agent and kind of the *active* issues makes a second
opener find the first one's row instead), and its life is recorded on it:

``open`` (a cycle may run) -> ``resolved`` (a change was kept), or ``held`` (the cycle ended with
no change: the detector stays quiet on this agent and kind for ``hold_runs`` runs, doubling at
each repeat up to a ceiling) -> ``open`` again when the alarm recurs after the hold, or
``cleared_without_change`` when the statistic stays near zero for a window by itself.

One issue, one cycle, fleet-wide: a cycle first *claims* its open issue (a compare-and-set on a
row of ``monitoring_issue_claims``), so two processes that both see the issue (a session, the MCP
server, the fleet checker) never both run a cycle for it. The claim ends with the issue's next
move (held, resolved, cleared); a claim older than its bound (its claimant died mid-cycle) may
be taken by the next cycle.

The detector's per-agent state (statistics, run counts, the hold's counters) is saved here too,
so a restarted process resumes where the last one stopped instead of starting from zero.

The SQL is kept plain and in this one module (``INSERT``, ``UPDATE``, ``SELECT``, a partial
unique index, ``ON CONFLICT ... DO UPDATE``), which SQLite and PostgreSQL both accept as written.
Without a store the same ledger lives in memory (one process).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Literal

from agentmend.infrastructure.detection import series
from agentmend.infrastructure.detection.series import StatisticPoint
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection

__all__ = [
    "ACTIVE",
    "IssueClaim",
    "IssueLedger",
    "IssueRow",
    "IssueStatus",
    "SavedState",
    "read_active_issues",
    "read_detector_states",
]

IssueStatus = Literal["open", "held", "resolved", "cleared_without_change"]
ACTIVE: tuple[IssueStatus, ...] = ("open", "held")

_COMPONENT = "monitoring"
_MIGRATIONS = [
    """
    CREATE TABLE monitoring_issues (
        issue_id TEXT PRIMARY KEY,
        agent TEXT NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        detector TEXT NOT NULL,
        context TEXT NOT NULL,
        opened_ts REAL NOT NULL,
        updated_ts REAL NOT NULL,
        cycles INTEGER NOT NULL,
        hold_runs INTEGER NOT NULL,
        outcome TEXT,
        change_id TEXT
    );
    CREATE UNIQUE INDEX monitoring_one_active_issue ON monitoring_issues (agent, kind)
        WHERE status IN ('open', 'held');
    CREATE TABLE monitoring_detector_state (
        agent TEXT NOT NULL,
        kind TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        statistic REAL NOT NULL,
        runs INTEGER NOT NULL,
        total REAL NOT NULL,
        issue_id TEXT,
        runs_since_hold INTEGER NOT NULL,
        quiet_runs INTEGER NOT NULL,
        scale REAL NOT NULL,
        threshold REAL NOT NULL,
        updated_ts REAL NOT NULL,
        PRIMARY KEY (agent, kind)
    )
    """,
    """
    CREATE TABLE monitoring_issue_claims (
        issue_id TEXT PRIMARY KEY,
        claimed_by TEXT NOT NULL,
        claimed_at REAL NOT NULL
    )
    """,
]
_ISSUE_COLUMNS = (
    "issue_id, agent, kind, status, detector, context, opened_ts, updated_ts, cycles, hold_runs,"
    " outcome, change_id"
)
_STATE_COLUMNS = (
    "agent, kind, epoch, statistic, runs, total, issue_id, runs_since_hold, quiet_runs, scale,"
    " threshold, updated_ts"
)


@dataclass(frozen=True, slots=True)
class IssueRow:
    """One issue: an agent's condition of one kind (``low_success_rate``, ...), and its life."""

    issue_id: str
    agent: str
    kind: str
    status: IssueStatus
    detector: str
    context: str
    opened_ts: float
    updated_ts: float
    cycles: int  # cycles that ended on this issue with no change
    hold_runs: int  # the current hold, in runs of the agent
    outcome: str | None  # the last cycle's outcome, or why the issue closed
    change_id: str | None  # the kept change that resolved it


@dataclass(frozen=True, slots=True)
class IssueClaim:
    """Who runs the cycle for an issue: ``mine`` when the asker's claim holds."""

    issue_id: str
    claimed_by: str
    claimed_at: float
    mine: bool


@dataclass(frozen=True, slots=True)
class SavedState:
    """One agent's chart state of one kind, as the detector last saved it."""

    agent: str
    kind: str
    epoch: int  # the baseline the statistic was computed against
    statistic: float
    runs: int
    total: float
    issue_id: str | None
    runs_since_hold: int
    quiet_runs: int
    scale: float  # statistic * scale is the statistic as shown (nats for the failure chart)
    threshold: float  # as shown


def read_active_issues(conn: StoreConnection) -> list[IssueRow]:
    """The open and held issues, oldest first (for readers that hold a connection)."""
    rows = conn.execute(
        f"SELECT {_ISSUE_COLUMNS} FROM monitoring_issues WHERE status IN ('open', 'held')"
        " ORDER BY opened_ts"
    ).fetchall()
    return [_issue(row) for row in rows]


def read_detector_states(conn: StoreConnection) -> dict[tuple[str, str], SavedState]:
    """Every saved detector state, by (agent, kind)."""
    rows = conn.execute(f"SELECT {_STATE_COLUMNS} FROM monitoring_detector_state").fetchall()
    return {(r[0], r[1]): SavedState(*r[:11]) for r in rows}


class IssueLedger:
    """The open issues and saved detector state of one store (or of this process, in memory)."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store
        self._issues: dict[str, IssueRow] = {}
        self._claims: dict[str, tuple[str, float]] = {}
        self._states: dict[tuple[str, str], SavedState] = {}
        if store is not None:
            store.migrate(_COMPONENT, _MIGRATIONS)
            store.migrate(series.COMPONENT, series.MIGRATIONS)

    # ----------------------------------------------------------------- issues

    def open(
        self, agent: str, kind: str, *, detector: str, context: str, hold_runs: int
    ) -> tuple[IssueRow, bool]:
        """Open the agent's issue of ``kind``: ``(row, True)``, or ``(active row, False)`` if
        one is already open or held (by this process or another)."""
        now = time.time()
        fresh = IssueRow(
            uuid.uuid4().hex[:12],
            agent,
            kind,
            "open",
            detector,
            context,
            now,
            now,
            0,
            hold_runs,
            None,
            None,
        )
        if self.store is None:
            existing = self.active(agent, kind)
            if existing is not None:
                return existing, False
            self._issues[fresh.issue_id] = fresh
            return fresh, True
        with self.store.transaction() as conn:
            row = conn.execute(
                f"SELECT {_ISSUE_COLUMNS} FROM monitoring_issues"
                " WHERE agent = ? AND kind = ? AND status IN ('open', 'held')",
                (agent, kind),
            ).fetchone()
            if row is not None:
                return _issue(row), False
            conn.execute(
                f"INSERT INTO monitoring_issues ({_ISSUE_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _values(fresh),
            )
        return fresh, True

    def hold(self, issue_id: str, *, outcome: str, hold_runs: int) -> IssueRow | None:
        """A cycle ended with no change: hold the issue for ``hold_runs`` runs."""
        current = self.get(issue_id)
        if current is None or current.status not in ACTIVE:
            return current
        return self._update(
            replace(
                current,
                status="held",
                outcome=outcome,
                cycles=current.cycles + 1,
                hold_runs=hold_runs,
            )
        )

    def reopen(self, issue_id: str, *, context: str) -> IssueRow | None:
        """The condition came back after its hold: the issue is open for a cycle again."""
        current = self.get(issue_id)
        if current is None or current.status not in ACTIVE:
            return current
        return self._update(replace(current, status="open", context=context))

    def resolve(
        self, issue_id: str, *, change_id: str | None, outcome: str = "kept"
    ) -> IssueRow | None:
        """A change was kept for this issue: it is closed."""
        current = self.get(issue_id)
        if current is None or current.status not in ACTIVE:
            return current
        return self._update(
            replace(current, status="resolved", outcome=outcome, change_id=change_id)
        )

    def clear(self, issue_id: str) -> IssueRow | None:
        """The condition cleared by itself: closed as ``cleared_without_change``."""
        current = self.get(issue_id)
        if current is None or current.status not in ACTIVE:
            return current
        return self._update(
            replace(current, status="cleared_without_change", outcome="cleared without change")
        )

    def claim(self, issue_id: str, by: str, *, stale_after_s: float) -> IssueClaim | None:
        """Claim ``issue_id`` for a cycle run ``by`` this claimant.

        Returns the claim as it stands after (``mine`` says whether ``by`` holds it), or None
        when the issue is not open (held or closed meanwhile: no cycle should run for it). A
        claim older than ``stale_after_s`` seconds is taken over.
        """
        now = time.time()
        if self.store is None:
            row = self._issues.get(issue_id)
            if row is None or row.status != "open":
                return None
            held = self._claims.get(issue_id)
            if held is None or held[0] == by or now - held[1] > stale_after_s:
                self._claims[issue_id] = (by, now)
                return IssueClaim(issue_id, by, now, mine=True)
            return IssueClaim(issue_id, held[0], held[1], mine=False)
        with self.store.transaction() as conn:
            status = conn.execute(
                "SELECT status FROM monitoring_issues WHERE issue_id = ?", (issue_id,)
            ).fetchone()
            if status is None or status[0] != "open":
                return None
            held = conn.execute(
                "SELECT claimed_by, claimed_at FROM monitoring_issue_claims WHERE issue_id = ?",
                (issue_id,),
            ).fetchone()
            if held is not None and held[0] != by and now - float(held[1]) <= stale_after_s:
                return IssueClaim(issue_id, str(held[0]), float(held[1]), mine=False)
            conn.execute("DELETE FROM monitoring_issue_claims WHERE issue_id = ?", (issue_id,))
            conn.execute(
                "INSERT INTO monitoring_issue_claims (issue_id, claimed_by, claimed_at)"
                " VALUES (?, ?, ?)",
                (issue_id, by, now),
            )
        return IssueClaim(issue_id, by, now, mine=True)

    def get(self, issue_id: str) -> IssueRow | None:
        if self.store is None:
            return self._issues.get(issue_id)
        row = (
            self.store.connection()
            .execute(
                f"SELECT {_ISSUE_COLUMNS} FROM monitoring_issues WHERE issue_id = ?", (issue_id,)
            )
            .fetchone()
        )
        return _issue(row) if row is not None else None

    def active(self, agent: str, kind: str) -> IssueRow | None:
        """The agent's open or held issue of ``kind``, if any."""
        return next((i for i in self.issues(agent=agent, active=True) if i.kind == kind), None)

    def issues(
        self, *, agent: str | None = None, active: bool = False, limit: int = 200
    ) -> list[IssueRow]:
        """Issues, newest first (only open and held ones with ``active``)."""
        if self.store is None:
            kept = [
                i
                for i in self._issues.values()
                if (agent is None or i.agent == agent) and (not active or i.status in ACTIVE)
            ]
            return sorted(kept, key=lambda i: i.opened_ts, reverse=True)[:limit]
        where: list[str] = []
        params: list[object] = []
        if agent is not None:
            where.append("agent = ?")
            params.append(agent)
        if active:
            where.append("status IN ('open', 'held')")
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = (
            self.store.connection()
            .execute(
                f"SELECT {_ISSUE_COLUMNS} FROM monitoring_issues{clause}"
                " ORDER BY opened_ts DESC LIMIT ?",
                (*params, limit),
            )
            .fetchall()
        )
        return [_issue(row) for row in rows]

    def _update(self, row: IssueRow) -> IssueRow:
        row = replace(row, updated_ts=time.time())
        if self.store is None:
            self._issues[row.issue_id] = row
            if row.status != "open":
                self._claims.pop(row.issue_id, None)
            return row
        with self.store.transaction() as conn:
            if row.status != "open":  # the issue moved on: the cycle that claimed it is over
                conn.execute(
                    "DELETE FROM monitoring_issue_claims WHERE issue_id = ?", (row.issue_id,)
                )
            conn.execute(
                "UPDATE monitoring_issues SET status = ?, context = ?, updated_ts = ?, cycles = ?,"
                " hold_runs = ?, outcome = ?, change_id = ? WHERE issue_id = ?",
                (
                    row.status,
                    row.context,
                    row.updated_ts,
                    row.cycles,
                    row.hold_runs,
                    row.outcome,
                    row.change_id,
                    row.issue_id,
                ),
            )
        return row

    # ----------------------------------------------------------------- detector state

    def save_states(
        self, states: list[SavedState], points: list[StatisticPoint] | None = None
    ) -> None:
        """Save the detector's state for these agents and kinds, and add ``points`` to the
        statistic's chart series (``detector_series``), in one transaction."""
        if not states:
            return
        if self.store is None:
            for state in states:
                self._states[(state.agent, state.kind)] = state
            return
        now = time.time()
        with self.store.transaction() as conn:
            conn.executemany(
                f"INSERT INTO monitoring_detector_state ({_STATE_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (agent, kind) DO UPDATE SET epoch = excluded.epoch,"
                " statistic = excluded.statistic, runs = excluded.runs, total = excluded.total,"
                " issue_id = excluded.issue_id, runs_since_hold = excluded.runs_since_hold,"
                " quiet_runs = excluded.quiet_runs, scale = excluded.scale,"
                " threshold = excluded.threshold, updated_ts = excluded.updated_ts",
                [
                    (
                        s.agent,
                        s.kind,
                        s.epoch,
                        s.statistic,
                        s.runs,
                        s.total,
                        s.issue_id,
                        s.runs_since_hold,
                        s.quiet_runs,
                        s.scale,
                        s.threshold,
                        now,
                    )
                    for s in states
                ],
            )
            series.add_points(conn, points or [])

    def load_states(self) -> dict[tuple[str, str], SavedState]:
        """Every saved detector state, by (agent, kind)."""
        if self.store is None:
            return dict(self._states)
        return read_detector_states(self.store.connection())


def _issue(row: tuple[object, ...]) -> IssueRow:
    return IssueRow(*row)  # type: ignore[arg-type]


def _values(row: IssueRow) -> tuple[object, ...]:
    return (
        row.issue_id,
        row.agent,
        row.kind,
        row.status,
        row.detector,
        row.context,
        row.opened_ts,
        row.updated_ts,
        row.cycles,
        row.hold_runs,
        row.outcome,
        row.change_id,
    )
