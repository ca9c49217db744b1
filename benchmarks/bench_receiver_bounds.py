"""What hostile traces cost the OTLP receiver: memory held for orphans, time to assemble a trace.

- orphan memory: ``R`` requests of one trace that never completes (no root, no agent span),
  each span carrying a 1 MB attribute, through ``OtlpReceiver.export()`` in process. Measured:
  the bytes the process still holds afterwards (``tracemalloc``), as a ratio to the bytes
  posted (the baseline, measured in the same run).
- assembly time: one request of N agent spans (each with one chat child) under one parent that
  has not arrived, for N = 5,000 and 20,000. Measured: the time ``export()`` takes, as a ratio to
  decoding the same body alone (the baseline, same run). Linear assembly keeps the ratio
  about the same for both N; quadratic assembly multiplies it by about N's ratio.

Run: ``.venv/bin/python benchmarks/bench_receiver_bounds.py [-r 3] [--requests 100]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable
from functools import partial

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.otlp_decode import decode_protobuf
from agentmend.infrastructure.telemetry.receiver import PROTOBUF, OtlpReceiver

_TRACE = (7).to_bytes(16, "big")
_ABSENT_PARENT = (1).to_bytes(8, "big")


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _body(spans: list[Span]) -> bytes:
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[_kv("service.name", "bench")]),
                scope_spans=[ScopeSpans(spans=spans)],
            )
        ]
    )
    return bytes(request.SerializeToString())


def orphan_bodies(requests: int, attribute_bytes: int) -> list[bytes]:
    """One span per request, all of one trace, each a child of a span that never arrives."""
    return [
        _body(
            [
                Span(
                    trace_id=_TRACE,
                    span_id=(1000 + i).to_bytes(8, "big"),
                    parent_span_id=_ABSENT_PARENT,
                    name="tool",
                    start_time_unix_nano=1,
                    end_time_unix_nano=2,
                    attributes=[_kv("payload", chr(ord("a") + i % 26) * attribute_bytes)],
                )
            ]
        )
        for i in range(requests)
    ]


def agent_trace_body(agents: int) -> bytes:
    """``agents`` agent spans, each with one chat child, under one parent not yet arrived."""
    spans = []
    for i in range(agents):
        agent_id = (10 + 2 * i).to_bytes(8, "big")
        spans.append(
            Span(
                trace_id=_TRACE,
                span_id=(11 + 2 * i).to_bytes(8, "big"),
                parent_span_id=agent_id,
                name="chat",
                start_time_unix_nano=i,
                end_time_unix_nano=i + 1,
                attributes=[_kv("gen_ai.operation.name", "chat")],
            )
        )
        spans.append(
            Span(
                trace_id=_TRACE,
                span_id=agent_id,
                parent_span_id=_ABSENT_PARENT,
                name="invoke_agent",
                start_time_unix_nano=i,
                end_time_unix_nano=i + 2,
                attributes=[
                    _kv("gen_ai.operation.name", "invoke_agent"),
                    _kv("gen_ai.agent.name", f"agent-{i % 8}"),
                ],
            )
        )
    return _body(spans)


def _receiver() -> OtlpReceiver:
    return OtlpReceiver(TraceAssembler(lambda record: None), port=0)


def orphan_memory(requests: int, attribute_bytes: int) -> tuple[int, int, int]:
    """(bytes posted, bytes still held after the requests, orphan spans counted)."""
    bodies = orphan_bodies(requests, attribute_bytes)
    posted = sum(len(b) for b in bodies)
    receiver = _receiver()
    try:
        gc.collect()
        tracemalloc.start()
        start = tracemalloc.get_traced_memory()[0]
        for body in bodies:
            answer = receiver.export(PROTOBUF, "", body)
            assert answer.status == 200, answer
            bodies[bodies.index(body)] = b""  # the request is done with: only the receiver holds
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - start
        tracemalloc.stop()
        return posted, held, receiver.assembler.counts().orphans
    finally:
        receiver.close()


def assembly_ratio(agents: int, reps: int) -> tuple[float, float]:
    """(median seconds of export(), its ratio to decoding the same body alone)."""
    body = agent_trace_body(agents)
    decode = statistics.median(_timed(lambda: decode_protobuf(body)) for _ in range(reps))
    times = []
    for _ in range(reps):
        receiver = _receiver()
        try:
            times.append(_timed(partial(receiver.export, PROTOBUF, "", body)))
            assert receiver.assembler.counts().executions_recorded == agents
        finally:
            receiver.close()
    seconds = statistics.median(times)
    return seconds, seconds / decode


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", "--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=100, help="orphan requests of 1 MB")
    args = parser.parse_args()
    posted, held, orphans = orphan_memory(args.requests, 1_000_000)
    print(
        f"orphans: {args.requests} requests of one rootless trace, 1 MB attribute each: "
        f"{posted / 1e6:,.1f} MB posted, {held / 1e6:,.1f} MB still held "
        f"({held / posted:.2f}x the bytes posted), {orphans} spans dropped as orphans"
    )
    results = {n: assembly_ratio(n, args.reps) for n in (5_000, 20_000)}
    for n, (seconds, ratio) in results.items():
        print(
            f"assembly: one trace of {n:,} agent spans (+ {n:,} chats): {seconds:.3f} s, "
            f"{ratio:.1f}x decoding the body"
        )
    growth = results[20_000][1] / results[5_000][1]
    print(f"assembly: ratio at 20,000 / ratio at 5,000 = {growth:.2f} (linear: about 1)")


if __name__ == "__main__":
    main()
