"""What one improvement cycle produced, and how it is recorded so it can be replayed.

A cycle is a sequence of ``CycleEvent``s (started, a question asked, the analysis, the
proposal, each gate verdict, the apply, each verification, the keep or the rollback, the end).
The orchestrator writes every event to the store's ``decisions`` table as it happens and builds
its ``CycleResult`` by folding those same events (``fold_events``), so ``replay_cycle`` rebuilds
exactly the result the caller got from nothing but the store. Event data is JSON-shaped
(``model_dump(mode="json")``) for that reason: what the live fold sees is what the store keeps.

A change to an agent with no eval suite is watched on its live runs after the cycle ends
(``watching``, see ``agentmend.loop.change_pipeline``): its verdict comes later, from the watch's
row in the store. ``replay_cycle`` (and the readers of ``agentmend.loop.cycle_history``) read that
row, so a replayed watched cycle says how its watch stands: still ``watching``, ``kept``,
``rolled_back`` (it hurt) or ``not_proven`` (rolled back: not shown better within its budget).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentmend.infrastructure.changes.proposal import GateVerdict
from agentmend.infrastructure.changes.protocol.decisions import list_decisions, record_decision
from agentmend.infrastructure.changes.watch import ChangeWatch, WatchVerdict, read_watch
from agentmend.infrastructure.detection.checker_seat import SeatHolder
from agentmend.infrastructure.errors import InvalidArgument, NotFound
from agentmend.infrastructure.evaluation.verification import VerificationVerdict
from agentmend.infrastructure.frozen import FrozenDict
from agentmend.infrastructure.llm.base import AgentResult
from agentmend.infrastructure.models import (
    ImprovementAction,
    IssueReport,
    RootCauseAnalysis,
    utc_now,
)
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import json_text
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.roles.outcomes import ActionOutcome, QuestionAnswer

__all__ = [
    "DECISION_PREFIX",
    "CycleEvent",
    "CycleRecorder",
    "CycleResult",
    "CycleStatus",
    "CycleStep",
    "OnProgress",
    "TaskResult",
    "WatchOutcome",
    "cycle_events",
    "describe_failure",
    "fold_events",
    "list_cycle_ids",
    "replay_cycle",
    "with_watch_verdict",
]

DECISION_PREFIX = "cycle."
"""Decision kinds of cycle events are ``cycle.<step>`` (``cycle.gate_checked``, ...)."""

CycleStep = Literal[
    "cycle_started",
    "question_asked",
    "analysis_completed",
    "actions_proposed",
    "proposal_invalid",
    "gate_checked",
    "change_applied",
    "verification_completed",
    "change_kept",
    "change_rolled_back",
    "change_rollback_blocked",
    # the process lost its lease while verifying (stopped past its expiry): recovery settled
    # the change, and the cycle stopped without writing
    "change_lease_lost",
    # the change was applied under a watch on the agent's live runs (no eval suite): the cycle
    # ends "watching" and the watch keeps or rolls it back later
    "change_watched",
    "cycle_finished",
]

CycleStatus = Literal[
    "kept",  # a change was applied, verified and kept
    "rolled_back",  # a change was applied and undone (verification failed, or an error)
    # a change was applied and not kept, but someone edited a file of it meanwhile: that agent's
    # files are left as they are, its change is FAILED and needs attention; the rest is undone
    "rollback_blocked",
    "no_action",  # the improver proposed nothing (transient fault, unknown cause)
    "not_reproduced",  # its suite (or else the sample query) passes before any change
    "refused",  # every proposed action was refused by a gate
    "analysis_failed",  # no usable root cause analysis
    "invalid_proposal",  # the improver's output named an unknown agent/field or was malformed
    "error",  # something failed before any file was written
    # applied and watched on the agent's live runs (it has no eval suite); a replay from the
    # store shows the watch's verdict instead once it has one: kept, rolled_back (it hurt) or
    # not_proven (rolled back, not shown better within the watch's budget)
    "watching",
    "not_proven",
    # nothing applied: a change to this agent is being watched on live runs (one at a time)
    "watch_open",
    # nothing run: another process claimed the issue and runs its cycle (or it moved on)
    "claimed_elsewhere",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WatchOutcome(_Frozen):
    """Where the watch on a cycle's change stands (see
    ``agentmend.infrastructure.changes.watch``)."""

    watch_id: str
    agent: str
    verdict: WatchVerdict
    decision: str | None = None
    """The sequential test's decision (``better``, ``hurts``, ``no_worse``, ``budget_spent``)."""
    runs: int = 0
    """The agent's live runs judged so far."""
    budget: int = 0
    """The most live runs the watch judges before it rolls back a change not shown better."""
    description: str = ""

    @classmethod
    def of(cls, watch: ChangeWatch) -> WatchOutcome:
        return cls(
            watch_id=watch.watch_id,
            agent=watch.agent,
            verdict=watch.verdict,
            decision=watch.decision,
            runs=watch.pairs,
            budget=watch.budget,
            description=watch.describe(),
        )


class CycleEvent(_Frozen):
    """One step of a cycle, as shown live (``on_progress``) and kept in the store."""

    cycle_id: str
    seq: int
    step: CycleStep
    agent_name: str | None = None
    message: str = ""
    data: FrozenDict[str, Any] = Field(default_factory=FrozenDict)
    timestamp: datetime = Field(default_factory=utc_now)


class CycleResult(_Frozen):
    """Everything one cycle did, truthy when a change was kept (so ``if cycle:`` reads as success).

    ``rolled_back`` says some of the applied change was undone; ``rollback_blocked`` names the
    files that were not, because someone edited them after the change was applied (see
    ``agentmend.loop.change_pipeline``): they hold that person's edit on top of the unproven change,
    which is FAILED in the history and needs a person to look at it.
    """

    cycle_id: str
    issue: IssueReport
    status: CycleStatus
    analysis: RootCauseAnalysis | None = None
    questions: tuple[QuestionAnswer, ...] = ()
    proposal_summary: str = ""
    actions: tuple[ImprovementAction, ...] = ()
    outcomes: tuple[ActionOutcome, ...] = ()
    change_ids: tuple[str, ...] = ()
    group_id: str | None = None
    verifications: FrozenDict[str, VerificationVerdict] = Field(default_factory=FrozenDict)
    rolled_back: bool = False
    rollback_reason: str | None = None
    rollback_blocked: tuple[str, ...] = ()
    error: str | None = None
    watch: WatchOutcome | None = None
    """The watch on the change (an agent without an eval suite), as last read."""
    model_calls: int = 0
    duration_ms: float = 0.0
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def __bool__(self) -> bool:
        return self.status == "kept"

    @property
    def success(self) -> bool:
        return self.status == "kept"

    @property
    def gate_verdicts(self) -> list[GateVerdict]:
        """Every gate verdict of the cycle, action by action."""
        return [verdict for outcome in self.outcomes for verdict in outcome.verdicts]

    @property
    def applied_actions(self) -> list[ImprovementAction]:
        """The actions whose edits were written (whatever verification then decided)."""
        if not self.change_ids:
            return []
        return [outcome.action for outcome in self.outcomes if outcome.accepted]

    @property
    def verification(self) -> VerificationVerdict | None:
        """The verdict on the responsible agent (else the first one), if anything was verified."""
        if not self.verifications:
            return None
        if self.analysis is not None and self.analysis.agent_name in self.verifications:
            return self.verifications[self.analysis.agent_name]
        return next(iter(self.verifications.values()))

    def summary(self) -> str:
        """One line for logs and the interactive session."""
        agent = self.analysis.agent_name if self.analysis else self.issue.agent_name
        text = f"cycle {self.cycle_id} on {agent}: {self.status}"
        verdict = self.verification
        if verdict is not None:
            before = "n/a" if verdict.before_score is None else f"{verdict.before_score:.2f}"
            text += f" (score {before} -> {verdict.after_score:.2f})"
        if self.watch is not None:
            text += f" ({self.watch.agent}'s change {self.watch.description})"
        if self.error:
            text += f": {self.error}"
        elif self.rollback_reason:
            text += f": {self.rollback_reason}"
        if self.rollback_blocked:
            text += (
                f" (rollback blocked: {', '.join(self.rollback_blocked)} edited since the "
                "change was applied and left as it is; needs attention)"
            )
        return text


@dataclass
class TaskResult:
    """What ``execute_task`` returns: every agent's result, the issues found, the cycles run."""

    query: str
    results: dict[str, AgentResult[Any]]
    issues: list[IssueReport] = field(default_factory=list)
    cycles: list[CycleResult] = field(default_factory=list)
    declined: list[IssueReport] = field(default_factory=list)
    left_to_checker: list[IssueReport] = field(default_factory=list)
    """Issues no cycle was started or offered for: the team's fleet checker holds the team
    (``checker``) and deals with them by its policy; asking for a cycle still runs one."""
    checker: SeatHolder | None = None
    store_notice: str | None = None
    """Set when the store could not be reached: the steps skipped and why (the question was
    answered all the same, its runs kept to be written)."""

    @property
    def answers(self) -> dict[str, str]:
        return {name: result.text for name, result in self.results.items()}

    @property
    def success(self) -> bool:
        """Whether every agent's run succeeded."""
        return all(result.success for result in self.results.values())

    @property
    def failed(self) -> list[str]:
        return [name for name, result in self.results.items() if not result.success]

    @property
    def text(self) -> str:
        """The successful answers, one ``### name`` section per agent, as one string."""
        return "\n\n".join(
            f"### {name}\n{result.text}" for name, result in self.results.items() if result.success
        )

    def __str__(self) -> str:
        return self.text


# -- recording, folding and replay -------------------------------------------------------

log = get_logger(__name__)

OnProgress = Callable[[CycleEvent], Awaitable[None] | None]
"""Shown every event as it happens (``main.py`` prints the steps live)."""


class CycleRecorder:
    """One cycle's events: logged under the step's name, stored, shown, kept for the fold.

    Each event is written to the store before it is shown, so a display that fails never
    loses a step of the record. ``rolled_back`` tells the caller a rollback already happened;
    ``rollback_blocked`` that one left edited files (their paths) in place; ``watch_id`` that
    the change is watched on live runs. ``issue_id`` is the detector's id of the issue the
    cycle answers (None: a requested analysis or a self-edit).
    """

    def __init__(
        self,
        store: Store,
        cycle_id: str,
        on_progress: OnProgress | None,
        *,
        issue_id: str | None = None,
    ) -> None:
        self.store = store
        self.cycle_id = cycle_id
        self.on_progress = on_progress
        self.issue_id = issue_id
        self.events: list[CycleEvent] = []
        self.rolled_back = False
        self.rollback_blocked: list[str] = []
        self.watch_id: str | None = None

    async def emit(
        self, step: CycleStep, agent_name: str | None, message: str, /, **data: Any
    ) -> CycleEvent:
        """Record one step; ``data`` must be JSON-shaped (it is what a replay sees)."""
        event = CycleEvent(
            cycle_id=self.cycle_id,
            seq=len(self.events),
            step=step,
            agent_name=agent_name,
            message=message,
            data=data,
        )
        self.events.append(event)
        log.info(step, cycle_id=self.cycle_id, agent=agent_name, message=message)
        record_decision(
            self.store,
            DECISION_PREFIX + step,
            agent_name=agent_name,
            payload=event.model_dump(mode="json", exclude={"timestamp"}),
            timestamp=event.timestamp,
        )
        if self.on_progress is not None:
            shown = self.on_progress(event)
            if inspect.isawaitable(shown):
                await shown
        return event


def fold_events(events: list[CycleEvent]) -> CycleResult:
    """The ``CycleResult`` a sequence of events amounts to (live and replayed alike).

    Raises:
        InvalidArgument: the events do not start with ``cycle_started`` (not one whole cycle).
    """
    if not events or events[0].step != "cycle_started":
        raise InvalidArgument(
            "events", [e.step for e in events[:1]], "must start with cycle_started"
        )
    first = events[0]
    state: dict[str, Any] = {
        "cycle_id": first.cycle_id,
        "issue": IssueReport.model_validate(first.data["issue"]),
        "status": "error",
        "started_at": first.timestamp,
    }
    questions: list[QuestionAnswer] = []
    outcomes: dict[int, dict[str, Any]] = {}
    verifications: dict[str, VerificationVerdict] = {}
    for event in events[1:]:
        data = event.data
        if event.step == "question_asked":
            questions.append(QuestionAnswer.model_validate(data))
        elif event.step == "analysis_completed":
            state["analysis"] = RootCauseAnalysis.model_validate(data["analysis"])
        elif event.step == "actions_proposed":
            state["actions"] = tuple(ImprovementAction.model_validate(a) for a in data["actions"])
            state["proposal_summary"] = data.get("summary", "")
        elif event.step == "proposal_invalid":
            state["error"] = data["error"]
        elif event.step == "gate_checked":
            slot = outcomes.setdefault(int(data["index"]), {"verdicts": []})
            slot["action"] = data["action"]
            slot["diff"] = data.get("diff", "")
            slot["paths"] = tuple(data.get("paths", ()))
            if data.get("verdict") is not None:
                slot["verdicts"].append(GateVerdict.model_validate(data["verdict"]))
            if data.get("error") is not None:
                slot["error"] = data["error"]
            slot["accepted"] = bool(data.get("accepted", False))
        elif event.step == "change_applied":
            state["change_ids"] = tuple(data["change_ids"])
            state["group_id"] = data.get("group_id")
        elif event.step == "verification_completed":
            verifications[str(data["agent"])] = VerificationVerdict.model_validate(data["verdict"])
        elif event.step == "change_watched":
            state["watch"] = WatchOutcome.model_validate(data["watch"])
        elif event.step == "change_rolled_back":
            state["rolled_back"] = True
            state["rollback_reason"] = data.get("reason")
        elif event.step == "change_rollback_blocked":
            state["rollback_blocked"] = tuple(data.get("paths", ()))
            state["rollback_reason"] = data.get("reason")
        elif event.step == "cycle_finished":
            state["status"] = data["status"]
            state["error"] = data.get("error", state.get("error"))
            state["model_calls"] = int(data.get("model_calls", 0))
            state["duration_ms"] = float(data.get("duration_ms", 0.0))
            state["finished_at"] = event.timestamp
    state["questions"] = tuple(questions)
    state["verifications"] = verifications
    state["outcomes"] = tuple(
        ActionOutcome(
            index=index,
            action=ImprovementAction.model_validate(slot["action"]),
            verdicts=tuple(slot["verdicts"]),
            accepted=slot["accepted"],
            diff=slot["diff"],
            paths=slot["paths"],
            error=slot.get("error"),
        )
        for index, slot in sorted(outcomes.items())
    )
    return CycleResult(**state)


def _event_from_decision(payload: dict[str, Any], timestamp: datetime) -> CycleEvent:
    return CycleEvent.model_validate({**payload, "timestamp": timestamp})


def cycle_events(store: Store, cycle_id: str) -> list[CycleEvent]:
    """Every recorded event of one cycle, in order (empty if the id is unknown)."""
    list_decisions(store, limit=0)  # makes sure the decisions table exists
    conn = store.connection()
    rows = conn.execute(
        "SELECT timestamp, payload FROM decisions"
        f" WHERE kind LIKE 'cycle.%' AND {json_text(conn, 'payload', 'cycle_id')} = ?"
        " ORDER BY id",
        (cycle_id,),
    ).fetchall()
    return [
        _event_from_decision(json.loads(payload), datetime.fromisoformat(stamp))
        for stamp, payload in rows
    ]


def replay_cycle(store: Store, cycle_id: str) -> CycleResult:
    """Rebuild a cycle's result from the store alone.

    Raises:
        NotFound: no cycle with this id was recorded (a ``KeyError`` too).
    """
    events = cycle_events(store, cycle_id)
    if not events:
        raise NotFound("cycle", cycle_id, "in the store")
    return with_watch_verdict(store, fold_events(events))


def with_watch_verdict(store: Store, result: CycleResult) -> CycleResult:
    """``result`` with its watch as the store has it now (unchanged without a watch).

    A cycle that ended ``watching`` takes its watch's verdict as its status once the watch has
    one: ``kept``, ``rolled_back`` (the change hurt) or ``not_proven``.
    """
    if result.watch is None:
        return result
    watch = read_watch(store, result.watch.watch_id)
    if watch is None:
        return result
    update: dict[str, Any] = {"watch": WatchOutcome.of(watch)}
    if result.status == "watching" and watch.verdict != "watching":
        update["status"] = watch.verdict
        if watch.verdict != "kept":
            update["rolled_back"] = True
            update["rollback_reason"] = watch.describe()
    return result.model_copy(update=update)


def list_cycle_ids(store: Store, *, limit: int = 50) -> list[str]:
    """The ids of the newest ``limit`` cycles, oldest first."""
    started = list_decisions(store, kind=DECISION_PREFIX + "cycle_started", limit=limit)
    return [str(decision.payload["cycle_id"]) for decision in started]


def describe_failure(exc: BaseException) -> str:
    """One line for an exception that ended a cycle, as a person reads it.

    A cancellation (Ctrl-C in the session, a caller's timeout) carries no text of its own, so
    it is said in words rather than as ``CancelledError:``.
    """
    if isinstance(exc, asyncio.CancelledError):
        return "interrupted (cancelled before it finished)"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
