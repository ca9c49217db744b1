"""Who acts: a principal and the permission that makes it an administrator.

Settings build the default principal and the gates judge every change against one, so it lives
below both.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ADMIN", "Principal"]

ADMIN = "admin"
"""The permission that may grant ``open`` or custom profiles (a server manager's right)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who invokes a change: the gates never let a change grant more than this principal could."""

    user_id: str
    name: str
    permissions: frozenset[str] = frozenset()

    @property
    def is_admin(self) -> bool:
        return ADMIN in self.permissions
