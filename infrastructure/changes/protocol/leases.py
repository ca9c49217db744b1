"""Leases: the store's record of who owns a change that is live but not yet proven.

A change the loop applies to verify it stays APPLIED, like one a person applies by hand; what
makes it "live but not yet proven" is its link to an open lease (``lease_changes``). A change
without a lease (``ImprovementManager.apply``/``log_change`` by hand) awaits nothing and is
never undone by recovery. A lease moves through::

    held --owner keeps or rolls back its changes--> released
      '--recovery finds the owner gone--> lost --its changes settled--> settled

Every move is a compare-and-set in one store transaction, so exactly one of "the owner settles
its work" and "recovery takes it away" wins: the owner's keep or rollback releases the lease in
the same transaction as its record and fails with :class:`LeaseLost` once the lease is lost;
recovery revokes only a lease still held. A lost lease's changes are settled by a process on
the host where their files live (:mod:`agentmend.infrastructure.changes.protocol.abandoned`); any
other process only revokes.

A lease is keyed by the team whose changes it holds (``team_id``, the id every host agrees on,
:mod:`agentmend.infrastructure.changes.protocol.team_registry`), not by a root path, which differs
per host: it is set when the lease's first change is linked (or given on acquiring, by a rollout),
and a store from before team ids gets its open leases' team filled in from their changes on open.

A process owner renews its lease while it works (:class:`LeaseKeeper`, a thread); the times are
wall-clock seconds (``time.time()``), compared across hosts with ``LeaseTerms.clock_skew_s`` of
slack. A record owner's lease (a watch or rollout) has no expiry.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal
from uuid import uuid4

from agentmend.infrastructure.changes.protocol.owners import (
    HostIdentity,
    LeaseTerms,
    Owner,
    ProcessOwner,
    RecordOwner,
)
from agentmend.infrastructure.errors import AgentmendError
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection, backend_of, has_table, join_in_order
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["Lease", "LeaseKeeper", "LeaseLost", "LeaseState", "Leases"]

log = get_logger(__name__)

LeaseState = Literal["held", "released", "lost", "settled"]

_MIGRATIONS = [
    """
    CREATE TABLE leases (
        lease_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        hostname TEXT,
        boot_id TEXT,
        machine_id TEXT,
        pid INTEGER,
        process_start INTEGER,
        record_kind TEXT,
        record_id TEXT,
        acquired REAL NOT NULL,
        renewed REAL NOT NULL,
        expires REAL,
        ended REAL,
        ended_by TEXT,
        end_reason TEXT
    );
    CREATE INDEX leases_open ON leases (state) WHERE state IN ('held', 'lost');
    CREATE TABLE lease_changes (
        change_id TEXT PRIMARY KEY,
        lease_id TEXT NOT NULL REFERENCES leases (lease_id)
    );
    CREATE INDEX lease_changes_lease ON lease_changes (lease_id)
    """,
    # keyed by team id (backfilled for open leases by ``_backfill_teams``)
    """
    ALTER TABLE leases ADD COLUMN team_id TEXT;
    CREATE INDEX leases_team ON leases (team_id, state) WHERE state IN ('held', 'lost')
    """,
]

_COLUMNS = (
    "lease_id, kind, state, hostname, boot_id, machine_id, pid, process_start, record_kind,"
    " record_id, acquired, renewed, expires, end_reason, team_id"
)


class LeaseLost(AgentmendError):
    """The owner's lease was taken away (its owner looked gone); its work is not its own now.

    The owner must stop without writing: recovery has settled, or is settling, its changes.
    """

    def __init__(self, lease_id: str, state: str = "lost") -> None:
        self.lease_id = lease_id
        self.state = state
        super().__init__(
            f"lease {lease_id} is {state}: its changes were settled by recovery, not by its owner"
        )


@dataclass(frozen=True, slots=True)
class Lease:
    """One ownership record as the store holds it."""

    lease_id: str
    owner: Owner
    state: LeaseState
    acquired: float
    renewed: float
    expires: float | None
    end_reason: str | None = None
    team_id: str | None = None
    """The team whose changes it holds (None until its first change is linked)."""

    def expired(self, now: float, *, slack: float = 0.0) -> bool:
        return self.expires is not None and now > self.expires + slack


class Leases:
    """Queries over ``leases`` and ``lease_changes``; every state change is a compare-and-set."""

    def __init__(self, store: Store) -> None:
        before = store.schema_version("leases")
        store.migrate("leases", _MIGRATIONS)
        self.store = store
        if 0 < before < 2:
            self._backfill_teams()

    def _backfill_teams(self) -> None:
        """The migration to team ids: each open lease takes its changes' team (idempotent,
        so processes migrating at once may both run it)."""
        if not has_table(self.store.connection(), "changes"):
            return
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE leases SET team_id = (SELECT MIN(c.team_id) FROM lease_changes lc"
                f" {join_in_order(conn)} changes c ON c.change_id = lc.change_id"
                " WHERE lc.lease_id = leases.lease_id)"
                " WHERE team_id IS NULL AND state IN ('held', 'lost')"
            )

    def acquire(self, owner: Owner, terms: LeaseTerms, *, team_id: str | None = None) -> Lease:
        """A new held lease for ``owner`` (a record owner's never expires), for ``team_id``
        if known now (else its first linked change's team)."""
        now = time.time()
        expires = now + terms.ttl_s if isinstance(owner, ProcessOwner) else None
        lease = Lease("l-" + uuid4().hex[:12], owner, "held", now, now, expires, team_id=team_id)
        process = owner if isinstance(owner, ProcessOwner) else None
        record = owner if isinstance(owner, RecordOwner) else None
        with self.store.transaction(durable=True) as conn:
            conn.execute(
                f"INSERT INTO leases ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    lease.lease_id,
                    "process" if process is not None else "record",
                    "held",
                    process.host.hostname if process else None,
                    process.host.boot_id if process else None,
                    process.host.machine_id if process else None,
                    process.pid if process else None,
                    process.start if process else None,
                    record.kind if record else None,
                    record.record_id if record else None,
                    now,
                    now,
                    expires,
                    None,
                    team_id,
                ),
            )
        return lease

    def get(self, lease_id: str) -> Lease | None:
        row = (
            self.store.connection()
            .execute(f"SELECT {_COLUMNS} FROM leases WHERE lease_id = ?", (lease_id,))
            .fetchone()
        )
        return None if row is None else _lease(row)

    def of_record(self, owner: RecordOwner) -> Lease | None:
        """The newest lease a record owns (a watch finds its own by its id), None if none."""
        row = (
            self.store.connection()
            .execute(
                f"SELECT {_COLUMNS} FROM leases WHERE kind = 'record' AND record_kind = ?"
                " AND record_id = ? ORDER BY acquired DESC LIMIT 1",
                (owner.kind, owner.record_id),
            )
            .fetchone()
        )
        return None if row is None else _lease(row)

    def open_leases(self, team_id: str | None = None) -> list[Lease]:
        """Every lease held or lost, or only team ``team_id``'s (served by partial indexes:
        settled ones cost nothing)."""
        where = "state IN ('held', 'lost')"
        args: tuple[str, ...] = ()
        if team_id is not None:
            where, args = where + " AND team_id = ?", (team_id,)
        rows = self.store.connection().execute(
            f"SELECT {_COLUMNS} FROM leases WHERE {where} ORDER BY acquired", args
        )
        return [_lease(row) for row in rows]

    def link(
        self,
        conn: StoreConnection,
        lease_id: str,
        change_ids: Sequence[str],
        team_id: str | None = None,
    ) -> None:
        """Put ``change_ids`` (of team ``team_id``) under the lease, inside the caller's
        transaction; a lease without a team yet takes theirs.

        Raises:
            LeaseLost: the lease is no longer held (nothing is linked; the transaction rolls
                back with the error).
        """
        self._require_held(conn, lease_id)
        conn.executemany(
            "INSERT INTO lease_changes (change_id, lease_id) VALUES (?, ?)",
            [(change_id, lease_id) for change_id in change_ids],
        )
        if team_id is not None:
            conn.execute(
                "UPDATE leases SET team_id = ? WHERE lease_id = ? AND team_id IS NULL",
                (team_id, lease_id),
            )

    def hand_over(self, conn: StoreConnection, lease_id: str, change_ids: Sequence[str]) -> None:
        """Put ``change_ids`` under ``lease_id`` whatever lease held them before.

        How a change kept live on purpose passes to its record owner (a rollout serving it to
        a canary share): inside the caller's transaction, so the record and its ownership
        commit together.

        Raises:
            LeaseLost: ``lease_id`` is not held; the caller's transaction rolls back.
        """
        self._require_held(conn, lease_id)
        for change_id in change_ids:
            conn.execute("DELETE FROM lease_changes WHERE change_id = ?", (change_id,))
        self.link(conn, lease_id, change_ids)

    def release(self, conn: StoreConnection, lease_id: str, reason: str) -> None:
        """held -> released, inside the transaction that records the owner's settlement.

        Raises:
            LeaseLost: the lease is no longer held; the caller's transaction rolls back.
        """
        cursor = conn.execute(
            "UPDATE leases SET state = 'released', ended = ?, end_reason = ?"
            " WHERE lease_id = ? AND state = 'held'",
            (time.time(), reason, lease_id),
        )
        if cursor.rowcount != 1:
            raise LeaseLost(lease_id, self._state(conn, lease_id))

    def renew(self, lease_id: str, terms: LeaseTerms) -> bool:
        """Push a held lease's expiry ``terms.ttl_s`` ahead; False when it is held no more."""
        now = time.time()
        with self.store.transaction() as conn:
            cursor = conn.execute(
                "UPDATE leases SET renewed = ?, expires = ? WHERE lease_id = ? AND state = 'held'",
                (now, now + terms.ttl_s, lease_id),
            )
        return cursor.rowcount == 1

    def revoke(self, lease: Lease, *, by: HostIdentity, reason: str, expired_before: float) -> bool:
        """held -> lost if it is still held and (for an expiry) still expired; True if it moved.

        ``expired_before``: revoke only if the lease expires before this time (``inf`` when the
        owner is known dead), so a renewal that lands first wins.
        """
        with self.store.transaction(durable=True) as conn:
            cursor = conn.execute(
                "UPDATE leases SET state = 'lost', ended = ?, ended_by = ?, end_reason = ?"
                " WHERE lease_id = ? AND state = 'held'"
                " AND (expires IS NULL OR expires < ?)",
                (
                    time.time(),
                    f"pid {os.getpid()} on {by}",
                    reason,
                    lease.lease_id,
                    expired_before,
                ),
            )
        return cursor.rowcount == 1

    def mark_settled(self, conn: StoreConnection, lease_id: str) -> None:
        """lost -> settled: every change it held is settled."""
        conn.execute(
            "UPDATE leases SET state = 'settled' WHERE lease_id = ? AND state = 'lost'",
            (lease_id,),
        )

    def changes_of(self, lease_id: str) -> list[str]:
        """The ids of the changes the lease holds, oldest first."""
        conn = self.store.connection()
        # insertion order: SQLite's rowid; PostgreSQL keeps none, so the changes' own order
        order = (
            "rowid"
            if backend_of(conn) == "sqlite"
            else "(SELECT seq FROM changes c WHERE c.change_id = lease_changes.change_id)"
        )
        rows = conn.execute(
            f"SELECT change_id FROM lease_changes WHERE lease_id = ? ORDER BY {order}",
            (lease_id,),
        )
        return [str(r[0]) for r in rows]

    def require_held(self, lease_id: str) -> None:
        """Raise :class:`LeaseLost` unless ``lease_id`` is held now."""
        self._require_held(self.store.connection(), lease_id)

    def _require_held(self, conn: StoreConnection, lease_id: str) -> None:
        state = self._state(conn, lease_id)
        if state != "held":
            raise LeaseLost(lease_id, state)

    @staticmethod
    def _state(conn: StoreConnection, lease_id: str) -> str:
        row = conn.execute("SELECT state FROM leases WHERE lease_id = ?", (lease_id,)).fetchone()
        return "unknown" if row is None else str(row[0])


def _lease(row: tuple[object, ...]) -> Lease:
    (lease_id, kind, state, hostname, boot_id, machine_id, pid, start, record_kind, record_id,
     acquired, renewed, expires, end_reason, team_id) = row  # fmt: skip
    owner: Owner
    if kind == "process":
        host = HostIdentity(str(hostname), str(boot_id or ""), str(machine_id or ""))
        owner = ProcessOwner(host, int(str(pid)), None if start is None else int(str(start)))
    else:
        owner = RecordOwner(str(record_kind), str(record_id))
    return Lease(
        lease_id=str(lease_id),
        owner=owner,
        state=str(state),  # type: ignore[arg-type]  # the column only holds LeaseState values
        acquired=float(str(acquired)),
        renewed=float(str(renewed)),
        expires=None if expires is None else float(str(expires)),
        end_reason=None if end_reason is None else str(end_reason),
        team_id=None if team_id is None else str(team_id),
    )


class LeaseKeeper:
    """Holds a process lease for as long as its owner works: renews it from a thread.

    Use as a context manager around the work; on exit the renewals stop. The lease itself is
    released by the owner's settlement (a keep or a rollback, in the same transaction), not
    here: if the owner leaves without settling (an error it could not undo), the lease simply
    expires and recovery settles the changes.

    A renewal that finds the lease lost sets :attr:`lost`; the owner calls
    :meth:`ensure_held` between steps and stops at once on :class:`LeaseLost`.
    """

    def __init__(self, leases: Leases, terms: LeaseTerms) -> None:
        self.leases, self.terms = leases, terms
        self.lease = leases.acquire(ProcessOwner.current(), terms)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"agentmend-lease-{self.lease.lease_id}", daemon=True
        )
        self._thread.start()

    @property
    def lease_id(self) -> str:
        return self.lease.lease_id

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.terms.renew_every_s):
            try:
                held = self.leases.renew(self.lease_id, self.terms)
            except Exception as exc:  # the store is failing: retry; expiry is the backstop
                log.warning("lease_renewal_failed", lease_id=self.lease_id, error=str(exc))
                continue
            if not held:
                state = self.leases.get(self.lease_id)
                if state is not None and state.state == "released":
                    return  # the owner settled its work
                log.warning("lease_lost", lease_id=self.lease_id)
                self.lost.set()
                return

    def ensure_held(self) -> None:
        """Raise :class:`LeaseLost` if a renewal found the lease lost (or it is lost now)."""
        if self.lost.is_set():
            raise LeaseLost(self.lease_id)
        lease = self.leases.get(self.lease_id)
        if lease is None or lease.state in ("lost", "settled"):
            self.lost.set()
            raise LeaseLost(self.lease_id, lease.state if lease else "unknown")

    def stop(self) -> None:
        """Stop renewing (idempotent)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> LeaseKeeper:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
