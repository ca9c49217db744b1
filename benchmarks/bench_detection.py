"""False alarms and detection delay: the per-agent guarantee; seed 003's rules against the CUSUMs.

First, exactly (no simulation; ``agentmend.infrastructure.detection.guarantee``): for baseline
sizes 30, 50, 100, 200, 500 and 2,000 and healthy success rates 0.5 .. 0.999, the failure chart's
expected false alarms per 1,000 healthy runs over the baselines such an agent produces (goal: at
most its budget, ``false_alarm_rate * failure_share`` = 0.95), and its expected detection delay for
a relative drop of 15 % and 30 % of the success rate against the optimal CUSUM that knows both
rates, at the same false-alarm rate (goal: at most 1.2x where the baseline is 500 or more).
Then, by simulation, the duration chart's (a bank of two CUSUMs,
``agentmend.infrastructure.detection.duration_bank``) false alarms per 1,000 healthy runs for
log-normal durations of log-sd 0.5 and 1.0 at the same baseline sizes (goal: at most its budget,
0.05). Delay by shift size, against the optimum and river's detectors: ``bench_shift_size.py``.

With ``--simulate``, a spot check through the public API follows (``PerformanceMonitor.record``
+ ``IssueDetector.check``) on simulated agents with log-normal durations (median 1 s, log-sd 0.4):

- false alarms per 1,000 healthy runs at healthy success rates 0.99, 0.95 and 0.90: each of
  ``--agents`` agents gets its own 500-run baseline, then ``--runs`` more healthy runs;
- detection delay for the drops 0.95 -> 0.70 and 0.95 -> 0.85: each of ``--trials`` agents
  gets a 500-run healthy baseline and then fails at the new rate; the delay is the number of
  runs after the change up to and including the first alarm (checked after every run), the
  zero-state delay, since the change comes as the baseline fills.

The yardstick is the optimal CUSUM for the same false-alarm rate: a Bernoulli CUSUM that knows the
true p0 and p1, with its threshold set for an in-control ARL of exactly 1,000 (interpolated between
the two integer thresholds around it), its delay computed exactly
(``agentmend.infrastructure.detection.cusum.bernoulli_arl``). The statistical detector has to
estimate p0 from its 500-run baseline and is tuned to one shift for both drops, so its ratio to that
optimum shows what not knowing them costs. Goals: at most 1 false alarm per 1,000 runs at every
healthy rate; delay within 1.1x of the optimum. Seeded; the exact table takes minutes to an hour
(each baseline's chart is calibrated exactly). Run: ``.venv/bin/python
benchmarks/bench_detection.py [--agents 100 --runs 10000 --trials 1500]``; ``--failure-share`` and
``--relative-drop`` measure the statistical detector with other settings (its defaults otherwise).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections import Counter
from typing import Any

from agentmend.infrastructure.detection.cusum import bernoulli_arl, integer_weights
from agentmend.infrastructure.detection.detector import DetectionMode, IssueDetector
from agentmend.infrastructure.detection.duration_bank import (
    DEFAULT_MEMBERS,
    calibrate_duration_bank,
)
from agentmend.infrastructure.detection.guarantee import failure_alarm_rate, failure_delay
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor

SEED = 20240901
BASELINE_N = 500
HEALTHY_RATES = (0.99, 0.95, 0.90)
DROPS = ((0.95, 0.70), (0.95, 0.85))
TARGET = 0.001
MODES: tuple[DetectionMode, ...] = ("rules", "statistical")
TABLE_SIZES = (30, 50, 100, 200, 500, 2000)
TABLE_SUCCESS = (0.5, 0.8, 0.9, 0.97, 0.99, 0.999)
TABLE_DROPS = (0.15, 0.30)
FAILURE_SHARE = 0.95


def exact_table(sizes: tuple[int, ...], rates: tuple[float, ...]) -> None:
    """The failure chart's exact false-alarm rate and delay per (baseline size, success rate)."""
    budget = TARGET * FAILURE_SHARE
    worst = 0.0
    print(
        f"Failure chart, exact: expected false alarms per 1,000 healthy runs (budget"
        f" {budget * 1000:.2f}) and the delay after a relative drop of the success rate"
    )
    print(
        f"(median and mean over the baselines, in runs; x: median over the optimal CUSUM"
        f" knowing both rates, at ARL0 {1 / budget:.0f})"
    )
    header = "".join(f" {f'drop {d:.0%}: median (x opt), mean':>34}" for d in TABLE_DROPS)
    print(f"  {'n':>5} {'success':>7} {'alarms/1000':>11}{header}")
    for n in sizes:
        for s in rates:
            p = 1.0 - s
            rate = failure_alarm_rate(n, p, budget) * 1000
            worst = max(worst, rate)
            cells = []
            for d in TABLE_DROPS:
                p1 = 1.0 - s * (1.0 - d)
                median, mean = failure_delay(n, p, p1, budget)
                best, _ = optimal_delay(p, p1, 1.0 / budget)
                cells.append(f" {median:>12.1f} ({median / best:5.2f}x) {mean:>10.1f}")
            print(f"  {n:>5} {s:>7} {rate:>11.3f}{''.join(cells)}", flush=True)
    print(f"  worst cell {worst:.3f} per 1,000 (budget {budget * 1000:.2f})")


def duration_table(sizes: tuple[int, ...], baselines: int, runs: int, seed: int) -> None:
    """The duration bank's false alarms per 1,000 healthy runs, by simulation.

    Each member restarts on its own alarm, as in the detector; a run on which any member alarms
    counts once.
    """
    budget = TARGET * (1.0 - FAILURE_SHARE)
    print()
    print(
        f"Duration chart (bank of {len(DEFAULT_MEMBERS)}), simulated: false alarms per 1,000"
        f" healthy runs ({baselines} baselines x {runs:,} runs per cell; budget"
        f" {budget * 1000:.2f})"
    )
    print(f"  {'n':>5} {'log-sd 0.5':>11} {'log-sd 1.0':>11}")
    rng = random.Random(seed)
    for n in sizes:
        cells = []
        for sd in (0.5, 1.0):
            alarms = 0
            for _ in range(baselines):
                bank = calibrate_duration_bank(
                    [rng.gauss(0.0, sd) for _ in range(n)], 1.0 / budget, 1.5
                )
                members = [(c.k, c.h, c.standardise) for c in bank.members]
                stats = [0.0] * len(members)
                gauss = rng.gauss
                for _ in range(runs):
                    y = gauss(0.0, sd)
                    alarmed = False
                    for j, (k, h, standardise) in enumerate(members):
                        stat = stats[j] + standardise(y) - k
                        if stat >= h:
                            alarmed, stat = True, 0.0
                        stats[j] = stat if stat > 0.0 else 0.0
                    alarms += alarmed
            cells.append(f" {alarms / (baselines * runs) * 1000:>11.3f}")
        print(f"  {n:>5}{''.join(cells)}", flush=True)


def _feed(monitor: PerformanceMonitor, rng: random.Random, agent: str, n: int, p: float) -> None:
    record, rand, gauss = monitor.record, rng.random, rng.gauss
    for _ in range(n):
        ok = rand() < p
        record(
            agent,
            success=ok,
            duration_ms=1000.0 * math.exp(gauss(0.0, 0.4)),
            error=None if ok else "ToolError: upstream returned 503",
        )


def _detectors(
    monitor: PerformanceMonitor, settings: dict[str, Any]
) -> dict[DetectionMode, IssueDetector]:
    return {
        "rules": IssueDetector("rules", monitor=monitor),
        "statistical": IssueDetector("statistical", monitor=monitor, **settings),
    }


def false_alarms(
    p: float, agents: int, runs: int, seed: int, settings: dict[str, Any]
) -> dict[DetectionMode, Counter[str]]:
    """Alarms by detector name over ``agents * runs`` healthy post-baseline runs, per mode."""
    rng = random.Random(seed)
    counts: dict[DetectionMode, Counter[str]] = {mode: Counter() for mode in MODES}
    block = 5_000
    with PerformanceMonitor(baseline_n=BASELINE_N, detection_backlog=2 * block) as monitor:
        detectors = _detectors(monitor, settings)
        for a in range(agents):
            agent = f"agent{a}"
            _feed(monitor, rng, agent, BASELINE_N, p)
            for detector in detectors.values():
                detector.check()  # the rules fire during the baseline too; not counted here
            done = 0
            while done < runs:
                step = min(block, runs - done)
                _feed(monitor, rng, agent, step, p)
                done += step
                for mode, detector in detectors.items():
                    counts[mode].update(r.detector for r in detector.check())
        assert all(d.missed_runs == 0 for d in detectors.values())
    return counts


def delays(
    p0: float, p1: float, trials: int, seed: int, settings: dict[str, Any], cap: int = 5_000
) -> dict[DetectionMode, list[int]]:
    """Runs after a success-rate change p0 -> p1 until the first alarm, per mode (capped)."""
    rng = random.Random(seed)
    found: dict[DetectionMode, list[int]] = {mode: [] for mode in MODES}
    with PerformanceMonitor(baseline_n=BASELINE_N) as monitor:
        detectors = _detectors(monitor, settings)
        for t in range(trials):
            agent = f"trial{t}"
            _feed(monitor, rng, agent, BASELINE_N, p0)
            for detector in detectors.values():
                detector.check()
            pending = set(MODES)
            n = 0
            while pending and n < cap:
                n += 1
                _feed(monitor, rng, agent, 1, p1)
                for mode in list(pending):
                    if any(r.agent_name == agent for r in detectors[mode].check()):
                        found[mode].append(n)
                        pending.discard(mode)
            for mode in pending:
                found[mode].append(cap)
    return found


def optimal_delay(p0: float, p1: float, arl0: float = 1000.0) -> tuple[float, float]:
    """(delay, achieved ARL0) of the Bernoulli CUSUM knowing p0 and p1, ARL0 = ``arl0``."""
    gain, loss = math.log(p1 / p0), math.log((1 - p0) / (1 - p1))
    up, down = integer_weights(gain, loss, max_unit=0.02)
    lo, hi = 1, 2
    while bernoulli_arl(up, down, hi, p0) < arl0:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if bernoulli_arl(up, down, mid, p0) < arl0:
            lo = mid
        else:
            hi = mid
    a_lo, a_hi = bernoulli_arl(up, down, lo, p0), bernoulli_arl(up, down, hi, p0)
    d_lo, d_hi = bernoulli_arl(up, down, lo, p1), bernoulli_arl(up, down, hi, p1)
    w = (math.log(arl0) - math.log(a_lo)) / (math.log(a_hi) - math.log(a_lo))
    return d_lo + w * (d_hi - d_lo), arl0


def _mean_ci(values: list[int]) -> str:
    mean = statistics.fmean(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:6.1f} +-{half:4.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100, help="baselines per healthy rate")
    parser.add_argument("--runs", type=int, default=10_000, help="healthy runs per agent")
    parser.add_argument("--trials", type=int, default=1500, help="trials per drop")
    parser.add_argument("--failure-share", type=float, help="IssueDetector failure_share")
    parser.add_argument("--relative-drop", type=float, help="IssueDetector relative_drop")
    parser.add_argument("--sizes", type=int, nargs="*", default=list(TABLE_SIZES))
    parser.add_argument("--baselines", type=int, default=100, help="duration-chart baselines")
    parser.add_argument("--duration-runs", type=int, default=10_000, help="runs per baseline")
    parser.add_argument("--simulate", action="store_true", help="also the simulated spot check")
    args = parser.parse_args()
    settings: dict[str, Any] = {
        key: value
        for key, value in (
            ("failure_share", args.failure_share),
            ("relative_drop", args.relative_drop),
        )
        if value is not None
    }
    started = time.perf_counter()
    exact_table(tuple(args.sizes), TABLE_SUCCESS)
    duration_table(tuple(args.sizes), args.baselines, args.duration_runs, SEED + 7)
    if not args.simulate:
        print(f"\n({time.perf_counter() - started:.0f} s)")
        return
    print()
    detector = IssueDetector(**settings)
    print(
        f"statistical detector: failure_share {detector.failure_share},"
        f" relative_drop {detector.relative_drop}"
    )

    print(f"False alarms per 1,000 healthy runs ({args.agents} agents x {args.runs:,} runs each,")
    print(f"each with its own {BASELINE_N}-run baseline; goal <= {TARGET * 1000:g})")
    print(f"  {'healthy success':>16} {'rules':>8} {'statistical':>12}   statistical by detector")
    for i, p in enumerate(HEALTHY_RATES):
        counts = false_alarms(p, args.agents, args.runs, SEED + i, settings)
        total = args.agents * args.runs / 1000
        split = ", ".join(f"{k} {v / total:.2f}" for k, v in sorted(counts["statistical"].items()))
        rules_split = ", ".join(
            f"{k[6:]} {v / total:.2f}" for k, v in sorted(counts["rules"].items())
        )
        print(
            f"  {p:>16.2f} {sum(counts['rules'].values()) / total:>8.2f}"
            f" {sum(counts['statistical'].values()) / total:>12.2f}   {split or '-'}"
        )
        print(f"  {'':>16} rules: {rules_split or '-'}")

    print()
    print(f"Detection delay, runs after the change (mean +- 95 % CI, {args.trials} trials each)")
    print(
        f"  {'drop':>12} {'rules':>14} {'statistical':>14} {'optimal':>8}"
        f" {'stat/opt':>9} {'rules/opt':>9}"
    )
    for j, (p0, p1) in enumerate(DROPS):
        found = delays(p0, p1, args.trials, SEED + 100 + j, settings)
        best, _ = optimal_delay(1 - p0, 1 - p1)
        stat = statistics.fmean(found["statistical"])
        rules = statistics.fmean(found["rules"])
        print(
            f"  {p0:.2f} -> {p1:.2f} {_mean_ci(found['rules']):>14} "
            f"{_mean_ci(found['statistical']):>14} {best:>8.1f} {stat / best:>9.2f}"
            f" {rules / best:>9.2f}"
        )
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
