"""A team's id: the same on every host, kept in a small file in the team's ``.agent/`` folder.

Releases, changes and the team lock are keyed by it rather than by the team directory's path,
which differs on every host. The id is made once (``team-`` and 12 hex digits) and never
changes; a team directory copied to another host carries it along.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.files import confined

__all__ = ["TEAM_ID_FILE", "team_id_for"]

TEAM_ID_FILE = ".agent/team-id"
"""Where the id lives, under the team directory."""

_VALID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def team_id_for(team_dir: str | Path) -> str:
    """The team's id, made and saved on first use.

    Raises:
        ConfigurationError: the file holds something that is not an id.
    """
    raw = confined.read(str(team_dir), TEAM_ID_FILE, max_bytes=1024)
    if raw is not None:
        text = raw.decode("utf-8", errors="replace").strip()
        if not _VALID.match(text):
            raise ConfigurationError(f"{Path(team_dir) / TEAM_ID_FILE}: not a team id: {text!r}")
        return text
    made = f"team-{uuid.uuid4().hex[:12]}"
    confined.write(str(team_dir), TEAM_ID_FILE, made + "\n")
    return made
