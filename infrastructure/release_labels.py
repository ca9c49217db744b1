"""The release label a run carries, and the tags of a label no release was found for.

Runs that agentmend does not route (OpenTelemetry spans, the Claude Agent SDK's hooks) name the
release that served them with a label; ``agentmend.infrastructure.releases.attribution`` turns a
label into the release, arm and rollout. The label's names and the tags of an unattributed run are
here, at the bottom of the package, so the runtimes' hooks and the receiver can use them without
depending on the release machinery (which depends on the runtimes through the eval suites).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

__all__ = [
    "MAX_LABEL_CHARS",
    "RELEASE_ATTRIBUTE",
    "TEAM_ATTRIBUTE",
    "ReleaseTagger",
    "unattributed",
]

RELEASE_ATTRIBUTE = "agentmend.release"
"""The span or resource attribute naming the release a run was served by."""

TEAM_ATTRIBUTE = "agentmend.team"
"""The span or resource attribute naming the team of that release (optional)."""

MAX_LABEL_CHARS = 200


class ReleaseTagger(Protocol):
    """What attributes a labelled run (``ReleaseAttribution``): the tags its record carries."""

    def tags(self, label: object, team: object = ...) -> Mapping[str, object]: ...


def unattributed(label: object, reason: str) -> dict[str, object]:
    """The tags of a labelled run no release could be found for (recorded all the same)."""
    text = label if isinstance(label, str) else repr(label)
    return {"release_label": text[:MAX_LABEL_CHARS], "release_unattributed": reason}
