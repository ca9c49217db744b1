"""The fleet loop end to end: a fault in one worker's agent, to the issue, to a canary release.

Per trial, on a real PostgreSQL server this script starts (and stops at the end), in a fresh
database: two workspace folders ("host A" and "host B", each with its own copy of the one team
folder, so one team id) share the store and an audit key. Four worker processes, two per
workspace, run the six agents of the simulated team round robin, each about 100 runs a second,
recording into the store through their workspace's monitor. ``agentmend watch --on-issue
improve`` (unattended approval: ``AGENTMEND_YOLO_MODE=true``; the team's first release is
published before) runs on host A and a standby ``watch`` on host B, both checking every 0.5 s
with a 4 s seat term. Once research-agent has a baseline, worker 0 injects a truncation fault
into its research-agent (the other three workers' runs of it stay healthy).

What is simulated: the team's model API. The simulated runtime (``SimulatedRuntime``) stands in
for it in the workers and in the checkers; the checkers run ``tests/checker_child.py``, the real
``agentmend watch`` command whose simulated runtime has the same fault, as a real API that
truncates answers would truncate the checker's questions and verification runs too. Everything
else is real: the processes, the store, the seat, the issue claims, the cycle, the release.

Per trial it prints the time and the runs of research-agent (all workers', and the failed ones)
from the fault to the issue opened (the issue's row in the store), against the detector's own
delay (the same stored runs replayed through a detector in this process, checked after every
run of the agent) plus one check interval; and the time from the fault to the kept fix published
as a canary release. Over the trials: issues beyond one per fault (goal 0), issues on healthy
agents, cycles run. One more trial SIGKILLs the active checker right after the fault: the time
until the standby takes the seat (goal within 10 s) and its own fault-to-canary times.

No timed assertion: figures only. Run: ``.venv/bin/python benchmarks/bench_fleet_loop.py
[--trials 10]`` (about 2 minutes on 2 cores). The script runs itself as the workers
(``bench_fleet_loop.py worker ...``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import queue
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' PostgreSQL server and checker child

AGENT = "research-agent"
FAULT = "truncation"
WORKERS = 4
INTERVAL_S, TERM_S = 0.5, 4.0
BASELINE_N = 30
RUN_PERIOD_S = 0.01  # each worker: about 100 runs a second
BATCH_S = 0.2  # a monitor's writer sends its batch every 0.2 s: a run reaches the store then
ENV = {
    "AGENTMEND_BASELINE_N": str(BASELINE_N),
    "AGENTMEND_MIN_BASELINE_N": str(BASELINE_N),
    "NO_COLOR": "1",
}
TRIAL_TIMEOUT_S = 90.0
CANARY_WAIT_S = 30.0  # from the issue: cycles run one at a time, a second may be needed


# -- the worker process -------------------------------------------------------------------------


def worker(folder: Path, index: int, seed: int, control: Path) -> None:
    """Run the simulated team round robin into the workspace's store until ``control/stop``;
    worker 0 injects the fault into its research-agent once ``control/fault`` exists."""
    from crash_child import quiet_logs

    from agentmend.faces.workspace import Workspace
    from agentmend.infrastructure.settings import load_settings
    from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime
    from agentmend.roles.team import AgentTeam

    quiet_logs()

    async def drive() -> None:
        with Workspace.open(folder, settings=load_settings(), create=False) as ws:
            runtime = SimulatedRuntime(seed)
            team = AgentTeam(ws.team_dir, runtime, monitor=ws.monitor)
            agents = sorted(p.stem for p in ws.team_dir.glob("*.md"))
            print("READY", flush=True)
            faulted = index != 0
            deadline = time.monotonic() + 10 * TRIAL_TIMEOUT_S
            n = 0
            next_at = time.monotonic()
            while not (control / "stop").exists() and time.monotonic() < deadline:
                if not faulted and (control / "fault").exists():
                    runtime.inject(AGENT, FaultKind(FAULT))
                    faulted = True
                    print(f"FAULT {time.time():.6f}", flush=True)
                await team.run(agents[n % len(agents)], f"question {n} from worker {index}")
                n += 1
                next_at += RUN_PERIOD_S
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            print(f"RUNS {n}", flush=True)

    asyncio.run(drive())


# -- the driver -----------------------------------------------------------------------------------


class Child:
    """A child process; its stdout lines with the wall-clock time each was read."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log.open("w")
        self.process = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, **ENV, **env},
        )
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put((time.time(), line.rstrip("\n")))

    def wait_for(
        self, pattern: str, timeout: float = TRIAL_TIMEOUT_S
    ) -> tuple[float, re.Match[str]]:
        """The first line from now on matching ``pattern``, and when it was read."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                at, line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append((at, line))
            found = re.search(pattern, line)
            if found is not None:
                return at, found
        raise TimeoutError(
            f"pid {self.process.pid}: no line matching {pattern!r} in {timeout:.0f} s "
            f"(last lines: {[line for _, line in self.seen[-5:]]}; stderr in {self.log.name})"
        )

    def stop(self, *, kill: bool = False) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        self._reader.join(timeout=20)
        assert self.process.stdout is not None
        self.process.stdout.close()
        self.log.close()


def checker(folder: Path, url: str, log: Path) -> Child:
    argv = [sys.executable, str(ROOT / "tests" / "checker_child.py"), AGENT, FAULT, "watch"]
    argv += ["--on-issue", "improve", "--workspace", str(folder), "--store", url]
    argv += ["--interval", str(INTERVAL_S), "--term", str(TERM_S)]
    return Child(argv, {"AGENTMEND_YOLO_MODE": "true", "COLUMNS": "1000"}, log)


def cli(*argv: str) -> str:
    """``agentmend ARGV`` in this process; its output (an error exits the benchmark)."""
    from agentmend.faces.cli.app import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    if code != 0:
        raise SystemExit(f"agentmend {' '.join(argv)} failed ({code}): {out.getvalue()}")
    return out.getvalue()


@dataclass
class Trial:
    to_issue_s: float
    runs_to_issue: int
    failed_to_issue: int
    detector_runs: int | None
    detector_s: float | None
    to_canary_s: float | None
    kinds_on_agent: list[str]
    issues_elsewhere: list[str]
    cycles: int
    cycle_ends: list[str]
    takeover_s: float | None = None


def _workspaces(base: Path, url: str) -> tuple[Path, Path]:
    """Host A's workspace with the team's first release published, and host B's with a copy
    of the same team folder (its ``.agent/team-id`` too: one team)."""
    from agentmend.faces.workspace import TEAM_DIR_NAME, Workspace
    from agentmend.infrastructure.settings import load_settings

    a, b = base / "host-a", base / "host-b"
    Workspace.open(a, settings=load_settings(store_url=url), create=True).close()
    cli("release", "publish", "--workspace", str(a), "--store", url)
    shutil.copytree(a / TEAM_DIR_NAME, b / TEAM_DIR_NAME)
    Workspace.open(b, settings=load_settings(store_url=url), create=True).close()
    return a, b


def _runs(url: str, folder: Path) -> list[tuple[str, bool, float, str | None, float]]:
    from agentmend.infrastructure.store.api import Store

    with Store(url, files_dir=folder) as store:
        rows = (
            store.connection()
            .execute(
                "SELECT agent, success, duration_ms, error, ts FROM executions "
                "WHERE source = 'run' ORDER BY id"
            )
            .fetchall()
        )
    return [(str(r[0]), bool(r[1]), float(r[2]), r[3], float(r[4])) for r in rows]


def _agent_runs(url: str, folder: Path) -> int:
    from agentmend.infrastructure.store.api import Store

    with Store(url, files_dir=folder) as store:
        (row,) = (
            store.connection()
            .execute(f"SELECT count(*) FROM executions WHERE agent = '{AGENT}'")
            .fetchall()
        )
    return int(row[0])


def _issues(url: str, folder: Path) -> list[tuple[str, str, float]]:
    from agentmend.infrastructure.store.api import Store

    with Store(url, files_dir=folder) as store:
        rows = (
            store.connection()
            .execute("SELECT agent, kind, opened_ts FROM monitoring_issues ORDER BY opened_ts")
            .fetchall()
        )
    return [(str(r[0]), str(r[1]), float(r[2])) for r in rows]


def detector_delay(
    runs: list[tuple[str, bool, float, str | None, float]], fault_ts: float
) -> tuple[int, float] | None:
    """The detector's own delay on these runs: research-agent's runs after the fault until a
    detector fed the same runs in the same order (and checked after each of the agent's runs)
    opens its issue, and the time of that run after the fault."""
    from agentmend.infrastructure.detection.detector import IssueDetector
    from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
    from agentmend.infrastructure.settings import load_settings

    settings = load_settings()
    with PerformanceMonitor(baseline_n=BASELINE_N, flush_interval_s=3600) as monitor:
        detector = IssueDetector(
            settings.detection_mode,
            false_alarm_rate=settings.false_alarm_rate,
            baseline_n=BASELINE_N,
            min_baseline_n=BASELINE_N,
            monitor=monitor,
            backoff_runs=settings.issue_backoff_runs,
            backoff_max_runs=max(settings.issue_backoff_runs, settings.issue_backoff_max_runs),
        )
        after = 0
        checked = False
        for agent, success, duration_ms, error, ts in runs:
            if ts >= fault_ts and not checked:
                detector.check()  # the baseline and the healthy runs judged before the fault
                checked = True
            monitor.record(agent, success=success, duration_ms=duration_ms, error=error)
            if checked and agent == AGENT:
                after += 1
                if any(issue.agent_name == AGENT for issue in detector.check()):
                    return after, ts - fault_ts
    return None


def trial(server: object, base: Path, number: int, *, kill_active: bool) -> Trial:
    from agentmend.infrastructure.releases.log import ReleaseLog
    from agentmend.infrastructure.store.api import Store
    from agentmend.loop.cycle import list_cycle_ids

    url = server.create_database()  # type: ignore[attr-defined]
    folder = base / f"trial-{number}"
    control = folder / "control"
    control.mkdir(parents=True)
    host_a, host_b = _workspaces(folder, url)
    children: list[Child] = []
    try:
        active = checker(host_a, url, folder / "checker-a.log")
        children.append(active)
        team = active.wait_for(r"checking team (\S+)'s runs")[1].group(1)
        standby = checker(host_b, url, folder / "checker-b.log")
        children.append(standby)
        standby.wait_for(r"standing by", timeout=30)
        workers = []
        for index in range(WORKERS):
            where = host_a if index < WORKERS // 2 else host_b
            seed = str(1000 * number + index)  # each trial and worker its own draws
            argv = [sys.executable, __file__, "worker", str(where), str(index), seed, str(control)]
            workers.append(Child(argv, {}, folder / f"worker-{index}.log"))
        children.extend(workers)
        for w in workers:
            w.wait_for("READY")
        deadline = time.monotonic() + TRIAL_TIMEOUT_S
        while _agent_runs(url, host_a) < 3 * BASELINE_N:  # a baseline, then healthy checks
            if time.monotonic() > deadline:
                raise TimeoutError("the workers recorded no baseline")
            time.sleep(0.2)
        (control / "fault").touch()
        fault_ts = float(workers[0].wait_for(r"FAULT (\S+)")[1].group(1))
        takeover_s = None
        judge = active
        if kill_active:
            active.process.kill()  # SIGKILL: the seat is never given back
            active.process.wait(timeout=20)
            killed = time.time()
            took = standby.wait_for(r"checking team")[0]
            takeover_s = took - killed
            judge = standby
        judge.wait_for(rf"issue \w+: {AGENT} ")
        canary = None
        with Store(url, files_dir=host_a) as store:
            releases = ReleaseLog(store, team, audit=False)
            deadline = time.monotonic() + CANARY_WAIT_S
            while canary is None and time.monotonic() < deadline:
                heads = releases.heads()
                if heads.canary is not None:
                    canary = releases.get(heads.canary).published_at
                time.sleep(0.05)
        time.sleep(4 * INTERVAL_S)  # a few more checks on the still failing worker
    finally:
        (control / "stop").touch()  # the workers end their loops
        for child in reversed(children):
            child.stop()

    while not judge.lines.empty():  # what it said until it stopped
        judge.seen.append(judge.lines.get())
    ended_as = re.compile(r"cycle for (\S+) ended: cycle \w+ on \S+: (\w+)(.*)")
    ends = [f"{m[1]} {m[2]}" for _, line in judge.seen if (m := ended_as.search(line))]
    for _, line in judge.seen:
        if (m := ended_as.search(line)) and m[2] not in ("kept", "not_reproduced"):
            print(f"  trial {number}: a cycle ended: {m[0]}")
    issues = _issues(url, host_a)
    on_agent = [i for i in issues if i[0] == AGENT]
    opened = on_agent[0][2]
    runs = _runs(url, host_a)
    window = [r for r in runs if r[0] == AGENT and fault_ts <= r[4] <= opened]
    own = detector_delay(runs, fault_ts)
    with Store(url, files_dir=host_a) as store:
        cycles = len(list_cycle_ids(store))
    return Trial(
        to_issue_s=opened - fault_ts,
        runs_to_issue=len(window),
        failed_to_issue=sum(1 for r in window if not r[1]),
        detector_runs=own[0] if own else None,
        detector_s=own[1] if own else None,
        to_canary_s=canary - fault_ts if canary is not None else None,
        kinds_on_agent=[i[1] for i in on_agent],
        issues_elsewhere=[
            f"{i[0]} {i[1]} {i[2] - fault_ts:+.1f} s" for i in issues if i[0] != AGENT
        ],
        cycle_ends=ends,
        cycles=cycles,
        takeover_s=takeover_s,
    )


def _show(number: int, t: Trial) -> None:
    own = (
        f"detector alone {t.detector_runs} runs, {t.detector_s:.2f} s; "
        f"+ one interval {t.detector_s + INTERVAL_S:.2f} s, + the batch "
        f"{t.detector_s + INTERVAL_S + BATCH_S:.2f} s"
        if t.detector_s is not None
        else "detector alone: no alarm on these runs"
    )
    canary = f"{t.to_canary_s:.2f} s" if t.to_canary_s is not None else "none"
    extra = f"; standby took over {t.takeover_s:.2f} s after SIGKILL" if t.takeover_s else ""
    print(
        f"  trial {number:>2}: issue after {t.to_issue_s:.2f} s, {t.runs_to_issue} runs "
        f"({t.failed_to_issue} failed) [{own}]; canary after {canary}; issues on {AGENT}: "
        f"{', '.join(t.kinds_on_agent)}; elsewhere: {', '.join(t.issues_elsewhere) or 'none'}; "
        f"cycles {t.cycles} ({'; '.join(t.cycle_ends)}){extra}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    from crash_child import quiet_logs
    from pg_server import PgServer

    quiet_logs()
    os.environ.update(ENV)
    os.environ["AGENTMEND_AUDIT_HMAC_KEY"] = secrets.token_hex(32)  # every host's, as printed
    started = time.monotonic()
    server = PgServer(fsync=True)
    base = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    results: list[Trial] = []
    ok = False
    try:
        print(
            f"{WORKERS} workers on 2 workspaces, ~{1 / RUN_PERIOD_S:.0f} runs/s each over 6 "
            f"agents; checker + standby every {INTERVAL_S} s, term {TERM_S} s; baseline "
            f"{BASELINE_N}; {FAULT} fault in {AGENT} on worker 0 (1 of {WORKERS} workers)",
            flush=True,
        )
        for number in range(1, args.trials + 1):
            results.append(trial(server, base, number, kill_active=False))
            _show(number, results[-1])
        killed = trial(server, base, args.trials + 1, kill_active=True)
        print("the active checker SIGKILLed right after the fault:")
        _show(args.trials + 1, killed)
        ok = True
    finally:
        server.stop()
        if ok:
            shutil.rmtree(base, ignore_errors=True)
        else:  # the children's logs, to see why
            print(f"the trials' folders and logs are kept in {base}", file=sys.stderr)

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}" if values else "-"

    bounds = [t.detector_s + INTERVAL_S for t in results if t.detector_s is not None]

    def within(slack: float) -> int:
        return sum(
            1 for t in results if t.detector_s is not None and t.to_issue_s <= t.detector_s + slack
        )

    print(f"over {len(results)} trials (medians):")
    print(
        f"  fault to issue {median([t.to_issue_s for t in results])} s, "
        f"{statistics.median(t.runs_to_issue for t in results):.0f} runs of {AGENT}; "
        f"the detector's own delay + one interval {median(bounds)} s; within it: "
        f"{within(INTERVAL_S)} of {len(results)}; within it + the writers' batch interval "
        f"({BATCH_S} s): {within(INTERVAL_S + BATCH_S)} of {len(results)}"
    )
    canaries = [t.to_canary_s for t in results if t.to_canary_s is not None]
    print(
        f"  fault to canary {median(canaries)} s (max "
        f"{max(canaries) if canaries else float('nan'):.2f}); published in {len(canaries)} "
        f"of {len(results)}"
    )
    all_trials = [*results, killed]
    duplicates = sum(len(t.kinds_on_agent) - len(set(t.kinds_on_agent)) for t in all_trials)
    kinds = sum(len(set(t.kinds_on_agent)) for t in all_trials)
    print(
        f"  duplicate issues (one agent, one kind, opened twice; {len(all_trials)} trials with "
        f"the killed one): {duplicates} (goal 0); distinct issues on {AGENT} {kinds} for "
        f"{len(all_trials)} faults (a failure and a latency chart can both fire); issues on "
        f"healthy agents {sum(len(t.issues_elsewhere) for t in all_trials)}; cycles "
        f"{sum(t.cycles for t in all_trials)}"
    )
    print(f"  standby after SIGKILL: {killed.takeover_s:.2f} s (goal within 10 s; term {TERM_S} s)")
    print(f"whole run {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
    else:
        main()
