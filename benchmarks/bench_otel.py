"""Spans per second into agentmend, and what the span processor costs the app's thread.

Workload (stated by the goals): export requests of 512 spans, 10 attributes per span, 3 spans
per trace (an ``invoke_agent`` span and two ``chat`` spans, children first, as exporters send
them), so one execution per 3 spans. Everything runs in this one process on one core at a time.

- receiver, in process: ``OtlpReceiver.export()`` on a protobuf body: decode, assemble, map,
  record through a ``PerformanceMonitor``'s buffered path, plus the monitor's drain at the end.
  Baseline: ``ExportTraceServiceRequest.FromString`` alone (the parse any receiver pays).
  ``bench_receiver.py`` measures this path in CPU time beside parsing and reading every
  attribute too.
  Again with every run labelled ``agentmend.release`` and attributed to the release
  (``ReleaseAttribution`` on a SQLite store).
- receiver, over HTTP: the same bodies POSTed on loopback by one client thread (client, server
  and recording share the machine's cores).
- span processor: N finished SDK spans through ``on_end`` and the worker (``force_flush``).
- app thread: creating and ending a span with 10 attributes on a TracerProvider holding
  ``AgentmendSpanProcessor`` against one holding a no-op processor; and ``on_end`` alone.
- assembly buffer memory: 1,000 traces held open (their agent spans not yet arrived).
- drops: bursts below and above the processor's queue limit, from the app's thread.

Each timing is the median of R repetitions. Goals: the receiver sustains >= 50,000 spans/s on
one core; the processor adds < 2 us per span on the app's thread; nothing is dropped below the
configured queue limit. Run: ``.venv/bin/python benchmarks/bench_otel.py [-r 5] [-n 60]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import tracemalloc
import urllib.request
from collections.abc import Callable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ProtoResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.otlp_decode import decode_protobuf
from agentmend.infrastructure.telemetry.receiver import PROTOBUF, OtlpReceiver
from agentmend.infrastructure.telemetry.span_processor import AgentmendSpanProcessor

SPANS_PER_REQUEST = 512
SPANS_PER_TRACE = 3


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def _span(trace_id: bytes, span_id: bytes, parent: bytes, kind: str, n: int) -> Span:
    start = 1_700_000_000_000_000_000 + n * 1_000_000
    if kind == "agent":
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": f"agent-{n % 8}",
            "gen_ai.agent.id": f"id-{n % 8}",
            "gen_ai.provider.name": "anthropic",
            "gen_ai.conversation.id": f"conv-{n}",
            "server.address": "api.example.com",
            "server.port": 443,
            "app.tenant": "acme",
            "app.request": f"req-{n}",
            "app.retry": False,
        }
    else:
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "anthropic",
            "gen_ai.request.model": "claude-sonnet-4-5",
            "gen_ai.response.model": "claude-sonnet-4-5",
            "gen_ai.request.max_tokens": 1024,
            "gen_ai.usage.input_tokens": 100 + n % 50,
            "gen_ai.usage.output_tokens": 20 + n % 10,
            "gen_ai.response.id": f"msg_{span_id.hex()}",  # two chats: two calls
            "server.address": "api.example.com",
            "server.port": 443,
        }
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name="invoke_agent" if kind == "agent" else "chat claude-sonnet-4-5",
        start_time_unix_nano=start,
        end_time_unix_nano=start + 5_000_000,
        attributes=[_kv(k, v) for k, v in attributes.items()],
    )


def request_bodies(count: int, seed: int, *, release: str | None = None) -> list[bytes]:
    """``count`` protobuf export requests of 512 spans each, every id unique (``release``:
    the resource's ``agentmend.release`` label)."""
    resource = [_kv("service.name", "bench")]
    if release is not None:
        resource.append(_kv("agentmend.release", release))
    bodies = []
    n = seed * 10_000_000
    for _ in range(count):
        spans: list[Span] = []
        while len(spans) < SPANS_PER_REQUEST:
            n += 1
            trace_id = n.to_bytes(16, "big")
            agent_id = (n * 4 + 1).to_bytes(8, "big")
            spans.append(_span(trace_id, (n * 4 + 2).to_bytes(8, "big"), agent_id, "chat", n))
            spans.append(_span(trace_id, (n * 4 + 3).to_bytes(8, "big"), agent_id, "chat", n))
            spans.append(_span(trace_id, agent_id, b"", "agent", n))
        request = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    resource=ProtoResource(attributes=resource),
                    scope_spans=[ScopeSpans(spans=spans[:SPANS_PER_REQUEST])],
                )
            ]
        )
        bodies.append(request.SerializeToString())
    return bodies


def _median_rate(runs: list[tuple[int, float]]) -> float:
    return statistics.median(spans / seconds for spans, seconds in runs)


def parse_only(bodies: list[bytes]) -> tuple[int, float]:
    start = time.perf_counter()
    for body in bodies:
        ExportTraceServiceRequest.FromString(body)
    return len(bodies) * SPANS_PER_REQUEST, time.perf_counter() - start


def decode_only(bodies: list[bytes]) -> tuple[int, float]:
    start = time.perf_counter()
    for body in bodies:
        decode_protobuf(body)
    return len(bodies) * SPANS_PER_REQUEST, time.perf_counter() - start


def receiver_in_process(
    bodies: list[bytes], clock: Callable[[], float] = time.perf_counter
) -> tuple[int, float, int]:
    """(spans, seconds by ``clock``, runs recorded): every body through ``OtlpReceiver.export``
    and the monitor's flush (``bench_receiver.py`` times it in CPU time)."""
    with PerformanceMonitor(flush_interval_s=3600) as monitor:
        assembler = TraceAssembler(monitor)
        receiver = OtlpReceiver(assembler, port=0)
        try:
            start = clock()
            for body in bodies:
                assert receiver.export(PROTOBUF, "", body).status == 200
            monitor.flush()
            elapsed = clock() - start
        finally:
            receiver.close()
        counts = assembler.counts()
    assert counts.orphans == 0  # each request leaves one trace open: its last, cut short
    return len(bodies) * SPANS_PER_REQUEST, elapsed, counts.executions_recorded


def receiver_attributed(bodies: list[bytes]) -> tuple[int, float, int]:
    """As ``receiver_in_process``, every run labelled with release 1 and attributed to it."""
    import tempfile
    from pathlib import Path

    from agentmend.infrastructure.principal import Principal
    from agentmend.infrastructure.releases.attribution import ReleaseAttribution
    from agentmend.infrastructure.releases.log import ReleaseLog
    from agentmend.infrastructure.simulation import copy_team
    from agentmend.infrastructure.store.api import Store

    with tempfile.TemporaryDirectory() as folder:
        store = Store(Path(folder) / "agentmend.db")
        log = ReleaseLog(store, "team-bench")
        log.publish_directory(copy_team(Path(folder) / "team"), by=Principal("b", "bench"))
        with PerformanceMonitor(flush_interval_s=3600) as monitor:
            assembler = TraceAssembler(monitor, attribute=ReleaseAttribution(log).tags)
            receiver = OtlpReceiver(assembler, port=0)
            try:
                start = time.perf_counter()
                for body in bodies:
                    assert receiver.export(PROTOBUF, "", body).status == 200
                monitor.flush()
                elapsed = time.perf_counter() - start
            finally:
                receiver.close()
            recorded = assembler.counts().executions_recorded
        store.close()
    return len(bodies) * SPANS_PER_REQUEST, elapsed, recorded


def receiver_over_http(bodies: list[bytes]) -> tuple[int, float]:
    with PerformanceMonitor(flush_interval_s=3600) as monitor:
        receiver = OtlpReceiver(TraceAssembler(monitor), port=0).start()
        url = receiver.endpoint + "/v1/traces"
        try:
            start = time.perf_counter()
            for body in bodies:
                headers = {
                    "Content-Type": PROTOBUF,
                    "Authorization": f"Bearer {receiver.token}",  # the token it made itself
                }
                request = urllib.request.Request(url, data=body, method="POST", headers=headers)
                with urllib.request.urlopen(request, timeout=30) as answer:
                    answer.read()
            monitor.flush()
            elapsed = time.perf_counter() - start
        finally:
            receiver.close()
    return len(bodies) * SPANS_PER_REQUEST, elapsed


class _NoOp(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        return None


def _finished_spans(count: int) -> list[ReadableSpan]:
    """``count`` real finished SDK spans (3 per trace, 10 attributes each), kept in memory."""
    kept: list[ReadableSpan] = []

    class Keep(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            kept.append(span)

    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(Keep())
    tracer = provider.get_tracer("bench")
    n = 0
    while len(kept) < count:
        n += 1
        with tracer.start_as_current_span("invoke_agent", attributes=_agent_attributes(n)):
            for call in range(2):
                with tracer.start_as_current_span("chat", attributes=_chat_attributes(n, call)):
                    pass
    provider.shutdown()
    return kept[:count]


def _agent_attributes(n: int) -> dict[str, str | int | bool]:
    return {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": f"agent-{n % 8}",
        "gen_ai.agent.id": f"id-{n % 8}",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.conversation.id": f"conv-{n}",
        "server.address": "api.example.com",
        "server.port": 443,
        "app.tenant": "acme",
        "app.request": f"req-{n}",
        "app.retry": False,
    }


def _chat_attributes(n: int, call: int = 0) -> dict[str, str | int | bool]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5",
        "gen_ai.response.model": "claude-sonnet-4-5",
        "gen_ai.request.max_tokens": 1024,
        "gen_ai.usage.input_tokens": 100 + n % 50,
        "gen_ai.usage.output_tokens": 20 + n % 10,
        "gen_ai.response.id": f"msg_{n}_{call}",  # each call its own answer
        "server.address": "api.example.com",
        "server.port": 443,
    }


def processor_throughput(spans: list[ReadableSpan]) -> tuple[int, float]:
    with PerformanceMonitor(flush_interval_s=3600) as monitor:
        processor = AgentmendSpanProcessor(monitor, max_queue_size=len(spans) + 1)
        start = time.perf_counter()
        for span in spans:
            processor.on_end(span)
        assert processor.force_flush(120_000)
        monitor.flush()
        elapsed = time.perf_counter() - start
        assert processor.counts().dropped_queue_full == 0
        processor.shutdown()
    return len(spans), elapsed


def on_end_alone(spans: list[ReadableSpan], processor: SpanProcessor) -> float:
    """ns per ``on_end`` call on the app's thread."""
    start = time.perf_counter()
    for span in spans:
        processor.on_end(span)
    return (time.perf_counter() - start) / len(spans) * 1e9


def app_thread(n: int, make: Callable[[], SpanProcessor]) -> float:
    """us per span created, given 10 attributes and ended on a provider with ``make()``."""
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    processor = make()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("bench")
    attributes = _chat_attributes(1)
    start = time.perf_counter()
    for _ in range(n):
        tracer.start_span("chat", attributes=attributes).end()
    elapsed = time.perf_counter() - start
    provider.shutdown()
    return elapsed / n * 1e6


def buffer_memory(traces: int) -> tuple[float, int]:
    """Bytes held per open trace (2 chat spans each, agent pending): the buffer and everything
    its spans hold, decoding included (a decoder may leave values undecoded until a span is
    left waiting, so what the decoder made counts too)."""
    bodies = request_bodies(traces * SPANS_PER_TRACE // SPANS_PER_REQUEST + 1, seed=99)
    assembler = TraceAssembler(lambda record: None, max_open_traces=traces * 2)
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    for body in bodies:
        room = traces * 2 - 2 * assembler.counts().open_traces
        assembler.add([s for s in decode_protobuf(body).spans if s.parent_span_id][:room])
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    return held / traces, assembler.counts().open_traces


def drops(burst: int, limit: int) -> tuple[int, int]:
    spans = _finished_spans(burst)
    with PerformanceMonitor(flush_interval_s=3600) as monitor:
        processor = AgentmendSpanProcessor(monitor, max_queue_size=limit)
        for span in spans:
            processor.on_end(span)
        processor.force_flush(120_000)
        counts = processor.counts()
        processor.shutdown()
    return counts.dropped_queue_full, counts.spans_received


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-r", "--reps", type=int, default=5)
    parser.add_argument("-n", "--requests", type=int, default=60, help="requests per rep")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    reps, count = args.reps, args.requests
    spans_total = count * SPANS_PER_REQUEST

    parse_runs, decode_runs, receiver_runs, http_runs, processor_runs = [], [], [], [], []
    attributed_runs = []
    recorded = 0
    for rep in range(reps):
        bodies = request_bodies(count, seed=rep + 1)
        parse_runs.append(parse_only(bodies))
        decode_runs.append(decode_only(bodies))
        spans, seconds, recorded = receiver_in_process(bodies)
        receiver_runs.append((spans, seconds))
        labelled = request_bodies(count, seed=rep + 100, release="1")
        spans, seconds, _ = receiver_attributed(labelled)
        attributed_runs.append((spans, seconds))
        http_runs.append(receiver_over_http(request_bodies(count, seed=rep + 50)))
        processor_runs.append(processor_throughput(_finished_spans(spans_total)))
    parse = _median_rate(parse_runs)
    rows = [
        ("protobuf parse only (baseline)", parse),
        ("decode to SpanData (dialect attributes only)", _median_rate(decode_runs)),
        ("receiver in process: decode, map, record", _median_rate(receiver_runs)),
        ("  the same, every run labelled and attributed", _median_rate(attributed_runs)),
        ("receiver over HTTP on loopback (1 client)", _median_rate(http_runs)),
        ("span processor: on_end + worker", _median_rate(processor_runs)),
    ]
    print(
        f"throughput, median of {reps} x {spans_total:,} spans ({count} requests of "
        f"{SPANS_PER_REQUEST} spans, 10 attributes, {SPANS_PER_TRACE} spans per trace), one core"
    )
    for name, rate in rows:
        print(f"  {name:<44} {rate:>10,.0f} spans/s   {parse / rate:6.2f}x the parse")
    print(f"  executions recorded per rep: {recorded:,} (one per trace)")

    app_spans = 50_000
    noop = statistics.median(app_thread(app_spans, _NoOp) for _ in range(reps))
    with PerformanceMonitor(flush_interval_s=3600) as monitor:
        ours = statistics.median(
            app_thread(app_spans, lambda: AgentmendSpanProcessor(monitor, max_queue_size=10**6))
            for _ in range(reps)
        )
    finished = _finished_spans(app_spans)
    noop_end = statistics.median(on_end_alone(finished, _NoOp()) for _ in range(reps))
    with PerformanceMonitor(flush_interval_s=3600) as monitor:
        processors = [
            AgentmendSpanProcessor(monitor, max_queue_size=10**6, schedule_delay_s=3600)
            for _ in range(reps)
        ]
        ours_end = statistics.median(on_end_alone(finished, p) for p in processors)
        for p in processors:
            p.shutdown()
    print(f"cost on the app's thread, median of {reps} x {app_spans:,} spans")
    print(f"  {'start + end a span, no-op processor':<44} {noop:8.2f} us/span")
    print(f"  {'start + end a span, AgentmendSpanProcessor':<44} {ours:8.2f} us/span")
    print(f"  {'added by AgentmendSpanProcessor':<44} {ours - noop:8.2f} us/span")
    print(f"  {'on_end alone: no-op / Agentmend':<44} {noop_end:6.0f} / {ours_end:.0f} ns")

    per_trace, open_traces = buffer_memory(1000)
    print(
        f"assembly buffer: {open_traces:,} open traces (2 spans each) hold "
        f"{per_trace * open_traces / 1e6:.2f} MB, {per_trace:,.0f} bytes per trace"
    )
    for burst, limit in ((4096, 8192), (8192, 8192), (20_000, 8192)):
        dropped, received = drops(burst, limit)
        print(
            f"drops: burst of {burst:,} spans, queue limit {limit:,}: "
            f"{dropped:,} dropped, {received:,} received"
        )


if __name__ == "__main__":
    main()
