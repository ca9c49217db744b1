"""What the roles say to each other: the structured outputs of mediator, improver and supervisor.

Every runtime returns these (the LLM runtimes through structured output, the offline playbooks
directly), so the cycle never parses prose unless a model failed to give structure, in which
case the plain-text report and ACTION formats (``report_parsing``) are the fallback.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentmend.infrastructure.frozen import FrozenJson
from agentmend.infrastructure.models import ChangeType

__all__ = [
    "CauseCategory",
    "ImprovementPlan",
    "MediatorReport",
    "ProposedAction",
    "SupervisorReview",
]

CauseCategory = Literal[
    "truncation",
    "tool_denied",
    "model_unavailable",
    "timeout",
    "format_violation",
    "rate_limit",
    "unknown",
]
"""Failure signatures the offline playbooks know; anything else is ``unknown``."""


class _Schema(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MediatorReport(_Schema):
    """The mediator's final report: the ROOT CAUSE ANALYSIS REPORT, structured."""

    responsible_agent: str = Field(description="The agent whose configuration causes the issue")
    cause_category: CauseCategory
    identified_cause: str = Field(description="The fundamental cause, in one or two sentences")
    confidence: float = Field(ge=0.0, le=1.0)
    evidence: tuple[str, ...] = Field(
        default_factory=tuple,
        description="Verbatim quotes from agent answers or recorded errors supporting the cause",
    )
    recommendations: tuple[str, ...] = Field(default_factory=tuple)


class ProposedAction(_Schema):
    """One concrete change the improver proposes.

    ``target_field`` says what it touches: ``system_prompt``, ``temperature``, ``max_tokens``,
    ``timeout_s``, ``max_turns``, ``tools``, ``permission_profile``, ``model``,
    ``docs/<path>``, or nothing for agent creation and deletion.
    """

    action_type: ChangeType
    target_agent: str
    target_field: str | None = None
    new_value: FrozenJson = None
    rationale: str
    confidence: float = Field(ge=0.0, le=1.0)


class ImprovementPlan(_Schema):
    """The improver's answer: the actions to take (possibly none) and why."""

    actions: tuple[ProposedAction, ...] = Field(default_factory=tuple)
    summary: str = ""


class SupervisorReview(_Schema):
    """The supervisor's verdict on one concrete change: the automated review before a write."""

    approved: bool
    risk: Literal["low", "medium", "high"]
    reason: str
    concerns: tuple[str, ...] = Field(default_factory=tuple)
