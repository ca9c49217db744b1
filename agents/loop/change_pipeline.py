"""``ChangePipeline``: one change, proven or undone (the path cycles and self-edits share).

::

    plan: the exact bytes of each action              invalid: done ("invalid_proposal")
      -> an agent it targets has a change watched on live runs: done ("watch_open")
      -> no target has an eval suite: the change is WATCHED on live runs (below)
      -> eval suites loaded and run BEFORE the change (without a suite: the sample query),
         recorded apart from production runs; everything already passing: done
         ("not_reproduced", nothing could be shown to help)
      -> gates per action, every verdict recorded     all refused: done ("refused")
      -> apply the accepted changes as one group
      -> reload, the same run AFTER, compare (without a suite: the weaker check, see
         ``agentmend.loop.cycle_verification``)
      -> keep (a new detection baseline, unless only the weaker check spoke for the change:
         see ``agentmend.loop.cycle_verification.fresh_baselines``)
         or  roll back the whole group (why, with the scores)

Without an eval suite: watched on live runs
-------------------------------------------
When no agent the change targets has an eval suite, there is nothing to run before and after
but the agent's own traffic. The change is then applied under a watch
(``agentmend.infrastructure.changes.watch``): the watched agent is the cycle's agent (else the
change's only target), its newest ``watch_runs`` production runs are the "before" (in a random
order), and every production run it makes after the change is judged against them, one for one, by
the always-valid two-sample test. The cycle ends ``watching``; the watch rolls the change back
the moment the test says it hurts, keeps it once it is shown better, and rolls it back when its
budget (as many runs as the "before") is spent without that: a change that does not help is
not kept.
Whoever records the agent's runs advances the watch (``MetaOrchestrator.advance_watches``); the
watch is owned by its record in the store, so a crash does not undo it and the next open of
the store continues it. While it is open, no other change to that agent is made
(``watch_open``). A keep on a watch starts no new detection baseline (the change was shown
better than the degraded runs, not as good as the healthy agent): detection keeps judging the
agent against its behaviour before the fault. Before the change is written, live runs that
all succeeded show nothing a change could improve: done ("not_reproduced").

An agent with fewer than ``MIN_WATCH_RUNS`` production runs has too little traffic to judge a
change on (even a perfect fix could not reach the test's bar), and an agent the change creates
has none: those changes get the weaker sample-query check (below, ``weaker`` in the verdict).
So does a team served from releases (``AgentTeam.following``): its runs use the change only
once a release carries it, and a kept change's canary release is judged on live runs there.

Verification runs that fail transiently (rate limit, overload) are run again: the weather of
the API is not what a change is judged on. Any exception after the apply rolls the group back
before it propagates (the exception raised is always the original one), so a crash in
verification never leaves an unproven change silently in place. The group is held by a lease
of this process (``ImprovementManager.hold_lease``) from its apply to its keep or rollback: if
the process dies, or stops past the lease's expiry, the next open of the store settles the
group (restored, FAILED ``interrupted``), and a resumed process that finds its lease lost stops
without writing (``change_lease_lost``, outcome ``error``).
Every step is recorded as a ``CycleEvent`` of the cycle it belongs to (``CycleRecorder``).

Rolling back an unproven change
-------------------------------
Someone may edit a file of the group while it is being verified (a person, or an agent with a
Write tool). Such an edit is never overwritten, and it never stops the rest of the group from
being undone. ``ImprovementManager.rollback_unproven`` undoes the group under the root's lock,
agent by agent (an agent's files stay together, so no agent is left half-undone), and the
pipeline records what it did:

- an agent whose changed files all still hold exactly what the change wrote gets its old bytes
  back: its changes are ROLLED_BACK (``change_rolled_back``);
- an agent with a file edited since the apply keeps every file of the change as it is now. Its
  changes become FAILED with ``rollback_info`` saying why (``needs_attention``,
  ``left_unchanged``: the paths left, ``edited_since_apply``, ``conflict``), each with a
  ``rollback_blocked`` audit row; the cycle records ``change_rollback_blocked`` naming the paths
  and ends ``rollback_blocked`` (``CycleResult.rollback_blocked``). The unproven change is then
  live only under that person's edit, and the record says so: a person decides what to keep
  (the bytes from before the change are in ``.agent/backups/``, name ending
  ``_<change id>.bak``, and in the change history).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from agentmend.infrastructure.changes.audit.breaks import AuditChainBroken
from agentmend.infrastructure.changes.improvement_manager import (
    LeaseKeeper,
    LeaseLost,
    PartialRollback,
)
from agentmend.infrastructure.changes.proposal import GateVerdict, ProposedChange
from agentmend.infrastructure.changes.watch import ChangeWatcher
from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.errors import AgentmendError, ConfigurationError, StoreError
from agentmend.infrastructure.evaluation.evals import EvalSuite
from agentmend.infrastructure.evaluation.verification import VerificationVerdict
from agentmend.infrastructure.models import ChangeRecord, ImprovementAction
from agentmend.infrastructure.monitoring.run_reader import last_run_id, recent_outcomes
from agentmend.infrastructure.principal import ChangeAuthor
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.tracing import emit_evaluation, set_outcome, work_span
from agentmend.loop.collaborators import LoopCollaborators
from agentmend.loop.cycle import CycleRecorder, CycleStatus, WatchOutcome, describe_failure
from agentmend.loop.cycle_verification import (
    NEW_BASELINE,
    BeforeRun,
    fresh_baselines,
    not_reproduced_reason,
    passes_everything,
)
from agentmend.roles.self_improver import GatedAction, InvalidProposal

__all__ = [
    "MIN_WATCH_RUNS",
    "WATCH_RUNS",
    "ChangePipeline",
    "Outcome",
    "WatchPlan",
    "record_invalid",
]

log = get_logger(__name__)

Outcome = tuple[CycleStatus, str | None]
"""How a cycle's body ended: its status and, when it did not keep a change, why."""

WATCH_RUNS = 100
"""Default pre-change production runs a watched change is compared with (its budget too)."""

MIN_WATCH_RUNS = 20
"""Fewer pre-change production runs than this: the change is not watched (too little traffic
to show anything) but gets the weaker sample-query check."""


@dataclass(frozen=True, slots=True)
class WatchPlan:
    """The agent whose live runs will judge a change, and its runs from before the change."""

    agent: str
    before: tuple[bool, ...]


_CHANGING: ContextVar[bool] = ContextVar("agentmend_changing", default=False)
"""Set while this task makes a change (plan to keep or roll back): nested changes are refused."""


class ChangePipeline:
    """Makes changes one at a time: plans, gates, applies, verifies, keeps or rolls back.

    One per orchestrator: its lock is what makes that orchestrator's cycles and self-edits take
    turns.

    Args:
        shared: the loop's collaborators (team, monitor, detector, manager, improver,
            verifier, gates, tracer), the orchestrator's own.
        watcher: starts the watches on changes to agents without an eval suite (default one
            on the shared manager).
        watch_runs: pre-change production runs a watch compares with (and its budget).
        watch_margin: the watch test's non-inferiority margin; ``watch_alpha`` its level.
    """

    def __init__(
        self,
        shared: LoopCollaborators,
        *,
        watcher: ChangeWatcher | None = None,
        watch_runs: int = WATCH_RUNS,
        watch_margin: float = 0.05,
        watch_alpha: float = 0.05,
    ) -> None:
        if watch_runs < MIN_WATCH_RUNS:
            raise ConfigurationError(
                f"watch_runs must be at least {MIN_WATCH_RUNS}, got {watch_runs}"
            )
        self.shared = shared
        self.watcher = watcher if watcher is not None else ChangeWatcher(shared.manager)
        self.watch_runs = watch_runs
        self.watch_margin = watch_margin
        self.watch_alpha = watch_alpha
        self._lock = asyncio.Lock()

    async def run(
        self,
        rec: CycleRecorder,
        actions: Sequence[ImprovementAction],
        agent: str,
        author: ChangeAuthor,
    ) -> Outcome:
        """Plan, run before, gate, apply, verify, keep or roll back: one change at a time.

        ``author`` is who the applied change is attributed to (the improver or the agent
        editing itself, for the orchestrator's principal).

        Cycles and self-edits of this orchestrator take turns here, so the budget gate and the
        verification of one never see another's half-made change. A self-edit asked for from
        inside a change being made (an agent's verification run calling its tool) is refused
        rather than waiting for the change that waits for it.
        """
        if _CHANGING.get():
            return "error", (
                "another change is being verified in this task; a change cannot be made from "
                "inside it"
            )
        async with self._lock:
            token = _CHANGING.set(True)
            try:
                return await self._plan_and_gate(rec, actions, agent, author)
            finally:
                _CHANGING.reset(token)

    async def _plan_and_gate(
        self,
        rec: CycleRecorder,
        actions: Sequence[ImprovementAction],
        agent: str,
        author: ChangeAuthor,
    ) -> Outcome:
        # the exam is fixed before anything can change it
        try:
            suites = self.shared.verifier.load_suites([a.target_agent for a in actions])
        except AgentmendError as exc:
            return "error", f"cannot load an eval suite: {exc}"
        try:
            planned = self.shared.improver.plan_all(actions)
        except InvalidProposal as exc:
            return await record_invalid(rec, exc, agent)
        targets = _targets([item.change for item in planned if item.change is not None])
        for name in targets:
            busy = self.watch_open(name)
            if busy is not None:
                return "watch_open", busy
        watch = self.watch_plan(targets, suites, agent)
        before: dict[str, BeforeRun] = {}
        if watch is not None:
            if all(watch.before):
                return "not_reproduced", (
                    f"no eval suite, and the last {len(watch.before)} live runs of "
                    f"{watch.agent} all succeeded: a watch on live runs could not show a change "
                    "helps, so nothing was applied"
                )
        else:
            before = await self.shared.verifier.run_before(targets, suites)
            if (
                before
                and len(before) == len(targets)
                and all(map(passes_everything, before.values()))
            ):
                # nothing fails on the agent's own cases (or its sample query), so no change
                # could be shown to help: do not write one only to roll it back (and spend
                # the budget)
                return "not_reproduced", not_reproduced_reason(before)
        cannot = self._cannot_apply()
        if cannot is not None:  # the eval runs took a while: what held at the start may not
            return "error", cannot
        gated = await self.shared.improver.gate_all(planned, on_verdict=self._verdict_recorder(rec))
        accepted = [item for item in gated if item.accepted]
        if not accepted:
            return "refused", _refusals(gated)
        changes = [item.change for item in accepted if item.change is not None]
        targets = _targets(changes)
        if watch is not None:
            return await self._apply_watched(rec, changes, targets, watch, agent, author)
        before = {name: run for name, run in before.items() if name in targets}
        return await self._apply_and_verify(rec, changes, targets, suites, before, agent, author)

    def _cannot_apply(self) -> str | None:
        """Why no change could be applied now, or None: checked again right before the gates,
        so a person is never asked to approve a change that could not be applied.

        The audit chain must take appends (the head and the database agree) and the store must
        answer (the check reads it).
        """
        try:
            self.shared.manager.audit.ensure_appendable()
        except (AuditChainBroken, StoreError) as exc:
            return f"no change can be applied: {exc}"
        return None

    def watch_open(self, agent: str) -> str | None:
        """Why no change to ``agent`` can be made now (its change is watched), or None.

        One change at a time per agent: a second one would be judged together with the first.
        """
        watch = next(iter(self.watcher.open_watches(agent)), None)
        if watch is None:
            return None
        return (
            f"a change to {agent} is being watched on its live runs (watch {watch.watch_id}, "
            f"{watch.pairs} of at most {watch.budget} runs so far); no other change to it "
            "until that ends"
        )

    def watch_plan(
        self,
        targets: dict[str, AgentSpec | None],
        suites: dict[str, EvalSuite | None],
        agent: str,
    ) -> WatchPlan | None:
        """How a change to ``targets`` is judged on live runs, or None (suites or the weaker
        check judge it): no target has a suite, none is created by the change, and the watched
        agent (``agent`` if the change targets it or targets several, else its one target) is
        in the team with at least ``MIN_WATCH_RUNS`` production runs."""
        if not targets or any(suites.get(name) is not None for name in targets):
            return None
        if self.shared.team.releases is not None:
            # served from releases, the agent's runs do not run the team folder's change until
            # a release carries it; a kept change's canary is judged on live runs there
            return None
        if any(old is None for old in targets.values()):
            return None
        watched = agent if agent in targets or len(targets) != 1 else next(iter(targets))
        if watched not in self.shared.team:
            return None
        self.shared.monitor.flush()  # the runs recorded so far are the "before"
        before = recent_outcomes(self.shared.manager.store.connection(), watched, self.watch_runs)
        if len(before) < MIN_WATCH_RUNS:
            return None
        # the test pairs each new run with the next "before" run; drawn in a random order, the
        # before runs' own drift (healthy, then the fault) does not line up with the watch's
        # progress (in time order a fix would first meet only healthy runs and show nothing)
        # (seeded by the agent and the store's newest run: the same store draws the same order)
        order = random.Random(f"{watched}:{last_run_id(self.shared.manager.store.connection())}")
        return WatchPlan(watched, tuple(order.sample(before, len(before))))

    async def _apply_watched(
        self,
        rec: CycleRecorder,
        changes: list[ProposedChange],
        targets: dict[str, AgentSpec | None],
        watch: WatchPlan,
        agent: str,
        author: ChangeAuthor,
    ) -> Outcome:
        """Apply the group under a watch on ``watch.agent``'s live runs; the cycle ends here."""
        applied: list[ChangeRecord] = []

        def apply(lease: str) -> list[ChangeRecord]:
            applied.extend(self.shared.improver.apply(changes, author=author, lease=lease))
            return applied

        issue_id = rec.issue_id
        try:
            started = self.watcher.start_applying(
                watch.agent,
                apply,
                before=watch.before,
                margin=self.watch_margin,
                alpha=self.watch_alpha,
                origin={
                    "cycle_id": rec.cycle_id,
                    "issue_id": issue_id,
                    # a keep on live runs starts no new detection baseline (see above)
                    NEW_BASELINE: [],
                },
            )
        except AgentmendError as exc:  # the manager wrote nothing (or put it all back)
            return "error", f"could not apply: {exc}"
        self.shared.team.reload()  # the agent's next runs are the change's
        change_ids = [record.change_id for record in applied]
        rec.watch_id = started.watch_id
        await _emit_applied(rec, agent, applied, targets, changes)
        await rec.emit(
            "change_watched",
            watch.agent,
            f"no eval suite: watching {watch.agent}'s live runs against its last "
            f"{len(watch.before)} before the change; rolled back the moment they show it hurts, "
            f"kept once they show it helps, rolled back if that is not shown within "
            f"{started.budget} runs",
            change_ids=change_ids,
            watch=WatchOutcome.of(started).model_dump(mode="json"),
        )
        return "watching", None

    async def _apply_and_verify(
        self,
        rec: CycleRecorder,
        changes: list[ProposedChange],
        targets: dict[str, AgentSpec | None],
        suites: dict[str, EvalSuite | None],
        before: dict[str, BeforeRun],
        agent: str,
        author: ChangeAuthor,
    ) -> Outcome:
        # the lease makes the group live but not yet proven: if this process stops (killed,
        # stopped past the lease's expiry) the next open anywhere settles it (see
        # agentmend.infrastructure.changes.protocol.abandoned); the keep or the rollback releases it
        with self.shared.manager.hold_lease() as keeper:
            try:
                records = self.shared.improver.apply(changes, author=author, lease=keeper.lease_id)
            except AgentmendError as exc:  # the manager wrote nothing (or put it all back)
                self.shared.manager.release_lease(keeper.lease_id, "not_applied")
                return "error", f"could not apply: {exc}"
            try:
                return await self._verify_and_settle(
                    rec, records, changes, targets, suites, before, agent, keeper
                )
            except LeaseLost as exc:  # recovery settled the change: write nothing more
                log.warning("change_lease_lost", lease_id=exc.lease_id)
                await rec.emit(
                    "change_lease_lost",
                    agent,
                    f"{exc}; this cycle stopped without keeping or rolling back",
                    change_ids=[record.change_id for record in records],
                    lease_id=exc.lease_id,
                )
                return "error", str(exc)

    async def _verify_and_settle(
        self,
        rec: CycleRecorder,
        records: Sequence[ChangeRecord],
        changes: list[ProposedChange],
        targets: dict[str, AgentSpec | None],
        suites: dict[str, EvalSuite | None],
        before: dict[str, BeforeRun],
        agent: str,
        keeper: LeaseKeeper,
    ) -> Outcome:
        change_ids = [record.change_id for record in records]
        lease = keeper.lease_id
        try:
            await _emit_applied(rec, agent, records, targets, changes)
            verdicts = await self._verify(targets, suites, before, rec)
            rejected = {name: v for name, v in verdicts.items() if not v.accepted}
            # a keep proven only by the weaker check keeps the old detection baseline (see
            # fresh_baselines): production traffic is then still judged against the agent's
            # behaviour before the fault, which is what catches a fix one query misjudged
            fresh = fresh_baselines(verdicts, self.shared.team)
            keeper.ensure_held()  # a lease lost while verifying: the verdict is not ours
            if not rejected:
                summary = {name: v.model_dump(mode="json") for name, v in verdicts.items()}
                self.shared.manager.mark_kept(
                    change_ids[0],
                    {"cycle_id": rec.cycle_id, "verdicts": summary, NEW_BASELINE: fresh},
                    lease=lease,
                )
        except LeaseLost:
            raise
        except BaseException as exc:  # nothing unproven stays applied, whatever went wrong
            why = f"error after the change was applied: {describe_failure(exc)}"
            try:
                undone = await self._roll_back(rec, change_ids, why, targets, lease=lease)
            except BaseException as failure:  # the first error is the one the caller must see
                log.error("rollback_after_error_failed", change_ids=change_ids, error=repr(failure))
                exc.add_note(
                    f"rolling the change back failed too ({type(failure).__name__}: {failure}); "
                    f"change(s) {', '.join(change_ids)} may still be applied until recovery "
                    "settles them once their lease expires"
                )
            else:
                if undone.blocked:
                    exc.add_note(_blocked_note(undone, self.shared.team.directory))
            raise
        if rejected:
            reason = "verification failed: " + "; ".join(
                f"{name}: {verdict.reason}" for name, verdict in rejected.items()
            )
            undone = await self._roll_back(rec, change_ids, reason, targets, verdicts, lease=lease)
            return ("rollback_blocked" if undone.blocked else "rolled_back"), None
        await self._keep(rec, agent, change_ids, targets, verdicts, fresh)
        return "kept", None

    def _verdict_recorder(
        self, rec: CycleRecorder
    ) -> Callable[[int, ProposedChange | None, GateVerdict | None, str | None], Awaitable[None]]:
        counts: dict[int, int] = {}
        total = len(self.shared.gates)

        async def on_verdict(
            index: int,
            change: ProposedChange | None,
            verdict: GateVerdict | None,
            error: str | None,
        ) -> None:
            counts[index] = counts.get(index, 0) + (verdict is not None)
            action = change.action if change is not None else None
            accepted = verdict is not None and verdict.passed and counts[index] == total
            message = (
                f"{verdict.gate}: {'passed' if verdict.passed else 'refused'}: {verdict.reason}"
                if verdict is not None
                else f"not gated: {error}"
            )
            await rec.emit(
                "gate_checked",
                action.target_agent if action is not None else None,
                message,
                index=index,
                action=action.model_dump(mode="json") if action is not None else None,
                diff=change.diff if change is not None else "",
                paths=[e.path for e in change.edits] if change is not None else [],
                verdict=verdict.model_dump(mode="json") if verdict is not None else None,
                error=error,
                accepted=accepted,
            )

        return on_verdict

    async def _verify(
        self,
        targets: dict[str, AgentSpec | None],
        suites: dict[str, EvalSuite | None],
        before: dict[str, BeforeRun],
        rec: CycleRecorder,
    ) -> dict[str, VerificationVerdict]:
        specs = self.shared.team.reload()
        verdicts: dict[str, VerificationVerdict] = {}
        for name in targets:
            with work_span(
                self.shared.tracer, "agentmend.verification", **{"gen_ai.agent.name": name}
            ) as span:
                verdict = await self.shared.verifier.verify(
                    name, specs.get(name), suites.get(name), before.get(name)
                )
                span.set_attributes(
                    {
                        "agentmend.verdict.accepted": verdict.accepted,
                        "agentmend.verdict.after_score": verdict.after_score,
                    }
                    | (
                        {"agentmend.verdict.before_score": verdict.before_score}
                        if verdict.before_score is not None
                        else {}
                    )
                )
                emit_evaluation(
                    span,
                    name="agentmend.verification",
                    agent=name,
                    score=verdict.after_score,
                    passed=verdict.accepted,
                    explanation=verdict.reason,
                )
            verdicts[name] = verdict
            await rec.emit(
                "verification_completed",
                name,
                verdict.reason,
                agent=name,
                verdict=verdict.model_dump(mode="json"),
            )
        return verdicts

    async def _keep(
        self,
        rec: CycleRecorder,
        agent: str,
        change_ids: list[str],
        targets: dict[str, AgentSpec | None],
        verdicts: dict[str, VerificationVerdict],
        fresh: list[str],
    ) -> None:
        label = f"change {', '.join(change_ids)}"
        for name in fresh:
            self.shared.detector.on_change_kept(name, self.shared.monitor, label=label)
        kept_old = [name for name in targets if name not in fresh and name in self.shared.team]
        note = (
            f" (weaker check only: {', '.join(kept_old)} keep(s) the detection baseline from "
            "before the change)"
            if kept_old
            else ""
        )
        await rec.emit(
            "change_kept",
            agent,
            "kept: " + "; ".join(f"{n}: {v.reason}" for n, v in verdicts.items()) + note,
            change_ids=change_ids,
            new_baseline=fresh,
        )

    async def _roll_back(
        self,
        rec: CycleRecorder,
        change_ids: list[str],
        reason: str,
        targets: dict[str, AgentSpec | None],
        verdicts: dict[str, VerificationVerdict] | None = None,
        *,
        lease: str | None = None,
    ) -> PartialRollback:
        """Undo the unproven group (see "Rolling back an unproven change") and record it."""
        with work_span(
            self.shared.tracer,
            "agentmend.rollback",
            **{"agentmend.change_ids": change_ids, "agentmend.rollback.reason": reason},
        ) as span:
            undone = self.shared.manager.rollback_unproven(
                change_ids[0], reason=reason, lease=lease
            )
            set_outcome(span, not undone.blocked, "rollback blocked" if undone.blocked else None)
        self.shared.team.reload()
        scores = {
            name: {"before": v.before_score, "after": v.after_score}
            for name, v in (verdicts or {}).items()
        }
        if undone.rolled_back or not undone.blocked:
            rec.rolled_back = True
            await rec.emit(
                "change_rolled_back",
                undone.rolled_back_agents[0] if undone.blocked else next(iter(targets), None),
                reason,
                change_ids=list(undone.rolled_back) if undone.blocked else change_ids,
                reason=reason,
                scores=scores,
            )
        if undone.blocked:
            rec.rollback_blocked = list(undone.left)
            await rec.emit(
                "change_rollback_blocked",
                undone.blocked_agents[0],
                _blocked_note(undone, self.shared.team.directory),
                change_ids=list(undone.blocked),
                paths=list(undone.left),
                edited=list(undone.edited),
                reason=reason,
                conflict=undone.conflict,
                scores=scores,
            )
        return undone


def _targets(changes: Sequence[ProposedChange]) -> dict[str, AgentSpec | None]:
    """The agents the changes touch, with their definitions before the change."""
    targets: dict[str, AgentSpec | None] = {}
    for change in changes:
        name = change.action.target_agent
        if change.new_spec is not None:
            name = change.new_spec.name
        targets.setdefault(name, change.old_spec)
    return targets


async def record_invalid(rec: CycleRecorder, exc: InvalidProposal, agent: str) -> Outcome:
    """Record an unusable proposal; nothing was applied."""
    await rec.emit("proposal_invalid", exc.agent or agent, str(exc), error=str(exc))
    return "invalid_proposal", str(exc)


def _refusals(gated: Sequence[GatedAction]) -> str:
    reasons = []
    for item in gated:
        refusal = next((v for v in item.verdicts if not v.passed), None)
        if refusal is not None:
            reasons.append(f"action {item.index}: {refusal.gate}: {refusal.reason}")
        elif item.error is not None:
            reasons.append(f"action {item.index}: {item.error}")
    return "every action was refused: " + "; ".join(reasons)


# -- rolling back an unproven change ---------------------------------------------------------


def _blocked_note(undone: PartialRollback, root: Path) -> str:
    """One sentence on a blocked rollback, for the cycle's record and the re-raised error."""
    edited = ", ".join(_shown(path, root) for path in undone.edited) or "a file"
    others = [_shown(path, root) for path in undone.left if path not in undone.edited]
    also = f", nor the rest of that agent's change ({', '.join(others)})" if others else ""
    rest = undone.rolled_back_agents
    undone_rest = f"; the rest was rolled back ({', '.join(rest)})" if rest else ""
    return (
        f"rollback blocked: {edited} edited since the change was applied; not overwritten"
        f"{also}. Change(s) {', '.join(undone.blocked)} of {', '.join(undone.blocked_agents)} "
        "marked failed, needs attention (the change history keeps what the files held "
        f"before, and .agent/backups/ a copy){undone_rest}"
    )


def _shown(path: str, root: Path) -> str:
    """``path`` relative to the team directory when it lies inside it (shorter to read)."""
    try:
        return Path(path).relative_to(root.resolve()).as_posix()
    except ValueError:
        return path


async def _emit_applied(
    rec: CycleRecorder,
    agent: str,
    records: Sequence[ChangeRecord],
    targets: dict[str, AgentSpec | None],
    changes: Sequence[ProposedChange],
) -> None:
    """Record that the group was applied: its change ids, group and paths."""
    await rec.emit(
        "change_applied",
        agent,
        f"applied {len(records)} change(s) to {', '.join(sorted(targets))}",
        change_ids=[record.change_id for record in records],
        group_id=records[0].group_id,
        paths=[edit.path for change in changes for edit in change.edits],
    )
