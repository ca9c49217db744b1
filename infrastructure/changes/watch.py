"""A change watched on live runs: kept once it is shown to help, rolled back once it hurts.

For an agent with no eval suite there is nothing to run before and after; what there is, is its
live traffic. A watched change is applied on one host and then judged on the agent's runs that
follow, against the runs from before it, with the always-valid two-sample test
(:class:`~infrastructure.evaluation.sequential.TwoSampleTest`, one pre-change run per new run,
in order). The watch ends at the first of:

- ``hurts``: rolled back at once (``rollback_unproven``), as soon as the test says so;
- ``better``: kept (``mark_kept``);
- the budget spent without ``better`` (``no_worse`` or ``budget_spent``): rolled back, because
  a change that does not help is not kept.

Ownership: the change is held by a lease whose owner is the watch's record
(``RecordOwner("watch", watch_id)``, :mod:`infrastructure.changes.owners`), not by a process.
Recovery at open leaves such a lease alone (:mod:`infrastructure.changes.abandoned`), so a
crash of the process that started the watch does not undo the change: whichever process next
calls :meth:`ChangeWatcher.advance` (or :meth:`ChangeWatcher.continue_all` at open) on the
host of the change's files picks the watch up where it was. It keeps no test state of its own
to lose: the test is replayed from the store (the pre-change outcomes in the watch's row, the
runs since the change in the executions table), so the taker-over reaches the decision the
first process would have. Keeping or rolling back releases the lease in the same transaction,
so two processes advancing one watch settle it once (the other gets ``LeaseLost`` and reads
the outcome).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from uuid import uuid4

from infrastructure.changes.improvement_manager import ImprovementManager
from infrastructure.changes.leases import LeaseLost
from infrastructure.changes.owners import HostIdentity, RecordOwner
from infrastructure.errors import InvalidArgument
from infrastructure.evaluation.sequential import TwoSampleDecision, TwoSampleTest
from infrastructure.models import ChangeStatus, ImprovementAction
from infrastructure.monitoring.execution_store import last_run_id, outcomes_after
from infrastructure.structured_logger import get_logger

__all__ = ["ChangeWatch", "ChangeWatcher", "WatchState"]

log = get_logger(__name__)

WatchState = Literal["watching", "kept", "rolled_back"]

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
    """
]
_COLUMNS = (
    "watch_id, agent, hostname, machine_id, before, after_id, budget, margin, alpha,"
    " state, decision, pairs"
)


@dataclass(frozen=True, slots=True)
class ChangeWatch:
    """One watch as the store holds it.

    Attributes:
        before: the agent's pre-change outcomes the new runs are compared with, oldest first.
        after_id: runs with a larger id in the executions table are the change's.
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
        if not before:
            raise InvalidArgument("before", 0, "a watch needs the agent's pre-change runs")
        budget = len(before) if budget is None else budget
        if not 1 <= budget <= len(before):
            raise InvalidArgument("budget", budget, f"need 1 <= budget <= {len(before)}")
        TwoSampleTest(budget, margin, alpha)  # refuses a bad margin or alpha before any write
        watch_id = "w-" + uuid4().hex[:12]
        # the row first, then its lease (found by the watch's id), then the change under it: a
        # crash between leaves a watch that settles as "nothing applied"
        with self.store.transaction(durable=True) as conn:
            conn.execute(
                f"INSERT INTO change_watches ({_COLUMNS}, started)"
                " VALUES (?,?,?,?,?,?,?,?,?,'watching',NULL,0,?)",
                (
                    watch_id,
                    action.target_agent,
                    self.host.hostname,
                    self.host.machine_id,
                    "".join("1" if ok else "0" for ok in before),
                    last_run_id(self.store),
                    budget,
                    margin,
                    alpha,
                    time.time(),
                ),
            )
        lease = self.manager.leases.acquire(
            RecordOwner("watch", watch_id), self.manager.lease_terms
        )
        self.manager.apply(action, path=path, new_content=new_content, root=root,
                           lease=lease.lease_id)  # fmt: skip
        # runs recorded while the change was applied were made by the old definition: count
        # from here (a crash before this line counts those few as the change's)
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE change_watches SET after_id = ? WHERE watch_id = ?",
                (last_run_id(self.store), watch_id),
            )
        log.info("watch_started", watch_id=watch_id, agent=action.target_agent, budget=budget)
        watch = self.get(watch_id)
        assert watch is not None
        return watch

    def get(self, watch_id: str) -> ChangeWatch | None:
        row = (
            self.store.connection()
            .execute(f"SELECT {_COLUMNS} FROM change_watches WHERE watch_id = ?", (watch_id,))
            .fetchone()
        )
        return None if row is None else _watch(row)

    def open_watches(self) -> list[ChangeWatch]:
        """Every watch still watching, oldest first."""
        rows = self.store.connection().execute(
            f"SELECT {_COLUMNS} FROM change_watches WHERE state = 'watching' ORDER BY started"
        )
        return [_watch(row) for row in rows]

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
        after = outcomes_after(self.store, watch.agent, watch.after_id, watch.budget)
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
        evidence = {"watch_id": watch.watch_id, "decision": decision, "pairs": pairs}
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
                    changes[0], reason=f"watch: {decision}", lease=lease.lease_id
                )
        except LeaseLost:
            # another process settled this watch first: record what it did
            row = self.manager.changes.get(changes[0]) if changes else None
            keep = row is not None and row.status is ChangeStatus.KEPT
        state: WatchState = "kept" if keep else "rolled_back"
        self._record(watch.watch_id, state, decision, pairs)
        log.info("watch_settled", watch_id=watch.watch_id, state=state, decision=decision,
                 pairs=pairs)  # fmt: skip
        settled = self.get(watch.watch_id)
        assert settled is not None
        return settled

    def _record(
        self, watch_id: str, state: WatchState, decision: TwoSampleDecision | None, pairs: int
    ) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE change_watches SET state = ?, decision = ?, pairs = ?, ended = ?"
                " WHERE watch_id = ? AND state = 'watching'",
                (state, decision, pairs, None if state == "watching" else time.time(), watch_id),
            )


def _watch(row: tuple[object, ...]) -> ChangeWatch:
    (watch_id, agent, hostname, machine_id, before, after_id, budget, margin, alpha,
     state, decision, pairs) = row  # fmt: skip
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
    )


def _same_host(here: HostIdentity, there: HostIdentity) -> bool:
    """Whether the change's files (written on ``there``) are on this machine."""
    if not here.same_name(there):
        return False
    return not there.machine_id or here.machine_id == there.machine_id
