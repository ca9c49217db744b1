"""``Rollouts``: a new release served to a canary share, promoted or rolled back on live runs.

A rollout is owned by its record in the store, not by a process: the record holds its state,
limits, evidence and the cursor into the executions it has read, and any worker that calls
:meth:`Rollouts.advance` (each :class:`~agentmend.infrastructure.releases.follower.ReleaseFollower`
does on every poll) carries it one step on. A worker that crashes mid-step leaves the last committed
step; the next worker continues from there, never undoes it. Settling is a compare-and-set on the
record's state, so two workers deciding at once settle it once.

The changes the canary carries are owned by the rollout too, through the ownership records of
:mod:`agentmend.infrastructure.changes.protocol.leases`: starting a rollout takes a lease whose
owner is the record (``RecordOwner("rollout", id)``) and hands the release's changes over to it;
recovery at any open leaves such a lease to the record, and settling the rollout releases it.

States: ``canary`` (serving its share) -> ``promoted`` | ``rolled_back``; ``canary`` <->
``paused`` (share 0, evidence kept). Every step is an audit row with its evidence (runs and
successes per arm, each test's wealth and its boundary, and ``decided_by``: the test that
settled it, also kept in the record's evidence). Promote, abort, pause and resume by hand
need a principal with the admin permission.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from dataclasses import replace

from agentmend.infrastructure.changes.protocol.owners import LeaseTerms, RecordOwner
from agentmend.infrastructure.errors import NotFound, PermissionRequired
from agentmend.infrastructure.monitoring.agent_window import RUN
from agentmend.infrastructure.monitoring.run_reader import RunRow, last_run_id, runs_after
from agentmend.infrastructure.principal import ADMIN, PUBLISH_CANARY, Principal
from agentmend.infrastructure.releases.attribution import read_trusted
from agentmend.infrastructure.releases.content import release_widening
from agentmend.infrastructure.releases.errors import RolloutConflict
from agentmend.infrastructure.releases.log import Release, ReleaseLog
from agentmend.infrastructure.releases.rollout_evidence import (
    Evidence,
    RolloutLimits,
    decide,
    trusted_receivers,
)
from agentmend.infrastructure.releases.routing import DEFAULT_SHARE, check_share
from agentmend.infrastructure.releases.settlement import (
    ACTIVE,
    RELEASE_AGENT,
    RolloutRecord,
    settle_in,
)
from agentmend.infrastructure.releases.settlement import ROLLOUT_COLUMNS as _COLUMNS
from agentmend.infrastructure.releases.settlement import record_of as _record
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["ACTIVE", "RolloutRecord", "Rollouts"]

log = get_logger(__name__)

_READ_BATCH = 5000  # executions read per step: bounded work per poll


class Rollouts:
    """Start, advance and steer the rollouts of one team's releases."""

    def __init__(self, releases: ReleaseLog, *, trusted: frozenset[str] | None = None) -> None:
        """``trusted``: the receivers whose labelled runs count (None: the names in
        ``AGENTMEND_TRUSTED_RECEIVERS`` and those the store trusts, read at every step: see
        :func:`~agentmend.infrastructure.releases.attribution.read_trusted`); runs the workers
        routed always count."""
        self.releases = releases
        self._trusted = trusted
        self._trusted_here = trusted_receivers()
        self.leases = releases.leases

    @property
    def trusted(self) -> frozenset[str]:
        """The receivers whose labelled runs count now."""
        if self._trusted is not None:
            return self._trusted
        return self._trusted_here | read_trusted(self.releases.store)

    # -- starting ----------------------------------------------------------------------------

    def start(
        self,
        version: int,
        *,
        by: Principal,
        share: float = DEFAULT_SHARE,
        claimed_fix: bool = False,
        limits: RolloutLimits | None = None,
    ) -> RolloutRecord:
        """Serve release ``version`` to ``share`` of runs, beside the stable release.

        Raises:
            InvalidArgument: ``share`` outside (0, 1). NotFound: no such release.
            RolloutConflict: no stable release yet, ``version`` is the stable one, or another
                canary is in progress.
        """
        by.require(PUBLISH_CANARY, "start a canary")
        share = check_share(share)
        limits = limits or RolloutLimits()
        release = self.releases.get(version)
        rollout_id = f"rollout-{uuid.uuid4().hex[:12]}"
        # The changes the canary carries are owned by this record from now on: recovery at any
        # open leaves them to the rollout, which promotes or rolls them back.
        lease = self.leases.acquire(RecordOwner("rollout", rollout_id), LeaseTerms())
        try:
            self._start(release, rollout_id, lease.lease_id, share, claimed_fix, limits, by)
        except BaseException:
            # a refused start leaves no lease behind that owns nothing
            with self.releases.store.transaction() as conn:
                self.leases.release(conn, lease.lease_id, "rollout not started")
            raise
        log.info("rollout_started", rollout=rollout_id, canary=version, share=share)
        return self.get(rollout_id)

    def _start(
        self,
        release: Release,
        rollout_id: str,
        lease_id: str,
        share: float,
        claimed_fix: bool,
        limits: RolloutLimits,
        by: Principal,
    ) -> None:
        version = release.version
        # the cursor before the transaction (read outside one, it waits only for this
        # database's older writes): every run of this rollout is recorded after its start
        # commits, so it lies past the cursor
        cursor = last_run_id(self.releases.store.connection())
        with self.releases.write() as (conn, txn):
            heads = self.releases.lock_heads(conn)
            if heads.stable is None:
                raise RolloutConflict(version, "the team has no stable release to compare with")
            if heads.stable == version:
                raise RolloutConflict(version, "it is already the stable release")
            if heads.canary is not None:
                raise RolloutConflict(
                    version, f"release {heads.canary} is the canary now ({heads.rollout_id})"
                )
            widens = release_widening(
                self.releases.files_in(conn, heads.stable), self.releases.files_in(conn, version)
            )
            if widens and not by.is_admin:
                raise PermissionRequired(
                    by.user_id, ADMIN, "start a canary that widens " + "; ".join(widens)
                )
            conn.execute(
                "INSERT INTO rollout_secrets (rollout_id, secret) VALUES (?, ?)",
                (rollout_id, secrets.token_hex(16)),
            )
            self.leases.hand_over(conn, lease_id, release.change_ids)
            conn.execute(
                f"INSERT INTO rollouts ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    rollout_id,
                    self.releases.team_id,
                    version,
                    heads.stable,
                    share,
                    int(claimed_fix),
                    "canary",
                    None,
                    limits.to_json(),
                    Evidence().to_json(),
                    cursor,
                    time.time(),
                    None,
                    lease_id,
                ),
            )
            self.releases.set_heads(
                conn, stable=heads.stable, canary=version, share=share, rollout_id=rollout_id
            )
            if txn is not None:
                txn.append(
                    agent_name=RELEASE_AGENT,
                    edit_type="rollout_started",
                    old_value=heads.stable,
                    new_value=json.dumps(
                        {
                            "rollout": rollout_id,
                            "canary": version,
                            "stable": heads.stable,
                            "share": share,
                            "claimed_fix": claimed_fix,
                            "limits": json.loads(limits.to_json()),
                            **({"widens": widens} if widens else {}),
                        }
                    ),
                    user_id=by.user_id,
                    user_name=by.name,
                )

    # -- reading -----------------------------------------------------------------------------

    def routing_key_of(self, rollout_id: str) -> str:
        """The secret its routing hash is keyed with (for the workers that route its runs
        alone: never shown, never recorded). A rollout started before rollouts had one is
        keyed by its id, as it was then."""
        row = (
            self.releases.store.connection()
            .execute("SELECT secret FROM rollout_secrets WHERE rollout_id = ?", (rollout_id,))
            .fetchone()
        )
        return str(row[0]) if row is not None else rollout_id

    def get(self, rollout_id: str) -> RolloutRecord:
        """One rollout.

        Raises:
            NotFound: no rollout with this id for the team.
        """
        row = (
            self.releases.store.connection()
            .execute(
                f"SELECT {_COLUMNS} FROM rollouts WHERE rollout_id = ? AND team_id = ?",
                (rollout_id, self.releases.team_id),
            )
            .fetchone()
        )
        if row is None:
            raise NotFound("rollout", rollout_id)
        return _record(row)

    def of_release(self, version: int) -> RolloutRecord | None:
        """The newest rollout of release ``version`` (None: it was never a canary)."""
        row = (
            self.releases.store.connection()
            .execute(
                f"SELECT {_COLUMNS} FROM rollouts WHERE team_id = ? AND canary = ? "
                "ORDER BY started_at DESC LIMIT 1",
                (self.releases.team_id, version),
            )
            .fetchone()
        )
        return _record(row) if row is not None else None

    def rolled_back(self, limit: int = 20) -> list[RolloutRecord]:
        """The newest ``limit`` rollouts that ended rolled back, newest first."""
        rows = (
            self.releases.store.connection()
            .execute(
                f"SELECT {_COLUMNS} FROM rollouts WHERE team_id = ? AND state = 'rolled_back' "
                "ORDER BY settled_at DESC LIMIT ?",
                (self.releases.team_id, limit),
            )
            .fetchall()
        )
        return [_record(row) for row in rows]

    def active(self) -> RolloutRecord | None:
        """The rollout in progress (None when there is none)."""
        heads = self.releases.heads()
        return self.get(heads.rollout_id) if heads.rollout_id is not None else None

    # -- advancing ---------------------------------------------------------------------------

    def advance(self, *, now: float | None = None) -> RolloutRecord | None:
        """Read the live runs recorded since the last step and settle if the test decides.

        Any worker may call it at any time; it does nothing when no rollout is in progress.
        Returns the rollout as it stands afterwards (None: none in progress).
        """
        heads = self.releases.heads()
        if heads.rollout_id is None:
            return None
        rollout_id = heads.rollout_id
        record = self.get(rollout_id)
        if record.state != "canary":
            return record
        # Read and pair outside any write transaction (the monitors keep writing meanwhile),
        # then store the step with a compare-and-set on the cursor: of two workers stepping
        # at once, one step counts and the other is dropped, never counted twice.
        # The cursor is safe whatever order writers commit in: run_reader reads only below
        # a horizon nothing can commit under later (ids on SQLite, which has one writer;
        # transaction ids below the oldest running one on PostgreSQL, whose writers append
        # without a lock); tests/infrastructure/releases/test_release_race.py and
        # tests/faults/test_unlocked_appends.py check it with concurrent writers.
        conn = self.releases.store.connection()
        rows = runs_after(conn, record.cursor, _READ_BATCH)
        age_hours = ((now or time.time()) - record.started_at) / 3600.0
        if not rows and age_hours < record.limits.max_hours:
            return record  # nothing new to judge
        evidence = record.evidence
        if rows:
            evidence.add_all(_arm_runs(rows, rollout_id, record.canary, self.trusted, evidence))
        cursor = rows[-1].id if rows else record.cursor
        decision, reason, decided_by = decide(
            evidence, record.limits, claimed_fix=record.claimed_fix, age_hours=age_hours
        )
        step = (
            "UPDATE rollouts SET evidence = ?, cursor = ? "
            "WHERE rollout_id = ? AND cursor = ? AND state = 'canary'"
        )
        if decision == "continue":
            if rows:
                with self.releases.store.transaction() as conn:
                    conn.execute(step, (evidence.to_json(), cursor, rollout_id, record.cursor))
            return self.get(rollout_id)
        outcome = "promoted" if decision == "promote" else "rolled_back"
        evidence.decided_by = decided_by
        # The step and the settlement it decides commit together: settled on its own, a step
        # another worker took in between would be overwritten by this one's older evidence.
        with self.releases.write(safety=outcome == "rolled_back") as (conn, txn):
            stepped = conn.execute(
                step, (evidence.to_json(), cursor, rollout_id, record.cursor)
            ).rowcount
            if stepped == 1:  # else another worker took this step: it decides, not this one
                settle_in(
                    self.releases,
                    conn,
                    txn,
                    replace(record, evidence=evidence, cursor=cursor),
                    outcome,
                    reason,
                    evidence.summary(record.limits),
                    by=None,
                    decided_by=decided_by,
                )
        return self.get(rollout_id)

    # -- steering by hand --------------------------------------------------------------------

    def promote(self, version: int, *, by: Principal) -> RolloutRecord:
        """Make the current canary the stable release now (an administrator's call).

        Raises:
            PermissionRequired: ``by`` is not an administrator.
            RolloutConflict: ``version`` is not the current canary.
        """
        record = self._current_canary(version, by, "promote a release")
        self._settle(record, "promoted", "by_hand", record.evidence.summary(), by=by)
        return self.get(record.rollout_id)

    def abort(self, version: int, *, by: Principal) -> RolloutRecord | Release:
        """Take ``version`` out of service: a canary is rolled back; the stable release is
        rolled back fleet-wide by publishing its parent's content as a new stable release.

        Any rollout of ``version`` that is not settled is rolled back, including one that no
        longer serves (left by a stable publication that did not settle it). A fleet-wide
        rollback of the stable while a canary runs rolls the canary back first, in the same
        transaction (reason ``superseded``): the canary was built on the release going away.

        Raises:
            PermissionRequired: ``by`` is not an administrator.
            RolloutConflict: ``version`` is neither a canary not settled nor the stable release.
        """
        _require_admin(by, "abort a release")
        self.releases.get(version)
        heads = self.releases.heads()
        unsettled = self.of_release(version)
        if unsettled is not None and unsettled.state in ACTIVE:
            self._settle(unsettled, "rolled_back", "aborted", unsettled.evidence.summary(), by=by)
            return self.get(unsettled.rollout_id)
        if heads.stable == version:
            return self.releases.publish_rollback(version, by=by)
        raise RolloutConflict(version, "it is neither the canary nor the stable release")

    def pause(self, version: int, *, by: Principal, resume: bool = False) -> RolloutRecord:
        """Stop serving the canary (share 0, evidence kept), or serve it again (``resume``).

        Raises:
            PermissionRequired: ``by`` is not an administrator.
            RolloutConflict: ``version`` is not the current canary, or is already so.
        """
        record = self._current_canary(version, by, "pause a rollout")
        wanted, before = ("canary", "paused") if resume else ("paused", "canary")
        with self.releases.write() as (conn, txn):
            updated = conn.execute(
                "UPDATE rollouts SET state = ? WHERE rollout_id = ? AND state = ?",
                (wanted, record.rollout_id, before),
            ).rowcount
            if updated != 1:
                raise RolloutConflict(version, f"its rollout is not {before}")
            self.releases.set_heads(
                conn,
                stable=record.stable,
                canary=version,
                share=record.share if resume else 0.0,
                rollout_id=record.rollout_id,
            )
            if txn is not None:
                txn.append(
                    agent_name=RELEASE_AGENT,
                    edit_type="rollout_resumed" if resume else "rollout_paused",
                    old_value=before,
                    new_value=json.dumps(
                        {
                            "rollout": record.rollout_id,
                            "canary": record.canary,
                            "stable": record.stable,
                            "evidence": record.evidence.summary(),
                        },
                        separators=(",", ":"),
                    ),
                    user_id=by.user_id,
                    user_name=by.name,
                )
        return self.get(record.rollout_id)

    # -- internals ---------------------------------------------------------------------------

    def _current_canary(self, version: int, by: Principal, action: str) -> RolloutRecord:
        _require_admin(by, action)
        self.releases.get(version)
        heads = self.releases.heads()
        if heads.canary != version or heads.rollout_id is None:
            now = f"the canary is {heads.canary}" if heads.canary else "there is no canary"
            raise RolloutConflict(version, f"it is not the current canary ({now})")
        return self.get(heads.rollout_id)

    def _settle(
        self,
        record: RolloutRecord,
        outcome: str,
        reason: str,
        evidence: dict[str, object],
        *,
        by: Principal | None,
        decided_by: str | None = None,
    ) -> None:
        """Promote or roll back, once, audited (see :func:`settle_in`)."""
        # A rollback must go through even over a broken audit head (it is a safety write).
        with self.releases.write(safety=outcome == "rolled_back") as (conn, txn):
            settle_in(
                self.releases,
                conn,
                txn,
                record,
                outcome,
                reason,
                evidence,
                by=by,
                decided_by=decided_by,
            )


def _require_admin(by: Principal, action: str) -> None:
    if not by.is_admin:
        raise PermissionRequired(by.user_id, ADMIN, action)


def _arm_runs(
    rows: list[RunRow], rollout_id: str, canary: int, trusted: frozenset[str], evidence: Evidence
) -> list[tuple[str, bool, float]]:
    """(arm, success, duration) of the production runs served under ``rollout_id`` that may be
    believed: routed by a worker, or attributed by a trusted receiver (the rest are counted in
    ``evidence.not_counted``, with why)."""
    runs: list[tuple[str, bool, float]] = []
    for row in rows:
        if row.source != RUN or not row.extra:
            continue
        try:
            tags = json.loads(str(row.extra))
        except ValueError:
            continue
        if not isinstance(tags, dict) or tags.get("rollout") != rollout_id:
            continue
        untrusted = _untrusted(tags, trusted)
        if untrusted is not None:
            evidence.skip(untrusted)
            continue
        arm = "canary" if tags.get("release") == canary else "stable"
        runs.append((arm, row.success, row.duration_ms))
    return runs


def _untrusted(tags: dict[str, object], trusted: frozenset[str]) -> str | None:
    """Why a run's tags cannot be believed (None: they can). A worker's routed run carries no
    ``attributed_by``; a labelled one carries the name of the receiver that attributed it."""
    if "attributed_by" not in tags:
        return None
    source = tags.get("received_by")
    if not isinstance(source, str):
        return "labelled run with no receiver identity"
    if source in trusted:
        return None
    return f"labelled run from receiver {source[:64]!r}, not trusted (release trust)"
