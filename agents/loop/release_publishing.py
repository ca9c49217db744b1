"""Publishing what the loop keeps: each kept change, or rollback, becomes a release for the fleet.

A kept change is published as the team's next release and served first to a canary share of
live runs (it claims a fix, so it is promoted once shown better, and rolled back the moment it is
shown worse); a change rolled back is published straight to stable, since the content it returns
to is what the fleet ran before. The change log stays the record of what changed and why; the
release carries the ids of the changes it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentmend.infrastructure.errors import PermissionRequired
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.releases.errors import RolloutConflict
from agentmend.infrastructure.releases.log import Release, ReleaseLog
from agentmend.infrastructure.releases.rollout import ACTIVE, Rollouts
from agentmend.infrastructure.releases.rollout_evidence import RolloutLimits
from agentmend.infrastructure.releases.routing import DEFAULT_SHARE, check_share
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["ReleasePublisher"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ReleasePublisher:
    """Where and how the loop publishes: the team's release log, the canary share, the limits."""

    releases: ReleaseLog
    share: float = DEFAULT_SHARE
    limits: RolloutLimits | None = None

    def __post_init__(self) -> None:
        check_share(self.share)

    def kept(
        self, directory: str | Path, change_ids: Sequence[str], *, by: Principal, reason: str
    ) -> Release | None:
        """Publish ``directory`` carrying ``change_ids`` and start its canary.

        The team's first release is stable at once. While another canary is being judged
        nothing is published (None; the log names the running canary): a release published
        beside it would carry that canary's unjudged change. Nor is anything published when
        ``by`` may not publish such a release (a fleet checker, before the team's first
        release: it publishes canaries only). The kept change stays in the team folder and
        rides with the next publication.
        """
        try:
            release = self.releases.publish_directory(
                directory, by=by, change_ids=change_ids, reason=reason, refuse_during_rollout=True
            )
        except (RolloutConflict, PermissionRequired) as exc:
            log.warning("release_not_published", changes=list(change_ids), reason=str(exc))
            return None
        if release.parent is None:
            return release
        try:
            Rollouts(self.releases).start(
                release.version, by=by, share=self.share, claimed_fix=True, limits=self.limits
            )
        except RolloutConflict as exc:  # a canary started by another host in between
            log.warning("release_not_canaried", version=release.version, reason=exc.problem)
        return release

    def running_change_ids(self) -> list[str]:
        """The changes only the running canary carries (empty: no rollout is running)."""
        record = Rollouts(self.releases).active()
        if record is None or record.state not in ACTIVE:
            return []
        return list(self.releases.get(record.canary).change_ids)

    def undone_change_ids(self) -> list[str]:
        """The changes carried by canaries that were rolled back (newest rollouts first).

        The fleet never served them beyond the canary; the loop rolls them back in the team
        folder too (:meth:`MetaOrchestrator.follow_rollouts`), or the next release would carry
        them again.
        """
        found: list[str] = []
        for record in Rollouts(self.releases).rolled_back():
            found.extend(self.releases.get(record.canary).change_ids)
        return found

    def rolled_back(
        self, directory: str | Path, change_ids: Sequence[str], *, by: Principal, reason: str
    ) -> Release:
        """Publish ``directory`` after a rollback, straight to stable for the whole fleet.

        A running canary is rolled back first (``superseded``) when the folder no longer
        carries its change; when it still does, the publication is refused naming it
        (:meth:`ReleaseLog.publish`): the caller takes the canary's changes out first
        (:meth:`MetaOrchestrator.rollback` does).

        Raises:
            RolloutConflict: the folder carries the running canary's change.
        """
        return self.releases.publish_directory(
            directory, by=by, change_ids=change_ids, reason=reason, stable=True
        )
