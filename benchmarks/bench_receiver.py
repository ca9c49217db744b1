"""The OTLP receiver's cost in CPU time, beside what any receiver must pay, measured in one run.

Spans per CPU-second (``time.process_time``: every thread of this process, the monitor's
flusher included) on the workload of ``bench_otel.py``: requests of 512 spans, 10 attributes
each, 3 spans per trace (an ``invoke_agent`` span and two ``chat`` spans), one run per trace.

- parse only: ``ExportTraceServiceRequest.FromString``, the parse any receiver pays;
- parse plus reading every attribute: that parse, then every span's ids, times, status and
  every attribute value read into a dict (what a receiver that decodes everything pays);
- receiver: ``OtlpReceiver.export()`` on each body (decode, assemble, map, hand the runs to a
  ``PerformanceMonitor``), then the monitor's flush into its per-agent state.

The three are interleaved, rep by rep, on the same bodies, each timed from a collected heap
(``gc.collect()`` first, so none pays for the garbage the one before left), and each figure is
the median of the reps; the ratios are of figures from this run only, so a busy machine moves
all three. The load average is printed before and after. Goals: the receiver >= 150,000 spans per
CPU-second, and >= 0.5x "parse plus reading every attribute".

Then where the receiver's time goes, in CPU µs per span (medians of the same reps): the lean
parse alone, decoding (``decode_protobuf``: the parse and the spans built), assembly and mapping
(``TraceAssembler.add`` of the decoded spans into a sink that keeps nothing), and the monitor
(the same into a ``PerformanceMonitor``, its flush included, less the sink that keeps nothing).
Run: ``.venv/bin/python benchmarks/bench_receiver.py [-r 7] [-n 60]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Any

from bench_otel import SPANS_PER_REQUEST, receiver_in_process, request_bodies
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.otlp_decode import decode_protobuf
from agentmend.infrastructure.telemetry.otlp_lean import lean_request_type


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


class _Discard:
    """A run sink that keeps nothing: assembly and mapping timed without the monitor."""

    def record_observed(self, *row: Any) -> None:
        pass


def stages(bodies: list[bytes]) -> tuple[float, float, float, float]:
    """CPU seconds of: the lean parse, decoding, assembly and mapping, the monitor (each after
    a full collection, so no stage pays for the garbage of the one before)."""
    lean = lean_request_type()
    gc.collect()
    start = time.process_time()
    for body in bodies:
        lean.FromString(body)
    parse = time.process_time() - start
    gc.collect()
    start = time.process_time()
    for body in bodies:
        decode_protobuf(body)
    decode = time.process_time() - start
    batches = [decode_protobuf(body).spans for body in bodies]
    assembler = TraceAssembler(_Discard())
    gc.collect()
    start = time.process_time()
    for spans in batches:
        assembler.add(spans)
    assemble = time.process_time() - start
    batches = [decode_protobuf(body).spans for body in bodies]  # fresh: values decode once
    with PerformanceMonitor(flush_interval_s=3600) as monitor:
        assembler = TraceAssembler(monitor)
        gc.collect()
        start = time.process_time()
        for spans in batches:
            assembler.add(spans)
        monitor.flush()
        monitored = time.process_time() - start
    return parse, decode, assemble, monitored - assemble


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
    split: list[tuple[float, ...]] = []
    recorded = 0
    for rep in range(args.reps):
        bodies = request_bodies(args.requests, seed=rep + 1)
        # each measured from a collected heap: none pays for the garbage the one before left
        gc.collect()
        parse.append(spans / parse_only(bodies))
        gc.collect()
        read_all.append(spans / read_every_attribute(bodies))
        gc.collect()
        seconds, recorded = receiver(bodies)
        served.append(spans / seconds)
        split.append(tuple(part / spans * 1e6 for part in stages(bodies)))
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
    names = ("lean parse", "decoding (parse included)", "assembly and mapping", "the monitor")
    medians = [statistics.median(rep[i] for rep in split) for i in range(len(names))]
    print("where the receiver's CPU goes, µs per span (median of the reps):")
    for name, value in zip(names, medians, strict=True):
        print(f"  {name:<52} {value:>11.2f}")
    print(f"  {'all three stages (150,000 spans/s allows 6.67)':<52} {sum(medians[1:]):>11.2f}")


if __name__ == "__main__":
    main()
