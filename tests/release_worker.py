"""A worker process for the fleet tests: follows a team's releases and serves live runs.

    python tests/release_worker.py STORE TEAM_ID ROOT STATUS_FILE [--serve] [--fault-tokens F]
        [--interval S] [--seed N] [--files-dir DIR] [--verify-interval S] [--run-pause S]

STORE is a SQLite path or a PostgreSQL URL (then ``--files-dir`` is the host's folder for the
store's files, the audit head among them; workers of one host share it).

It follows the team's releases into ROOT (a :class:`ReleaseFollower` polling every ``--interval``
seconds, which also carries the team's rollout on), and with ``--serve`` runs the simulated
research agent continuously through ``AgentTeam`` (each run routed by a random run id),
recording every run into STORE. ``--fault-tokens`` gives the agents answers that many times
longer than usual (a truncation fault that a larger ``max_tokens`` fixes). ``--run-pause`` sleeps
that long after each batch of ten runs (a slower stream of runs, for a rollout that must stay
undecided while a test acts on it).

About every 50 ms it replaces STATUS_FILE with JSON: pid, the follower's status, runs served,
whether a ``LISTEN`` connection wakes it, and the wall-clock time at which the follower began
serving each stable release. It runs
until killed (SIGTERM: a clean stop, after which the status is written once more with
``stopped`` true, once every run it served was written to the store; the tests also SIGKILL
it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor  # noqa: E402
from agentmend.infrastructure.releases.follower import ReleaseFollower  # noqa: E402
from agentmend.infrastructure.releases.log import ReleaseLog  # noqa: E402
from agentmend.infrastructure.simulation import SimulatedRuntime  # noqa: E402
from agentmend.infrastructure.simulation.faults import Fault, FaultKind  # noqa: E402
from agentmend.infrastructure.store.api import Store  # noqa: E402
from agentmend.roles.team import AgentTeam  # noqa: E402

AGENT = "research-agent"


def _write_status(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    store = Store(args.store, files_dir=args.files_dir)
    releases = ReleaseLog(store, args.team)  # as the README builds one: audited by default
    checking = {} if args.verify_interval is None else {"verify_interval_s": args.verify_interval}
    follower = ReleaseFollower(releases, args.root, interval_s=args.interval, **checking)
    follower.start()
    monitor = PerformanceMonitor(store, flush_interval_s=0.1)
    runtime = SimulatedRuntime(args.seed)
    if args.fault_tokens:
        runtime.inject(AGENT, Fault(FaultKind.TRUNCATION, token_factor=args.fault_tokens))
    team = AgentTeam.following(follower, runtime, monitor=monitor) if args.serve else None
    first_served: dict[str, float] = {}
    status_path = Path(args.status)
    last_status = 0.0
    i = 0

    def report(**more: object) -> None:
        status = follower.status()
        _write_status(
            status_path,
            {
                "pid": os.getpid(),
                "stable": status.stable,
                "canary": status.canary,
                "connected": status.connected,
                "problem": status.problem,
                "runs": i,
                "listening": follower.listening,
                "first_served": first_served,
                "mismatch": status.mismatch,
                "mismatch_at": status.mismatch_at,
                **more,
            },
        )

    while not stop.is_set():
        status = follower.status()
        if status.stable is not None and str(status.stable) not in first_served:
            first_served[str(status.stable)] = status.serving_since or time.time()
        if team is not None and status.stable is not None:
            for _ in range(10):  # each run's release is in its record (extra.release)
                await team.run(AGENT, f"Explain concept {i}")
                i += 1
            if args.run_pause:
                await asyncio.sleep(args.run_pause)
        now = time.monotonic()
        if now - last_status > 0.05:
            report()
            last_status = now
        await asyncio.sleep(0.005)
    follower.stop()
    unwritten = monitor.close()  # writes every run still buffered
    report(stopped=True, unwritten=unwritten)
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("team")
    parser.add_argument("root")
    parser.add_argument("status")
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--fault-tokens", type=float, default=0.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--files-dir", default=None)
    parser.add_argument("--verify-interval", type=float, default=None)
    parser.add_argument("--run-pause", type=float, default=0.0)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
