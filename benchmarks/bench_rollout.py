"""Guarded rollout on the simulated team: how fast canaries are judged, how little harm they do.

Four parts, each printed as a table:

1. Harmful canaries. Generated harmful changes to the research agent (``max_tokens`` trimmed
   below what some answers need: no eval case is that long, so verification would have kept
   them), each served to 10 % of live runs routed by a random run id, judged by the rollout's
   own rule (:func:`~agentmend.infrastructure.releases.rollout_evidence.decide`, every 50 runs, as a
   worker's poll does). Reported: runs until the rollback, canary runs exposed to the harmful
   release, and, for the same change rolled out to every run at once, the runs exposed before
   the statistical detector (default settings: a 500-run baseline, false-alarm rate 0.001)
   fired. Goal: canary exposure at most a tenth of the full rollout's.
2. Good canaries: a change that fixes a truncation fault (claimed fix: promoted once shown
   better), and a neutral edit (no claim: promoted once shown no worse within 2 points, else
   rolled back as "not proven" at the limits). Reported: runs until promotion.
3. The share of harmful canaries promoted (goal: within the test's alpha, 0.05).
4. Time from publication to every worker serving a release: worker processes
   (``tests/release_worker.py``) on one store, each publication stamped before the commit and
   each worker's switch stamped by the worker; the slowest worker counts. On SQLite the
   workers poll (every ``--interval`` s); on PostgreSQL (a throwaway server started from the
   binaries ``pg_config --bindir`` names, fsync on, sharing this machine's cores) a NOTIFY
   committed with the publication wakes them, measured once with the same poll interval and
   once with a 5 s poll, which only the notification can beat.

    python benchmarks/bench_rollout.py [--seeds 10] [--workers 4] [--publications 10]
        [--only-propagation] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # pg_server: the tests' throwaway PostgreSQL server

from agentmend.infrastructure.definitions.spec import AgentSpec  # noqa: E402
from agentmend.infrastructure.detection.detector import IssueDetector  # noqa: E402
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor  # noqa: E402
from agentmend.infrastructure.principal import Principal  # noqa: E402
from agentmend.infrastructure.releases.log import ReleaseLog  # noqa: E402
from agentmend.infrastructure.releases.rollout_evidence import Evidence, RolloutLimits, decide  # noqa: E402
from agentmend.infrastructure.releases.routing import DEFAULT_SHARE, choose_arm, new_run_key  # noqa: E402
from agentmend.infrastructure.settings import Settings  # noqa: E402
from agentmend.infrastructure.simulation import SimulatedRuntime, copy_team  # noqa: E402
from agentmend.infrastructure.simulation.faults import Fault, FaultKind  # noqa: E402
from agentmend.infrastructure.store.api import Store  # noqa: E402
from agentmend.infrastructure.structured_logger import configure_logging  # noqa: E402

AGENT = "research-agent"
STABLE = AgentSpec.from_file(REPO / "infrastructure" / "simulated_team" / f"{AGENT}.md")
HARMFUL_MAX_TOKENS = (1010, 990, 970, 950, 900)  # about 11 %, 19 %, 27 %, 34 %, 52 % failures
STEP = 50  # runs between two decisions (a worker's poll)
RUN_CAP = 200_000


@dataclass(frozen=True, slots=True)
class Judged:
    decision: str
    reason: str
    runs: int
    canary_runs: int


async def judge(
    stable: AgentSpec,
    canary: AgentSpec,
    seed: int,
    *,
    claimed_fix: bool,
    fault: Fault | None = None,
    share: float = DEFAULT_SHARE,
) -> Judged:
    """Serve live runs to both arms until the rollout's rule decides."""
    runtime = SimulatedRuntime(seed)
    if fault is not None:
        runtime.inject(AGENT, fault)
    limits = RolloutLimits()
    evidence = Evidence()
    salt = f"rollout-{seed}"
    runs = 0
    while runs < RUN_CAP:
        for _ in range(STEP):
            arm = choose_arm(new_run_key(), share, salt)
            result = await runtime.run(canary if arm == "canary" else stable, f"concept {runs}")
            evidence.add(arm, result.success, result.duration_ms)
            runs += 1
        decision, reason, _ = decide(evidence, limits, claimed_fix=claimed_fix, age_hours=0.0)
        if decision != "continue":
            return Judged(decision, reason, runs, evidence.canary_runs)
    return Judged("continue", "cap", runs, evidence.canary_runs)


async def detector_exposure(canary: AgentSpec, seed: int) -> int:
    """Runs of ``canary`` served to everyone before the statistical detector fires."""
    settings = Settings()
    runtime = SimulatedRuntime(seed + 10_000)
    with PerformanceMonitor(baseline_n=settings.baseline_n) as monitor:
        detector = IssueDetector(
            "statistical",
            monitor=monitor,
            false_alarm_rate=settings.false_alarm_rate,
            baseline_n=settings.baseline_n,
        )
        for i in range(settings.baseline_n):
            result = await runtime.run(STABLE, f"concept {i}")
            monitor.record(AGENT, success=result.success, duration_ms=result.duration_ms)
        detector.check()
        exposed = 0
        while exposed < RUN_CAP:
            result = await runtime.run(canary, f"concept {exposed}")
            monitor.record(AGENT, success=result.success, duration_ms=result.duration_ms)
            exposed += 1
            if exposed % 10 == 0 and detector.check():
                return exposed
    return exposed


def failure_rate(spec: AgentSpec, runs: int = 4000) -> float:
    runtime = SimulatedRuntime(99)

    async def go() -> float:
        failed = 0
        for i in range(runs):
            failed += not (await runtime.run(spec, f"concept {i}")).success
        return failed / runs

    return asyncio.run(go())


def _q(values: list[int] | list[float], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def harmful_table(seeds: int) -> list[Judged]:
    print("1. Harmful canaries (share 10 %, margin 2 points, alpha 0.05), medians over seeds")
    print(
        f"  {'max_tokens':>10} {'fail rate':>9} {'runs to rollback':>17} {'canary exposed':>15}"
        f" {'full rollout exposed':>21} {'ratio':>6} {'rolled back':>12}"
    )
    base = failure_rate(STABLE)
    every: list[Judged] = []
    for max_tokens in HARMFUL_MAX_TOKENS:
        canary = STABLE.with_changes(max_tokens=max_tokens)
        judged = [asyncio.run(judge(STABLE, canary, s, claimed_fix=True)) for s in range(seeds)]
        full = [asyncio.run(detector_exposure(canary, s)) for s in range(seeds)]
        every.extend(judged)
        exposed = statistics.median(j.canary_runs for j in judged)
        total = statistics.median(j.runs for j in judged)
        full_median = statistics.median(full)
        back = sum(j.decision == "roll_back" for j in judged)
        print(
            f"  {max_tokens:>10} {failure_rate(canary):>8.0%} {total:>17,.0f} {exposed:>15,.0f}"
            f" {full_median:>21,.0f} {exposed / full_median:>6.2f} {back:>6}/{seeds:<5}"
        )
    print(f"  (stable release: max_tokens 2048, failure rate {base:.1%})")
    return every


def good_table(seeds: int) -> None:
    print("\n2. Good canaries: runs until promotion (median, p90 over seeds)")
    print(
        f"  {'change':<44} {'runs':>8} {'p90':>8} {'canary runs':>12} {'promoted':>9}"
        f" {'not proven':>11}"
    )
    cases = [
        ("fix, fault: answers 2.6x (claimed fix)", Fault(FaultKind.TRUNCATION, token_factor=2.6),
         STABLE.with_changes(max_tokens=4096), True),
        ("fix, fault: answers 2.2x (claimed fix)", Fault(FaultKind.TRUNCATION, token_factor=2.2),
         STABLE.with_changes(max_tokens=4096), True),
        ("neutral edit, no claim (shown no worse)", None,
         STABLE.with_changes(temperature=0.25), False),
    ]  # fmt: skip
    for label, fault, canary, claimed in cases:
        n = seeds if claimed else max(2, seeds // 3)
        judged = [
            asyncio.run(judge(STABLE, canary, s, claimed_fix=claimed, fault=fault))
            for s in range(n)
        ]
        promoted = [j for j in judged if j.decision == "promote"]
        runs = [j.runs for j in promoted] or [0]
        print(
            f"  {label:<44} {statistics.median(runs):>8,.0f} {_q(runs, 0.9):>8,.0f}"
            f" {statistics.median(j.canary_runs for j in promoted) if promoted else 0:>12,.0f}"
            f" {len(promoted):>4}/{n:<4} {sum(j.reason == 'not_proven' for j in judged):>11}"
        )


def promoted_table(harmful: list[Judged]) -> None:
    promoted = sum(j.decision == "promote" for j in harmful)
    print("\n3. Harmful canaries promoted (goal: at most alpha = 0.05)")
    print(f"  {promoted} of {len(harmful)} ({promoted / len(harmful):.1%})")


def propagation_table(
    workers: int, publications: int, interval: float, backends: list[str]
) -> None:
    print(f"\n4. Publication to every worker serving it: {workers} worker processes, one store")
    print(
        f"  {'backend':<11} {'wake':<16} {'poll':>6} {'publications':>12} {'median':>9}"
        f" {'p95':>9} {'max':>9}  (slowest worker each)"
    )
    for backend in backends:
        if backend == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                location = str(Path(tmp) / "agentmend.db")
                slowest = _propagation(location, Path(tmp), workers, publications, interval)
            _propagation_row("SQLite", "poll", interval, slowest)
            continue
        from pg_server import PgServer, PgUnavailable

        try:
            server = PgServer(fsync=True)
        except PgUnavailable as exc:
            print(f"  {'PostgreSQL':<11} skipped: {exc}")
            continue
        try:
            for poll in (interval, 5.0):
                with tempfile.TemporaryDirectory() as tmp:
                    url = server.create_database()
                    slowest = _propagation(url, Path(tmp), workers, publications, poll)
                _propagation_row("PostgreSQL", "LISTEN/NOTIFY", poll, slowest)
        finally:
            server.stop()


def _propagation_row(backend: str, wake: str, poll: float, slowest: list[float]) -> None:
    print(
        f"  {backend:<11} {wake:<16} {poll:>5g}s {len(slowest):>12} "
        f"{statistics.median(slowest):>8.3f}s {_q(slowest, 0.95):>8.3f}s {max(slowest):>8.3f}s"
    )


def _propagation(
    location: str, root: Path, workers: int, publications: int, interval: float
) -> list[float]:
    """Publication to the slowest worker serving it, for each of ``publications``."""
    files_dir = root / "files"
    source = copy_team(root / "team")
    store = Store(location, files_dir=files_dir)
    log = ReleaseLog(store, "bench")
    who = Principal("bench", "bench")
    log.publish_directory(source, by=who)
    procs = []
    for k in range(workers):
        args = [sys.executable, str(REPO / "tests" / "release_worker.py"), location]
        args += ["bench", str(root / f"w{k}"), str(root / f"w{k}.json")]
        args += ["--interval", str(interval), "--seed", str(k), "--files-dir", str(files_dir)]
        procs.append(subprocess.Popen(args, stderr=subprocess.DEVNULL))
    try:
        slowest: list[float] = []
        for n in range(publications):
            _wait(lambda: all(_status(root, k).get("stable") for k in range(workers)))
            path = source / f"{AGENT}.md"
            path.write_text(path.read_text() + f"\n<!-- publication {n} -->\n")
            published = time.time()
            version = log.publish_directory(source, by=who, stable=True).version
            _wait(
                lambda: all(
                    _status(root, k).get("stable") == version  # noqa: B023
                    for k in range(workers)
                )
            )
            served = [_first_served(root, k, version) for k in range(workers)]
            slowest.append(max(served) - published)
            time.sleep(random.uniform(0.0, min(interval, 0.2)))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        store.close()
    return slowest


def _status(root: Path, k: int) -> dict[str, object]:
    try:
        data: dict[str, object] = json.loads((root / f"w{k}.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data


def _first_served(root: Path, k: int, version: int) -> float:
    first = _status(root, k)["first_served"]
    assert isinstance(first, dict)
    return float(first[str(version)])


def _wait(check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    assert callable(check)
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("workers did not follow")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--publications", type=int, default=10)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--only-propagation", action="store_true")
    args = parser.parse_args()
    configure_logging("ERROR", stream=sys.stderr)
    started = time.perf_counter()
    if not args.only_propagation:
        harmful = harmful_table(args.seeds)
        good_table(args.seeds)
        promoted_table(harmful)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    propagation_table(args.workers, args.publications, args.interval, backends)
    print(f"\n({time.perf_counter() - started:.0f} s on this machine)")


if __name__ == "__main__":
    main()
