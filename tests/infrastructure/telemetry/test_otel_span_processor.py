"""AgentmendSpanProcessor on an app's own TracerProvider, with the real ``anthropic`` client.

The provider is passed to the client explicitly (``open_telemetry={"tracer_provider": ...}``):
the global provider can be set once per process, and agentmend never sets it.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest
from fake_messages_api import FakeMessagesAPI, Reply
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from agentmend import AgentmendSpanProcessor
from agentmend.infrastructure.llm.base import Usage
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.tracing import agentmend_tracer, role_span


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider(resource=Resource.create({"service.name": "support-bot"}))
    yield provider
    provider.shutdown()


@pytest.fixture
def processor(
    monitor: PerformanceMonitor, provider: TracerProvider
) -> Iterator[AgentmendSpanProcessor]:
    processor = AgentmendSpanProcessor(monitor)
    provider.add_span_processor(processor)
    yield processor
    processor.shutdown()


def client(api: FakeMessagesAPI, provider: TracerProvider) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="sk-test",
        base_url=api.base_url,
        max_retries=0,
        open_telemetry={"tracer_provider": provider},
    )


def ask(api_client: anthropic.Anthropic, text: str = "hello") -> None:
    api_client.messages.create(
        model="claude-haiku-4-5", max_tokens=100, messages=[{"role": "user", "content": text}]
    )


def test_plain_anthropic_calls_become_executions_named_by_the_service(
    fake_api: FakeMessagesAPI,
    provider: TracerProvider,
    processor: AgentmendSpanProcessor,
    monitor: PerformanceMonitor,
) -> None:
    fake_api.enqueue(
        Reply.text("hi", usage=Usage(input_tokens=12, output_tokens=3)),
        Reply.text("again", usage=Usage(input_tokens=20, output_tokens=4)),
        Reply.server_error(),
    )
    api_client = client(fake_api, provider)
    ask(api_client)
    ask(api_client)
    with pytest.raises(anthropic.InternalServerError):
        ask(api_client)
    assert processor.force_flush()
    monitor.flush()
    metrics = monitor.get_metrics()["support-bot"]
    assert metrics.executions == 3
    assert metrics.failures == 1
    assert (metrics.input_tokens, metrics.output_tokens) == (32, 7)
    assert metrics.last_error
    counts = processor.counts()
    assert counts.executions_recorded == 3
    assert counts.dropped_queue_full == 0


def test_an_agent_span_around_the_calls_is_one_execution_with_their_tokens(
    fake_api: FakeMessagesAPI,
    provider: TracerProvider,
    processor: AgentmendSpanProcessor,
    monitor: PerformanceMonitor,
) -> None:
    fake_api.enqueue(
        Reply.text("a", usage=Usage(input_tokens=100, output_tokens=10)),
        Reply.text("b", usage=Usage(input_tokens=50, output_tokens=5)),
    )
    api_client = client(fake_api, provider)
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span(
        "invoke_agent researcher",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher"},
    ):
        ask(api_client, "first")
        ask(api_client, "second")
    assert processor.force_flush()
    monitor.flush()
    metrics = monitor.get_metrics()
    assert list(metrics) == ["researcher"]
    researcher = metrics["researcher"]
    assert researcher.executions == 1
    assert (researcher.input_tokens, researcher.output_tokens) == (150, 15)
    # the client's calls carried the agent span's trace context to the API
    traceparents = [r.headers.get("traceparent") for r in fake_api.message_requests()]
    assert all(traceparents)


def test_agentmends_own_role_spans_are_not_executions(
    fake_api: FakeMessagesAPI,
    provider: TracerProvider,
    processor: AgentmendSpanProcessor,
    monitor: PerformanceMonitor,
) -> None:
    fake_api.enqueue(Reply.text("the writer truncated", usage=Usage(5, 5)))
    api_client = client(fake_api, provider)
    with role_span(agentmend_tracer(provider), "socratic-mediator"):
        ask(api_client, "why did the writer fail?")
    assert processor.force_flush()
    monitor.flush()
    assert monitor.get_metrics() == {}
    assert processor.counts().own_spans == 2  # the role's span and the client's chat span


def test_the_processor_never_installs_a_global_provider(
    processor: AgentmendSpanProcessor,
) -> None:
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)


def test_a_full_queue_drops_spans_and_counts_them(
    monitor: PerformanceMonitor, provider: TracerProvider
) -> None:
    processor = AgentmendSpanProcessor(monitor, max_queue_size=10)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("app")
    total = 300
    # the worker is held at its first batch, so the queue fills up behind it
    with processor.assembler._lock:
        for n in range(total):
            with tracer.start_as_current_span(
                "chat", attributes={"gen_ai.operation.name": "chat", "n": n}
            ):
                pass
    assert processor.force_flush()
    counts = processor.counts()
    assert counts.dropped_queue_full > 0
    assert counts.spans_received + counts.dropped_queue_full == total
    assert counts.executions_recorded == counts.spans_received
    processor.shutdown()
