"""A change watched on live runs: kept once it is shown to help, rolled back once it hurts.

For an agent with no eval suite there is nothing to run before and after; what there is, is its
live traffic. A watched change is applied on one host and then judged on the agent's runs that
follow, against the runs from before it, with the always-valid two-sample test
(:class:`~agentmend.infrastructure.evaluation.sequential.TwoSampleTest`, one pre-change run per new
run, in order). The watch ends at the first of:

- ``hurts``: rolled back at once (``rollback_unproven``), as soon as the test says so;
- ``better``: kept (``mark_kept``);
- the budget spent without ``better`` (``no_worse`` or ``budget_spent``): rolled back, because
  a change that does not help is not kept.

Ownership: the change is held by a lease whose owner is the watch's record
(``RecordOwner("watch", watch_id)``, :mod:`agentmend.infrastructure.changes.protocol.owners`), not
by a process. Recovery at open leaves such a lease alone
(:mod:`agentmend.infrastructure.changes.protocol.abandoned`), so a crash of the process that started
the watch does not undo the change: whichever process next calls :meth:`ChangeWatcher.advance` (or
:meth:`ChangeWatcher.continue_all` at open) on the host of the change's files picks the watch up
where it was. It keeps no test state of its own to lose: the test is replayed from the store (the
pre-change outcomes in the watch's row, the runs since the change in the executions table), so the
taker-over reaches the decision the first process would have. Keeping or rolling back releases the
lease in the same transaction, so two processes advancing one watch settle it once (the other gets
``LeaseLost`` and reads the outcome).

What started the watch (an improvement cycle: its id, the issue it answers) is kept in the
watch's row as its ``origin`` and merged into the evidence of a keep, so the record of the
change says which cycle it came from however the watch ended. Every settlement is also recorded
as a ``watch_settled`` decision. A watch's :attr:`ChangeWatch.verdict` reads ``watching``,
``kept``, ``rolled_back`` (it hurt) or ``not_proven`` (not shown better within its budget).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from uuid import uuid4

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.decisions import record_decision
from agentmend.infrastructure.changes.protocol.leases import LeaseLost
from agentmend.infrastructure.changes.protocol.owners import HostIdentity, RecordOwner
from agentmend.infrastructure.errors import InvalidArgument
from agentmend.infrastructure.evaluation.sequential import TwoSampleDecision, TwoSampleTest
from agentmend.infrastructure.models import ChangeRecord, ChangeStatus, ImprovementAction
from agentmend.infrastructure.monitoring.run_reader import last_run_id, outcomes_after
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["ChangeWatch", "ChangeWatcher", "WatchState", "WatchVerdict", "read_watch"]

log = get_logger(__name__)

WatchState = Literal["watching", "kept", "rolled_back"]
WatchVerdict = Literal["watching", "kept", "rolled_back", "not_proven"]
"""How a watch stands: still watching, kept (shown better), rolled back because it hurt, or
rolled back because it was not shown better within its budget (``no_worse``/``budget_spent``)."""

_MIGRATIONS = [
    """
    CREATE TABLE change_watches (
        watch_id TEXT PRIMARY KEY,
        agent TEXT NOT NULL,
        hostname TEXT NOT NULL,
        machine_id TEXT NOT NULL,
        before TEXT NOT NULL,
        after_id INTEGER NOT NULL,
        budget INTEGER NOT NULL,
        margin REAL NOT NULL,
        alpha REAL NOT NULL,
        state TEXT NOT NULL,
        decision TEXT,
        pairs INTEGER NOT NULL,
        started REAL NOT NULL,
        ended REAL
    );
    CREATE INDEX change_watches_open ON change_watches (state) WHERE state = 'watching'
    """,
    # what started the watch (JSON: a cycle's id, its issue), merged into a keep's evidence
    "ALTER TABLE change_watches ADD COLUMN origin TEXT",
]
_COLUMNS = (
    "watch_id, agent, hostname, machine_id, before, after_id, budget, margin, alpha,"
    " state, decision, pairs, origin"
)


@dataclass(frozen=True, slots=True)
class ChangeWatch:
    """One watch as the store holds it.

    Attributes:
        before: the agent's pre-change outcomes the new runs are compared with, oldest first.
        after_id: the run cursor at the change: runs the executions reader gives after it
            are the change's (an id on SQLite, a position on PostgreSQL; see
            :mod:`agentmend.infrastructure.monitoring.run_reader`).
        pairs: new runs judged so far (as of the last :meth:`ChangeWatcher.advance`).
    """

    watch_id: str
    agent: str
    host: HostIdentity  # where the change's files are: only there is it settled
    before: tuple[bool, ...]
    after_id: int
    budget: int
    margin: float
    alpha: float
    state: WatchState
    decision: TwoSampleDecision | None
    pairs: int
    origin: Mapping[str, Any] = field(default_factory=dict)
    """What started the watch (a cycle's id, its issue's id), as given to ``start``."""

    @property
    def verdict(self) -> WatchVerdict:
        """``watching``, ``kept``, ``rolled_back`` (it hurt) or ``not_proven``."""
        if self.state == "rolled_back" and self.decision != "hurts":
            return "not_proven"
        return self.state

    def describe(self) -> str:
        """One phrase for people: where the watch stands, on how many live runs."""
        runs = f"{self.pairs} live run{'s' if self.pairs != 1 else ''}"
        return {
            "watching": f"watching on live runs ({self.pairs} of at most {self.budget} so far)",
            "kept": f"kept: shown better than before the change on {runs}",
            "rolled_back": f"rolled back: shown to hurt on {runs}",
            "not_proven": f"rolled back: not shown better within its budget of {self.budget} "
            f"live runs ({self.decision})",
        }[self.verdict]


class ChangeWatcher:
    """Starts and advances watched changes on one :class:`ImprovementManager`'s store."""

    def __init__(self, manager: ImprovementManager, *, host: HostIdentity | None = None) -> None:
        manager.store.migrate("change_watches", _MIGRATIONS)
        self.manager = manager
        self.store = manager.store
        self.host = host if host is not None else HostIdentity.current()

    def start(
        self,
        action: ImprovementAction,
        *,
        path: str,
        new_content: str,
        root: Path,
        before: Sequence[bool],
        budget: int | None = None,
        margin: float = 0.05,
        alpha: float = 0.05,
    ) -> ChangeWatch:
        """Apply the change under a new watch; the runs recorded from now on are judged.

        Args:
            before: the agent's outcomes before the change (oldest first), one per run the
                watch may judge.
            budget: the most new runs to watch (default and at most ``len(before)``).

        Raises:
            InvalidArgument: no pre-change runs, or a budget they cannot cover.
        """
        return self.start_applying(
            action.target_agent,
            lambda lease: [
                self.manager.apply(
                    action, path=path, new_content=new_content, root=root, lease=lease
                )
            ],
            before=before,
            budget=budget,
            margin=margin,
            alpha=alpha,
        )

    def start_applying(
        self,
        agent: str,
        apply: Callable[[str], Sequence[ChangeRecord]],
        *,
        before: Sequence[bool],
        budget: int | None = None,
        margin: float = 0.05,
        alpha: float = 0.05,
        origin: Mapping[str, Any] | None = None,
    ) -> ChangeWatch:
        """Start a watch on ``agent``'s runs and make the change with ``apply(lease_id)``.

        ``apply`` writes the change (one or a group) under the watch's lease and returns its
        records; if it raises, nothing was applied (the manager's contract), the lease is
        released and the watch settles as "nothing applied" (rolled back, no decision) before
        the error propagates. ``origin`` (JSON-shaped) is kept with the watch.

        Raises:
            InvalidArgument: no pre-change runs, or a budget they cannot cover.
        """
        if not before:
            raise InvalidArgument("before", 0, "a watch needs the agent's pre-change runs")
        budget = len(before) if budget is None else budget
        if not 1 <= budget <= len(before):
            raise InvalidArgument("budget", budget, f"need 1 <= budget <= {len(before)}")
        TwoSampleTest(budget, margin, alpha)  # refuses a bad margin or alpha before any write
        origin_text = json.dumps(dict(origin or {}), sort_keys=True)
        watch_id = "w-" + uuid4().hex[:12]
        # the row first, then its lease (found by the watch's id), then the change under it: a
        # crash between leaves a watch that settles as "nothing applied"
        # the run cursor before the transaction: read outside one, it waits only for this
        # database's older writes (run_reader.read_horizon)
        before_id = last_run_id(self.store.connection())
        with self.store.transaction(durable=True) as conn:
            conn.execute(
                f"INSERT INTO change_watches ({_COLUMNS}, started)"
                " VALUES (?,?,?,?,?,?,?,?,?,'watching',NULL,0,?,?)",
                (
                    watch_id,
                    agent,
                    self.host.hostname,
                    self.host.machine_id,
                    "".join("1" if ok else "0" for ok in before),
                    before_id,
                    budget,
                    margin,
                    alpha,
                    origin_text,
                    time.time(),
                ),
            )
        lease = self.manager.leases.acquire(
            RecordOwner("watch", watch_id), self.manager.lease_terms
        )
        try:
            apply(lease.lease_id)
        except BaseException:
            with self.store.transaction() as conn:
                self.manager.leases.release(conn, lease.lease_id, "not_applied")
            self._record(watch_id, "rolled_back", None, 0)
            raise
        # runs recorded while the change was applied were made by the old definition: count
        # from here (a crash before this line counts those few as the change's)
        after_id = last_run_id(self.store.connection())
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE change_watches SET after_id = ? WHERE watch_id = ?", (after_id, watch_id)
            )
        log.info("watch_started", watch_id=watch_id, agent=agent, budget=budget)
        watch = self.get(watch_id)
        assert watch is not None
        return watch

    def get(self, watch_id: str) -> ChangeWatch | None:
        return read_watch(self.store, watch_id)

    def open_watches(self, agent: str | None = None) -> list[ChangeWatch]:
        """Every watch still watching (of ``agent`` only, if given), oldest first."""
        where = "state = 'watching'" + (" AND agent = ?" if agent is not None else "")
        rows = self.store.connection().execute(
            f"SELECT {_COLUMNS} FROM change_watches WHERE {where} ORDER BY started",
            (agent,) if agent is not None else (),
        )
        return [_watch(row) for row in rows]

    def open_here(self, agent: str | None = None) -> list[ChangeWatch]:
        """The open watches this host settles (the change's files are here), oldest first."""
        return [w for w in self.open_watches(agent) if _same_host(self.host, w.host)]

    def changes_of(self, watch_id: str) -> list[str]:
        """The ids of the changes the watch holds (empty once it is settled)."""
        lease = self.manager.leases.of_record(RecordOwner("watch", watch_id))
        return self.manager.leases.changes_of(lease.lease_id) if lease is not None else []

    def advance(self, watch_id: str) -> ChangeWatch:
        """Judge the watch on every run recorded so far; keep or roll back if the test decided.

        Only the host that applied the change settles it (its files are there); elsewhere the
        watch is returned as it is.
        """
        watch = self.get(watch_id)
        if watch is None or watch.state != "watching":
            if watch is None:
                raise InvalidArgument("watch_id", watch_id, "no such watch")
            return watch
        if not _same_host(self.host, watch.host):
            return watch
        test = TwoSampleTest(watch.budget, watch.margin, watch.alpha)
        decision: TwoSampleDecision = "continue"
        after = outcomes_after(self.store.connection(), watch.agent, watch.after_id, watch.budget)
        for new, old in zip(after, watch.before, strict=False):
            test.add(new, old)
            decision = test.decision()
            if decision != "continue":
                break
        if decision == "continue":
            self._record(watch_id, "watching", None, test.pairs)
            return self.get(watch_id) or watch
        return self._settle(watch, decision, test.pairs)

    def continue_all(self) -> list[ChangeWatch]:
        """Advance every open watch this host applied (what an open does after a crash)."""
        return [self.advance(w.watch_id) for w in self.open_watches()]

    def _settle(self, watch: ChangeWatch, decision: TwoSampleDecision, pairs: int) -> ChangeWatch:
        lease = self.manager.leases.of_record(RecordOwner("watch", watch.watch_id))
        changes = self.manager.leases.changes_of(lease.lease_id) if lease is not None else []
        keep = decision == "better" and bool(changes)
        evidence = {
            **watch.origin,
            "watch_id": watch.watch_id,
            "decision": decision,
            "pairs": pairs,
            "watched_on": "live runs",
        }
        try:
            if lease is None:
                pass  # the start crashed before its lease: nothing was applied
            elif not changes:  # ... or before the apply
                with self.store.transaction() as conn:
                    self.manager.leases.release(conn, lease.lease_id, "nothing applied")
            elif keep:
                self.manager.mark_kept(changes[0], evidence, lease=lease.lease_id)
            else:
                self.manager.rollback_unproven(
                    changes[0], reason=_rollback_reason(decision, pairs), lease=lease.lease_id
                )
        except LeaseLost:
            # another process settled this watch first: record what it did
            row = self.manager.changes.get(changes[0]) if changes else None
            keep = row is not None and row.status is ChangeStatus.KEPT
        state: WatchState = "kept" if keep else "rolled_back"
        if self._record(watch.watch_id, state, decision, pairs):
            record_decision(
                self.store,
                "watch_settled",
                agent_name=watch.agent,
                payload={
                    **watch.origin,
                    "watch_id": watch.watch_id,
                    "state": state,
                    "decision": decision,
                    "pairs": pairs,
                    "change_ids": changes,
                },
            )
        log.info("watch_settled", watch_id=watch.watch_id, state=state, decision=decision,
                 pairs=pairs)  # fmt: skip
        settled = self.get(watch.watch_id)
        assert settled is not None
        return settled

    def _record(
        self, watch_id: str, state: WatchState, decision: TwoSampleDecision | None, pairs: int
    ) -> bool:
        """Write the watch's state; False when another process had already ended it."""
        with self.store.transaction() as conn:
            cursor = conn.execute(
                "UPDATE change_watches SET state = ?, decision = ?, pairs = ?, ended = ?"
                " WHERE watch_id = ? AND state = 'watching'",
                (state, decision, pairs, None if state == "watching" else time.time(), watch_id),
            )
            return bool(cursor.rowcount)


def read_watch(store: Store, watch_id: str) -> ChangeWatch | None:
    """One watch as the store holds it (None: no such watch), without a manager: what a
    record of the cycle that started it reads to show how it ended."""
    store.migrate("change_watches", _MIGRATIONS)
    row = (
        store.connection()
        .execute(f"SELECT {_COLUMNS} FROM change_watches WHERE watch_id = ?", (watch_id,))
        .fetchone()
    )
    return None if row is None else _watch(row)


def _rollback_reason(decision: TwoSampleDecision, pairs: int) -> str:
    if decision == "hurts":
        return f"watched on live runs: shown to hurt after {pairs} run(s)"
    return (
        f"watched on live runs: not shown better within its budget of {pairs} run(s) "
        f"({decision}); a change that does not help is not kept"
    )


def _watch(row: tuple[object, ...]) -> ChangeWatch:
    (watch_id, agent, hostname, machine_id, before, after_id, budget, margin, alpha,
     state, decision, pairs, origin) = row  # fmt: skip
    return ChangeWatch(
        watch_id=str(watch_id),
        agent=str(agent),
        host=HostIdentity(str(hostname), "", str(machine_id)),
        before=tuple(ch == "1" for ch in str(before)),
        after_id=int(str(after_id)),
        budget=int(str(budget)),
        margin=float(str(margin)),
        alpha=float(str(alpha)),
        state=str(state),  # type: ignore[arg-type]  # the column only holds WatchState values
        decision=None if decision is None else str(decision),  # type: ignore[arg-type]
        pairs=int(str(pairs)),
        origin=json.loads(str(origin)) if origin else {},
    )


def _same_host(here: HostIdentity, there: HostIdentity) -> bool:
    """Whether the change's files (written on ``there``) are on this machine."""
    if not here.same_name(there):
        return False
    return not there.machine_id or here.machine_id == there.machine_id
