"""Guarded rollout: how much harm a canary exposes against a full rollout, how rarely it errs.

Every figure is simulated in process (no model is called) and printed as a ratio or a rate
measured in the same run:

1. The guard against a full rollout (simulated traffic, see :class:`Traffic`): a harmful canary
   (2x, 4x, 8x, 16x stable's failure rate; 1.5x, 2x slower) at a 10 % share, judged by the
   rollout's own rule (:func:`~agentmend.infrastructure.releases.rollout_evidence.decide`,
   every 50 runs, as a worker's poll does), against the same release rolled out to every run
   and watched by the statistical detector (default settings: a 500-run baseline, false-alarm
   rate 0.001, checked every 10 runs). Reported: harmful runs served before the rollback
   divided by those served before the detector's alarm (medians and means over ``--trials``,
   each with a 95 % bootstrap interval; goal 1.1 at most) and harmful canaries promoted (goal 0).
2. Harmless canaries while the traffic drifts: the base failure rate and the duration mix
   drift during the canary (the share of hard questions grows from 10 % to about 40 %, and
   which users are active turns over), each user stays on one arm (routing by user id), and
   ``--harmless`` canaries of 500 canary runs are watched by the guard. Reported: the share
   rolled back by the guard, with its exact (Clopper-Pearson) upper 95 % bound, against the
   configured budget (``RolloutLimits.guard_alpha``).
3. Harmful canaries on the simulated team (``max_tokens`` trimmed below what some answers
   need), served by the simulated runtime: the same ratio with the real agent simulation.
4. Good canaries on the simulated team: a change that fixes a truncation fault (claimed fix:
   promoted once shown better), and a neutral edit (no claim: promoted once shown no worse
   within 2 points). Reported: runs and canary runs until promotion, share promoted.
5. Time from publication to every worker serving a release: worker processes
   (``tests/release_worker.py``) on one store, each publication stamped before the commit and
   each worker's switch stamped by the worker; the slowest worker counts. On SQLite the
   workers poll (every ``--interval`` s); on PostgreSQL (a throwaway server started from the
   binaries ``pg_config --bindir`` names, fsync on, sharing this machine's cores) a NOTIFY
   committed with the publication wakes them, measured once with the same poll interval and
   once with a 5 s poll, which only the notification can beat.

    python benchmarks/bench_rollout.py [--trials 200] [--harmless 200] [--seeds 10] [--first-seed 0]
        [--workers 4] [--publications 10] [--only-propagation] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
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
        step: list[tuple[str, bool, float]] = []
        for _ in range(STEP):
            arm = choose_arm(new_run_key(), share, salt)
            result = await runtime.run(canary if arm == "canary" else stable, f"concept {runs}")
            step.append((arm, result.success, result.duration_ms))
            runs += 1
        evidence.add_all(step)
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


# -- 1 and 2: simulated traffic -------------------------------------------------------------------

USERS = 2000
CANARY_RUNS = 500  # a harmless canary is watched for this many canary runs
FAILURE_MULTIPLES = (2.0, 4.0, 8.0, 16.0)
SLOWDOWNS = (1.5, 2.0)
EASY_FAIL, HARD_FAIL = 0.022, 0.082  # a 10 % hard mix fails 2.8 % of runs, as stable does
EASY_LOG_MS, HARD_LOG_MS = (math.log(15_000), 0.3), (math.log(40_000), 0.4)


class Traffic:
    """Simulated live traffic: users, each with a propensity for hard questions, routed by id.

    A hard question fails more often and takes longer. ``drift`` turns the traffic over during
    the canary: the share of hard questions grows from 10 % to about 40 % of runs and which
    users are active changes (each user's activity moves from one random weight to another).
    A harmful release fails ``multiple`` times as often as stable at the starting mix (an
    extra failure chance on every run) and takes ``slowdown`` times as long.
    """

    def __init__(self, seed: int, *, drift: bool = False) -> None:
        self.rng = random.Random(seed)
        self.drift = drift
        self.salt = f"rollout-{seed}"
        self.propensity = [self.rng.betavariate(2.0, 18.0) for _ in range(USERS)]
        self.active_from = [self.rng.expovariate(1.0) for _ in range(USERS)]
        self.active_to = [self.rng.expovariate(1.0) for _ in range(USERS)]
        self.arms: dict[int, str] = {}
        self._weights_at(0.0)

    def _weights_at(self, progress: float) -> None:
        total = 0.0
        self.cumulative: list[float] = []
        for a, b in zip(self.active_from, self.active_to, strict=True):
            total += a if not self.drift else a * (1.0 - progress) + b * progress
            self.cumulative.append(total)
        self.hardness = 1.0 + 3.0 * progress if self.drift else 1.0

    def progress(self, progress: float) -> None:
        """Move the drifting traffic to ``progress`` (0: start of the canary, 1: its end)."""
        if self.drift:
            self._weights_at(min(1.0, progress))

    def arm(self, user: int, share: float) -> str:
        found = self.arms.get(user)
        if found is None:
            found = self.arms[user] = choose_arm(f"user-{user}", share, self.salt)
        return found

    def run(
        self,
        *,
        harmful: bool,
        multiple: float = 1.0,
        slowdown: float = 1.0,
        share: float = DEFAULT_SHARE,
        routed: bool = True,
    ) -> tuple[str, bool, float]:
        """(arm, success, duration in ms) of one run; the harm applies to the canary arm only
        (``routed``) or to every run (a full rollout)."""
        rng = self.rng
        total = self.cumulative[-1]
        user = min(USERS - 1, bisect.bisect_left(self.cumulative, rng.random() * total))
        arm = self.arm(user, share) if routed else "canary"
        hard = rng.random() < min(0.95, self.propensity[user] * self.hardness)
        fail = HARD_FAIL if hard else EASY_FAIL
        mean, sd = HARD_LOG_MS if hard else EASY_LOG_MS
        duration = math.exp(rng.gauss(mean, sd))
        if harmful and arm == "canary":
            stable_rate = 0.9 * EASY_FAIL + 0.1 * HARD_FAIL
            extra = (multiple - 1.0) * stable_rate / (1.0 - stable_rate)
            fail = fail + (1.0 - fail) * extra
            duration *= slowdown
        return arm, rng.random() >= fail, duration


def guard_exposure(seed: int, multiple: float, slowdown: float) -> tuple[str, int]:
    """(decision, harmful canary runs served before it) for one simulated harmful canary."""
    traffic = Traffic(seed)
    limits = RolloutLimits()
    evidence = Evidence()
    runs = 0
    while runs < RUN_CAP:
        evidence.add_all(
            traffic.run(harmful=True, multiple=multiple, slowdown=slowdown) for _ in range(STEP)
        )
        runs += STEP
        decision, _, _ = decide(evidence, limits, claimed_fix=True, age_hours=0.0)
        if decision != "continue":
            return decision, evidence.canary_runs
    return "continue", evidence.canary_runs


def detector_full_exposure(seed: int, multiple: float, slowdown: float) -> int:
    """Harmful runs served to everyone before the statistical detector alarms."""
    settings = Settings()
    traffic = Traffic(seed + 50_000)
    with PerformanceMonitor(baseline_n=settings.baseline_n) as monitor:
        detector = IssueDetector(
            "statistical",
            monitor=monitor,
            false_alarm_rate=settings.false_alarm_rate,
            baseline_n=settings.baseline_n,
        )
        for _ in range(settings.baseline_n):
            _, ok, ms = traffic.run(harmful=False)
            monitor.record(AGENT, success=ok, duration_ms=ms)
        detector.check()
        exposed = 0
        while exposed < RUN_CAP:
            _, ok, ms = traffic.run(
                harmful=True, multiple=multiple, slowdown=slowdown, routed=False
            )
            monitor.record(AGENT, success=ok, duration_ms=ms)
            exposed += 1
            if exposed % 10 == 0 and detector.check():
                return exposed
    return exposed


def _bootstrap(
    guard: list[int], full: list[int], centre: object, rng: random.Random, rounds: int = 2000
) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of centre(guard) / centre(full) (trials resampled)."""
    assert callable(centre)
    ratios = []
    for _ in range(rounds):
        g = [rng.choice(guard) for _ in guard]
        f = [rng.choice(full) for _ in full]
        ratios.append(centre(g) / max(1e-9, centre(f)))
    ratios.sort()
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]


def exposure_table(trials: int, first_seed: int = 0) -> int:
    """Part 1; returns how many harmful canaries were promoted."""
    print(
        f"1. Harmful canaries (simulated traffic, share 10 %, guard budget "
        f"{RolloutLimits().guard_alpha:g}), {trials} trials each: canary runs exposed before the "
        "rollback / runs exposed by a full rollout before the detector's alarm"
    )
    print(
        f"  {'harm':<16} {'canary med':>10} {'full med':>9} {'ratio med [95 %]':>22}"
        f" {'canary mean':>11} {'full mean':>9} {'ratio mean [95 %]':>22} {'rolled back':>11}"
    )
    rng = random.Random(7)
    promoted = 0
    cases = [(f"{m:g}x failures", m, 1.0) for m in FAILURE_MULTIPLES]
    cases += [(f"{d:g}x slower", 1.0, d) for d in SLOWDOWNS]
    for label, multiple, slowdown in cases:
        seeds = range(first_seed, first_seed + trials)
        judged = [guard_exposure(s, multiple, slowdown) for s in seeds]
        full = [detector_full_exposure(s, multiple, slowdown) for s in seeds]
        guard = [n for _, n in judged]
        promoted += sum(d == "promote" for d, _ in judged)
        back = sum(d == "roll_back" for d, _ in judged)
        med = statistics.median(guard) / statistics.median(full)
        mean = statistics.mean(guard) / statistics.mean(full)
        med_lo, med_hi = _bootstrap(guard, full, statistics.median, rng)
        mean_lo, mean_hi = _bootstrap(guard, full, statistics.mean, rng)
        print(
            f"  {label:<16} {statistics.median(guard):>10,.1f} {statistics.median(full):>9,.1f}"
            f" {med:>6.2f} [{med_lo:.2f}, {med_hi:.2f}]{'':>2}"
            f" {statistics.mean(guard):>11,.1f} {statistics.mean(full):>9,.1f}"
            f" {mean:>6.2f} [{mean_lo:.2f}, {mean_hi:.2f}]{'':>2} {back:>5}/{trials:<5}"
        )
    print(f"  harmful canaries promoted: {promoted} of {trials * len(cases)} (goal 0)")
    return promoted


def _clopper_pearson_upper(k: int, n: int, level: float = 0.95) -> float:
    """The exact one-sided upper ``level`` bound of a binomial rate with k of n (bisection)."""
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        tail = sum(math.comb(n, i) * mid**i * (1.0 - mid) ** (n - i) for i in range(k + 1))
        lo, hi = (mid, hi) if tail > 1.0 - level else (lo, mid)
    return hi


def harmless_table(canaries: int, first_seed: int = 0) -> None:
    limits = RolloutLimits()
    print(
        f"\n2. Harmless canaries while the traffic drifts (simulated; users sticky to an arm):"
        f" {canaries} canaries of {CANARY_RUNS} canary runs"
    )
    rolled = {"failure_guard": 0, "slowness_guard": 0}
    start_rates, end_rates = [], []
    for seed in range(canaries):
        traffic = Traffic(100_000 + first_seed + seed, drift=True)
        evidence = Evidence()
        failed_first = failed_last = runs_first = runs_last = 0
        expected_runs = CANARY_RUNS / DEFAULT_SHARE
        while evidence.canary_runs < CANARY_RUNS:
            traffic.progress(evidence.canary_runs / CANARY_RUNS)
            step = [traffic.run(harmful=False) for _ in range(STEP)]
            evidence.add_all(step)
            fails = sum(not ok for _, ok, _ in step)
            if evidence.stable_runs + evidence.canary_runs <= expected_runs / 5:
                failed_first, runs_first = failed_first + fails, runs_first + STEP
            elif evidence.canary_runs >= 0.8 * CANARY_RUNS:
                failed_last, runs_last = failed_last + fails, runs_last + STEP
            decided_by = decide(evidence, limits, claimed_fix=True, age_hours=0.0)[2]
            if decided_by in rolled:  # rolled back by the guard (a promotion is not counted)
                rolled[decided_by] += 1
                break
        start_rates.append(failed_first / max(1, runs_first))
        end_rates.append(failed_last / max(1, runs_last))
    back = sum(rolled.values())
    print(
        f"  base failure rate drifted from {statistics.mean(start_rates):.1%} (first fifth) to"
        f" {statistics.mean(end_rates):.1%} (last fifth), on average"
    )
    print(
        f"  rolled back by the guard: {back} of {canaries} ({back / canaries:.1%}; failures"
        f" {rolled['failure_guard']}, slow runs {rolled['slowness_guard']}), upper 95 % bound"
        f" {_clopper_pearson_upper(back, canaries):.1%} against the budget {limits.guard_alpha:.0%}"
    )


# -- 3 and 4: the simulated team -------------------------------------------------------------------


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
    print(
        "\n3. Harmful canaries on the simulated team (share 10 %), medians over seeds:"
        " canary runs exposed / a full rollout's before the detector's alarm"
    )
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
    print("\n4. Good canaries on the simulated team: runs until promotion (median, p90)")
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
    print(f"  harmful canaries promoted: {promoted} of {len(harmful)} (goal 0)")


def propagation_table(
    workers: int, publications: int, interval: float, backends: list[str]
) -> None:
    print(f"\n5. Publication to every worker serving it: {workers} worker processes, one store")
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
    parser.add_argument("--trials", type=int, default=200, help="harmful canaries per harm")
    parser.add_argument("--harmless", type=int, default=200, help="harmless canaries")
    parser.add_argument("--seeds", type=int, default=10, help="runs of the simulated team")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="where parts 1 and 2 start their seeds (another value: trials never seen before)",
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--publications", type=int, default=10)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--only-propagation", action="store_true")
    args = parser.parse_args()
    configure_logging("ERROR", stream=sys.stderr)
    started = time.perf_counter()
    if not args.only_propagation:
        exposure_table(args.trials, args.first_seed)
        harmless_table(args.harmless, args.first_seed)
        harmful = harmful_table(args.seeds)
        promoted_table(harmful)
        good_table(args.seeds)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    propagation_table(args.workers, args.publications, args.interval, backends)
    print(f"\n({time.perf_counter() - started:.0f} s on this machine)")


if __name__ == "__main__":
    main()
