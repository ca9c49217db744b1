"""The per-agent false-alarm guarantee of the failure chart, and its exact computation.

The promise (docs/concepts/detection.md): for every true healthy failure rate ``p`` and every
baseline size ``n`` at or above the minimum (``DEFAULT_MIN_BASELINE_N``), the expected
false-alarm rate of an agent's failure chart, taken over the baselines of ``n`` runs such an
agent produces, is at most the chart's budget (``false_alarm_rate * failure_share``). It is a
statement about the agent in front of you, not about an average over agents: an agent whose
baseline happened to show fewer failures than it really has gets a too-low threshold, and the
promise counts that.

Why a margin: the threshold for a baseline of ``x`` failures in ``n`` runs is set
(``cusum.calibrate_bernoulli``) so that its alarm rate averaged over the Jeffreys posterior of
the failure rate meets a target; that is a Bayesian average over agents, and for a fixed ``p``
the average over baselines can exceed it (exactly 0.962 per 1,000 against 0.95 at ``n = 30``,
``p = 0.5``). The chart is therefore calibrated for ``ESTIMATION_MARGIN`` (0.9) of its budget,
the estimated-parameter correction of the control-chart literature: thresholds are adjusted so
the *unconditional* in-control performance, averaged over the sampling distribution of the
Phase I estimate, meets the target (Jones, Champ and Rigdon 2004, "The run length distribution
of the CUSUM with estimated parameters", J. Quality Technology 36(1); for the Bernoulli CUSUM
with an estimated rate, Lee, Wang, Xu, Schuh and Woodall 2013, "The effect of parameter
estimation on upper-sided Bernoulli cumulative sum charts", Quality and Reliability Engineering
International 29(5), who compute that average exactly, as here).

What the promise costs in delay (exact, 500-run baselines, healthy failure rates 0.05 and 0.2,
shifts from half to twice the design's; ``benchmarks/bench_shift_bound.py``): the chart knowing
p0 is within 1.00-1.08x of the optimal CUSUM for each shift (1.03-1.12x at the margin), the
chart as shipped 1.13-1.32x (p0 0.05) and 1.18-1.52x (p0 0.2), the most at half the shift. The
estimate of p0 is what costs, and no threshold rule can avoid it: a linear program over every
rule that keeps the promise (even randomised ones) puts the mean delay at half the design shift
at no less than 1.22x / 1.37x the optimum for this design and 1.15x / 1.30x for a chart tuned to
that very shift. At ``n = 500`` the promise holds with room (0.73-0.81 false alarms per 1,000
against 0.95); a margin of 1.06 would use it all (0.951 at ``p = 0.5``) and take the delay at half
the shift to 1.23x / 1.38x, but a margin that depends on ``n`` is only as good as the grid it is
computed on, so it stays one number, checked at every cell of ``bench_detection.py``'s table.

Exactly, not by simulation: the chart's state is an integer, so its in-control ARL for a given
baseline is exact (``cusum.bernoulli_arl``), and the chart restarts at 0 after every alarm, so
its long-run alarm rate is ``1 / ARL``. The expected rate over baselines is the sum over the
Binomial(n, p) baseline failure counts ``x`` of ``P(x) / ARL(chart(x), p)``; the counts left
out of the sum (total probability below ``tail``) are counted at the worst rate, one alarm per
run, so the figure is an upper bound, never an underestimate. ``benchmarks/bench_detection.py``
prints it for a grid of ``n`` and ``p``; ``tests/infrastructure/detection/test_guarantee.py`` checks
cells of it.
"""

from __future__ import annotations

import math
from functools import lru_cache

from agentmend.infrastructure.detection.cusum import (
    BernoulliChart,
    bernoulli_arl,
    calibrate_bernoulli,
)

__all__ = [
    "DEFAULT_MIN_BASELINE_N",
    "ESTIMATION_MARGIN",
    "binomial_support",
    "failure_alarm_rate",
    "failure_chart",
    "failure_delay",
]

ESTIMATION_MARGIN = 0.9
"""The share of the failure chart's budget its posterior-averaged threshold is calibrated for."""

DEFAULT_MIN_BASELINE_N = 30
"""Below this many baseline runs the charts do not run (the agent is warming up)."""

_TAIL = 1e-9
_NEVER = 1e9  # ARLs past this are beyond what the double-precision solve resolves: "never"


def failure_chart(
    failures: int, n: int, budget: float, relative_drop: float = 0.15
) -> BernoulliChart | None:
    """The failure chart for ``failures`` in ``n`` baseline runs, keeping ``budget`` per run.

    None when the baseline cannot be calibrated (it fails more than 90 % of the time, or is
    too uncertain): such a chart never alarms.
    """
    return calibrate_bernoulli(failures, n, 1.0 / (budget * ESTIMATION_MARGIN), relative_drop)


@lru_cache(maxsize=256)
def binomial_support(
    n: int, p: float, tail: float = _TAIL
) -> tuple[tuple[tuple[int, float], ...], float]:
    """``((x, P(X = x)), ...)`` for the most likely counts of Binomial(n, p), and the mass left.

    Counts are taken most likely first until at most ``tail`` of the probability is left out.
    """
    if not 0.0 < p < 1.0 or n < 1:
        raise ValueError(f"need n >= 1 and 0 < p < 1, got n={n}, p={p}")
    lp, lq, lf = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    pmf = [
        (x, math.exp(lf - math.lgamma(x + 1) - math.lgamma(n - x + 1) + x * lp + (n - x) * lq))
        for x in range(n + 1)
    ]
    pmf.sort(key=lambda item: item[1], reverse=True)
    kept: list[tuple[int, float]] = []
    mass = 0.0
    for x, weight in pmf:
        if mass >= 1.0 - tail:
            break
        kept.append((x, weight))
        mass += weight
    kept.sort()
    return tuple(kept), max(0.0, 1.0 - mass)


def failure_alarm_rate(n: int, p: float, budget: float, relative_drop: float = 0.15) -> float:
    """The exact expected false-alarm rate per run of the failure chart (failure rate p).

    Averaged over the Binomial(n, p) baselines; an upper bound by at most ``1e-9`` (the mass of
    the baselines left out, counted at one alarm per run). A baseline whose chart cannot be
    calibrated contributes no alarms (the chart is off).
    """
    support, left_out = binomial_support(n, p)
    total = left_out
    for x, weight in support:
        chart = failure_chart(x, n, budget, relative_drop)
        if chart is not None:
            total += weight / _arl(chart, p)
    return total


def _arl(chart: BernoulliChart, p: float) -> float:
    """The chart's ARL at ``p``, with astronomically long ones (whose elimination loses all
    precision, even its sign) counted as ``_NEVER``: that errs towards more alarms."""
    arl = bernoulli_arl(chart.up, chart.down, chart.threshold, p)
    return arl if 1.0 <= arl <= _NEVER else _NEVER


def failure_delay(
    n: int, p0: float, p1: float, budget: float, relative_drop: float = 0.15
) -> tuple[float, float]:
    """``(median, mean)`` runs from a change ``p0 -> p1`` to the alarm, over the baselines.

    Each baseline's delay is its chart's zero-state ARL at ``p1`` (the change comes as the
    baseline fills), weighted by its Binomial(n, p0) probability. The mean is infinite when a
    baseline of probability above ``1e-6`` leaves the chart off or practically never alarming
    (an ARL past ``1e9``), which small baselines do: the median says what a typical agent sees.
    """
    support, left_out = binomial_support(n, p0, 1e-6)
    delays: list[tuple[float, float]] = []
    for x, weight in support:
        chart = failure_chart(x, n, budget, relative_drop)
        arl = _arl(chart, p1) if chart is not None else _NEVER
        delays.append((math.inf if arl >= _NEVER else arl, weight))
    delays.sort()
    mass = 1.0 - left_out
    acc, median = 0.0, math.inf
    for arl, weight in delays:
        acc += weight
        if acc >= mass / 2:
            median = arl
            break
    mean = math.fsum(arl * weight for arl, weight in delays) / mass
    return median, mean
