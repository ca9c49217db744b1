"""Gates: what a concrete change must pass, in order, before a byte is written.

Budget, confidence, scope, role, supervisor review, human approval. Each gate is
a one-method policy returning a ``GateVerdict``; ``run_gates`` runs them in order, stops at the
first refusal and returns every verdict so the cycle can record them. The supervisor and the
human are protocols here and implemented above (agents/, main.py), since infrastructure never
imports the roles.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agentmend.infrastructure.frozen import FrozenDict
from agentmend.infrastructure.models import ImprovementAction

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "ApprovalCallback",
    "ChangeReviewer",
    "FileEdit",
    "Gate",
    "GateVerdict",
    "ProposedChange",
    "run_gates",
]


@dataclass(frozen=True, slots=True)
class FileEdit:
    """One file a change writes: ``path`` relative to ``ProposedChange.root``; None = absent."""

    path: str
    old_content: bytes | None
    new_content: bytes | None


@dataclass(frozen=True)
class ProposedChange:
    """A concrete change, ready to gate and apply: the action and the exact bytes it writes.

    ``old_spec``/``new_spec`` are the agent before and after (None for creation/deletion).
    """

    action: ImprovementAction
    root: Path
    edits: tuple[FileEdit, ...]
    old_spec: AgentSpec | None = None
    new_spec: AgentSpec | None = None
    diff: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


class GateVerdict(BaseModel):
    """One gate's decision on one change, recorded whatever it says."""

    model_config = ConfigDict(frozen=True)

    gate: str
    passed: bool
    reason: str
    details: FrozenDict[str, Any] = Field(default_factory=FrozenDict)


class Gate(Protocol):
    """A check a change must pass. ``name`` appears in every verdict it gives."""

    name: str

    async def check(self, change: ProposedChange) -> GateVerdict: ...


class ChangeReviewer(Protocol):
    """The supervisor: a separate review of the concrete change (security, correctness, scope)."""

    async def review(self, change: ProposedChange) -> GateVerdict: ...


ApprovalCallback = Callable[[ProposedChange], bool | Awaitable[bool]]
"""Asks a human about one ``ProposedChange`` (its ``action``, ``diff``, ``analysis``): a plain
function or an ``async def``; True approves, anything else refuses. An async one is given the
gate's time limit (no answer in time = no); a plain one runs on the event loop, so it should
decide quickly (ask a person with an ``async def``)."""


async def run_gates(change: ProposedChange, gates: Sequence[Gate]) -> list[GateVerdict]:
    """Run ``gates`` in order; stop at the first refusal. Returns every verdict given."""
    verdicts: list[GateVerdict] = []
    for gate in gates:
        verdict = await gate.check(change)
        verdicts.append(verdict)
        if not verdict.passed:
            break
    return verdicts
