"""``ReleaseFollower``: a worker keeps serving its team's current releases, and says what it serves.

A background thread polls the team's heads row (one indexed row; ``interval_s`` apart, 0.2 s by
default, so a publication reaches the worker well within a second). On PostgreSQL it also
listens (``LISTEN``) on a connection of its own
(:mod:`~agentmend.infrastructure.releases.signals`): a publication or rollout step wakes it
at once, and the poll stays the fallback. When the heads change it materializes the stable release
and the canary (if any) and switches the team link to the stable one; each run then asks
:meth:`ReleaseFollower.choose` which release serves it. On every poll it also carries the team's
rollout a step on (:meth:`Rollouts.advance`), so the rollout lives as long as any worker does.

A worker that cannot reach the store keeps serving the last release it had, and its
:meth:`status` says so (``connected`` False, the error, since when). A worker restarted after
being killed, even mid-materialization, starts on the release its link points at (always a
whole one) before it has reached the store.

What it serves is what was published: the releases it serves are checked against their content
address at start, at each switch (every file hashed) and every ``verify_interval_s`` (cheaply,
see :meth:`ReleaseDirectories.check`); a release found different is reported in
:meth:`status` (``mismatch``, when) and materialized again from the store.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from agentmend.infrastructure.errors import AgentmendError, NotFound, StoreError
from agentmend.infrastructure.releases.log import ReleaseHeads, ReleaseLog
from agentmend.infrastructure.releases.materialize import ReleaseDirectories, ServedRelease
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.releases.routing import Arm, choose_arm, new_run_key
from agentmend.infrastructure.releases.signals import ReleaseWakeup
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["FollowerStatus", "ReleaseChoice", "ReleaseFollower"]

log = get_logger(__name__)

DEFAULT_INTERVAL_S = 0.2
DEFAULT_VERIFY_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    """What a worker serves and whether it is in touch with the store."""

    team_id: str
    stable: int | None
    canary: int | None
    share: float
    rollout_id: str | None
    connected: bool
    problem: str | None = None
    cut_off_since: float | None = None
    last_contact: float | None = None
    pinned: int | None = None
    serving_since: float | None = None  # wall-clock time it began serving these releases
    mismatch: str | None = None  # the last served release found not as published, and how
    mismatch_at: float | None = None  # when it was found (then materialized again)
    verified_at: float | None = None  # the last check that found what it serves whole


@dataclass(frozen=True, slots=True)
class ReleaseChoice:
    """The release that serves one run, and the tags its record carries."""

    version: int
    directory: Path
    arm: Arm
    rollout_id: str | None

    def tags(self) -> dict[str, object]:
        """The ``extra`` of the run's record: which release and rollout arm served it."""
        found: dict[str, object] = {"release": self.version, "arm": self.arm}
        if self.rollout_id is not None:
            found["rollout"] = self.rollout_id
        return found


class ReleaseFollower:
    """Follows one team's releases into a worker's own folder.

    Args:
        releases: the team's release log in the shared store.
        root: the worker's own folder for materialized releases.
        link: the team directory under ``root`` (a link the follower switches).
        interval_s: how often the store is polled (on PostgreSQL also the longest a missed
            notification can delay a worker).
        pin: serve this release only (no canary, no rollout steps).
        advance_rollouts: carry the team's rollout on at every poll (a role the store
            refuses it, a worker role, stops trying and serves).
        verify_interval_s: how often the served releases are checked against their content
            address between switches (None: only at start and at each switch).

    Raises:
        NotFound: ``pin`` names a release the team does not have.
    """

    def __init__(
        self,
        releases: ReleaseLog,
        root: str | Path,
        *,
        link: str = "agents",
        interval_s: float = DEFAULT_INTERVAL_S,
        pin: int | None = None,
        advance_rollouts: bool = True,
        verify_interval_s: float | None = DEFAULT_VERIFY_INTERVAL_S,
    ) -> None:
        self.releases = releases
        self.rollouts = Rollouts(releases)
        self.directories = ReleaseDirectories(root, link)
        self.interval_s = interval_s
        self.pin = pin
        self.advance_rollouts = advance_rollouts and pin is None
        self.verify_interval_s = verify_interval_s
        self._verified_mono = time.monotonic()
        self._damaged: set[int] = set()  # versions found damaged, not yet replaced
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wakeup = ReleaseWakeup(releases.store, releases.team_id)
        self._generation = -1
        self._stable: ServedRelease | None = None
        self._canary: ServedRelease | None = None
        self._routing_salt: str | None = None  # the rollout's secret routing key
        self._status = FollowerStatus(releases.team_id, None, None, 0.0, None, False, pinned=pin)
        self.directories.remove_staging()
        linked = self.directories.linked()  # a restart serves its whole last release at once
        if linked is not None:
            self._stable = linked
            self._status = replace(self._status, stable=linked.version)
            self._verify(linked, full=True)  # replaced at the first poll that reaches the store
        if pin is not None:
            self.releases.get(pin)  # raises NotFound before the worker serves anything

    @property
    def listening(self) -> bool:
        """Whether a PostgreSQL ``LISTEN`` connection wakes this worker (False: polling only)."""
        return self._wakeup.connected

    @property
    def team_dir(self) -> Path:
        """The team directory agents read (the link to the stable release)."""
        return self.directories.team_dir

    # -- polling -----------------------------------------------------------------------------

    def poll(self) -> FollowerStatus:
        """One poll: follow a change of the heads, carry the rollout on, note the contact."""
        try:
            heads = self.releases.heads()
            if self.pin is not None:
                heads = ReleaseHeads(heads.team_id, self.pin, None, 0.0, None, 0)
            if (
                heads.generation != self._generation
                or self._stable is None
                or self._damaged
                or self._verification_due()
            ):
                self._follow(heads)
        except AgentmendError as exc:
            if isinstance(exc, NotFound) and self.pin is not None:
                raise
            self._check_while_cut_off()
            return self._cut_off(exc)
        if self.advance_rollouts and heads.rollout_id is not None:
            try:
                self.rollouts.advance()
            except StoreError as exc:
                if not exc.refused_to_role:
                    return self._cut_off(exc)
                # a worker role serves and records; controllers carry the rollout on
                self.advance_rollouts = False
                log.info("rollout_steps_left_to_controllers", rollout=heads.rollout_id)
            except AgentmendError as exc:  # a broken audit chain refusing a promotion, ...
                log.error("rollout_step_failed", rollout=heads.rollout_id, error=str(exc))
        now = time.time()
        with self._lock:
            self._status = replace(
                self._status, connected=True, problem=None, cut_off_since=None, last_contact=now
            )
            return self._status

    def _verification_due(self) -> bool:
        interval = self.verify_interval_s
        return interval is not None and time.monotonic() - self._verified_mono >= interval

    def _check_while_cut_off(self) -> None:
        """Without the store a damaged release cannot be replaced, but it is reported; the
        first poll that reaches the store again replaces it."""
        if not self._verification_due():
            return
        self._verified_mono = time.monotonic()
        with self._lock:
            served = [r for r in (self._stable, self._canary) if r is not None]
        for release in served:
            self._verify(release, full=False)

    def _verify(self, served: ServedRelease, *, full: bool) -> bool:
        """Check ``served`` on disk; False (reported, to be replaced) when it is not whole."""
        problem = self.directories.check(served, full=full)
        if problem is None:
            self._damaged.discard(served.version)
            return True
        self._damaged.add(served.version)
        found = f"release {served.version} on disk is not what was published: {problem}"
        log.error(
            "release_mismatch", team=self.releases.team_id, version=served.version, problem=problem
        )
        with self._lock:
            self._status = replace(self._status, mismatch=found, mismatch_at=time.time())
        return False

    def _served(self, version: int, *, switch: bool) -> ServedRelease:
        """Release ``version`` materialized and checked (every file at a switch), replaced
        from the store when it is not what was published."""
        served = self.directories.materialize(self.releases, version)
        if not self._verify(served, full=switch):
            served = self.directories.replace(self.releases, version)
            if self._verify(served, full=True):
                log.warning("release_replaced", team=self.releases.team_id, version=version)
        return served

    def _follow(self, heads: ReleaseHeads) -> None:
        if heads.stable is None:
            self._generation = heads.generation
            return
        switch = heads.generation != self._generation
        stable = self._served(heads.stable, switch=switch)
        canary = self._served(heads.canary, switch=switch) if heads.canary is not None else None
        self._verified_mono = time.monotonic()
        linked = self.directories.linked()
        if linked is None or linked.directory != stable.directory:
            self.directories.switch(stable)
        keep = {stable.version} | ({canary.version} if canary else set())
        salt = (
            self.rollouts.routing_key_of(heads.rollout_id)
            if canary is not None and heads.rollout_id is not None
            else None
        )
        with self._lock:
            self._stable, self._canary = stable, canary
            self._routing_salt = salt
            self._generation = heads.generation
            self._status = replace(
                self._status,
                stable=stable.version,
                canary=canary.version if canary else None,
                share=heads.share if canary else 0.0,
                rollout_id=heads.rollout_id if canary else None,
                serving_since=time.time() if switch else self._status.serving_since,
                verified_at=time.time() if not self._damaged else self._status.verified_at,
            )
        if not switch:
            return
        self.directories.prune(keep)
        log.info("release_followed", team=heads.team_id, stable=stable.version, canary=heads.canary)

    def _cut_off(self, exc: Exception) -> FollowerStatus:
        with self._lock:
            first = self._status.connected or self._status.cut_off_since is None
            self._status = replace(
                self._status,
                connected=False,
                problem=str(exc),
                cut_off_since=time.time() if first else self._status.cut_off_since,
            )
            if first:
                log.warning("release_store_unreachable", team=self.releases.team_id, error=str(exc))
            return self._status

    def status(self) -> FollowerStatus:
        """What this worker serves now and whether it reaches the store."""
        with self._lock:
            return self._status

    # -- serving -----------------------------------------------------------------------------

    def choose(self, routing_key: object = None) -> ReleaseChoice:
        """The release that serves one run: the canary for its share of routing keys.

        Args:
            routing_key: the caller's key (a user or conversation id); None draws a random
                run id.

        Raises:
            WrongArgumentType: ``routing_key`` is given and is not a string.
            NotFound: nothing is materialized yet (the store was never reached).
        """
        key = new_run_key() if routing_key is None else routing_key
        with self._lock:
            stable, canary, status = self._stable, self._canary, self._status
            salt = self._routing_salt
        if stable is None:
            raise NotFound("materialized release", self.releases.team_id, "(store not reached)")
        rollout = status.rollout_id
        if canary is not None and rollout is not None and status.share > 0.0:
            if choose_arm(key, status.share, salt or rollout) == "canary":
                return ReleaseChoice(canary.version, canary.directory, "canary", rollout)
        else:
            choose_arm(key, 0.0, "")  # the key is checked whether or not a canary runs
        return ReleaseChoice(stable.version, stable.directory, "stable", rollout)

    # -- the thread --------------------------------------------------------------------------

    def start(self) -> ReleaseFollower:
        """Poll once now, then every ``interval_s`` in a daemon thread."""
        self.poll()
        self._thread = threading.Thread(
            target=self._run, name=f"agentmend-releases-{self.releases.team_id}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self._wakeup.wait(self.interval_s, self._stop)
            if self._stop.is_set():
                return
            try:
                self.poll()
            except Exception as exc:  # the thread must outlive any one failed poll
                log.error("release_poll_failed", error=str(exc))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._wakeup.close()

    def __enter__(self) -> ReleaseFollower:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
