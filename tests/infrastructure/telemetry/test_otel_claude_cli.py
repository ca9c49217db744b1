"""The real Claude Code CLI (bundled with claude-agent-sdk), offline against the fake Messages
API, exporting its own spans over OTLP/HTTP to agentmend's receiver on loopback.

Found with CLI 2.1.330 (claude-agent-sdk 0.2.187), and held here:

- ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` (needed offline) does not switch the trace
  export off: the spans arrive with it set.
- The CLI flushes its spans before it exits: they have reached the receiver by the time the
  SDK's ``query()`` has finished, with no wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from claude_agent_sdk import ClaudeAgentOptions, ResultError, query
from fake_messages_api import FakeMessagesAPI, Reply
from opentelemetry.sdk.trace import TracerProvider
from otel_helpers import Recorder

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.llm.base import Usage
from agentmend.infrastructure.llm.claude.runtime import ClaudeAgentRuntime
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.receiver import OtlpReceiver
from agentmend.infrastructure.telemetry.span import SpanData
from agentmend.infrastructure.tracing import agentmend_tracer, work_span

pytestmark = pytest.mark.slow


class KeepingAssembler(TraceAssembler):
    """The real assembler, keeping a copy of every span it is given (to check nesting)."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__(recorder)
        self.spans: list[SpanData] = []

    def add(self, spans: Iterable[SpanData], *, rejected: int = 0) -> int:
        kept = list(spans)
        self.spans.extend(kept)
        return super().add(kept, rejected=rejected)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def receiver(recorder: Recorder) -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver(KeepingAssembler(recorder), port=0).start()  # a token of its own
    yield receiver
    receiver.close()


def telemetry_env(receiver: OtlpReceiver) -> dict[str, str]:
    return {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {receiver.token}",
    }


async def run_cli(api: FakeMessagesAPI, receiver: OtlpReceiver, home: Path) -> None:
    env = {
        "ANTHROPIC_BASE_URL": api.base_url,
        "ANTHROPIC_API_KEY": "sk-test",
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "OTEL_SERVICE_NAME": "researcher",
        **telemetry_env(receiver),
    }
    options = ClaudeAgentOptions(env=env, tools=[], model="claude-sonnet-4-5", cwd=str(home))
    async for _message in query(prompt="summarise the findings", options=options):
        pass


async def test_a_cli_run_is_recorded_from_its_own_spans(
    fake_api: FakeMessagesAPI, receiver: OtlpReceiver, recorder: Recorder, tmp_path: Path
) -> None:
    fake_api.enqueue(Reply.text("done", usage=Usage(input_tokens=321, output_tokens=45)))
    await run_cli(fake_api, receiver, tmp_path)
    # no wait: the CLI flushed its spans before it exited
    (run,) = recorder.records
    assert run.agent_name == "researcher"
    assert run.success
    assert (run.input_tokens, run.output_tokens) == (321, 45)
    assert run.extra["span_name"] == "claude_code.interaction"
    assert 0 < run.duration_ms < 60_000


async def test_a_failed_cli_run_is_recorded_as_a_failure(
    fake_api: FakeMessagesAPI, receiver: OtlpReceiver, recorder: Recorder, tmp_path: Path
) -> None:
    fake_api.enqueue(Reply.server_error())
    with pytest.raises(ResultError):
        await run_cli(fake_api, receiver, tmp_path)
    (run,) = recorder.records
    assert run.agent_name == "researcher"
    assert not run.success
    assert run.error is not None
    assert "server error" in run.error.lower()


async def test_a_run_agentmend_executes_nests_under_the_callers_span_and_is_skipped(
    fake_api: FakeMessagesAPI, receiver: OtlpReceiver, recorder: Recorder
) -> None:
    fake_api.enqueue(Reply.text("ok"))
    provider = TracerProvider()
    spec = AgentSpec(name="writer", description="writes", system_prompt="You write.")
    async with ClaudeAgentRuntime(
        base_url=fake_api.base_url,
        api_key="sk-test",
        max_retries=0,
        extra_env=telemetry_env(receiver),
    ) as runtime:
        with work_span(agentmend_tracer(provider), "agentmend.test_run") as caller:
            result = await runtime.run(spec, "write it")
    provider.shutdown()
    assert result.error is None
    assembler = receiver.assembler
    assert isinstance(assembler, KeepingAssembler)
    context = caller.get_span_context()
    interaction = next(s for s in assembler.spans if s.name == "claude_code.interaction")
    assert interaction.trace_id == context.trace_id.to_bytes(16, "big")
    assert interaction.parent_span_id == context.span_id.to_bytes(8, "big")
    assert recorder.records == []  # agentmend records this run itself: skipped here
    assert assembler.counts().own_spans == len(assembler.spans)
