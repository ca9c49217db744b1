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

from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.releases.errors import RolloutConflict
from agentmend.infrastructure.releases.log import Release, ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
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
    ) -> Release:
        """Publish ``directory`` carrying ``change_ids`` and start its canary.

        The team's first release is stable at once. When another canary is still being judged
        the release is published but not started (the log says so); start it by hand later.
        """
        release = self.releases.publish_directory(
            directory, by=by, change_ids=change_ids, reason=reason
        )
        if release.parent is None:
            return release
        try:
            Rollouts(self.releases).start(
                release.version, by=by, share=self.share, claimed_fix=True, limits=self.limits
            )
        except RolloutConflict as exc:
            log.warning("release_not_canaried", version=release.version, reason=exc.problem)
        return release

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
        """Publish ``directory`` after a rollback, straight to stable for the whole fleet."""
        return self.releases.publish_directory(
            directory, by=by, change_ids=change_ids, reason=reason, stable=True
        )
