"""What one role step produced: the mediator's question and its answer, the improver's action
after planning and gating. The cycle records both; the roles return them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agentmend.infrastructure.changes.proposal import GateVerdict
from agentmend.infrastructure.models import ImprovementAction

__all__ = ["ActionOutcome", "QuestionAnswer"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QuestionAnswer(_Frozen):
    """One ``ask_agent`` exchange (a failed one has an empty ``answer`` and an ``error``)."""

    agent_name: str
    question: str
    answer: str = ""
    error: str | None = None


class ActionOutcome(_Frozen):
    """One proposed action after planning and gating.

    ``action`` carries ``old_value`` as the effector found it; ``verdicts`` are every gate's
    verdicts in order (the gates stop at the first refusal); ``error`` says why it could not be
    planned at all.
    """

    index: int
    action: ImprovementAction
    verdicts: tuple[GateVerdict, ...] = ()
    accepted: bool = False
    diff: str = ""
    paths: tuple[str, ...] = ()
    error: str | None = None

    @property
    def refused_by(self) -> GateVerdict | None:
        """The verdict that refused the action, if one did."""
        return next((v for v in self.verdicts if not v.passed), None)
