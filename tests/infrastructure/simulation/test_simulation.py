"""The simulated team: healthy baselines, faults that bite, fixes that work, agents that answer."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from agentmend.infrastructure.definitions.spec import AgentSpec, load_agent_specs
from agentmend.infrastructure.errors import ConfigurationError, ErrorKind
from agentmend.infrastructure.evaluation.evals import find_eval_suite
from agentmend.infrastructure.llm.base import AgentResult, AgentRuntime
from agentmend.infrastructure.simulation import (
    AVAILABLE_MODELS,
    FORMAT_HEADING,
    FORMAT_INSTRUCTION,
    SIMULATED_AGENTS,
    TEAM_AGENT_NAMES,
    Fault,
    FaultKind,
    SimulatedRuntime,
    copy_team,
    format_instruction_line,
    has_format_instruction,
)
from agentmend.roles.ask_agent_tool import AskAgentTool

PROMPT = "Pythagorean theorem"
_BASELINE_KINDS = {
    ErrorKind.RATE_LIMIT,
    ErrorKind.OVERLOADED,
    ErrorKind.SERVER_ERROR,
    ErrorKind.OUTPUT_INVALID,
}


@pytest.fixture
def team_dir(tmp_path: Path) -> Path:
    return copy_team(tmp_path / "team")


@pytest.fixture
def specs(team_dir: Path) -> dict[str, AgentSpec]:
    return load_agent_specs(team_dir)


def edit(team_dir: Path, name: str, **changes: Any) -> AgentSpec:
    """Apply a change to the agent's file and reload it, as the improvement loop does."""
    path = team_dir / f"{name}.md"
    AgentSpec.from_file(path).with_changes(**changes).save()
    return load_agent_specs(team_dir)[name]


async def outcomes(runtime: SimulatedRuntime, spec: AgentSpec, runs: int) -> Counter[str]:
    counts: Counter[str] = Counter()
    for _ in range(runs):
        result: AgentResult[Any] = await runtime.run(spec, PROMPT)
        counts[result.error.kind.value if result.error else "ok"] += 1
    return counts


def fingerprint(result: AgentResult[Any]) -> tuple[Any, ...]:
    error = (result.error.kind, result.error.message) if result.error else None
    return (
        result.text,
        error,
        result.duration_ms,
        result.usage,
        result.cost_usd,
        result.stop_reason,
        result.permission_denials,
        tuple((call.name, call.is_error) for call in result.tool_calls),
    )


# the team files ---------------------------------------------------------------------------


def test_the_six_definitions_load_with_realistic_settings(specs: dict[str, AgentSpec]) -> None:
    assert sorted(specs) == sorted(TEAM_AGENT_NAMES)
    assert len(specs) == 6
    for name, spec in specs.items():
        profile = SIMULATED_AGENTS[name]
        assert spec.model in AVAILABLE_MODELS
        assert spec.tools is not None
        assert set(profile.uses_tools) <= set(spec.tools)
        assert profile.extra_tool not in spec.tools
        assert spec.max_tokens is not None
        assert spec.max_tokens > profile.answer_tokens * 1.15
        assert spec.timeout_s is not None
        assert spec.max_turns is not None
        assert spec.permission_profile == "standard"
        assert has_format_instruction(spec.system_prompt)
        line, total = format_instruction_line(spec.system_prompt)
        # stated mid-prompt, so a drift away from it has something to bite on
        assert line is not None
        assert line < total
        suite = find_eval_suite(spec)
        assert suite is not None
        assert len(suite.cases) >= 3


def test_copy_team_keeps_the_package_files_and_refuses_to_clobber(tmp_path: Path) -> None:
    first = copy_team(tmp_path / "team")
    assert {p.name for p in first.glob("*.md")} == {f"{n}.md" for n in TEAM_AGENT_NAMES}
    assert copy_team(first) == first  # identical files: nothing to refuse
    edited = first / "research-agent.md"
    edited.write_text(edited.read_text() + "\nA local edit.\n")
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    with pytest.raises(ConfigurationError, match=r"research-agent\.md"):
        copy_team(first)
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    copy_team(first, overwrite=True)
    assert "A local edit." not in edited.read_text()
    assert (
        copy_team(tmp_path / "other").joinpath("quality-agent.md").read_bytes()
        == (first / "quality-agent.md").read_bytes()
    )


# healthy behaviour ------------------------------------------------------------------------


def test_simulated_runtime_is_an_agent_runtime() -> None:
    assert isinstance(SimulatedRuntime(), AgentRuntime)


async def test_healthy_team_succeeds_at_a_realistic_rate(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime(seed=11)
    for name, spec in specs.items():
        counts = await outcomes(runtime, spec, 200)
        rate = counts["ok"] / 200
        assert 0.9 <= rate <= 0.995, (name, counts)
        assert {ErrorKind(kind) for kind in counts if kind != "ok"} <= _BASELINE_KINDS


async def test_a_healthy_result_is_complete(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime(seed=3)
    spec = specs["research-agent"]
    result: AgentResult[Any] = await runtime.run(spec, PROMPT)
    while not result.success:
        result = await runtime.run(spec, PROMPT)
    assert result.text.startswith(FORMAT_HEADING)
    assert PROMPT in result.text
    assert result.stop_reason == "end_turn"
    assert result.model == "claude-sonnet-4-6"
    assert result.usage.input_tokens > 0
    assert result.usage.output_tokens > 500
    assert result.cost_usd is not None
    assert result.cost_usd > 0
    assert 1_000 < result.duration_ms < spec.timeout_s * 1000  # type: ignore[operator]
    assert [call.name for call in result.tool_calls] == ["WebSearch", "Read"]
    assert result.turns == 3
    assert result.permission_denials == ()


async def test_same_seed_same_calls_same_results(specs: dict[str, AgentSpec]) -> None:
    async def session(seed: int) -> list[tuple[Any, ...]]:
        runtime = SimulatedRuntime(seed=seed)
        runtime.inject("quality-agent", FaultKind.TRUNCATION)
        runtime.inject("research-agent", Fault(FaultKind.RATE_LIMIT_STORM, calls=3))
        seen = []
        for _ in range(15):
            for spec in specs.values():
                seen.append(fingerprint(await runtime.run(spec, PROMPT)))
        return seen

    first = await session(5)
    assert first == await session(5)
    assert first != await session(6)


# faults -----------------------------------------------------------------------------------

FAULT_KINDS = {
    FaultKind.TRUNCATION: ErrorKind.TRUNCATED,
    FaultKind.TOOL_DENIED: ErrorKind.TOOL_DENIED,
    FaultKind.MODEL_RETIRED: ErrorKind.MODEL_NOT_FOUND,
    FaultKind.SLOW: ErrorKind.TIMEOUT,
    FaultKind.FORMAT_DRIFT: ErrorKind.OUTPUT_INVALID,
    FaultKind.RATE_LIMIT_STORM: ErrorKind.RATE_LIMIT,
    FaultKind.UNKNOWN: ErrorKind.RUNTIME,
}


@pytest.mark.parametrize("agent", TEAM_AGENT_NAMES)
@pytest.mark.parametrize("fault", list(FAULT_KINDS))
async def test_a_fault_fails_its_agent_with_its_error_kind_and_no_other(
    specs: dict[str, AgentSpec], agent: str, fault: FaultKind
) -> None:
    runtime = SimulatedRuntime(seed=2)
    runtime.inject(agent, Fault(fault, calls=20))
    counts = await outcomes(runtime, specs[agent], 20)
    expected = FAULT_KINDS[fault].value
    # transient API errors may come first; the fault decides everything else
    assert counts[expected] >= 17, counts
    assert counts["ok"] == 0, counts
    others: Counter[str] = Counter()
    for name, spec in specs.items():
        if name != agent:
            others += await outcomes(runtime, spec, 10)
    assert others["ok"] >= 45, others
    assert others[expected] <= 5, others


async def test_truncated_run_looks_truncated(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime(seed=1)
    runtime.inject("knowledge-builder", FaultKind.TRUNCATION)
    result: AgentResult[Any] = await runtime.run(specs["knowledge-builder"], PROMPT)
    assert result.truncated
    assert result.stop_reason == "max_tokens"
    assert result.usage.output_tokens == specs["knowledge-builder"].max_tokens
    assert result.text
    assert not result.text.endswith("\n")


async def test_denied_tool_is_reported_as_a_permission_denial(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime(seed=1)
    runtime.inject("research-agent", FaultKind.TOOL_DENIED)
    result: AgentResult[Any] = await runtime.run(specs["research-agent"], PROMPT)
    assert result.permission_denials == ("WebFetch",)
    assert result.tool_calls[-1].name == "WebFetch"
    assert result.tool_calls[-1].is_error
    assert result.error is not None
    assert "WebFetch" in result.error.message


async def test_timeout_stops_the_run_at_the_timeout(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime(seed=1)
    runtime.inject("dependency-mapper", FaultKind.SLOW)
    result: AgentResult[Any] = await runtime.run(specs["dependency-mapper"], PROMPT)
    assert result.error is not None
    assert result.error.kind is ErrorKind.TIMEOUT
    assert result.duration_ms == specs["dependency-mapper"].timeout_s * 1000  # type: ignore[operator]


async def test_rate_limit_storm_passes_by_itself(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime(seed=4)
    runtime.inject("socratic-planner", Fault(FaultKind.RATE_LIMIT_STORM, calls=5))
    storm: list[AgentResult[Any]] = [
        await runtime.run(specs["socratic-planner"], PROMPT) for _ in range(5)
    ]
    assert all(r.error is not None and r.error.kind is ErrorKind.RATE_LIMIT for r in storm)
    assert all(r.error is not None and r.error.retry_after_s for r in storm)
    assert ErrorKind.RATE_LIMIT.transient
    assert runtime.faults("socratic-planner") == ()
    after = await outcomes(runtime, specs["socratic-planner"], 30)
    assert after["ok"] >= 27, after


async def test_heal_ends_faults(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime(seed=4)
    runtime.inject("quality-agent", FaultKind.UNKNOWN)
    runtime.inject("quality-agent", FaultKind.SLOW)
    runtime.heal("quality-agent", FaultKind.UNKNOWN)
    assert [f.kind for f in runtime.faults("quality-agent")] == [FaultKind.SLOW]
    runtime.heal()
    assert runtime.faults("quality-agent") == ()
    assert (await outcomes(runtime, specs["quality-agent"], 20))["ok"] >= 18


# fixes: the right change to the file restores success, a wrong one does not -----------------

Change = Callable[[AgentSpec], dict[str, Any]]


def _restate_format(spec: AgentSpec) -> dict[str, Any]:
    return {"system_prompt": f"{spec.system_prompt}\n\n{FORMAT_INSTRUCTION}"}


def _grant_tool(spec: AgentSpec) -> dict[str, Any]:
    return {"tools": (*(spec.tools or ()), SIMULATED_AGENTS[spec.name].extra_tool)}


def _other_model(spec: AgentSpec) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-6" if spec.model == "claude-haiku-4-5" else "claude-haiku-4-5"
    }


def _double(field: str) -> Change:
    return lambda spec: {field: getattr(spec, field) * 2}


FIXES: list[tuple[FaultKind, str, Change, Change]] = [
    (FaultKind.TRUNCATION, "research-agent", _double("max_tokens"), _other_model),
    (FaultKind.TRUNCATION, "dependency-mapper", _double("max_tokens"), _double("timeout_s")),
    (FaultKind.TOOL_DENIED, "research-agent", _grant_tool, _double("max_tokens")),
    (FaultKind.TOOL_DENIED, "socratic-planner", _grant_tool, _restate_format),
    (FaultKind.MODEL_RETIRED, "quality-agent", _other_model, _double("timeout_s")),
    (FaultKind.MODEL_RETIRED, "knowledge-builder", _other_model, _grant_tool),
    (FaultKind.SLOW, "knowledge-builder", _double("timeout_s"), _double("max_tokens")),
    (FaultKind.SLOW, "research-agent", _other_model, _restate_format),
    (FaultKind.SLOW, "example-generator", _double("timeout_s"), _other_model),
    (FaultKind.FORMAT_DRIFT, "socratic-planner", _restate_format, _other_model),
    (FaultKind.FORMAT_DRIFT, "quality-agent", _restate_format, _double("max_tokens")),
]


@pytest.mark.parametrize(("fault", "agent", "right", "wrong"), FIXES)
async def test_the_right_fix_restores_success_and_a_wrong_one_does_not(
    tmp_path: Path, fault: FaultKind, agent: str, right: Change, wrong: Change
) -> None:
    expected = FAULT_KINDS[fault]
    wrong_dir, right_dir = copy_team(tmp_path / "wrong"), copy_team(tmp_path / "right")
    runtime = SimulatedRuntime(seed=8)
    runtime.inject(agent, fault)
    original = load_agent_specs(right_dir)[agent]
    assert (await outcomes(runtime, original, 10))[expected.value] >= 9

    wrong_spec = edit(wrong_dir, agent, **wrong(original))
    after_wrong = await outcomes(runtime, wrong_spec, 30)
    assert after_wrong[expected.value] >= 27, after_wrong
    assert after_wrong["ok"] == 0, after_wrong

    right_spec = edit(right_dir, agent, **right(original))
    after_right = await outcomes(runtime, right_spec, 60)
    assert after_right["ok"] >= 54, after_right
    assert after_right[expected.value] <= 2, after_right
    assert runtime.faults(agent)  # fixed by configuration, not by the fault going away


@pytest.mark.parametrize(
    "change", [_double("timeout_s"), _other_model, _grant_tool, _restate_format]
)
async def test_no_configuration_fixes_an_opaque_fault(
    team_dir: Path, specs: dict[str, AgentSpec], change: Change
) -> None:
    runtime = SimulatedRuntime(seed=9)
    runtime.inject("example-generator", FaultKind.UNKNOWN)
    changed = edit(team_dir, "example-generator", **change(specs["example-generator"]))
    counts = await outcomes(runtime, changed, 20)
    assert counts["ok"] == 0, counts
    assert counts[ErrorKind.RUNTIME.value] >= 18, counts


@pytest.mark.parametrize("agent", TEAM_AGENT_NAMES)
async def test_the_numbers_an_agent_reports_are_enough_to_fix_it(
    team_dir: Path, specs: dict[str, AgentSpec], agent: str
) -> None:
    runtime = SimulatedRuntime(seed=12)
    runtime.inject(agent, FaultKind.TRUNCATION)
    runtime.inject(agent, FaultKind.SLOW)
    await outcomes(runtime, specs[agent], 8)
    answer = runtime.answer_question(agent, "Why do your runs fail?", specs[agent])
    complete_s = float(re.search(r"would take about (\d+(?:\.\d+)?) s", answer).group(1))  # type: ignore[union-attr]
    # the timeout stops runs before the length shows; with the timeout fixed, length does
    fixed = edit(team_dir, agent, timeout_s=round(complete_s * 3))
    await outcomes(runtime, fixed, 8)
    answer = runtime.answer_question(agent, "What errors do you see?", fixed)
    enough = int(re.search(r"max_tokens of at least (\d+)", answer).group(1))  # type: ignore[union-attr]
    fixed = edit(team_dir, agent, max_tokens=enough)
    counts = await outcomes(runtime, fixed, 60)
    assert counts["ok"] >= 54, counts


# configuration faults with no injected fault ----------------------------------------------


async def test_a_prompt_without_the_format_instruction_breaks_format(
    team_dir: Path, specs: dict[str, AgentSpec]
) -> None:
    runtime = SimulatedRuntime(seed=1)
    spec = specs["knowledge-builder"]
    stripped = edit(
        team_dir, spec.name, system_prompt=spec.system_prompt.replace(FORMAT_INSTRUCTION, "")
    )
    assert (await outcomes(runtime, stripped, 20))[ErrorKind.OUTPUT_INVALID.value] >= 18
    restored = edit(team_dir, spec.name, system_prompt=spec.system_prompt)
    assert (await outcomes(runtime, restored, 20))["ok"] >= 18


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        ({"model": "claude-2.1"}, ErrorKind.MODEL_NOT_FOUND),
        ({"model": "claude-sonnet-4-6-typo"}, ErrorKind.MODEL_NOT_FOUND),
        ({"max_tokens": 100_000}, ErrorKind.BAD_REQUEST),
        ({"max_turns": 2}, ErrorKind.MAX_TURNS),
        ({"tools": ("Read",)}, ErrorKind.TOOL_DENIED),
        ({"max_tokens": 256}, ErrorKind.TRUNCATED),
        ({"timeout_s": 2.0}, ErrorKind.TIMEOUT),
    ],
)
async def test_a_bad_definition_fails_the_way_the_api_would(
    team_dir: Path, specs: dict[str, AgentSpec], changes: dict[str, Any], kind: ErrorKind
) -> None:
    bad = edit(team_dir, "dependency-mapper", **changes)
    counts = await outcomes(SimulatedRuntime(seed=1), bad, 20)
    assert counts[kind.value] >= 18, counts


async def test_a_model_alias_and_an_agent_outside_the_team_run(team_dir: Path) -> None:
    runtime = SimulatedRuntime(seed=1)
    aliased = edit(team_dir, "quality-agent", model="sonnet")
    assert (await runtime.run(aliased, PROMPT)).model == "claude-sonnet-4-6"
    newcomer = AgentSpec(
        name="geometry-tutor",
        description="Explains geometry.",
        system_prompt=f"You tutor geometry.\n{FORMAT_INSTRUCTION}",
        model="claude-haiku-4-5",
        max_tokens=2048,
    )
    assert (await outcomes(runtime, newcomer, 20))["ok"] >= 18


async def test_available_models_limit_what_runs(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime(available_models=["claude-haiku-4-5"])
    assert runtime.available_models == ("claude-haiku-4-5",)
    result: AgentResult[Any] = await runtime.run(specs["research-agent"], PROMPT)
    assert result.error is not None
    assert result.error.kind is ErrorKind.MODEL_NOT_FOUND
    with pytest.raises(ConfigurationError, match=r"claude-2\.1"):
        SimulatedRuntime(available_models=["claude-2.1"])


# structured output ------------------------------------------------------------------------


class Verdict(BaseModel):
    verdict: Literal["pass", "fail"]
    summary: str = Field(min_length=3)
    confidence: float = Field(ge=0, le=1)
    issues: list[str]
    reviewer: str = "quality-agent"


class Unfillable(BaseModel):
    handle: Callable[[], None]


async def test_structured_output_is_a_validated_instance(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime(seed=21, base_failure_rate=0.0)
    result: AgentResult[Any] = await runtime.run(
        specs["research-agent"], PROMPT, output_type=Verdict
    )
    assert result.success
    assert isinstance(result.output, Verdict)
    assert Verdict.model_validate(result.output.model_dump()) == result.output
    assert result.output.verdict == "pass"
    assert 0 <= result.output.confidence <= 1

    failed = await runtime.run(specs["research-agent"], PROMPT, output_type=Unfillable)
    assert failed.output is None
    assert failed.error is not None
    assert failed.error.kind is ErrorKind.OUTPUT_INVALID


# ask_agent --------------------------------------------------------------------------------

QUESTIONS = (
    "What errors have you run into recently?",
    "Which tools did you try to use?",
    "Which model are you running on?",
    "How long do your runs take, and what is your timeout?",
    "Is your output format correct?",
    "What is your configuration?",
    "Tell me about your recent work.",
)
EVIDENCE = {
    FaultKind.TRUNCATION: ("max_tokens limit of 2048", "stop reason max_tokens", "output tokens"),
    FaultKind.TOOL_DENIED: ("'WebFetch'", "denied", "Read, Grep, WebSearch"),
    FaultKind.MODEL_RETIRED: ("'claude-sonnet-4-6' was not found (404)",),
    FaultKind.SLOW: ("timeout of 90 s", "of the work done", "would take about"),
    FaultKind.FORMAT_DRIFT: (f"'{FORMAT_HEADING}' heading", "line 8 of 13"),
    FaultKind.RATE_LIMIT_STORM: ("rate limit errors (429)",),
    FaultKind.UNKNOWN: ("E_UPSTREAM_",),
}


async def run_with_fault(specs: dict[str, AgentSpec], fault: FaultKind) -> SimulatedRuntime:
    runtime = SimulatedRuntime(seed=3)
    spec = specs["research-agent"]
    for _ in range(4):
        await runtime.run(spec, PROMPT)
    runtime.inject("research-agent", Fault(fault, calls=6))
    for _ in range(6):
        await runtime.run(spec, PROMPT)
    return runtime


@pytest.mark.parametrize("fault", list(FaultKind))
async def test_answers_give_the_evidence_and_never_the_fault(
    specs: dict[str, AgentSpec], fault: FaultKind
) -> None:
    runtime = await run_with_fault(specs, fault)
    spec = specs["research-agent"]
    answers = {q: runtime.answer_question("research-agent", q, spec) for q in QUESTIONS}
    about_errors = answers[QUESTIONS[0]]
    for evidence in EVIDENCE[fault]:
        assert evidence in about_errors, about_errors
    assert "6 failed" in about_errors
    forbidden = {fault.value, fault.value.replace("_", " "), "fault", "inject", "simulat"}
    for answer in answers.values():
        assert answer
        assert not {word for word in forbidden if word in answer.casefold()}, answer


async def test_answers_follow_the_question(specs: dict[str, AgentSpec]) -> None:
    runtime = await run_with_fault(specs, FaultKind.TOOL_DENIED)
    spec = specs["research-agent"]
    tools = runtime.answer_question("research-agent", "Which tools did you use?", spec)
    assert "I tried to call 'WebFetch' in 6 of my last 10 runs" in tools
    assert "to read the full text of a source" in tools
    model = runtime.answer_question("research-agent", "Which model are you on?", spec)
    assert "'claude-sonnet-4-6'" in model
    assert "WebFetch" not in model
    config = runtime.answer_question("research-agent", "Show me your configuration", spec)
    assert "max_tokens 2048" in config
    assert "timeout_s 90" in config


async def test_opaque_failures_are_reported_only_by_their_message(
    specs: dict[str, AgentSpec],
) -> None:
    runtime = SimulatedRuntime(seed=3)
    runtime.inject("research-agent", Fault(FaultKind.UNKNOWN, message="E_GATEWAY: code 0x2a"))
    for _ in range(5):
        await runtime.run(specs["research-agent"], PROMPT)
    answer = runtime.answer_question("research-agent", "What went wrong?", specs["research-agent"])
    assert "'E_GATEWAY: code 0x2a'" in answer
    assert "no other information" in answer


async def test_registry_answers_with_the_current_definition(team_dir: Path) -> None:
    runtime = SimulatedRuntime(seed=3)
    current: dict[str, dict[str, AgentSpec]] = {"specs": load_agent_specs(team_dir)}
    runtime.inject("research-agent", FaultKind.TOOL_DENIED)
    for _ in range(3):
        await runtime.run(current["specs"]["research-agent"], PROMPT)
    tool = AskAgentTool(runtime.agent_registry(lambda: current["specs"]))
    assert sorted(tool.agent_registry) == sorted(TEAM_AGENT_NAMES)

    before = await tool.ask_agent("research-agent", "Which tools were denied?")
    assert before["success"]
    assert "'WebFetch'" in before["answer"]
    edit(team_dir, "research-agent", tools=("Read", "Grep", "WebSearch", "WebFetch"))
    current["specs"] = load_agent_specs(team_dir)
    after = await tool.ask_agent("research-agent", "Which tools are you allowed?")
    assert "My allowed tools are: Read, Grep, WebSearch, WebFetch." in after["answer"]
    assert "allows 'WebFetch' now" in after["answer"]


async def test_an_agent_with_no_runs_says_so(specs: dict[str, AgentSpec]) -> None:
    runtime = SimulatedRuntime()
    answer = runtime.answer_question("quality-agent", "Any errors?", specs["quality-agent"])
    assert "no runs on record" in answer
    with pytest.raises(ConfigurationError, match="quality-agent"):
        runtime.answer_question("quality-agent", "Any errors?")


def test_fault_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="token_factor"):
        Fault(FaultKind.TRUNCATION, token_factor=0.5)
    with pytest.raises(ValueError, match="calls"):
        Fault(FaultKind.RATE_LIMIT_STORM, calls=0)
    assert SimulatedRuntime().inject("x", FaultKind.SLOW) == Fault(FaultKind.SLOW)


async def test_each_question_of_a_truncation_interview_gets_its_own_answer(
    specs: dict[str, AgentSpec],
) -> None:
    """The length follow-up is answered about length, not with the format answer again."""
    from agentmend.roles.playbooks.mediator import BASE_QUESTIONS, FOLLOW_UPS

    runtime = await run_with_fault(specs, FaultKind.TRUNCATION)
    spec = specs["research-agent"]
    follow_up = runtime.answer_question("research-agent", FOLLOW_UPS["truncation"], spec)
    asked_format = runtime.answer_question("research-agent", BASE_QUESTIONS[3], spec)
    assert follow_up != asked_format
    assert follow_up.startswith("My recent answers needed about")
    assert re.search(r"A max_tokens of at least \d+ would let all of them finish", follow_up)
    healthy = SimulatedRuntime(seed=3)
    for _ in range(5):
        await healthy.run(spec, PROMPT)
    calm = healthy.answer_question("research-agent", FOLLOW_UPS["truncation"], spec)
    assert calm.startswith("None of my last 5 runs was cut off for length")
