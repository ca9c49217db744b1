"""``ImprovementCycle``: one improvement cycle from the issue to the kept or rolled-back change.

``improve`` is the loop the orchestrator runs for a detected issue::

    another process claimed the issue (its cycle)   done ("claimed_elsewhere"), nothing asked
    the audit chain is broken (no apply could run)  done ("error"), nothing asked
    the agent's change is watched on live runs       done ("watch_open"), nothing asked
    analysis (mediator questions the agents)        unusable: done ("analysis_failed")
      -> proposal (improver)                         none: done ("no_action")
      -> the change: plan, run before, gate, apply, verify, keep or roll back
         (``agentmend.loop.change_pipeline``)

``self_edit`` takes one action an agent asked for (through its self-edit tools) through the same
change, recorded the same way.

Every step is a ``CycleEvent``: logged with structlog under the step's name, written to the
store's ``decisions`` table (kind ``cycle.<step>``, the cycle id in the payload), and passed to
``on_progress``. The ``CycleResult`` is the fold of those events (``cycle.fold_events``),
so ``replay_cycle(store, cycle_id)`` rebuilds it from the store alone.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

from agentmend.infrastructure.changes.audit.breaks import AuditChainBroken
from agentmend.infrastructure.models import ImprovementAction, IssueReport, RootCauseAnalysis
from agentmend.infrastructure.principal import IMPROVER_VIA, ChangeAuthor
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.tracing import role_span
from agentmend.loop.change_pipeline import ChangePipeline, Outcome, record_invalid
from agentmend.loop.collaborators import LoopCollaborators
from agentmend.loop.cycle import (
    CycleRecorder,
    CycleResult,
    CycleStatus,
    OnProgress,
    describe_failure,
    fold_events,
)
from agentmend.roles.ask_agent_tool import AskAgentTool
from agentmend.roles.outcomes import QuestionAnswer
from agentmend.roles.self_improver import InvalidProposal
from agentmend.roles.socratic_mediator import is_failed

__all__ = ["SELF_EDIT", "ImprovementCycle", "Outcome"]

log = get_logger(__name__)

SELF_EDIT = "self_edit"
"""The ``error_type`` (and ``detector``) of the issue a self-edit is recorded under."""

SELF_EDIT_VIA = "self-edit:"
"""How the history records a self-edit (``ChangeAuthor.via``), followed by the agent's name."""


class ImprovementCycle:
    """Runs recorded cycles on the orchestrator's team with the orchestrator's roles.

    It works on the collaborators the ``MetaOrchestrator`` was built with (``shared``: team,
    store, mediator, improver, reviewer, principal, tracer), and hands them to its
    ``ChangePipeline``; the orchestrator decides when a cycle runs and keeps the open issues,
    this class carries a cycle (or a self-edit) from start to finish.
    """

    def __init__(self, shared: LoopCollaborators, *, on_progress: OnProgress | None = None) -> None:
        self.shared = shared
        self.on_progress = on_progress
        self.changes = ChangePipeline(shared)

    # -- the two ways in -----------------------------------------------------------------------

    async def improve(
        self, issue: IssueReport, *, settle: Callable[[], object] | None = None
    ) -> CycleResult:
        """Diagnose ``issue``, fix, verify, keep or roll back, as one recorded cycle.

        ``settle`` is called once the cycle's body ends (however it ends), before the cycle's
        end is recorded: the orchestrator forgets the issue there.
        """
        return await self.recorded(issue, lambda rec: self._diagnose_and_fix(issue, rec), settle)

    async def self_edit(
        self, action: ImprovementAction, *, available_agents: list[str]
    ) -> CycleResult:
        """Make the self-edit ``action`` as one recorded cycle, from the plan on as a cycle does."""
        agent = action.target_agent
        issue = IssueReport(
            agent_name=agent,
            error_type=SELF_EDIT,
            context=f"self-edit of {action.target_field or action.action_type.value} "
            f"requested by {agent}",
            available_agents=available_agents,
            detector=SELF_EDIT,
            severity=0.0,
        )

        async def body(rec: CycleRecorder) -> Outcome:
            self.shared.team.reload()  # the files are the truth, as in a cycle
            await rec.emit(
                "actions_proposed",
                agent,
                f"1 action: {agent} edits its own {action.target_field or 'definition'}",
                actions=[action.model_dump(mode="json")],
                summary=f"self-edit requested by {agent}",
            )
            author = ChangeAuthor.of(self.shared.principal, via=f"{SELF_EDIT_VIA}{agent}")
            return await self.changes.run(rec, [action], agent, author)

        return await self.recorded(issue, body)

    # -- the record ----------------------------------------------------------------------------

    def role_calls(self) -> int:
        """Model calls made so far by the mediator, the improver and the reviewer."""
        reviewer_calls = getattr(self.shared.reviewer, "model_calls", 0)
        calls = self.shared.mediator.model_calls + self.shared.improver.model_calls
        return calls + (reviewer_calls if isinstance(reviewer_calls, int) else 0)

    async def recorded(
        self,
        issue: IssueReport,
        body: Callable[[CycleRecorder], Awaitable[Outcome]],
        settle: Callable[[], object] | None = None,
    ) -> CycleResult:
        """Run ``body`` as one recorded cycle: started, its steps, finished (even on error)."""
        cycle_id = uuid.uuid4().hex[:12]
        recorder = CycleRecorder(
            self.shared.store, cycle_id, self.on_progress, issue_id=issue.issue_id
        )
        started = time.perf_counter()
        calls_before = self.role_calls()
        status: CycleStatus = "error"
        error: str | None = None
        failure: BaseException | None = None
        try:
            await recorder.emit(
                "cycle_started",
                issue.agent_name,
                f"{issue.error_type} on {issue.agent_name}: {issue.context}",
                issue=issue.model_dump(mode="json"),
            )
            status, error = await body(recorder)
        except BaseException as exc:
            failure = exc
            status = (
                "rollback_blocked"
                if recorder.rollback_blocked
                else "rolled_back"
                if recorder.rolled_back
                else "error"
            )
            error = describe_failure(exc)
        if settle is not None:
            settle()
        try:
            await recorder.emit(
                "cycle_finished",
                issue.agent_name,
                f"cycle {status}" + (f": {error}" if error else ""),
                status=status,
                error=error,
                model_calls=self.role_calls() - calls_before,
                duration_ms=(time.perf_counter() - started) * 1000,
                # a table of cycles reads a watched one's verdict through this (cycle_history)
                watch_id=recorder.watch_id,
            )
        except Exception as exc:
            if failure is None:
                raise
            # the first failure is the one worth seeing; this one is only logged
            log.error("cycle_not_recorded", cycle_id=cycle_id, error=str(exc))
        if failure is not None:
            raise failure
        return fold_events(recorder.events)

    # -- analyse and propose -------------------------------------------------------------------

    async def _diagnose_and_fix(self, issue: IssueReport, rec: CycleRecorder) -> Outcome:
        taken = self._claimed_elsewhere(issue, rec)
        if taken is not None:  # before any model call: one cycle per issue, fleet-wide
            return "claimed_elsewhere", taken
        try:  # before any question is asked: a cycle whose change could not be applied ends
            self.shared.manager.audit.ensure_appendable()
        except AuditChainBroken as exc:
            return "error", f"no change can be applied: {exc}"
        busy = self.changes.watch_open(issue.agent_name)
        if busy is not None:  # before any model call: no change to it could be made now
            return "watch_open", busy
        analysis = await self._analyse(issue, rec)
        if is_failed(analysis):
            return "analysis_failed", analysis.identified_cause
        try:
            with role_span(
                self.shared.tracer,
                "self-improver",
                **{"agentmend.issue.agent": analysis.agent_name},
            ):
                proposal = await self.shared.improver.propose_plan(analysis)
        except InvalidProposal as exc:
            return await record_invalid(rec, exc, analysis.agent_name)
        await rec.emit(
            "actions_proposed",
            analysis.agent_name,
            f"{len(proposal.actions)} action(s): {proposal.summary}",
            actions=[action.model_dump(mode="json") for action in proposal.actions],
            summary=proposal.summary,
        )
        if not proposal.actions:
            return "no_action", None
        return await self.changes.run(
            rec,
            proposal.actions,
            analysis.agent_name,
            ChangeAuthor.of(self.shared.principal, via=IMPROVER_VIA),
        )

    def _claimed_elsewhere(self, issue: IssueReport, rec: CycleRecorder) -> str | None:
        """Claim the detector's issue for this cycle; why not, when another process has it."""
        if issue.issue_id is None:  # a requested analysis: no issue row to share
            return None
        ledger = self.shared.detector.ledger
        claimant = f"{socket.gethostname()}:{os.getpid()}:{rec.cycle_id}"
        stale = self.shared.settings.issue_claim_stale_s
        claim = ledger.claim(issue.issue_id, claimant, stale_after_s=stale)
        if claim is None:
            row = ledger.get(issue.issue_id)
            if row is None:  # not this ledger's issue: there is no claim to share
                return None
            if row.status == "held":
                # the detector reports open issues only: a held one is asked for again (a
                # person's /improve after a "no"), and the hold yields to that
                ledger.reopen(issue.issue_id, context=row.context)
                claim = ledger.claim(issue.issue_id, claimant, stale_after_s=stale)
        if claim is None:
            return f"issue {issue.issue_id} is no longer open: another cycle dealt with it"
        if not claim.mine:
            return f"issue {issue.issue_id} is being handled by {claim.claimed_by}"
        return None

    async def _analyse(self, issue: IssueReport, rec: CycleRecorder) -> RootCauseAnalysis:
        # the files are the truth: read them once per cycle (someone may have edited them), and
        # rebuild the registry, since agents may have been created or deleted since
        self.shared.team.reload()
        self.shared.mediator.ask_agent_tool = AskAgentTool(self.shared.team.ask_agent_registry())

        async def asked(exchange: QuestionAnswer) -> None:
            await rec.emit(
                "question_asked",
                exchange.agent_name,
                exchange.question,
                **exchange.model_dump(mode="json"),
            )

        self.shared.mediator.on_question = asked
        try:
            with role_span(
                self.shared.tracer,
                "socratic-mediator",
                **{"agentmend.issue.agent": issue.agent_name},
            ):
                analysis = await self.shared.mediator.analyze_issue(issue)
        finally:
            self.shared.mediator.on_question = None
        await rec.emit(
            "analysis_completed",
            analysis.agent_name,
            f"{analysis.cause_category or 'cause'} ({analysis.confidence_score:.2f}): "
            f"{analysis.identified_cause}",
            analysis=analysis.model_dump(mode="json"),
        )
        return analysis
