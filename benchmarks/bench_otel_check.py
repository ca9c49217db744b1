"""What the fleet checker costs the OpenTelemetry receiver: ``agentmend otel receive --check``
against ``agentmend otel receive``, both measured in the same run.

Two real receiver processes, each on a workspace of its own (its SQLite store and the simulated
team), one started with ``--check --check-interval 1`` (the checker judges the store's runs in a
thread of the receiver's process, every second, with the report policy), the other without.
Each round sends the same workload to both, one after the other (the order alternates every
round): export requests of 512 spans (10 attributes, 3 spans per trace: one run per trace, 8
agents, as in ``bench_otel.py``) POSTed over loopback HTTP by one client thread, and the time
runs until the last run is in the receiver's store (read back from it). Throughput is spans per
second over that time; the figure is the ratio of the medians over the rounds (goal >= 0.90).
The checker's detector uses the default settings: after the first 500 runs of an agent it judges
every new run. Run: ``.venv/bin/python benchmarks/bench_otel_check.py [-r 7] [-n 96]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench_otel import SPANS_PER_REQUEST, SPANS_PER_TRACE, request_bodies

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.telemetry.receiver import PROTOBUF

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-otel-check-token"
CHECK_INTERVAL_S = 1.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Receiver:
    """``agentmend otel receive`` (with ``--check`` if ``check``) on a workspace of its own."""

    def __init__(self, base: Path, *, check: bool) -> None:
        self.folder = base / ("checked" if check else "plain")
        Workspace.open(self.folder, create=True).close()
        self.port = _free_port()
        argv = [sys.executable, "-m", "agentmend.faces.cli", "otel", "receive"]
        argv += ["--workspace", str(self.folder), "--port", str(self.port), "--token", TOKEN]
        if check:
            argv += ["--check", "--check-interval", str(CHECK_INTERVAL_S)]
        self.process = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "NO_COLOR": "1"},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self._wait_for("receiving OTLP traces")
        if check:
            self._wait_for("checking team")
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line)

    def _wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            if (left := deadline - time.monotonic()) <= 0:
                self.stop()
                raise SystemExit(f"the receiver said no line with {text!r} in {timeout:.0f} s")
            with contextlib.suppress(queue.Empty):
                self.seen.append(self.lines.get(timeout=left))

    def stored_runs(self) -> int:
        with sqlite3.connect(f"file:{self.folder / 'agentmend.db'}?mode=ro", uri=True) as conn:
            return int(conn.execute("SELECT count(*) FROM executions").fetchone()[0])

    def measure(self, bodies: list[bytes]) -> float:
        """Spans per second: the bodies POSTed, until their runs are all in the store."""
        # 170 whole traces a request: the two spans left over belong to a trace it cuts
        expected = self.stored_runs() + len(bodies) * (SPANS_PER_REQUEST // SPANS_PER_TRACE)
        headers = {"Content-Type": PROTOBUF, "Authorization": f"Bearer {TOKEN}"}
        start = time.perf_counter()
        for body in bodies:
            request = urllib.request.Request(self.url, data=body, method="POST", headers=headers)
            with urllib.request.urlopen(request, timeout=60) as answer:
                answer.read()
        deadline = time.monotonic() + 60
        while self.stored_runs() < expected:
            if time.monotonic() > deadline:
                raise SystemExit(f"the receiver on {self.folder} stored too few runs")
            time.sleep(0.01)
        return len(bodies) * SPANS_PER_REQUEST / (time.perf_counter() - start)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-r", "--rounds", type=int, default=7)
    parser.add_argument("-n", "--requests", type=int, default=96, help="requests per measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-otel-check-") as folder:
        plain = Receiver(Path(folder), check=False)
        try:
            checked = Receiver(Path(folder), check=True)
        except BaseException:
            plain.stop()
            raise
        rates: dict[str, list[float]] = {"plain": [], "checked": []}
        try:
            for number in range(args.rounds):
                bodies = request_bodies(args.requests, seed=number + 1)
                order = [("plain", plain), ("checked", checked)]
                for name, receiver in order if number % 2 == 0 else order[::-1]:
                    rates[name].append(receiver.measure(bodies))
                print(
                    f"  round {number + 1}: without {rates['plain'][-1]:,.0f} spans/s, with "
                    f"--check {rates['checked'][-1]:,.0f}",
                    flush=True,
                )
        finally:
            plain.stop()
            checked.stop()
        runs = checked.stored_runs()
    without, with_check = statistics.median(rates["plain"]), statistics.median(rates["checked"])
    print(
        f"otel receive over HTTP, {args.rounds} rounds x {args.requests * SPANS_PER_REQUEST:,} "
        f"spans each (alternating, medians); the checker every {CHECK_INTERVAL_S:g} s judged "
        f"{runs:,} runs of 8 agents"
    )
    print(f"  without --check  {without:>10,.0f} spans/s")
    print(f"  with --check     {with_check:>10,.0f} spans/s")
    print(f"  ratio            {with_check / without:10.2f} (goal >= 0.90)")


if __name__ == "__main__":
    main()
