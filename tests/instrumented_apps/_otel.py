"""What every app here does first: a tracer provider exporting OTLP/HTTP, as its docs show.

The apps run as child processes with the instrumented venv's python (``make
instrumented-venv``), never agentmend's; the exporter reads ``OTEL_EXPORTER_OTLP_ENDPOINT`` and
``OTEL_EXPORTER_OTLP_HEADERS`` from the environment the test gives, the fake model API's URL is
``FAKE_API_URL``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

API_URL = os.environ.get("FAKE_API_URL", "")


def global_provider(service: str) -> TracerProvider:
    """The app's tracer provider, set as the global one (the SDKs' own tracing uses that)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def run_each(agents: list[str], run: Callable[[str], object]) -> None:
    """One run per name in ``agents``, in order; a failed run is printed and the next goes on."""
    for name in agents:
        try:
            run(name)
        except Exception as exc:  # the fake API scripted it: the app carries on, as apps do
            print(f"{name} failed: {type(exc).__name__}", file=sys.stderr)


def plain_anthropic_calls(provider: TracerProvider, calls: int, *, parallel: bool) -> None:
    """``calls`` plain Messages calls (in turn, or all at once), then the spans flushed."""
    from concurrent.futures import ThreadPoolExecutor

    from anthropic import Anthropic

    client = Anthropic(api_key="sk-test", base_url=API_URL, max_retries=0)

    def run(_name: str) -> object:
        return client.messages.create(
            model="claude-haiku-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": "go"}],
        )

    if parallel:
        with ThreadPoolExecutor(max_workers=calls) as pool:
            list(pool.map(lambda _: run_each(["call"], run), range(calls)))
    else:
        run_each(["call"] * calls, run)
    provider.shutdown()
