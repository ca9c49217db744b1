"""Offline playbooks: rule-based stand-ins for the mediator, improver and supervisor models.

On the offline runtime (``agentmend.infrastructure.llm.offline.OfflineRuntime``) each role's
definition runs one of these policies instead of a model. They use the same tools (``ask_agent``)
and return the same structured outputs (``agentmend.roles.schemas``), read only their prompt's
tagged JSON blocks and the tools' answers, and fix known failure signatures with no model spend; an
unknown signature gets a low-confidence analysis and no change, to be escalated to a model.

Example::

    runtime = OfflineRuntime(offline_policies())
    result = await runtime.run(mediator_spec, prompt, tools=[ask.tool_spec],
                               output_type=MediatorReport)
"""

from __future__ import annotations

from agentmend.infrastructure.llm.offline import OfflinePolicy
from agentmend.roles.playbooks.improver import improver_policy, plan_for
from agentmend.roles.playbooks.mediator import mediator_policy
from agentmend.roles.playbooks.supervisor import review_change, supervisor_policy

__all__ = [
    "IMPROVER_NAME",
    "MEDIATOR_NAME",
    "SUPERVISOR_NAME",
    "improver_policy",
    "mediator_policy",
    "offline_policies",
    "plan_for",
    "review_change",
    "supervisor_policy",
]

MEDIATOR_NAME = "socratic-mediator"
IMPROVER_NAME = "self-improver"
SUPERVISOR_NAME = "supervisor"


def offline_policies() -> dict[str, OfflinePolicy]:
    """The three role policies keyed by the role agents' names, for ``OfflineRuntime``."""
    return {
        MEDIATOR_NAME: mediator_policy,
        IMPROVER_NAME: improver_policy,
        SUPERVISOR_NAME: supervisor_policy,
    }
