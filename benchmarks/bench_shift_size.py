"""Detection delay by shift size, at a matched false-alarm rate: the charts, the optimum, river.

For shifts from half to twice each chart's design shift, the mean and median number of runs from
the change to the first alarm (the change comes right after a healthy 500-run baseline):

- failures (healthy failure rates 0.05 and 0.2; the chart is designed for a 15 % relative drop of
  the success rate, so the shifts are relative drops of 7.5 % .. 30 %), at the failure chart's
  budget (0.95 false alarms per 1,000 healthy runs);
- latency (log-normal durations of log-sd 0.5 and 1.0; slowdowns x1.25, x1.5 and x2, plus x1.22
  and x2.25, exactly half and twice the design's log-shift of x1.5), at the duration chart's
  budget (0.05 per 1,000).

Detectors, all at the same false-alarm rate:

- ``detector``: the statistical detector's chart as shipped (its baseline estimated from the 500
  runs; for latency the two-member bank of ``agentmend.infrastructure.detection.duration_bank``),
  by simulation; for failures also its exact mean over the Binomial(500, p0) baselines;
- ``single``: latency only, one chart tuned to x1.5 with the whole duration budget (the design
  before the bank), by simulation;
- ``known p0`` (failures, exact, as a ratio to the optimum): the shipped design built on the true
  healthy rate, its threshold for exactly the budget: the chart with what the peers are given;
- ``optimal``: the CUSUM that knows the healthy and the changed distribution, tuned to this
  very shift (failures: exact, threshold interpolated to the ARL0; latency: a normal CUSUM with
  Siegmund's threshold, simulated);
- river's ``PageHinkley`` (one-sided, ``mode="up"``, default delta, alpha and min_instances; its
  threshold calibrated) and ``ADWIN`` (two-sided by construction; its delta calibrated), each
  calibrated by simulation on healthy streams to the same false-alarm rate, then fed the 500
  healthy runs and the changed stream (failures as 0/1, latency as log-durations).

The peers' thresholds are calibrated on healthy streams of the *true* healthy distribution, so
they bear none of the cost of estimating it that the detector's per-agent promise charges it
(``guarantee.py``); the fair match for them is the ``known p0`` column, and what no chart can
do with an estimated baseline is in ``bench_shift_bound.py``.

Page-Hinkley's calibration uses a replica of river's recursion (checked against river on a
stream before use) because it needs millions of updates; every delay is measured with river's
own objects. Seeded. Run: ``.venv/bin/python benchmarks/bench_shift_size.py [--trials 400
--calibration 200]`` (a few minutes at the defaults; the calibration noise is about
``1 / sqrt(calibration)``).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from functools import partial

from river.drift import ADWIN, PageHinkley

from agentmend.infrastructure.detection.cusum import (
    NormalChart,
    bernoulli_arl,
    calibrate_normal,
    integer_weights,
    siegmund_arl,
)
from agentmend.infrastructure.detection.duration_bank import DurationBank, calibrate_duration_bank
from agentmend.infrastructure.detection.guarantee import failure_chart, failure_delay

SEED = 20260115
BASELINE_N = 500
FAILURE_BUDGET = 0.001 * 0.95
DURATION_BUDGET = 0.001 * 0.05
DESIGN_DROP = 0.15
DESIGN_SLOWDOWN = 1.5
P0S = (0.05, 0.2)
MULTIPLIERS = (0.5, 0.75, 1.0, 1.5, 2.0)
LOG_SDS = (0.5, 1.0)
SLOWDOWNS = (1.5**0.5, 1.25, 1.5, 2.0, 1.5**2)
CAP = 50_000

Sampler = Callable[[random.Random], float]


def ph_threshold(sample: Sampler, arl: float, streams: int, rng: random.Random) -> float:
    """The Page-Hinkley threshold with ``arl`` runs per false alarm on ``sample``'s stream.

    River's detector resets completely after an alarm, so the alarm rate is one over the mean
    first-alarm time from a fresh start. Before its first alarm the statistic does not depend
    on the threshold, so one pass per stream records when the statistic first exceeds every
    level; streams are cut at ``4 * arl`` and the mean is estimated as time watched over alarms
    seen (exact for a geometric run length, which the tail of a CUSUM's is).
    """
    ref = PageHinkley(mode="up")
    delta, alpha, min_n = ref.delta, ref.alpha, ref.min_instances
    length = int(4 * arl)
    records: list[list[tuple[float, int]]] = []
    for _ in range(streams):
        mean, s, s_min, best = 0.0, 0.0, math.inf, -math.inf
        rec: list[tuple[float, int]] = []
        for t in range(1, length + 1):
            x = sample(rng)
            n = t
            mean += (x - mean) / n
            s = alpha * s + (x - mean) - delta
            if s < s_min:
                s_min = s
            if n >= min_n and s - s_min > best:
                best = s - s_min
                rec.append((best, t))
        records.append(rec)

    def mean_run(level: float) -> float:
        watched, alarms = 0, 0
        for rec in records:
            t = next((t for v, t in rec if v > level), None)
            watched += t if t is not None else length
            alarms += t is not None
        return watched / max(alarms, 1)

    lo, hi = 0.0, 1.0
    while mean_run(hi) < arl:
        lo, hi = hi, hi * 2.0
    for _ in range(40):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if mean_run(mid) < arl else (lo, mid)
    _check_replica(sample, rng)
    return hi


def _check_replica(sample: Sampler, rng: random.Random) -> None:
    """River's PageHinkley and the replica agree on when a stream first crosses a level."""
    ref = PageHinkley(mode="up")
    xs = [sample(rng) for _ in range(5000)]
    mean, s, s_min = 0.0, 0.0, math.inf
    path: list[float] = []
    for n, x in enumerate(xs, start=1):
        mean += (x - mean) / n
        s = ref.alpha * s + (x - mean) - ref.delta
        s_min = min(s_min, s)
        path.append(s - s_min if n >= ref.min_instances else -math.inf)
    level = max(path) / 2.0
    replica_t = next(i + 1 for i, v in enumerate(path) if v > level)
    detector = PageHinkley(mode="up", threshold=level)
    river_t = next((i + 1 for i, x in enumerate(xs) if _update(detector, x)), None)
    if river_t != replica_t:
        raise SystemExit(f"Page-Hinkley replica disagrees with river: {replica_t} vs {river_t}")


def _update(detector: PageHinkley | ADWIN, x: float) -> bool:
    detector.update(x)  # type: ignore[no-untyped-call]  # river leaves it unannotated
    return bool(detector.drift_detected)


def adwin_delta(sample: Sampler, arl: float, alarms: int, seed: int) -> tuple[float, float]:
    """ADWIN's delta giving ``arl`` runs per false alarm, and the runs per alarm it gives.

    Bisection on log delta with common random numbers. ADWIN keeps running after an alarm (it
    drops the older part of its window), so the rate is alarms over runs on one long healthy
    stream of ``alarms * arl`` runs. Its bound is conservative: on some streams even its most
    sensitive setting (delta 0.99) raises fewer false alarms than the budget; it is then
    compared at that setting, with fewer false alarms than the others (which favours them).
    """
    runs = int(alarms * arl)

    def rate(delta: float) -> float:
        rng = random.Random(seed)
        detector = _adwin(delta)
        return sum(_update(detector, sample(rng)) for _ in range(runs)) / runs

    lo, hi = math.log(1e-14), math.log(0.99)
    if rate(0.99) <= 1.0 / arl:
        lo = hi
    for _ in range(14 if lo < hi else 0):
        mid = (lo + hi) / 2.0
        lo, hi = (lo, mid) if rate(math.exp(mid)) > 1.0 / arl else (mid, hi)
    delta = math.exp(hi)
    achieved = rate(delta)
    return delta, (1.0 / achieved if achieved > 0 else math.inf)


def _adwin(delta: float) -> ADWIN:
    return ADWIN(delta=delta)  # type: ignore[no-untyped-call]  # river leaves it unannotated


def peer_delay(
    make: Callable[[], PageHinkley | ADWIN], pre: list[float], after: Sampler, rng: random.Random
) -> int:
    """Runs after the change to a river detector's first alarm (it first sees the baseline)."""
    detector = make()
    for x in pre:
        _update(detector, x)
    for t in range(1, CAP + 1):
        if _update(detector, after(rng)):
            return t
    return CAP


def bernoulli_run(up: int, down: int, threshold: int, p: float, rng: random.Random) -> int:
    """Runs to the integer failure chart's first alarm from 0, failure rate ``p``."""
    s, rand = 0, rng.random
    for t in range(1, CAP + 1):
        s = s + up if rand() < p else max(0, s - down)
        if s >= threshold:
            return t
    return CAP


def optimal_failure(p0: float, p1: float, arl: float) -> tuple[float, int, int, int]:
    """(exact mean delay at ARL0 ``arl`` interpolated, up, down, integer threshold above it)."""
    gain, loss = math.log(p1 / p0), math.log((1 - p0) / (1 - p1))
    up, down = integer_weights(gain, loss, max_unit=0.02)
    return interpolated_failure(up, down, p0, p1, arl)


def known_failure(p0: float, p1: float, arl: float) -> float:
    """Exact mean delay of the shipped design built on the true ``p0``, at ARL0 ``arl``."""
    design = p0 + DESIGN_DROP * (1 - p0)
    gain, loss = math.log(design / p0), math.log((1 - p0) / (1 - design))
    up, down = integer_weights(gain, loss)
    return interpolated_failure(up, down, p0, p1, arl)[0]


def interpolated_failure(
    up: int, down: int, p0: float, p1: float, arl: float
) -> tuple[float, int, int, int]:
    """The integer chart's exact delay at ``p1`` with its ARL0 at ``p0`` interpolated to ``arl``."""
    lo, hi = 1, 2
    while bernoulli_arl(up, down, hi, p0) < arl:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if bernoulli_arl(up, down, mid, p0) < arl else (lo, mid)
    a_lo, a_hi = bernoulli_arl(up, down, lo, p0), bernoulli_arl(up, down, hi, p0)
    d_lo, d_hi = bernoulli_arl(up, down, lo, p1), bernoulli_arl(up, down, hi, p1)
    w = (math.log(arl) - math.log(a_lo)) / (math.log(a_hi) - math.log(a_lo))
    return d_lo + w * (d_hi - d_lo), up, down, hi


def normal_run(charts: list[NormalChart], mean: float, sd: float, rng: random.Random) -> int:
    """Runs to the first alarm of any chart (each from 0) on N(mean, sd) log-durations."""
    stats = [0.0] * len(charts)
    for t in range(1, CAP + 1):
        y = rng.gauss(mean, sd)
        for j, c in enumerate(charts):
            s = stats[j] + c.standardise(y) - c.k
            if s >= c.h:
                return t
            stats[j] = s if s > 0.0 else 0.0
    return CAP


def _cell(values: list[int]) -> str:
    return f"{statistics.fmean(values):7.1f} {statistics.median(values):6.0f}"


def failure_table(trials: int, calibration: int) -> None:
    arl = 1.0 / FAILURE_BUDGET
    print(f"Failures: runs to the alarm, mean and median ({trials} trials; ARL0 {arl:.0f})")
    print(
        f"  {'p0':>4} {'shift':>5} {'p1':>5} {'optimal':>14} {'detector':>14} {'exact':>6}"
        f" {'x opt':>5} {'known p0':>8} {'PageHinkley':>14} {'ADWIN':>14}  fastest non-oracle"
    )
    rng = random.Random(SEED)
    for p0 in P0S:

        def healthy(r: random.Random, p: float = p0) -> float:
            return 1.0 if r.random() < p else 0.0

        threshold = ph_threshold(healthy, arl, calibration, rng)
        delta, adwin_arl = adwin_delta(healthy, arl, calibration, SEED + 1)
        print(
            f"  (p0 {p0}: Page-Hinkley threshold {threshold:.3f}; ADWIN delta {delta:.3g},"
            f" {adwin_arl:.0f} runs per false alarm)"
        )
        for m in MULTIPLIERS:
            p1 = p0 + DESIGN_DROP * m * (1 - p0)

            def changed(r: random.Random, p: float = p1) -> float:
                return 1.0 if r.random() < p else 0.0

            opt_mean, up, down, h = optimal_failure(p0, p1, arl)
            opt = [bernoulli_run(up, down, h, p1, rng) for _ in range(trials)]
            ours: list[int] = []
            ph: list[int] = []
            ad: list[int] = []
            for _ in range(trials):
                pre = [healthy(rng) for _ in range(BASELINE_N)]
                chart = failure_chart(int(sum(pre)), BASELINE_N, FAILURE_BUDGET)
                ours.append(
                    CAP
                    if chart is None
                    else bernoulli_run(chart.up, chart.down, chart.threshold, p1, rng)
                )
                ph.append(
                    peer_delay(
                        partial(PageHinkley, mode="up", threshold=threshold), pre, changed, rng
                    )
                )
                ad.append(peer_delay(partial(_adwin, delta), pre, changed, rng))
            _, exact = failure_delay(BASELINE_N, p0, p1, FAILURE_BUDGET)
            means = {
                "detector": statistics.fmean(ours),
                "Page-Hinkley": statistics.fmean(ph),
                "ADWIN": statistics.fmean(ad),
            }
            print(
                f"  {p0:>4} {m:>4}x {p1:>5.3f} {opt_mean:7.1f} {statistics.median(opt):6.0f}"
                f" {_cell(ours)} {exact:6.1f} {exact / opt_mean:5.2f}"
                f" {known_failure(p0, p1, arl) / opt_mean:8.2f} {_cell(ph)} {_cell(ad)}"
                f"  {min(means, key=lambda k: means[k])}",
                flush=True,
            )


def duration_table(trials: int, calibration: int) -> None:
    arl = 1.0 / DURATION_BUDGET
    print()
    print(f"Latency: runs to the alarm, mean and median ({trials} trials; ARL0 {arl:.0f})")
    print(
        f"  {'log-sd':>6} {'slowdown':>8} {'optimal':>14} {'detector':>14} {'x opt':>5}"
        f" {'single':>14} {'x opt':>5} {'PageHinkley':>14} {'ADWIN':>14}  fastest non-oracle"
    )
    rng = random.Random(SEED + 2)
    for sd in LOG_SDS:

        def healthy(r: random.Random, s: float = sd) -> float:
            return r.gauss(0.0, s)

        threshold = ph_threshold(healthy, arl, max(20, calibration // 4), rng)
        delta, adwin_arl = adwin_delta(healthy, arl, max(20, calibration // 4), SEED + 3)
        print(
            f"  (log-sd {sd}: Page-Hinkley threshold {threshold:.3f}; ADWIN delta {delta:.3g},"
            f" {adwin_arl:.0f} runs per false alarm)"
        )
        for f in SLOWDOWNS:
            shift = math.log(f)

            def changed(r: random.Random, s: float = sd, mu: float = shift) -> float:
                return r.gauss(mu, s)

            oracle = _oracle_normal(shift / sd, arl, sd)
            opt = [normal_run([oracle], shift, sd, rng) for _ in range(trials)]
            ours: list[int] = []
            single: list[int] = []
            ph: list[int] = []
            ad: list[int] = []
            for _ in range(trials):
                pre = [healthy(rng) for _ in range(BASELINE_N)]
                bank: DurationBank = calibrate_duration_bank(pre, arl, DESIGN_SLOWDOWN)
                ours.append(normal_run(list(bank.members), shift, sd, rng))
                one = calibrate_normal(pre, arl, math.log(DESIGN_SLOWDOWN))
                single.append(normal_run([one], shift, sd, rng))
                ph.append(
                    peer_delay(
                        partial(PageHinkley, mode="up", threshold=threshold), pre, changed, rng
                    )
                )
                ad.append(peer_delay(partial(_adwin, delta), pre, changed, rng))
            best = statistics.fmean(opt)
            means = {
                "detector": statistics.fmean(ours),
                "single": statistics.fmean(single),
                "Page-Hinkley": statistics.fmean(ph),
                "ADWIN": statistics.fmean(ad),
            }
            print(
                f"  {sd:>6} {f:>7.2f}x {_cell(opt)} {_cell(ours)} {means['detector'] / best:5.2f}"
                f" {_cell(single)} {means['single'] / best:5.2f} {_cell(ph)} {_cell(ad)}"
                f"  {min(means, key=lambda k: means[k])}",
                flush=True,
            )


def _oracle_normal(delta: float, arl: float, sd: float) -> NormalChart:
    """The normal CUSUM knowing mean 0 and ``sd``, tuned to a shift of ``delta`` sd."""
    k = delta / 2.0
    lo, hi = 0.0, 1.0
    while siegmund_arl(k, hi) < arl:
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if siegmund_arl(k, mid) < arl else (lo, mid)
    wide = 1e9
    return NormalChart(0.0, sd, k, hi, -wide, wide, wide, arl, 2.0 * k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400, help="changes per shift")
    parser.add_argument("--calibration", type=int, default=200, help="peer calibration size")
    parser.add_argument("--only", choices=("failures", "latency"), help="one table only")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.only != "latency":
        failure_table(args.trials, args.calibration)
    if args.only != "failures":
        duration_table(args.trials, args.calibration)
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
