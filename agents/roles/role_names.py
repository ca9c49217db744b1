"""The names the roles run under, which a user's own team may not reuse.

The mediator, improver and supervisor run as agents named ``socratic-mediator``,
``self-improver`` and ``supervisor`` (their definitions are in ``agents/roles/definitions``).
Their runs are recorded under those names, the offline runtime picks a role's playbook by
name, and changes address agents by name; a team agent with one of these names would have its
runs, its detector and its fixes mixed with a role's, so a team that reuses one is refused.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.llm.offline import OfflineRuntime
from agentmend.roles.playbooks import (
    IMPROVER_NAME,
    MEDIATOR_NAME,
    SUPERVISOR_NAME,
    offline_policies,
)

__all__ = ["ROLE_AGENT_NAMES", "RoleNameClash", "check_team_names", "offline_role_runtime"]

ROLE_AGENT_NAMES: frozenset[str] = frozenset({MEDIATOR_NAME, IMPROVER_NAME, SUPERVISOR_NAME})
"""``socratic-mediator``, ``self-improver`` and ``supervisor``."""


class RoleNameClash(ConfigurationError):
    """A team agent is named like one of the roles; ``names`` lists the clashing names."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        super().__init__(
            f"the team has agent(s) named {', '.join(map(repr, names))}, which agentmend's "
            f"own roles use ({', '.join(sorted(ROLE_AGENT_NAMES))}); rename them (the name "
            "front-matter key and the file)"
        )


def check_team_names(names: Iterable[str]) -> None:
    """Refuse a team that reuses a role's name.

    Raises:
        RoleNameClash: naming every clashing agent.
    """
    clash = tuple(sorted(set(names) & ROLE_AGENT_NAMES))
    if clash:
        raise RoleNameClash(clash)


def offline_role_runtime() -> OfflineRuntime:
    """The roles' runtime with no model: the offline playbooks for the three roles.

    Known failure signatures are diagnosed and fixed with no model spend; an unknown one gets
    a low-confidence analysis and no change. Pass it as ``roles_runtime``.
    """
    return OfflineRuntime(offline_policies())
