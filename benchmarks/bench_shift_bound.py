"""What a 500-run baseline costs in delay, whatever the threshold rule: lower bounds by shift size.

``bench_shift_size.py`` measures the charts against the CUSUM that knows the true rates; this
script asks how close *any* chart can come once the healthy rate has to be estimated from the
baseline and the false-alarm promise has to hold for every agent (``guarantee.py``), so that a
gap left in that table can be told apart from a gap no detector of the kind could close.

Failures (exact, no simulation; healthy failure rates 0.05 and 0.2, shifts of half to twice the
design's 15 % relative drop of the success rate, budget 0.95 false alarms per 1,000 runs), as
mean delays over the Binomial(500, p0) baselines divided by the optimum's:

- ``known p0``: the shipped design (tuned to a 15 % drop) built on the *true* p0, its threshold
  for exactly the budget: what the design alone costs; ``@margin``: the same with the budget
  scaled by ``ESTIMATION_MARGIN``;
- ``shipped``: the failure chart as shipped (``guarantee.failure_delay``);
- ``LP``: a lower bound on every threshold rule, even randomised, for integer CUSUMs whose
  design is computed from the baseline (``design 15 %``: the shipped one; ``design = shift``:
  tuned to the very shift measured, which no detector knows). A rule is a distribution over
  thresholds for each baseline count ``x``; the linear program minimises the mean delay at this
  ``p0`` subject to the expected false-alarm rate over the Binomial(500, p) baselines being
  within budget at ``--grid`` failure rates ``p`` within 4 standard errors of ``p0``. The
  guarantee asks that of every ``p``, so any valid rule is feasible here and the optimum of the
  program is below its delay. (The estimated-parameter view of Jones, Champ and Rigdon 2004 and
  Lee, Wang, Xu, Schuh and Woodall 2013, cited in ``guarantee.py``, as an optimisation.)

Latency (Siegmund's approximation; log-sd 0.5 and 1.0, slowdowns x1.22 .. x2.25): a chart
standardised by the baseline mean sees an in-control drift ``-e``, ``e ~ N(0, 1/500)`` in sd
units, that it cannot observe (the shift of every duration by a constant leaves its decisions
alone), so its threshold cannot depend on ``e``. ``best valid`` is the single CUSUM that knows
the sd and the shift, with ``k`` and ``h`` chosen to minimise the mean delay over ``e`` while its
false-alarm rate averaged over ``e`` is within the duration budget (0.05 per 1,000): a floor for
the duration bank, which also estimates the sd.

Run: ``.venv/bin/python benchmarks/bench_shift_bound.py [--lp-shifts 0.5 --grid 25]``
(each linear program takes about a minute; ``--lp-shifts`` lists the multipliers it is run
for, ``--lp-shifts`` with none skips it).
"""

from __future__ import annotations

import argparse
import math
import time
from statistics import NormalDist

import numpy as np
from scipy.linalg import solve_banded  # type: ignore[import-untyped]
from scipy.optimize import linprog  # type: ignore[import-untyped]

from agentmend.infrastructure.detection.cusum import (
    _solve_threshold,
    integer_weights,
    siegmund_arl,
)
from agentmend.infrastructure.detection.guarantee import (
    ESTIMATION_MARGIN,
    binomial_support,
    failure_delay,
)

BASELINE_N = 500
FAILURE_BUDGET = 0.001 * 0.95
DURATION_ARL = 1.0 / (0.001 * 0.05)
DESIGN_DROP = 0.15
P0S = (0.05, 0.2)
MULTIPLIERS = (0.5, 0.75, 1.0, 1.5, 2.0)
LOG_SDS = (0.5, 1.0)
SLOWDOWNS = (1.5**0.5, 1.25, 1.5, 2.0, 1.5**2)
SPAN = 1.4  # thresholds offered to the program: within this factor of the plug-in threshold


def arl(up: int, down: int, threshold: int, p: float) -> float:
    """Exact zero-state ARL of the integer CUSUM (as ``cusum.bernoulli_arl``), banded LAPACK."""
    if threshold <= 0:
        return 1.0
    bands = np.zeros((down + up + 1, threshold))  # bands[up + i - j, j] = (I - P)[i, j]
    bands[up, :] = 1.0
    rows = np.arange(threshold)
    cols = np.maximum(0, rows - down)
    bands[up + rows - cols, cols] -= 1.0 - p
    bands[0, rows[rows + up < threshold] + up] -= p
    return float(solve_banded((down, up), bands, np.ones(threshold))[0])


def design(p0: float, drop: float) -> tuple[int, int]:
    p1 = p0 + drop * (1.0 - p0)
    return integer_weights(math.log(p1 / p0), math.log((1.0 - p0) / (1.0 - p1)))


def threshold_for(up: int, down: int, p0: float, target: float) -> tuple[int, int]:
    """The integer thresholds just below and at-or-above an ARL0 of ``target`` at ``p0``."""
    lo, hi = 1, 2
    while arl(up, down, hi, p0) < target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if arl(up, down, mid, p0) < target else (lo, mid)
    return lo, hi


def interpolated_delay(up: int, down: int, p0: float, p1: float, target: float) -> float:
    """Delay at ``p1`` of the chart with ARL0 ``target`` at ``p0`` (log-interpolated)."""
    lo, hi = threshold_for(up, down, p0, target)
    a_lo, a_hi = arl(up, down, lo, p0), arl(up, down, hi, p0)
    w = (math.log(target) - math.log(a_lo)) / (math.log(a_hi) - math.log(a_lo))
    return arl(up, down, lo, p1) + w * (arl(up, down, hi, p1) - arl(up, down, lo, p1))


def optimal_delay(p0: float, p1: float) -> float:
    gain, loss = math.log(p1 / p0), math.log((1.0 - p0) / (1.0 - p1))
    up, down = integer_weights(gain, loss, max_unit=0.02)
    return interpolated_delay(up, down, p0, p1, 1.0 / FAILURE_BUDGET)


def lp_bound(p0: float, p1: float, drop: float, grid: int) -> float:
    """The least mean delay at ``p0 -> p1`` of any rule valid at ``grid`` rates around ``p0``.

    Baseline counts outside the support of Binomial(n, p0) (tail 1e-6) are left out of both the
    delay and the constraints, and thresholds outside ``SPAN`` of each count's plug-in threshold
    are not offered; leaving out constraints only lowers the bound, and the program never chose
    a threshold at the edge of the offered range in the runs reported.
    """
    n = BASELINE_N
    se = math.sqrt(p0 * (1.0 - p0) / n)
    rates = [p0 + se * 4.0 * (2.0 * j / (grid - 1) - 1.0) for j in range(grid)]
    support, _ = binomial_support(n, p0, 1e-6)
    pmfs = [dict(binomial_support(n, p, 1e-12)[0]) for p in rates]
    costs: list[float] = []
    alarms: list[list[float]] = []
    owner: list[int] = []
    for i, (x, weight) in enumerate(support):
        p_hat = (x + 0.5) / (n + 1)
        up, down = design(p_hat, drop)
        _, plug_in = threshold_for(up, down, p_hat, 1.0 / FAILURE_BUDGET)
        for t in range(max(1, int(plug_in / SPAN)), int(plug_in * SPAN) + 1):
            costs.append(weight * arl(up, down, t, p1))
            alarms.append(
                [
                    pmf.get(x, 0.0) / max(arl(up, down, t, p), 1.0)
                    for p, pmf in zip(rates, pmfs, strict=True)
                ]
            )
            owner.append(i)
    choose_one = np.zeros((len(support), len(costs)))
    choose_one[owner, np.arange(len(costs))] = 1.0
    result = linprog(
        np.array(costs),
        A_ub=np.array(alarms).T,
        b_ub=np.full(grid, FAILURE_BUDGET),
        A_eq=choose_one,
        b_eq=np.ones(len(support)),
        bounds=(0, None),
        method="highs",
    )
    if result.status != 0:
        raise SystemExit(f"linear program failed at p0={p0}, p1={p1}: {result.message}")
    return float(result.fun) / math.fsum(w for _, w in support)


def failure_table(lp_shifts: tuple[float, ...], grid: int) -> None:
    print(
        f"Failures, exact: mean delay / the optimum's ({BASELINE_N}-run baselines, budget"
        f" {FAILURE_BUDGET * 1000:.2f} per 1,000; LP at {grid} rates)"
    )
    print(
        f"  {'p0':>4} {'shift':>5} {'p1':>5} {'optimum':>7} {'known p0':>8}"
        f" {'@margin':>7} {'shipped':>7} {'LP design 15%':>13} {'LP design=shift':>15}"
    )
    for p0 in P0S:
        for m in MULTIPLIERS:
            p1 = p0 + DESIGN_DROP * m * (1.0 - p0)
            best = optimal_delay(p0, p1)
            up, down = design(p0, DESIGN_DROP)
            known = interpolated_delay(up, down, p0, p1, 1.0 / FAILURE_BUDGET)
            margin = interpolated_delay(
                up, down, p0, p1, 1.0 / (FAILURE_BUDGET * ESTIMATION_MARGIN)
            )
            _, shipped = failure_delay(BASELINE_N, p0, p1, FAILURE_BUDGET)
            bounds = "".join(
                f" {lp_bound(p0, p1, drop, grid) / best:>{w}.2f}"
                if m in lp_shifts
                else f" {'':>{w}}"
                for drop, w in ((DESIGN_DROP, 13), (DESIGN_DROP * m, 15))
            )
            print(
                f"  {p0:>4} {m:>4}x {p1:>5.3f} {best:>7.1f} {known / best:>8.2f}"
                f" {margin / best:>7.2f} {shipped / best:>7.2f}{bounds}",
                flush=True,
            )


_NODES = tuple(NormalDist().inv_cdf((i + 0.5) / 128) for i in range(128))


def _rate(k: float, h: float, drift: float) -> float:
    try:
        return 1.0 / siegmund_arl(k, h, drift)
    except OverflowError:
        return 0.0


def best_invariant(delta: float, n: int = BASELINE_N) -> tuple[float, float, float]:
    """(mean delay, k, h) of the best single CUSUM whose baseline mean is off by N(0, 1/n)."""
    errors = [z / math.sqrt(n) for z in _NODES]
    best = (math.inf, 0.0, 0.0)
    for i in range(1, 121):
        k = delta * i / 80.0

        def in_control(h: float, k: float = k) -> float:
            rate = math.fsum(_rate(k, h, -e) for e in errors) / len(errors)
            return 1.0 / rate if rate > 0.0 else math.inf

        h = _solve_threshold(in_control, DURATION_ARL)
        delay = math.fsum(siegmund_arl(k, h, delta - e) for e in errors) / len(errors)
        if delay < best[0]:
            best = (delay, k, h)
    return best


def oracle_delay(delta: float) -> float:
    """Delay of the CUSUM knowing mean, sd and the shift ``delta`` (sd units), at the ARL0."""
    k = delta / 2.0

    def in_control(h: float) -> float:
        return siegmund_arl(k, h)

    return siegmund_arl(k, _solve_threshold(in_control, DURATION_ARL), delta)


def duration_table() -> None:
    print()
    print(
        f"Latency (Siegmund): mean delay of the best valid single chart with the mean estimated"
        f" from {BASELINE_N} runs / the optimum's (ARL0 {DURATION_ARL:.0f})"
    )
    print(
        f"  {'log-sd':>6} {'slowdown':>8} {'shift/sd':>8} {'optimum':>7} {'best valid':>10}"
        f" {'x opt':>5}"
    )
    for sd in LOG_SDS:
        for f in SLOWDOWNS:
            delta = math.log(f) / sd
            best = oracle_delay(delta)
            delay, _, _ = best_invariant(delta)
            print(
                f"  {sd:>6} {f:>7.2f}x {delta:>8.3f} {best:>7.1f} {delay:>10.1f}"
                f" {delay / best:>5.2f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lp-shifts", type=float, nargs="*", default=[0.5], help="multipliers to bound by LP"
    )
    parser.add_argument("--grid", type=int, default=25, help="failure rates the LP constrains")
    args = parser.parse_args()
    started = time.perf_counter()
    failure_table(tuple(args.lp_shifts), args.grid)
    duration_table()
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
