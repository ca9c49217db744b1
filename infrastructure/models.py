"""The data that flows around the loop: executions, metrics, issues, analyses and changes.

Names and fields are the ones users of the loop already know; the models are pydantic v2 so every
step of the loop can be stored, compared and replayed. Records are frozen: a change of state is
a new record, so an old one can never be mutated behind the store's back.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentmend.infrastructure.frozen import FrozenDict, FrozenJson

__all__ = [
    "AgentMetrics",
    "ChangeRecord",
    "ChangeStatus",
    "ChangeType",
    "ExecutionRecord",
    "FileChange",
    "ImprovementAction",
    "IssueReport",
    "RootCauseAnalysis",
    "utc_now",
]


def utc_now() -> datetime:
    return datetime.now(UTC)


def _clip(value: Any, limit: int) -> str:
    return str(value)[:limit]


def _thawed(value: FrozenDict[str, Any] | None) -> dict[str, Any] | None:
    return None if value is None else dict(value)


class ChangeType(StrEnum):
    """What kind of thing a change touches."""

    PROMPT_MODIFICATION = "prompt_modification"
    PARAMETER_ADJUSTMENT = "parameter_adjustment"
    AGENT_CREATION = "agent_creation"
    AGENT_DELETION = "agent_deletion"
    TOOL_PERMISSION_CHANGE = "tool_permission_change"
    MODEL_CHANGE = "model_change"
    DOCS_EDIT = "docs_edit"
    CODE_PATCH = "code_patch"


class ChangeStatus(StrEnum):
    """A change's life: PENDING -> APPLIED -> KEPT or ROLLED_BACK, or FAILED."""

    PENDING = "pending"
    APPLIED = "applied"
    KEPT = "kept"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ExecutionRecord(_Frozen):
    """One agent run as the monitor saw it. A failed run is data, not an exception."""

    agent_name: str
    success: bool
    duration_ms: float = Field(ge=0)
    error: str | None = None
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)
    timestamp: datetime = Field(default_factory=utc_now)
    extra: FrozenDict[str, Any] = Field(default_factory=FrozenDict)


class AgentMetrics(_Frozen):
    """Per-agent statistics over the monitor's window and the agent's baseline."""

    agent_name: str
    executions: int = 0
    successes: int = 0
    failures: int = 0
    success_rate: float = 0.0
    error_rate: float = 0.0
    avg_duration_ms: float = 0.0
    p95_duration_ms: float = 0.0
    baseline_avg_duration_ms: float | None = None
    consecutive_failures: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    last_error: str | None = None
    recent_errors: tuple[str, ...] = ()
    """The latest errors since the agent's last kept change (up to 10, oldest first)."""
    errors_before_change: tuple[str, ...] = ()
    """History: the latest errors from before that change, which they preceded."""
    errors_before_change_label: str | None = None
    """The kept change ``errors_before_change`` preceded."""
    recent_outcomes: tuple[bool, ...] = ()
    """Success of each run in the window, oldest first (what ``/status`` draws)."""


class IssueReport(_Frozen):
    """A detected degradation, with the evidence of which detector fired and why."""

    agent_name: str
    error_type: str
    metrics: FrozenDict[str, Any] = Field(default_factory=FrozenDict)
    error_logs: tuple[str, ...] = ()
    context: str = ""
    available_agents: tuple[str, ...] = ()
    timestamp: datetime = Field(default_factory=utc_now)
    detector: str = "rules"
    statistic: float | None = None
    threshold: float | None = None
    baseline: FrozenDict[str, Any] = Field(default_factory=FrozenDict)
    severity: float = Field(default=1.0, ge=0)
    issue_id: str | None = None  # the detector's issue row (None: a requested analysis, ...)

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent_name": self.agent_name,
            "error_type": self.error_type,
            "metrics": dict(self.metrics),
            "error_count": len(self.error_logs),
            "context": self.context,
            "timestamp": self.timestamp.isoformat(),
            "detector": self.detector,
            "statistic": self.statistic,
            "threshold": self.threshold,
            "baseline": dict(self.baseline),
        }


class RootCauseAnalysis(_Frozen):
    """The mediator's finding: who is responsible, why, how sure, and on what evidence."""

    issue: IssueReport
    identified_cause: str
    confidence_score: float = Field(ge=0.0, le=1.0)
    recommendations: tuple[str, ...] = ()
    full_report: str = ""
    responsible_agent: str | None = None
    evidence: tuple[str, ...] = ()
    cause_category: str | None = None
    timestamp: datetime = Field(default_factory=utc_now)

    @property
    def agent_name(self) -> str:
        return self.responsible_agent or self.issue.agent_name

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent_name": self.agent_name,
            "cause": self.identified_cause,
            "cause_category": self.cause_category,
            "confidence": self.confidence_score,
            "recommendations": list(self.recommendations),
            "evidence": list(self.evidence),
            "timestamp": self.timestamp.isoformat(),
        }


class ImprovementAction(_Frozen):
    """One proposed change to one agent; `target_field` names the key or file it touches."""

    target_agent: str
    action_type: ChangeType
    old_value: FrozenJson = None
    new_value: FrozenJson = None
    rationale: str = ""
    confidence_score: float = Field(ge=0.0, le=1.0)
    target_field: str | None = None


class FileChange(_Frozen):
    """One file touched by a change: what it held before (hash) and after."""

    path: str
    old_sha256: str | None
    new_sha256: str | None


class ChangeRecord(_Frozen):
    """A change as the history holds it. A new state is a new record from the store."""

    change_id: str
    timestamp: datetime
    action: ImprovementAction
    status: ChangeStatus
    applied_by: str = "self-improver"
    verification_result: FrozenDict[str, Any] | None = None
    rollback_info: FrozenDict[str, Any] | None = None
    group_id: str | None = None
    files: tuple[FileChange, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "change_id": self.change_id,
            "timestamp": self.timestamp.isoformat(),
            "target_agent": self.action.target_agent,
            "action_type": self.action.action_type.value,
            "target_field": self.action.target_field,
            "old_value": _clip(self.action.old_value, 200),
            "new_value": _clip(self.action.new_value, 200),
            "rationale": self.action.rationale,
            "confidence": self.action.confidence_score,
            "status": self.status.value,
            "applied_by": self.applied_by,
            "group_id": self.group_id,
            "files": [f.path for f in self.files],
            "verification": _thawed(self.verification_result),
            "rollback_info": _thawed(self.rollback_info),
        }
