"""Helpers for the OpenTelemetry tests: real SDK spans, the real OTLP encoder, a recorder.

Spans are made by the real ``opentelemetry-sdk`` (a ``TracerProvider`` passed explicitly, never
the global one, which cannot be reset inside one pytest process) and encoded by the real OTLP
encoder the exporters use, so what the receiver is given is what an app would send.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode, Tracer

from agentmend.infrastructure.models import ExecutionRecord

__all__ = [
    "TEST_TOKEN",
    "Recorder",
    "SpanFactory",
    "auth",
    "post",
]

TEST_TOKEN = "test-receiver-token"
"""The bearer token the tests' receivers are given (a receiver always requires one)."""


def auth(token: str = TEST_TOKEN) -> dict[str, str]:
    """The ``Authorization`` header an exporter of the tests sends."""
    return {"Authorization": f"Bearer {token}"}


class Recorder:
    """Collects the executions an assembler records (and can forward them to a monitor)."""

    def __init__(self, forward: Any = None) -> None:
        self.records: list[ExecutionRecord] = []
        self._forward = forward
        self._lock = threading.Lock()

    def __call__(self, record: ExecutionRecord) -> None:
        with self._lock:
            self.records.append(record)
        if self._forward is not None:
            self._forward(record)

    def by_agent(self) -> dict[str, list[ExecutionRecord]]:
        found: dict[str, list[ExecutionRecord]] = {}
        for record in self.records:
            found.setdefault(record.agent_name, []).append(record)
        return found


class SpanFactory:
    """Real SDK spans of agent runs, collected in memory."""

    def __init__(self, service: str = "writer-service", **resource: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service, **resource})
        )
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer: Tracer = self.provider.get_tracer("tests")

    def agent_run(
        self,
        agent: str | None,
        *,
        chats: Sequence[tuple[int, int]] = ((10, 5),),
        fail: str | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """One ``invoke_agent`` span with a ``chat`` child per (input, output) token pair."""
        agent_attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent"}
        if agent is not None:
            agent_attributes["gen_ai.agent.name"] = agent
        agent_attributes.update(attributes or {})
        with self.tracer.start_as_current_span(
            f"invoke_agent {agent}", attributes=agent_attributes, record_exception=False
        ) as span:
            for input_tokens, output_tokens in chats:
                with self.tracer.start_as_current_span(
                    "chat claude-sonnet-4-5",
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.request.model": "claude-sonnet-4-5",
                        "gen_ai.usage.input_tokens": input_tokens,
                        "gen_ai.usage.output_tokens": output_tokens,
                    },
                ):
                    pass
            if fail is not None:
                span.record_exception(RuntimeError(fail))
                span.set_status(Status(StatusCode.ERROR))

    def chat(self, input_tokens: int = 7, output_tokens: int = 3) -> None:
        """A root ``chat`` span with no agent span (a plain ``anthropic`` app)."""
        with self.tracer.start_as_current_span(
            "anthropic.messages.create",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "claude-haiku-4-5",
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": output_tokens,
            },
        ):
            pass

    def take(self) -> tuple[ReadableSpan, ...]:
        spans = self.exporter.get_finished_spans()
        self.exporter.clear()
        return spans

    def body(self, spans: Sequence[ReadableSpan] | None = None) -> bytes:
        """The protobuf ``ExportTraceServiceRequest`` the OTLP exporter would send."""
        chosen = self.take() if spans is None else spans
        return bytes(encode_spans(chosen).SerializeToString())

    def close(self) -> None:
        self.provider.shutdown()


@contextmanager
def span_factory(service: str = "writer-service") -> Iterator[SpanFactory]:
    factory = SpanFactory(service)
    try:
        yield factory
    finally:
        factory.close()


def post(
    url: str,
    body: bytes,
    *,
    content_type: str = "application/x-protobuf",
    headers: Mapping[str, str] | None = None,
    token: str | None = TEST_TOKEN,
) -> tuple[int, bytes]:
    """POST ``body`` with ``token`` (None: none); the status and the answer's body."""
    sent = {"Content-Type": content_type, **(auth(token) if token is not None else {})}
    request = urllib.request.Request(
        url, data=body, method="POST", headers={**sent, **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        with exc:  # closes its connection now, not whenever the collector finds it
            return int(exc.code), bytes(exc.read())
