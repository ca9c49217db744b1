"""Cost of ``PerformanceMonitor.record()`` against prometheus_client in the same process.

The baseline is what a metrics library charges for the same observation: one
``Counter.inc()`` plus one ``Histogram.observe()`` (default buckets), both on pre-bound label
children (the cheapest way to use prometheus_client) and with a ``.labels(agent)`` lookup per
call (what a per-agent recorder really needs). Measured for ``record()``:

- caller path: N ``record()`` calls with the default flusher running (what the agent pays);
- amortised: N calls plus the drain into per-agent state (in memory) or plus the batched
  SQLite writes (``flush()``, store-backed): all the work the monitor ever does for a run.

Each figure is the median of R interleaved repetitions, in ns per run. Goal: the caller path no
slower than the pre-bound Counter+Histogram pair. Run:
``.venv/bin/python benchmarks/bench_record.py [-n 200000] [-r 7]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store


def prometheus_prebound(n: int) -> float:
    registry = CollectorRegistry()
    runs = Counter("agent_runs", "runs", ["agent"], registry=registry).labels("solver")
    seconds = Histogram("agent_seconds", "duration", ["agent"], registry=registry).labels("solver")
    start = time.perf_counter()
    for _ in range(n):
        runs.inc()
        seconds.observe(1.234)
    return time.perf_counter() - start


def prometheus_labels(n: int) -> float:
    registry = CollectorRegistry()
    runs = Counter("agent_runs", "runs", ["agent"], registry=registry)
    seconds = Histogram("agent_seconds", "duration", ["agent"], registry=registry)
    start = time.perf_counter()
    for _ in range(n):
        runs.labels("solver").inc()
        seconds.labels("solver").observe(1.234)
    return time.perf_counter() - start


def monitor_caller(n: int, store: bool = False) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        monitor = PerformanceMonitor(Store(Path(tmp) / "b.db") if store else None)
        record = monitor.record
        start = time.perf_counter()
        for _ in range(n):
            record("solver", success=True, duration_ms=1234.0)
        elapsed = time.perf_counter() - start
        monitor.close()
    return elapsed


def monitor_amortised(n: int, store: bool = False) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        monitor = PerformanceMonitor(Store(Path(tmp) / "b.db") if store else None)
        record = monitor.record
        start = time.perf_counter()
        for _ in range(n):
            record("solver", success=True, duration_ms=1234.0)
        if store:
            monitor.flush()
        else:
            monitor.get_agent_metrics("solver")
        elapsed = time.perf_counter() - start
        monitor.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200_000, help="runs per repetition")
    parser.add_argument("-r", type=int, default=7, help="repetitions (median)")
    args = parser.parse_args()
    n, reps = args.n, args.r

    rows = [
        ("prometheus Counter.inc + Histogram.observe (pre-bound)", prometheus_prebound),
        ("prometheus .labels(agent) + inc + observe", prometheus_labels),
        ("record(), in memory, caller path", monitor_caller),
        ("record(), in memory, amortised (+ drain)", monitor_amortised),
        ("record(), store-backed, caller path", lambda k: monitor_caller(k, store=True)),
        ("record(), store-backed, amortised (+ flush)", lambda k: monitor_amortised(k, store=True)),
    ]
    for _, fn in rows:
        fn(min(n, 10_000))  # warm up
    samples: dict[str, list[float]] = {name: [] for name, _ in rows}
    for _ in range(reps):  # interleaved, so drift on a busy machine hits every variant alike
        for name, fn in rows:
            samples[name].append(fn(n) / n * 1e9)
    results = {name: statistics.median(values) for name, values in samples.items()}
    base = results[rows[0][0]]
    print(f"record() cost, median of {reps} x {n:,} runs (ns per run; ratio to pre-bound pair)")
    for name, ns in results.items():
        print(f"  {name:<55} {ns:8.0f} ns   {ns / base:5.2f}x")


if __name__ == "__main__":
    main()
