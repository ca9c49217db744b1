"""The failure cycle once more, with the roles on the Anthropic runtime against the fake API.

The team is the simulated one (``SimulatedRuntime``) with a truncation fault injected into the
research agent; the mediator, improver and supervisor run on ``AnthropicRuntime``: the real
``anthropic`` client, over real HTTP, to the scripted Messages API on 127.0.0.1. Only the
model's decisions are scripted, and the script reads them off the requests it receives, the
way a model reads its context:

- the mediator's model calls ``ask_agent`` (``tool_use``); the real ``AskAgentTool`` asks the
  simulated agent, and the answer reaches the fake server as the ``tool_result`` of the next
  request. The model's report quotes a sentence of *that* answer as evidence, so the
  mediator's evidence check passes on what really travelled, not on a quote written here;
- the improver's model reads the analysis and the agent's configuration from its prompt and
  raises ``max_tokens`` to what the quoted evidence says is needed;
- the supervisor's model approves (or, in the negative, rejects) the concrete change.

The server routes by the role definition the request carries as its system prompt, so the
test does not depend on the order in which the cycle happens to make its requests.
"""

from __future__ import annotations

import difflib
import json
import re
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fake_messages_api import STRUCTURED_OUTPUT_TOOL, FakeMessagesAPI, RecordedRequest, Reply

from agentmend.infrastructure.changes.proposal import ProposedChange
from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.llm.anthropic_runtime import AnthropicRuntime
from agentmend.infrastructure.llm.retry import RetryPolicy
from agentmend.infrastructure.models import ChangeStatus, ChangeType
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime
from agentmend.loop.cycle import CycleResult, replay_cycle
from agentmend.loop.meta_orchestrator import MetaOrchestrator
from agentmend.roles.prompt_blocks import extract_block
from agentmend.roles.schemas import (
    ImprovementPlan,
    MediatorReport,
    ProposedAction,
    SupervisorReview,
)
from agentmend.roles.supervisor import Supervisor
from agentmend.roles.team import load_role_spec

AGENT = "research-agent"
BASELINE = 50
QUESTION = "Which errors did your recent runs end with?"
ROLES = ("socratic-mediator", "self-improver", "supervisor")
SUPERVISOR_MODEL = "claude-haiku-4-5"  # unlike the others, to show models follow the role
GATES = ["budget", "confidence", "scope", "role", "supervisor", "human_approval"]
ANSWER_FENCE = re.compile(r"<agent_answer [^>]*>\n(?P<answer>.*)\n</agent_answer>\Z", re.DOTALL)
TRUNCATION_SENTENCE = re.compile(r"[^.]*stopped at my max_tokens limit of \d+[^.]*\.")
NEEDED_TOKENS = re.compile(r"max_tokens of at least (\d+)")


def first_user_text(request: RecordedRequest) -> str:
    """The prompt of a request: the text of its first (user) message."""
    content = request.messages[0]["content"]
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content if block.get("type") == "text")


@dataclass
class FakeRoles:
    """The three roles' model, answering each request from what the request contains.

    Attributes:
        approve: the supervisor model's verdict.
        systems: role name -> the system prompt its requests must carry.
        routed: (role, request) for every request answered, in arrival order.
        problems: requests the script could not answer (the server then gives a 500).
    """

    approve: bool = True
    systems: dict[str, str] = field(default_factory=dict)
    routed: list[tuple[str, RecordedRequest]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def role_of(self, request: RecordedRequest) -> str | None:
        system = request.json.get("system") if isinstance(request.json, dict) else None
        return next((role for role, text in self.systems.items() if text == system), None)

    def __call__(self, request: RecordedRequest) -> Reply | None:
        role = self.role_of(request)
        with self._lock:
            if role is None:
                self.problems.append(f"request from no known role: {request.json!r:.200}")
                return None
            self.routed.append((role, request))
        try:
            if role == "socratic-mediator":
                return self.mediator(request)
            if role == "self-improver":
                return self.improver(request)
            return self.supervisor(request)
        except Exception as exc:  # the script's own failure must show in the test, not a 500
            with self._lock:
                self.problems.append(f"{role}: {type(exc).__name__}: {exc}")
            raise

    def mediator(self, request: RecordedRequest) -> Reply:
        results = request.tool_results()
        if not results:  # the first turn: question the agent the issue is about
            issue = extract_block(first_user_text(request), "issue_report")
            return Reply.tool_use(
                "ask_agent", {"agent_name": issue["agent_name"], "question": QUESTION}
            )
        issue = extract_block(first_user_text(request), "issue_report")
        (result,) = results
        fenced = ANSWER_FENCE.match(str(result["content"]))
        assert fenced is not None, f"the tool result is not a fenced answer: {result!r}"
        sentence = TRUNCATION_SENTENCE.search(fenced["answer"])
        assert sentence is not None, f"the answer does not report truncation: {fenced['answer']}"
        report = MediatorReport(
            responsible_agent=issue["agent_name"],
            cause_category="truncation",
            identified_cause="max_tokens is too small for the answers the agent must write",
            confidence=0.9,
            evidence=[sentence.group(0).strip()],
            recommendations=["raise max_tokens to what the agent's answers need"],
        )
        return Reply.structured(report.model_dump(mode="json"))

    def improver(self, request: RecordedRequest) -> Reply:
        prompt = first_user_text(request)
        analysis = extract_block(prompt, "analysis")
        config = extract_block(prompt, "agent_config")
        quoted = [int(n) for e in analysis["evidence"] for n in NEEDED_TOKENS.findall(e)]
        needed = max(quoted, default=0)
        action = ProposedAction(
            action_type=ChangeType.PARAMETER_ADJUSTMENT,
            target_agent=analysis["responsible_agent"],
            target_field="max_tokens",
            new_value=max(2 * int(config["max_tokens"]), needed),
            rationale=f"the evidence says answers need at least {needed} tokens",
            confidence=0.9,
        )
        plan = ImprovementPlan(actions=[action], summary="raise max_tokens")
        return Reply.structured(plan.model_dump(mode="json"))

    def supervisor(self, request: RecordedRequest) -> Reply:
        change = extract_block(first_user_text(request), "proposed_change")
        field_name = change["action"]["target_field"]
        if self.approve:
            review = SupervisorReview(
                approved=True, risk="low", reason=f"{field_name} only, within limits"
            )
        else:
            review = SupervisorReview(
                approved=False, risk="high", reason=f"scripted rejection of the {field_name} change"
            )
        return Reply.structured(review.model_dump(mode="json"))


@dataclass
class Setup:
    api: FakeMessagesAPI
    roles: FakeRoles
    runtime: AnthropicRuntime
    orchestrator: MetaOrchestrator
    approvals: list[ProposedChange]


Build = Callable[..., Setup]


@pytest.fixture
async def build(fake_api: FakeMessagesAPI, tmp_path: Path) -> AsyncIterator[Build]:
    made: list[Setup] = []

    def make(*, approve: bool = True) -> Setup:
        roles = FakeRoles(approve=approve)
        # one attempt: a request the script cannot answer fails the step at once
        runtime = AnthropicRuntime(
            api_key="test-key",
            base_url=fake_api.base_url,
            retry_policy=RetryPolicy(max_attempts=1),
            request_timeout_s=10.0,
        )
        supervisor_spec = load_role_spec("supervisor").with_changes(model=SUPERVISOR_MODEL)
        approvals: list[ProposedChange] = []

        async def approve_change(change: ProposedChange) -> bool:
            approvals.append(change)
            return True

        orchestrator = MetaOrchestrator.offline_simulated(
            tmp_path / "team",
            seed=11,
            settings=Settings(baseline_n=BASELINE, false_alarm_rate=1e-4),
            roles_runtime=runtime,
            reviewer=Supervisor(runtime, spec=supervisor_spec),
            yolo_mode=False,
            approval_callback=approve_change,
        )
        roles.systems = {
            "socratic-mediator": orchestrator.mediator.spec.full_system_prompt,
            "self-improver": orchestrator.improver.spec.full_system_prompt,
            "supervisor": supervisor_spec.full_system_prompt,
        }
        fake_api.set_responder(roles)
        setup = Setup(fake_api, roles, runtime, orchestrator, approvals)
        made.append(setup)
        return setup

    yield make
    for setup in made:
        setup.orchestrator.close()
        await setup.runtime.aclose()


def files(orchestrator: MetaOrchestrator) -> dict[str, bytes]:
    folder = orchestrator.team.directory
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


async def degrade_until_cycle(
    orchestrator: MetaOrchestrator, *, max_tasks: int = 40
) -> CycleResult:
    """Warm up, inject truncation into the agent, run tasks until its cycle has run."""
    for n in range(BASELINE):
        assert (await orchestrator.execute_task(f"warm-up topic {n}")).cycles == []
    runtime = orchestrator.team.runtime
    assert isinstance(runtime, SimulatedRuntime)
    runtime.inject(AGENT, FaultKind.TRUNCATION)
    for n in range(max_tasks):
        task = await orchestrator.execute_task(f"faulty topic {n}")
        for cycle in task.cycles:
            assert cycle.issue.agent_name == AGENT, f"an unexpected cycle: {cycle.summary()}"
            return cycle
    pytest.fail(f"no cycle for {AGENT} within {max_tasks} tasks")


def requests_by_role(roles: FakeRoles, role: str) -> list[RecordedRequest]:
    return [request for name, request in roles.routed if name == role]


async def test_the_cycle_runs_with_its_roles_on_the_anthropic_runtime(build: Build) -> None:
    setup = build()
    orchestrator, api, roles = setup.orchestrator, setup.api, setup.roles
    assert setup.runtime.client.max_retries == 0
    before = files(orchestrator)
    spec_before = orchestrator.team.spec(AGENT)
    assert spec_before.max_tokens is not None

    cycle = await degrade_until_cycle(orchestrator)

    assert roles.problems == []
    assert cycle, cycle.summary()
    assert cycle.status == "kept"

    # the mediator's model asked through the tool, and the server saw the real answer
    first, second = requests_by_role(roles, "socratic-mediator")
    assert first.tool_names == ["ask_agent", STRUCTURED_OUTPUT_TOOL]
    assert second.tool_names == first.tool_names
    (exchange,) = cycle.questions
    assert (exchange.agent_name, exchange.question, exchange.error) == (AGENT, QUESTION, None)
    assert f"max_tokens limit of {spec_before.max_tokens}" in exchange.answer
    asked = second.messages[-2]["content"]
    (tool_use,) = [block for block in asked if block["type"] == "tool_use"]
    assert tool_use["input"] == {"agent_name": AGENT, "question": QUESTION}
    (result,) = second.tool_results()
    assert result["tool_use_id"] == tool_use["id"]
    assert not result.get("is_error", False)
    assert result["content"] == orchestrator.mediator.ask_agent_tool.format_answer(
        AGENT, exchange.answer
    )

    # the evidence the model quoted from that answer survived the evidence check
    analysis = cycle.analysis
    assert analysis is not None
    assert (analysis.responsible_agent, analysis.cause_category) == (AGENT, "truncation")
    (quote,) = analysis.evidence
    assert quote in exchange.answer
    assert quote in str(result["content"])
    assert not any(quote in error for error in cycle.issue.error_logs)  # the answer supports it
    assert analysis.confidence_score == pytest.approx(0.9)  # nothing dropped, nothing capped

    # the improver's model read the analysis and config, and its number reached the file
    (improver_request,) = requests_by_role(roles, "self-improver")
    prompt = first_user_text(improver_request)
    assert extract_block(prompt, "analysis")["evidence"] == [quote]
    assert extract_block(prompt, "agent_config")["max_tokens"] == spec_before.max_tokens
    (needed,) = map(int, NEEDED_TOKENS.findall(quote))
    new_max_tokens = max(2 * spec_before.max_tokens, needed)
    (outcome,) = cycle.outcomes
    assert outcome.accepted
    assert outcome.action.target_field == "max_tokens"
    assert (outcome.action.old_value, outcome.action.new_value) == (
        spec_before.max_tokens,
        new_max_tokens,
    )
    assert [v.gate for v in outcome.verdicts] == GATES
    supervised = next(v for v in outcome.verdicts if v.gate == "supervisor")
    assert supervised.reason == "max_tokens only, within limits"
    (approved,) = setup.approvals
    assert approved.action.target_field == "max_tokens"

    # the supervisor's model saw the concrete change
    (supervisor_request,) = requests_by_role(roles, "supervisor")
    assert supervisor_request.tool_names == [STRUCTURED_OUTPUT_TOOL]
    assert supervisor_request.json["tool_choice"] == {
        "type": "tool",
        "name": STRUCTURED_OUTPUT_TOOL,
    }
    proposed = extract_block(first_user_text(supervisor_request), "proposed_change")
    assert proposed["action"]["new_value"] == new_max_tokens
    assert f"+  max_tokens: {new_max_tokens}" in proposed["diff"]

    # kept on verification, recorded, and only max_tokens changed
    verdict = cycle.verification
    assert verdict is not None
    assert verdict.accepted
    assert verdict.before_score is not None
    assert verdict.after_score > verdict.before_score
    (record,) = orchestrator.manager.get_history()
    assert record.status is ChangeStatus.KEPT
    assert cycle.change_ids == (record.change_id,)
    after = files(orchestrator)
    assert sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n)) == [
        f"{AGENT}.md"
    ]
    old_text, new_text = before[f"{AGENT}.md"].decode(), after[f"{AGENT}.md"].decode()
    changed = [
        line
        for line in difflib.unified_diff(old_text.splitlines(), new_text.splitlines(), n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == [
        f"-  max_tokens: {spec_before.max_tokens}",
        f"+  max_tokens: {new_max_tokens}",
    ]
    spec_after = AgentSpec.from_markdown(new_text)
    assert spec_after == AgentSpec.from_markdown(old_text).with_changes(max_tokens=new_max_tokens)

    # the request log: every request came from a role, on the role's model, one per call
    log = api.message_requests()
    assert [request for _, request in roles.routed] == log
    assert [role for role, _ in roles.routed] == [
        "socratic-mediator",
        "socratic-mediator",
        "self-improver",
        "supervisor",
    ]
    models = {role: {request.model for request in requests_by_role(roles, role)} for role in ROLES}
    assert models == {
        "socratic-mediator": {load_role_spec("socratic-mediator").model},
        "self-improver": {load_role_spec("self-improver").model},
        "supervisor": {SUPERVISOR_MODEL},
    }
    assert models["self-improver"] == {"claude-sonnet-4-6"}
    assert all(not request.stream for request in log)
    # sent by the real client, which made no retries of its own
    assert all(r.headers["user-agent"].startswith("AsyncAnthropic/Python") for r in log)
    assert all(r.headers["x-stainless-retry-count"] == "0" for r in log)
    assert cycle.model_calls == len(log)
    assert replay_cycle(orchestrator.store, cycle.cycle_id) == cycle

    # the agent recovers, and nothing else asks the model
    ok = 0
    for n in range(30):
        ok += (await orchestrator.execute_task(f"later topic {n}")).results[AGENT].success
    assert ok / 30 >= 0.85
    assert orchestrator.check_performance_issues() is None
    assert len(api.message_requests()) == len(log)
    assert len(orchestrator.manager.get_history()) == 1


async def test_a_rejection_by_the_supervisor_model_applies_nothing(build: Build) -> None:
    setup = build(approve=False)
    orchestrator, roles = setup.orchestrator, setup.roles
    before = files(orchestrator)

    cycle = await degrade_until_cycle(orchestrator)

    assert roles.problems == []
    assert not cycle
    assert cycle.status == "refused"
    (outcome,) = cycle.outcomes
    assert not outcome.accepted
    assert [v.gate for v in outcome.verdicts] == GATES[:5]  # stopped before the human
    refusal = outcome.refused_by
    assert refusal is not None
    assert (refusal.gate, refusal.reason) == (
        "supervisor",
        "scripted rejection of the max_tokens change",
    )
    assert refusal.details["risk"] == "high"
    assert setup.approvals == []  # nobody was asked to approve a rejected change
    assert [role for role, _ in roles.routed] == [
        "socratic-mediator",
        "socratic-mediator",
        "self-improver",
        "supervisor",
    ]
    (supervisor_request,) = requests_by_role(roles, "supervisor")
    assert supervisor_request.model == SUPERVISOR_MODEL
    assert "max_tokens" in json.dumps(
        extract_block(first_user_text(supervisor_request), "proposed_change")["action"]
    )
    assert cycle.change_ids == ()
    assert cycle.verifications == {}
    assert files(orchestrator) == before
    assert orchestrator.manager.get_history() == []
    assert replay_cycle(orchestrator.store, cycle.cycle_id) == cycle
