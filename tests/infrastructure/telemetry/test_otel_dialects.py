"""Each dialect's spans (fixtures made by ``tests/otel_fixtures/make_fixtures.py``) map to the
same execution: the agent, its outcome, its duration, its tokens and its model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from otel_helpers import Recorder

from agentmend.infrastructure.models import ExecutionRecord
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.mapping import SpanMapping
from agentmend.infrastructure.telemetry.otlp_decode import decode_json

FIXTURES = Path(__file__).parents[2] / "otel_fixtures"


def executions(name: str, mapping: SpanMapping | None = None) -> list[ExecutionRecord]:
    recorder = Recorder()
    body = (FIXTURES / f"{name}.json").read_bytes()
    batch = decode_json(body)
    assert batch.rejected == 0
    assembler = TraceAssembler(recorder, mapping)
    assembler.add(batch.spans)
    counts = assembler.counts()
    assert counts.open_traces == 0
    assert counts.orphans == 0
    return recorder.records


def test_every_fixture_says_where_it_came_from() -> None:
    for path in sorted(FIXTURES.glob("*.json")):
        source = json.loads(path.read_text())["_source"]
        assert source.startswith("generated"), path.name


# pydantic-ai with logfire, and every package unmodified: test_instrumented_apps.py
@pytest.mark.parametrize("dialect", ["gen_ai", "openinference", "openllmetry"])
def test_an_instrumented_anthropic_agent_run_maps_to_one_execution(dialect: str) -> None:
    (run,) = executions(dialect)
    assert run.agent_name == "researcher"
    assert run.success
    assert run.error is None
    assert (run.input_tokens, run.output_tokens) == (200, 50)
    assert run.extra["model"] == "claude-sonnet-4-5"
    assert run.extra["service"] == "researcher-service"
    assert run.duration_ms > 0


def test_the_claude_code_cli_interaction_maps_to_one_execution() -> None:
    (run,) = executions("claude_code")
    assert run.agent_name == "researcher"  # OTEL_SERVICE_NAME: the interaction names no agent
    assert run.success
    assert (run.input_tokens, run.output_tokens) == (10, 5)  # flat input_tokens/output_tokens
    assert run.extra["model"] == "claude-sonnet-4-5"
    assert run.extra["span_name"] == "claude_code.interaction"
    assert run.duration_ms > 0


def test_a_user_rule_names_the_agent_before_the_resource() -> None:
    mapping = SpanMapping(
        agent_name_rule=lambda span: span.resource.get("service.version") and "cli"
    )
    (run,) = executions("claude_code", mapping)
    assert run.agent_name == "cli"


def test_another_resource_attribute_can_name_the_agent() -> None:
    (run,) = executions("claude_code", SpanMapping(resource_attribute="host.arch"))
    assert run.agent_name == "amd64"
