"""The real Claude Code CLI (bundled with claude-agent-sdk), offline against the fake Messages
API, with its DEFAULT telemetry as its monitoring docs give it: events over OTLP logs and
metrics, no traces beta flag. Runs, failures and tokens are asserted exactly per agent.

Found with CLI 2.1.330 (claude-agent-sdk 0.2.187), and held here:

- the CLI flushes its logs and metrics when it exits, whatever the export intervals;
- it sends no span at all without ``CLAUDE_CODE_ENHANCED_TELEMETRY_BETA``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import AgentDefinition, ClaudeAgentOptions, ResultError, query
from fake_messages_api import FakeMessagesAPI, RecordedRequest, Reply
from otel_helpers import Recorder

from agentmend.infrastructure.llm.base import Usage
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.claude_code_events import LogAssembler
from agentmend.infrastructure.telemetry.receiver import OtlpReceiver

pytestmark = pytest.mark.slow

HELPER = "You are the helper."
QUIET_S = 120.0


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


class Clock:
    """The assembler's clock: a session falls quiet when the test says so, however slowly the
    CLI runs on a loaded machine (its real exporter still sends every 500 ms)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def receiver(recorder: Recorder, clock: Clock) -> Iterator[OtlpReceiver]:
    made = OtlpReceiver(
        TraceAssembler(Recorder()),
        port=0,  # a token of its own
        expire_every_s=0.05,
        logs=LogAssembler(recorder, quiet_s=QUIET_S, clock=clock),
    ).start()
    yield made
    made.close()


def default_telemetry(receiver: OtlpReceiver) -> dict[str, str]:
    """The settings of Claude Code's monitoring docs, and no traces beta flag."""
    return {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {receiver.token}",
        "OTEL_LOGS_EXPORT_INTERVAL": "500",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }


async def run_cli(api: FakeMessagesAPI, receiver: OtlpReceiver, home: Path, **options: Any) -> None:
    env = {
        "ANTHROPIC_BASE_URL": api.base_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "OTEL_SERVICE_NAME": "researcher",
        **default_telemetry(receiver),
        **options.pop("env", {}),
    }
    chosen = ClaudeAgentOptions(
        env=env, model="claude-sonnet-4-5", cwd=str(home), **{"tools": [], **options}
    )
    async for _message in query(prompt="summarise the findings", options=chosen):
        pass


def recorded(
    recorder: Recorder, receiver: OtlpReceiver, clock: Clock, runs: int
) -> dict[str, list[Any]]:
    """The runs by agent once the session fell quiet and the receiver's expiry recorded them.

    The CLI has exited, having flushed its exports: nothing is recorded before it falls quiet.
    """
    assert recorder.records == []
    clock.now += QUIET_S
    deadline = time.monotonic() + 10
    while len(recorder.records) < runs and time.monotonic() < deadline:
        time.sleep(0.05)
    assert receiver.assembler.counts().spans_received == 0  # logs only, no traces
    assert receiver.logs.counts().open_log_runs == 0
    return {
        name: [(r.success, r.input_tokens, r.output_tokens, r.error) for r in records]
        for name, records in sorted(recorder.by_agent().items())
    }


def subagent_options(**more: Any) -> dict[str, Any]:
    return {
        "system_prompt": "You are the lead.",
        "tools": ["Agent"],
        "allowed_tools": ["Agent"],
        "agents": {
            "helper": AgentDefinition(
                description="Looks things up.", prompt=HELPER, model="claude-haiku-4-5"
            )
        },
        "setting_sources": [],
        "skills": [],
        **more,
    }


def lead_and_helper(helper: Reply, *, background: bool) -> Any:
    turns = 0

    def respond(request: RecordedRequest) -> Reply:
        nonlocal turns
        system = " ".join(
            b.get("text", "") for b in request.json.get("system") or [] if isinstance(b, dict)
        )
        if HELPER in system:
            return helper
        turns += 1
        if turns == 1:
            call: dict[str, Any] = {
                "description": "look",
                "prompt": "TASK",
                "subagent_type": "helper",
            }
            if not background:
                call["run_in_background"] = False
            return Reply.tool_use("Agent", call, usage=Usage(input_tokens=10, output_tokens=5))
        return Reply.text("LEAD-DONE", usage=Usage(input_tokens=100, output_tokens=10))

    return respond


async def test_one_prompt_is_one_run_and_metrics_are_taken(
    fake_api: FakeMessagesAPI,
    receiver: OtlpReceiver,
    recorder: Recorder,
    clock: Clock,
    tmp_path: Path,
) -> None:
    fake_api.enqueue(Reply.text("done", usage=Usage(input_tokens=321, output_tokens=45)))
    await run_cli(fake_api, receiver, tmp_path)
    assert recorded(recorder, receiver, clock, 1) == {"researcher": [(True, 321, 45, None)]}
    (run,) = recorder.records
    assert run.cost_usd > 0
    assert run.extra["model"] == "claude-sonnet-4-5"
    counts = receiver.logs.counts()
    assert counts.metric_points_received > 0
    assert (counts.log_runs_cut_short, counts.log_unmappable, counts.log_rejected) == (0, 0, 0)


async def test_an_api_error_is_a_failed_run(
    fake_api: FakeMessagesAPI,
    receiver: OtlpReceiver,
    recorder: Recorder,
    clock: Clock,
    tmp_path: Path,
) -> None:
    fake_api.enqueue(Reply.server_error())
    with pytest.raises(ResultError):
        await run_cli(fake_api, receiver, tmp_path)
    assert recorded(recorder, receiver, clock, 1) == {
        "researcher": [(False, 0, 0, "Internal server error")]
    }


async def test_a_foreground_subagent_is_its_own_run_named_with_tool_details(
    fake_api: FakeMessagesAPI,
    receiver: OtlpReceiver,
    recorder: Recorder,
    clock: Clock,
    tmp_path: Path,
) -> None:
    helper = Reply.text("REPORT", usage=Usage(input_tokens=50, output_tokens=5))
    fake_api.set_responder(lead_and_helper(helper, background=False))
    await run_cli(
        fake_api,
        receiver,
        tmp_path,
        env={"OTEL_LOG_TOOL_DETAILS": "1"},
        **subagent_options(),
    )
    assert recorded(recorder, receiver, clock, 2) == {
        "helper": [(True, 50, 5, None)],
        "researcher": [(True, 110, 15, None)],
    }


async def test_a_failing_background_subagent_joins_its_query_and_fails_alone(
    fake_api: FakeMessagesAPI,
    receiver: OtlpReceiver,
    recorder: Recorder,
    clock: Clock,
    tmp_path: Path,
) -> None:
    fake_api.set_responder(lead_and_helper(Reply.server_error(), background=True))
    await run_cli(fake_api, receiver, tmp_path, **subagent_options())
    # the lead answers twice (once more when told the helper ended, under a new prompt.id):
    # one run of the lead with all three calls, one failed run of the helper
    assert recorded(recorder, receiver, clock, 2) == {
        "custom": [(False, 0, 0, "Internal server error")],
        "researcher": [(True, 210, 25, None)],
    }
    (lead,) = recorder.by_agent()["researcher"]
    assert lead.extra["model_requests"] == 3
    assert len(lead.extra["joined_prompts"]) == 1
