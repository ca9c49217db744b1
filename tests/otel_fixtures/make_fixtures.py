"""Write the span fixtures of each dialect agentmend reads (run by hand, never in CI).

    python tests/otel_fixtures/make_fixtures.py [DIALECT ...]   (default: every dialect)

Each dialect's spans are produced by its real instrumentation where it installs beside the
locked ``anthropic`` (the instrumentation packages are not dependencies of agentmend: install
``openinference-instrumentation-anthropic`` and ``opentelemetry-instrumentation-anthropic``
into a scratch environment with agentmend to run this). The real ``anthropic``
client talks to ``tests/fake_messages_api.py``; the Claude Code CLI bundled with
``claude-agent-sdk`` exports its own spans to a loopback collector. Spans an instrumentation does
not make (the agent span of OpenInference and OpenLLMetry, which come from their frameworks'
decorators) are written with their documented attribute names, and each fixture's ``_source``
says which spans were generated and which written by hand.

Fixtures are OTLP/JSON trace exports (ids as hex), read by
``tests/infrastructure/telemetry/test_otel_dialects.py``.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fake_messages_api import FakeMessagesAPI, Reply  # noqa: E402
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from agentmend.infrastructure.llm.base import Usage  # noqa: E402

MODEL = "claude-sonnet-4-5"


def otlp_json(request: Any, source: str) -> dict[str, Any]:
    """A protobuf export request as OTLP/JSON: hex ids, as the OTLP/JSON spec has them."""
    document: dict[str, Any] = MessageToDict(request)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64decode(span[key]).hex()
    return {"_source": source, **document}


def provider_with_memory(service: str) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def two_calls(api: FakeMessagesAPI, client: Any) -> None:
    api.enqueue(
        Reply.text("first", usage=Usage(input_tokens=120, output_tokens=30)),
        Reply.text("second", usage=Usage(input_tokens=80, output_tokens=20)),
    )
    for text in ("first", "second"):
        client.messages.create(
            model=MODEL, max_tokens=256, messages=[{"role": "user", "content": text}]
        )


def write(name: str, spans: Sequence[ReadableSpan], source: str) -> None:
    path = HERE / f"{name}.json"
    path.write_text(json.dumps(otlp_json(encode_spans(spans), source), indent=1) + "\n")
    print(f"wrote {path.relative_to(HERE.parent.parent)} ({len(spans)} spans)")


def gen_ai(api: FakeMessagesAPI) -> None:
    import anthropic

    provider, exporter = provider_with_memory("researcher-service")
    client = anthropic.Anthropic(
        api_key="k", base_url=api.base_url, open_telemetry={"tracer_provider": provider}
    )
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span(
        "invoke_agent researcher",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher"},
    ):
        two_calls(api, client)
    write(
        "gen_ai",
        exporter.get_finished_spans(),
        f"generated: chat spans by anthropic {version('anthropic')}'s own tracing; the "
        "invoke_agent span written with GenAI semantic-convention names",
    )


def openinference(api: FakeMessagesAPI) -> None:
    import anthropic
    from openinference.instrumentation.anthropic import (  # type: ignore[import-not-found]
        AnthropicInstrumentor,
    )

    provider, exporter = provider_with_memory("researcher-service")
    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        client = anthropic.Anthropic(
            api_key="k", base_url=api.base_url, open_telemetry={"traces": False}
        )
        tracer = provider.get_tracer("app")
        with tracer.start_as_current_span(
            "researcher",
            attributes={"openinference.span.kind": "AGENT", "agent.name": "researcher"},
        ):
            two_calls(api, client)
    finally:
        instrumentor.uninstrument()
    write(
        "openinference",
        exporter.get_finished_spans(),
        "generated: LLM spans by openinference-instrumentation-anthropic "
        f"{version('openinference-instrumentation-anthropic')}; the AGENT span written with "
        "OpenInference's documented names (openinference.span.kind, agent.name)",
    )


def openllmetry(api: FakeMessagesAPI) -> None:
    import anthropic
    from opentelemetry.instrumentation.anthropic import (  # type: ignore[import-not-found]
        AnthropicInstrumentor,
    )

    provider, exporter = provider_with_memory("researcher-service")
    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        client = anthropic.Anthropic(
            api_key="k", base_url=api.base_url, open_telemetry={"traces": False}
        )
        tracer = provider.get_tracer("app")
        with tracer.start_as_current_span(
            "researcher.agent",
            attributes={"traceloop.span.kind": "agent", "traceloop.entity.name": "researcher"},
        ):
            two_calls(api, client)
    finally:
        instrumentor.uninstrument()
    write(
        "openllmetry",
        exporter.get_finished_spans(),
        "generated: chat spans by opentelemetry-instrumentation-anthropic "
        f"{version('opentelemetry-instrumentation-anthropic')} (OpenLLMetry); the agent span "
        "written with traceloop-sdk's documented names (traceloop.span.kind, "
        "traceloop.entity.name)",
    )


def claude_code(api: FakeMessagesAPI) -> None:
    from claude_agent_sdk import ClaudeAgentOptions, query

    bodies: list[bytes] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api.enqueue(Reply.text("hello from the CLI"))
    import tempfile

    home = tempfile.mkdtemp()
    env = {
        "ANTHROPIC_BASE_URL": api.base_url,
        "ANTHROPIC_API_KEY": "k",
        "HOME": home,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "OTEL_SERVICE_NAME": "researcher",
    }

    async def run() -> None:
        options = ClaudeAgentOptions(env=env, tools=[], model=MODEL, cwd=home)
        async for _ in query(prompt="say hello", options=options):
            pass

    asyncio.run(run())
    server.shutdown()
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    merged = ExportTraceServiceRequest()
    for body in bodies:
        merged.MergeFrom(ExportTraceServiceRequest.FromString(body))
    path = HERE / "claude_code.json"
    source = (
        "generated: exported over OTLP/HTTP by the Claude Code CLI bundled with claude-agent-sdk "
        f"{version('claude-agent-sdk')}, offline against the fake Messages API"
    )
    path.write_text(json.dumps(otlp_json(merged, source), indent=1) + "\n")
    print(f"wrote {path.relative_to(HERE.parent.parent)}")


DIALECTS: dict[str, Callable[[FakeMessagesAPI], None]] = {
    "gen_ai": gen_ai,
    "openinference": openinference,
    "openllmetry": openllmetry,
    "claude_code": claude_code,
}


def main(names: Sequence[str]) -> int:
    api = FakeMessagesAPI()
    try:
        for name in names or DIALECTS:
            try:
                DIALECTS[name](api)
            except ImportError as exc:
                print(f"{name}: not generated, its instrumentation is not installed ({exc})")
    finally:
        api.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
