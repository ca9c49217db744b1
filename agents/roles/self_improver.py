"""``SelfImprover``: from a ``RootCauseAnalysis`` to gated, applied changes of agent definitions.

The improver's definition runs on the roles' runtime with the analysis, the responsible agent's
current configuration and the available models as tagged blocks, and answers with an
``ImprovementPlan`` (ACTION blocks in its text are parsed when a model gives prose). Then, action
by action, in order:

1. **validate**: the target agent must exist (except for a creation) and the field must be one
   an effector knows. One bad action makes the whole plan invalid (``InvalidProposal``) and
   nothing is applied: a model that names a field that does not exist is not trusted with the
   fields that do;
2. **plan**: ``effectors.plan_change`` turns the action into the exact bytes it would write
   (an ``InvalidChange`` there is an invalid plan too);
3. **gate**: the gates judge the concrete change, every verdict kept;
4. **apply**: the accepted changes are written as one group by the ``ImprovementManager``, so
   verification keeps or rolls back the cycle's work as a whole.

Confidence: an action is never surer than the analysis it came from; its confidence is capped
at the analysis's (after the mediator's evidence check), so a weakly evidenced diagnosis cannot
become a confident change.

One definition file, one change per cycle: ``plan_change`` plans on the files as they are, so a
second action on a file an earlier action of the same cycle already changes is not planned (its
outcome says so); the next cycle can make it once the first is verified.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.trace import Tracer

from agentmend.infrastructure.changes.effectors import InvalidChange, group_entries, plan_change
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.proposal import Gate, GateVerdict, ProposedChange, run_gates
from agentmend.infrastructure.definitions.spec import AgentSpec, load_agent_specs
from agentmend.infrastructure.errors import AgentmendError
from agentmend.infrastructure.llm.base import AgentResult, AgentRuntime
from agentmend.infrastructure.models import (
    ChangeRecord,
    ChangeType,
    ImprovementAction,
    RootCauseAnalysis,
)
from agentmend.infrastructure.principal import IMPROVER_VIA, ChangeAuthor, Principal
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.tracing import agentmend_tracer, work_span
from agentmend.roles.outcomes import ActionOutcome
from agentmend.roles.prompt_blocks import render_block
from agentmend.roles.report_parsing import (
    PARAMETER_FIELDS,
    ReportParseError,
    parse_improvement_actions,
)
from agentmend.roles.schemas import ImprovementPlan, ProposedAction
from agentmend.roles.supervisor import agent_config
from agentmend.roles.team import load_role_spec

__all__ = [
    "KNOWN_FIELDS",
    "GatedAction",
    "InvalidProposal",
    "Proposal",
    "SelfImprover",
    "validate_actions",
]

log = get_logger(__name__)

KNOWN_FIELDS: frozenset[str] = frozenset(
    {"system_prompt", "tools", "permission_profile", "model", *PARAMETER_FIELDS}
)
"""The ``target_field`` values an action may name (besides ``docs/<path>`` and none)."""

_NO_FIELD = (ChangeType.AGENT_CREATION, ChangeType.AGENT_DELETION)

OnVerdict = Callable[[int, ProposedChange | None, GateVerdict | None, str | None], Any]


class InvalidProposal(AgentmendError):
    """The improver's output cannot be acted on; nothing was applied.

    Attributes:
        problem: what was wrong (which action, agent or field).
        agent: the agent the bad action named, if that is what was wrong.
        field: the field it named, if that is what was wrong.
    """

    def __init__(self, problem: str, *, agent: str | None = None, field: str | None = None):
        self.problem = problem
        self.agent = agent
        self.field = field
        super().__init__(f"the improver's proposal is invalid, nothing applied: {problem}")


@dataclass
class Proposal:
    """What the improver proposed: the actions (confidence capped) and its summary."""

    actions: list[ImprovementAction]
    summary: str = ""
    result: AgentResult[ImprovementPlan] | None = None


@dataclass
class GatedAction:
    """One action after planning and gating; ``change`` is None when it could not be planned."""

    index: int
    action: ImprovementAction
    change: ProposedChange | None = None
    verdicts: list[GateVerdict] = field(default_factory=list)
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return (
            self.change is not None
            and self.error is None
            and bool(self.verdicts)
            and all(v.passed for v in self.verdicts)
        )

    def outcome(self) -> ActionOutcome:
        """The record kept in the cycle's result."""
        change = self.change
        return ActionOutcome(
            index=self.index,
            action=change.action if change is not None else self.action,
            verdicts=tuple(self.verdicts),
            accepted=self.accepted,
            diff=change.diff if change is not None else "",
            paths=tuple(edit.path for edit in change.edits) if change is not None else (),
            error=self.error,
        )


def validate_actions(
    actions: Sequence[ProposedAction], known_agents: Collection[str]
) -> list[ProposedAction]:
    """Check every action names a known agent and a known field; returns them unchanged.

    Raises:
        InvalidProposal: the first action naming an unknown agent or field.
    """
    for number, action in enumerate(actions, start=1):
        kind = action.action_type
        if kind is not ChangeType.AGENT_CREATION and action.target_agent not in known_agents:
            raise InvalidProposal(
                f"action {number} ({kind.value}) targets unknown agent {action.target_agent!r}; "
                f"agents: {', '.join(sorted(known_agents))}",
                agent=action.target_agent,
            )
        name = action.target_field
        if kind in _NO_FIELD or name is None or name in KNOWN_FIELDS:
            continue
        if not (name.startswith("docs/") and len(name) > len("docs/")):
            raise InvalidProposal(
                f"action {number} ({kind.value}) on {action.target_agent!r} names unknown field "
                f"{name!r}; fields: {', '.join(sorted(KNOWN_FIELDS))}, docs/<path>",
                agent=action.target_agent,
                field=name,
            )
    return list(actions)


class SelfImprover:
    """Proposes, gates and applies changes to the team's definitions.

    Args:
        runtime: the roles' runtime.
        manager: applies and rolls back changes (and keeps the budget).
        root: the team's definition directory.
        gates: the gates every change passes, in order
            (``agentmend.infrastructure.changes.gates.default_gates``).
        principal: who the changes are made for (the role gate judges against them).
        available_models: the models a model change may choose.
        spec: the improver's definition (default: the shipped one).
        specs_provider: the team's current definitions (default: read ``root`` each time, so
            a plan is never made on a stale view).
        tracer: where its spans go (default agentmend's tracer on the global provider); the
            orchestrator passes the one of its ``tracer_provider``.
    """

    def __init__(
        self,
        runtime: AgentRuntime,
        manager: ImprovementManager,
        *,
        root: str | Path,
        gates: Sequence[Gate],
        principal: Principal,
        available_models: Collection[str],
        spec: AgentSpec | None = None,
        specs_provider: Callable[[], Mapping[str, AgentSpec]] | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.runtime = runtime
        self.manager = manager
        self.root = Path(root)
        self.gates = list(gates)
        self.principal = principal
        self.available_models = tuple(available_models)
        self.spec = spec if spec is not None else load_role_spec("self-improver")
        self._specs_provider = specs_provider or (lambda: load_agent_specs(self.root))
        self.tracer: Tracer = tracer if tracer is not None else agentmend_tracer()
        self.model_calls = 0

    def specs(self) -> Mapping[str, AgentSpec]:
        return self._specs_provider()

    # -- propose ---------------------------------------------------------------------------

    def build_prompt(self, analysis: RootCauseAnalysis, spec: AgentSpec | None) -> str:
        """The prompt contract: ``<analysis>``, ``<agent_config>``, ``<available_models>``."""
        payload = {
            "responsible_agent": analysis.agent_name,
            "cause_category": analysis.cause_category,
            "identified_cause": analysis.identified_cause,
            "confidence": analysis.confidence_score,
            "evidence": list(analysis.evidence),
            "recommendations": list(analysis.recommendations),
            "issue_agent": analysis.issue.agent_name,
        }
        recommendations = "\n".join(f"- {r}" for r in analysis.recommendations) or "- (none)"
        return (
            "Root Cause Analysis Report:\n"
            f"Responsible agent: {analysis.agent_name} (issue raised by "
            f"{analysis.issue.agent_name})\n"
            f"Root cause: {analysis.identified_cause}\n"
            f"Confidence: {analysis.confidence_score:.2f}\n"
            f"Recommendations:\n{recommendations}\n\n"
            "Your task: propose the smallest change to the responsible agent's definition that "
            "removes this cause, or no change if none is warranted.\n\n"
            f"{render_block('analysis', payload)}\n"
            f"{render_block('agent_config', agent_config(spec))}\n"
            f"{render_block('available_models', list(self.available_models))}"
        )

    async def propose_plan(self, analysis: RootCauseAnalysis) -> Proposal:
        """Ask the improver for actions; validated and capped, not yet planned or gated.

        Raises:
            InvalidProposal: no usable plan (run failed and no parseable text, or an action
                naming an unknown agent or field).
        """
        specs = self.specs()
        spec = specs.get(analysis.agent_name)
        try:
            result: AgentResult[ImprovementPlan] = await self.runtime.run(
                self.spec, self.build_prompt(analysis, spec), output_type=ImprovementPlan
            )
        except AgentmendError as exc:
            raise InvalidProposal(f"the improver could not run: {exc}") from exc
        self.model_calls += max(1, result.turns)
        if result.output is not None:
            proposed, summary = list(result.output.actions), result.output.summary
        else:
            why = str(result.error) if result.error is not None else "no structured plan"
            try:
                proposed = parse_improvement_actions(result.text)
            except ReportParseError as exc:
                raise InvalidProposal(f"{why}; the text fallback failed too: {exc}") from exc
            summary = f"parsed from text ({why})"
        validate_actions(proposed, specs)
        cap = analysis.confidence_score
        actions = [
            ImprovementAction(
                target_agent=item.target_agent,
                action_type=item.action_type,
                target_field=item.target_field,
                new_value=item.new_value,
                rationale=item.rationale,
                confidence_score=min(item.confidence, cap),
            )
            for item in proposed
        ]
        log.info(
            "proposed_improvements",
            agent=analysis.agent_name,
            actions=len(actions),
            summary=summary,
        )
        return Proposal(actions=actions, summary=summary, result=result)

    async def propose(self, analysis: RootCauseAnalysis) -> list[ImprovementAction]:
        """The proposed actions (see ``propose_plan``)."""
        return (await self.propose_plan(analysis)).actions

    # -- plan and gate ---------------------------------------------------------------------

    def plan(self, action: ImprovementAction) -> ProposedChange:
        """The concrete change for ``action`` on the files as they are now.

        Raises:
            InvalidProposal: the effector refused the action (unknown agent or field, invalid
                value, unavailable model, docs path escaping, ...).
        """
        try:
            return plan_change(
                action,
                root=self.root,
                specs=self.specs(),
                available_models=self.available_models,
            )
        except InvalidChange as exc:
            raise InvalidProposal(str(exc), agent=exc.agent, field=exc.field) from exc

    async def gate(self, change: ProposedChange) -> list[GateVerdict]:
        """Every verdict the gates give ``change`` (they stop at the first refusal)."""
        return await run_gates(change, self.gates)

    async def plan_and_gate(
        self, actions: Sequence[ImprovementAction], *, on_verdict: OnVerdict | None = None
    ) -> list[GatedAction]:
        """Plan every action first (one invalid action invalidates all), then gate each.

        ``on_verdict(index, change, verdict, error)`` is called for each verdict as it is
        given, and once with ``verdict=None`` and an ``error`` for an action not gated.

        Raises:
            InvalidProposal: an action the effector refused; no action was gated.
        """
        return await self.gate_all(self.plan_all(actions), on_verdict=on_verdict)

    def plan_all(self, actions: Sequence[ImprovementAction]) -> list[GatedAction]:
        """Plan every action; one the effector refuses invalidates them all.

        Raises:
            InvalidProposal: an action the effector refused.
        """
        return [
            GatedAction(index, action, self.plan(action)) for index, action in enumerate(actions)
        ]

    async def gate_all(
        self, planned: Sequence[GatedAction], *, on_verdict: OnVerdict | None = None
    ) -> list[GatedAction]:
        """Gate planned actions in order (see ``plan_and_gate``); returns them with verdicts."""
        claimed: dict[str, int] = {}
        remaining = self._budget_left()
        for item in planned:
            assert item.change is not None
            paths = [edit.path for edit in item.change.edits]
            clash = next((p for p in paths if p in claimed), None)
            if clash is not None:
                item.error = (
                    f"{clash} is already changed by action {claimed[clash]} of this cycle; "
                    "a later cycle can make this change once that one is verified"
                )
                await _notify(on_verdict, item.index, item.change, None, item.error)
                continue
            for gate in self.gates:
                with work_span(
                    self.tracer,
                    "agentmend.gate",
                    **{"agentmend.gate": gate.name, "gen_ai.agent.name": item.action.target_agent},
                ) as span:
                    verdict = await gate.check(item.change)
                    if verdict.passed and gate.name == "budget" and remaining <= 0:
                        verdict = GateVerdict(
                            gate="budget",
                            passed=False,
                            reason="the session budget is used up by the earlier actions of "
                            "this cycle",
                        )
                    span.set_attributes(
                        {
                            "agentmend.gate.passed": verdict.passed,
                            "agentmend.gate.reason": verdict.reason,
                        }
                    )
                item.verdicts.append(verdict)
                log.debug(
                    "gate_checked",
                    agent=item.action.target_agent,
                    gate=verdict.gate,
                    passed=verdict.passed,
                    reason=verdict.reason,
                )
                await _notify(on_verdict, item.index, item.change, verdict, None)
                if not verdict.passed:
                    break
            if item.accepted:
                remaining -= 1
                for path in paths:
                    claimed[path] = item.index
        return list(planned)

    def _budget_left(self) -> int:
        return self.manager.improvements_left()

    # -- apply -----------------------------------------------------------------------------

    def apply(
        self,
        changes: Sequence[ProposedChange],
        *,
        author: ChangeAuthor | None = None,
        lease: str | None = None,
    ) -> list[ChangeRecord]:
        """Write ``changes`` as one group (all or nothing); returns their change records.

        ``author`` is who the history and the audit rows attribute them to: default the
        improver, for this improver's principal (the one the gates judged them for); a
        self-edit names the agent. ``lease``, the verifying owner's, makes the group live but
        not yet proven (``ImprovementManager.apply``).
        """
        entries = [entry for change in changes for entry in group_entries(change)]
        records = self.manager.apply_group(
            entries,
            root=self.root,
            author=author or ChangeAuthor.of(self.principal, via=IMPROVER_VIA),
            lease=lease,
        )
        log.debug(
            "change_applied",
            changes=[r.change_id for r in records],
            group=records[0].group_id if records else None,
            agents=sorted({r.action.target_agent for r in records}),
        )
        return records

    async def apply_improvements(self, analysis: RootCauseAnalysis) -> list[ImprovementAction]:
        """Propose, plan, gate and apply; returns the applied actions.

        No verification happens here (``MetaOrchestrator.run_improvement_cycle`` verifies and
        keeps or rolls back); the changes stay APPLIED.

        Raises:
            InvalidProposal: the proposal named an unknown agent or field, or was unparseable.
        """
        proposal = await self.propose_plan(analysis)
        if not proposal.actions:
            return []
        gated = await self.plan_and_gate(proposal.actions)
        accepted = [item for item in gated if item.accepted]
        if not accepted:
            return []
        changes = [item.change for item in accepted if item.change is not None]
        self.apply(changes)
        return [change.action for change in changes]


async def _notify(
    callback: OnVerdict | None,
    index: int,
    change: ProposedChange | None,
    verdict: GateVerdict | None,
    error: str | None,
) -> None:
    if callback is None:
        return
    result = callback(index, change, verdict, error)
    if inspect.isawaitable(result):
        await result
