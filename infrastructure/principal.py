"""Who acts: a principal and the permission that makes it an administrator, and who made a change.

Settings build the default principal and the gates judge every change against one, so it lives
below both. ``ChangeAuthor`` is the attribution a change carries from whoever asks for it down
to the change history and the audit rows, so it lives here too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["ADMIN", "IMPROVER_VIA", "ChangeAuthor", "Principal"]

ADMIN = "admin"
"""The permission that may grant ``open`` or custom profiles (a server manager's right)."""

IMPROVER_VIA = "self-improver"
"""How the history records a change the improver proposed, and any change whose author names no
other way (``ChangeAuthor.via``)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who invokes a change: the gates never let a change grant more than this principal could."""

    user_id: str
    name: str
    permissions: frozenset[str] = frozenset()

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.permissions


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
