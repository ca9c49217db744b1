"""Who acts: a principal and the permission that makes it an administrator, and who made a change.

Settings build the default principal and the gates judge every change against one, so it lives
below both. ``ChangeAuthor`` is the attribution a change carries from whoever asks for it down
to the change history and the audit rows, so it lives here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from agentmend.infrastructure.errors import PermissionRequired

__all__ = [
    "ADMIN",
    "ADMIN_UIDS_FILE",
    "CHECKER_ACTIONS",
    "IMPROVER_VIA",
    "PUBLISH_CANARY",
    "PUBLISH_STABLE",
    "SETTLE_ROLLOUT",
    "ChangeAuthor",
    "Principal",
    "admin_uid_refusal",
]

ADMIN = "admin"
"""The permission that may grant ``open`` or custom profiles (a server manager's right)."""

PUBLISH_CANARY = "publish_canary"
"""Publish a release to be served as a canary, and start its rollout."""
PUBLISH_STABLE = "publish_stable"
"""Publish a release served to the whole fleet at once (a team's first, or a rollback)."""
SETTLE_ROLLOUT = "settle_rollout"
"""Carry a rollout on by its evidence: promote or roll back as its sequential test decides."""
CHECKER_ACTIONS = frozenset({PUBLISH_CANARY, SETTLE_ROLLOUT})
"""All a fleet checker may do with releases: never promote, abort or acknowledge by itself."""

IMPROVER_VIA = "self-improver"
"""How the history records a change the improver proposed, and any change whose author names no
other way (``ChangeAuthor.via``)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who invokes a change: the gates never let a change grant more than this principal could."""

    user_id: str
    name: str
    permissions: frozenset[str] = frozenset()
    only: frozenset[str] | None = None
    """None: every action its permissions allow; else only these actions (``CHECKER_ACTIONS``
    for a fleet checker), and never an administrator's."""

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.permissions and self.only is None

    @classmethod
    def fleet_checker(cls, team_id: str) -> Principal:
        """The identity a team's fleet checker acts under: it may publish canaries and settle
        rollouts, nothing else (no promotion, no stable publication, no acknowledgement)."""
        return cls(
            user_id=f"fleet-checker:{team_id}",
            name=f"fleet checker of team {team_id}",
            only=CHECKER_ACTIONS,
        )

    def may(self, action: str) -> bool:
        """Whether this principal may take ``action`` (``PUBLISH_STABLE``, ...)."""
        return self.only is None or action in self.only

    def require(self, action: str, what: str) -> None:
        """Raise ``PermissionRequired`` naming ``what`` unless this principal ``may(action)``."""
        if not self.may(action):
            raise PermissionRequired(self.user_id, action, what)


@dataclass(frozen=True, slots=True)
class ChangeAuthor:
    """Who made a change, and how: one value from the caller down to the stored rows.

    A change is attributed twice: the change history records how it was made (its
    ``applied_by``: the improver, an agent's self-edit, a code plan) and every audit row names
    the person it was made for. Carried as one value, no layer between the caller and the rows
    can pass one half and drop the other.

    Attributes:
        via: how the change was made, recorded as its ``applied_by`` (``"self-improver"``,
            ``"self-edit:<agent>"``, ``"code_update:<plan id>"``); None leaves it to the
            ``ImprovementManager``'s default. A rollback records no ``via``.
        user_id: who the change (or rollback) is made for, as the audit rows name them; None
            names ``via`` for an apply, and the change's own ``applied_by`` for a rollback.
        user_name: their display name in the audit rows, if known.
    """

    via: str | None = None
    user_id: str | None = None
    user_name: str | None = None

    @classmethod
    def of(cls, principal: Principal, *, via: str | None = None) -> ChangeAuthor:
        """A change made for ``principal`` (its id and name in the audit rows), by ``via``."""
        return cls(via=via, user_id=principal.user_id, user_name=principal.name)

    @property
    def applied_by(self) -> str:
        """What the change history records as made it: ``via``, else ``IMPROVER_VIA``."""
        return self.via or IMPROVER_VIA

    def audit_user(self, fallback: str) -> str:
        """The ``user_id`` of the audit rows: the user's, else ``fallback``."""
        return self.user_id or fallback

    def via_or(self, default: str) -> ChangeAuthor:
        """This author, made by ``default`` unless it names its own ``via``."""
        return self if self.via else replace(self, via=default)


ADMIN_UIDS_FILE = "admin-uids"
"""In a workspace folder: more administrator uids (whitespace or comma separated)."""


def admin_uid_refusal(action: str, workspace: Path) -> str | None:
    """Why this process may not ``action`` as an administrator (None: it may).

    On one host with SQLite every process that records writes the store file, so the OS user is
    one trust domain and ``AGENTMEND_PRINCIPAL_ADMIN`` is only a claim. This check adds the one
    thing a same-host process cannot claim: its real uid must be one of the team's
    administrators, the uid that owns the workspace folder and those listed in its
    ``admin-uids`` file. The list is never read from the caller's environment, and the file
    counts only when the folder's owner owns it and nobody else may write it. It keeps other
    OS users out, never a process of an administrator's own uid.
    """
    uid = os.getuid()
    owner = workspace.stat().st_uid
    allowed = {owner}
    listed = workspace / ADMIN_UIDS_FILE
    try:
        info = listed.lstat()
        if info.st_uid == owner and not info.st_mode & 0o022 and listed.is_file():
            tokens = listed.read_text("utf-8").replace(",", " ").split()
            allowed.update(int(token) for token in tokens)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        return f"{action} refused: {listed} cannot be read as a list of uids ({exc})"
    if uid in allowed:
        return None
    return (
        f"{action} needs an administrator: uid {uid} is not one of this team's administrator "
        f"uids ({', '.join(str(u) for u in sorted(allowed))}; listed in {listed})"
    )
