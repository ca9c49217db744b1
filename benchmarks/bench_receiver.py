"""The OTLP receiver's cost in CPU time, beside what any receiver must pay, measured in one run.

Spans per CPU-second (``time.process_time``: every thread of this process, the monitor's
flusher included) on the workload of ``bench_otel.py``: requests of 512 spans, 10 attributes
each, 3 spans per trace (an ``invoke_agent`` span and two ``chat`` spans), one run per trace.

- parse only: ``ExportTraceServiceRequest.FromString``, the parse any receiver pays;
- parse plus reading every attribute: that parse, then every span's ids, times, status and
  every attribute value read into a dict (what a receiver that decodes everything pays);
- receiver: ``OtlpReceiver.export()`` on each body (decode, assemble, map, hand the runs to a
  ``PerformanceMonitor``), then the monitor's flush into its per-agent state.

The three are interleaved, rep by rep, on the same bodies, and each figure is the median of
the reps; the ratios are of figures from this run only, so a busy machine moves all three.
The load average is printed before and after. Goals: the receiver >= 150,000 spans per
CPU-second, and >= 0.5x "parse plus reading every attribute".
Run: ``.venv/bin/python benchmarks/bench_receiver.py [-r 7] [-n 60]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from bench_otel import SPANS_PER_REQUEST, receiver_in_process, request_bodies
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def parse_only(bodies: list[bytes]) -> float:
    start = time.process_time()
    for body in bodies:
        ExportTraceServiceRequest.FromString(body)
    return time.process_time() - start


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return {pair.key: _value(pair.value) for pair in value.kvlist_value.values}
    return getattr(value, kind)


def read_every_attribute(bodies: list[bytes]) -> float:
    """The parse, then every field and attribute of every span read (the old decoder's work)."""
    start = time.process_time()
    for body in bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = {p.key: _value(p.value) for p in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    _read = (
                        span.trace_id,
                        span.span_id,
                        span.parent_span_id,
                        span.name,
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        span.status.code,
                        span.status.message,
                        {p.key: _value(p.value) for p in span.attributes},
                        [
                            (e.name, {p.key: _value(p.value) for p in e.attributes})
                            for e in span.events
                        ],
                        resource,
                        span.flags,
                    )
    return time.process_time() - start


def receiver(bodies: list[bytes]) -> tuple[float, int]:
    _, elapsed, recorded = receiver_in_process(bodies, clock=time.process_time)
    assert recorded == len(bodies) * (SPANS_PER_REQUEST // 3)
    return elapsed, recorded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-r", "--reps", type=int, default=7)
    parser.add_argument("-n", "--requests", type=int, default=60, help="requests per rep")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    spans = args.requests * SPANS_PER_REQUEST
    load_before = os.getloadavg()
    parse, read_all, served = [], [], []
    recorded = 0
    for rep in range(args.reps):
        bodies = request_bodies(args.requests, seed=rep + 1)
        parse.append(spans / parse_only(bodies))
        read_all.append(spans / read_every_attribute(bodies))
        seconds, recorded = receiver(bodies)
        served.append(spans / seconds)
    load_after = os.getloadavg()
    rows = (
        ("protobuf parse only", statistics.median(parse)),
        ("parse plus reading every attribute", statistics.median(read_all)),
        ("receiver in process: decode, assemble, map, record", statistics.median(served)),
    )
    print(
        f"spans per CPU-second, median of {args.reps} x {spans:,} spans ({args.requests} "
        f"requests of {SPANS_PER_REQUEST}, 10 attributes, 3 spans per trace), one core"
    )
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min)")
    for name, rate in rows:
        print(f"  {name:<52} {rate:>11,.0f}")
    # each rep's three figures were taken moments apart: the median of their ratios is what a
    # load that changes from rep to rep moves least
    by_parse = statistics.median(s / p for s, p in zip(served, parse, strict=True))
    by_read = statistics.median(s / r for s, r in zip(served, read_all, strict=True))
    print(f"  receiver / parse only, median of the reps' ratios: {by_parse:.3f}")
    print(f"  receiver / parse plus reading every attribute, the same: {by_read:.2f}x")
    print(f"  best rep: receiver {max(served):,.0f}, reading every attribute {max(read_all):,.0f}")
    print(f"  runs recorded per rep: {recorded:,} (one per trace)")


if __name__ == "__main__":
    main()
