"""Calibration math for the change detectors: CUSUM charts whose false-alarm rate is known.

A CUSUM only earns its keep if its threshold is set for a known in-control average run length
(ARL0, the mean number of healthy runs between false alarms: the alarm rate is 1/ARL0 because
the chart restarts at 0 after every alarm). Two charts are calibrated here, in pure Python
(no numpy on the target machines), once per baseline and cached:

* ``BernoulliChart``: failures of an agent. The chart is an *integer* CUSUM: +``up`` on a
  failure, -``down`` on a success, floored at 0, alarm at ``threshold``. ``up/down`` is a close
  rational approximation of the log-likelihood-ratio weights for a shift ``p0 -> p1``, so the
  chart is (to within 2 %) the optimal CUSUM for that shift, and because the state is an
  integer its ARL is computed *exactly* (a Markov chain with ``threshold`` states solved as a
  banded linear system), not approximated. The unknown healthy failure rate is handled by
  averaging the alarm rate over its Jeffreys posterior given the baseline (see
  ``calibrate_bernoulli``).
* ``NormalChart``: log-durations. A one-sided normal CUSUM with a robust, conservative baseline
  (clipped mean plus its standard error, the larger of a clipped and a MAD-based sd), calibrated
  with Siegmund's approximation, and re-calibrated with the tilt that solves the baseline's own
  empirical moment equation so a skewed or heavy-tailed duration distribution gets a higher
  threshold rather than more false alarms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import mul, sub

from agentmend.infrastructure.errors import InvalidArgument

__all__ = [
    "BernoulliChart",
    "NormalChart",
    "bernoulli_arl",
    "beta_quantile",
    "calibrate_bernoulli",
    "calibrate_normal",
    "integer_weights",
    "posterior_arl",
    "regularized_beta",
    "siegmund_arl",
    "smallest_threshold",
]

# Posterior strata for the failure-rate average: (probability mass, quantile at which the
# stratum is evaluated). The alarm rate grows steeply with the failure rate, so the upper tail
# is cut finely; the top 0.1 % is evaluated at its own upper edge region (0.9995).
_STRATA: tuple[tuple[float, float], ...] = (
    (0.25, 0.125),
    (0.25, 0.375),
    (0.25, 0.625),
    (0.15, 0.825),
    (0.07, 0.935),
    (0.02, 0.98),
    (0.01, 0.995),
    (0.004, 0.997),
    (0.004, 0.9985),
    (0.002, 0.9995),
)
_MAX_UNIT_NATS = 0.05  # ARL grows ~e^(unit) per integer step: 5 % granularity in ARL0
_RATIO_TOLERANCE = 0.02
_MAX_DOWN = 200
_MAX_STATES = 6000  # beyond this the baseline is too uncertain to calibrate; chart disabled
_SIEGMUND_OVERSHOOT = 1.166  # 2 * 0.583: expected overshoot of a N(0,1) walk, in sd units


@dataclass(frozen=True, slots=True)
class BernoulliChart:
    """An integer CUSUM on failures: ``S = max(0, S + up)`` on a failure, ``- down`` on a success.

    ``unit`` converts the integer statistic to nats of log-likelihood ratio (``S * unit``), the
    scale reported in issues. ``p0`` is the reference healthy failure rate (posterior mean of the
    baseline), ``p1`` the failure rate the chart is tuned to detect fastest, ``bound`` the 95 %
    posterior upper bound of the healthy failure rate (reported, not used), ``arl0`` the in-control
    ARL the chart achieves averaged over the posterior (at least ``target_arl``).
    """

    up: int
    down: int
    threshold: int
    unit: float
    p0: float
    p1: float
    bound: float
    target_arl: float
    arl0: float


@dataclass(frozen=True, slots=True)
class NormalChart:
    """A one-sided CUSUM on standardised log-durations: ``S = max(0, S + z - k)``, alarm at ``h``.

    ``z = (clip(y, lower, upper) - mean) / sd`` capped at ``cap``: the clipping bounds come from
    the baseline's median and MAD, so one pathological run (a 10-minute hang) moves the
    statistic by at most ``cap - k`` and cannot by itself raise an alarm.
    """

    mean: float
    sd: float
    k: float
    h: float
    lower: float
    upper: float
    cap: float
    target_arl: float
    tilt: float

    def standardise(self, y: float) -> float:
        if y > self.upper:
            y = self.upper
        elif y < self.lower:
            y = self.lower
        z = (y - self.mean) / self.sd
        return self.cap if z > self.cap else (-self.cap if z < -self.cap else z)


def integer_weights(gain: float, loss: float, max_unit: float = _MAX_UNIT_NATS) -> tuple[int, int]:
    """Smallest integers ``(up, down)`` with ``up/down`` within 2 % of ``gain/loss``.

    ``down`` is at least ``loss / max_unit`` so one integer step is worth at most ``max_unit``
    nats (default 0.05); that keeps the exact threshold within about 5 % of any ARL0 target.
    """
    if gain <= 0 or loss <= 0:
        raise InvalidArgument("log-likelihood weights", (gain, loss), "must be positive")
    ratio = gain / loss
    down = max(1, math.ceil(loss / max_unit))
    while True:
        up = max(1, round(down * ratio))
        if abs(up / down - ratio) <= _RATIO_TOLERANCE * ratio or down >= _MAX_DOWN:
            return up, down
        down += 1


def bernoulli_arl(up: int, down: int, threshold: int, p: float) -> float:
    """Exact zero-state ARL of the integer CUSUM with failure probability ``p``.

    States ``0 .. threshold-1``; ``L(s) = 1 + p L(s+up) + (1-p) L(max(0, s-down))`` with
    ``L = 0`` at or above the threshold. ``I - P`` is a banded M-matrix (lower bandwidth
    ``down``, upper ``up``), so Gaussian elimination without pivoting is stable and costs
    ``O(threshold * down * up)``.
    """
    n = threshold
    if n <= 0:
        return 1.0
    q = 1.0 - p
    lo = down
    width = down + up + 1
    rows: list[list[float]] = []
    for i in range(n):
        row = [0.0] * width
        row[lo] = 1.0
        j = i - down if i >= down else 0
        row[j - i + lo] -= q
        if i + up < n:
            row[lo + up] -= p
        rows.append(row)
    rhs = [1.0] * n
    for k in range(n):
        rk = rows[k]
        pivot = rk[lo]
        m = min(up, n - 1 - k) + 1
        seg = rk[lo : lo + m]
        bk = rhs[k]
        for i in range(k + 1, min(k + down, n - 1) + 1):
            ri = rows[i]
            off = k - i + lo
            f = ri[off] / pivot
            if f != 0.0:
                # map over operator functions: the same products and differences as a
                # comprehension (so the same bits), in about two thirds of its time
                ri[off : off + m] = map(sub, ri[off : off + m], map(mul, repeat(f, m), seg))
                rhs[i] -= f * bk
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        r = rows[i]
        m = min(up, n - 1 - i)
        acc = rhs[i]
        if m:
            acc -= math.fsum(map(mul, r[lo + 1 : lo + 1 + m], x[i + 1 : i + 1 + m]))
        x[i] = acc / r[lo]
    return x[0]


@lru_cache(maxsize=8192)
def calibrate_bernoulli(
    failures: int, n: int, target_arl: float, relative_drop: float = 0.15
) -> BernoulliChart | None:
    """The failure chart for a baseline of ``failures`` in ``n`` runs, or None if uncalibratable.

    Reference: ``p0`` is the posterior mean ``(x + 1/2) / (n + 1)`` (Jeffreys prior) and
    ``p1 = p0 + relative_drop * (1 - p0)``: the success rate falling by ``relative_drop`` of
    itself (0.95 -> 0.8075 for the default 0.15, chosen to minimise the worse of the delay
    ratios for the reference drops 0.95 -> 0.70 and 0.95 -> 0.85).

    Threshold: the smallest integer threshold whose alarm rate, *averaged over the posterior of
    the healthy failure rate*, is at most ``1/target_arl``. A plug-in threshold is too liberal
    on average (the alarm rate is convex in the failure rate: measured 1.08x the target at
    p0=0.05, n=500), and an upper confidence bound pays for its coverage in delay (a one-sigma
    bound costs 15 % / 31 % more delay than the plug-in on the reference drops); the posterior
    average is the quantity the false-alarm budget is about, it stays below target across rates
    (measured 0.77-0.88x the target for p0 in 0.01..0.30) and handles a baseline with no
    failures at all (where any plug-in estimate is 0). Returns None when the baseline fails more
    than 90 % of the time (no meaningful further degradation to detect) or is too uncertain.
    """
    if not 0 <= failures <= n or n <= 0:
        raise InvalidArgument("(failures, n)", (failures, n), "need 0 <= failures <= n, n > 0")
    if target_arl <= 1:
        raise InvalidArgument("target_arl", target_arl, "must exceed 1")
    a_post = failures + 0.5
    b_post = n - failures + 0.5
    p0 = a_post / (a_post + b_post)
    if p0 > 0.9:
        return None
    p1 = p0 + relative_drop * (1.0 - p0)
    gain = math.log(p1 / p0)
    loss = math.log((1.0 - p0) / (1.0 - p1))
    up, down = integer_weights(gain, loss)
    unit = loss / down
    nodes = _posterior_nodes(failures, n)
    budget = 1.0 / target_arl

    rates: dict[int, float] = {}

    def rate(threshold: int) -> float:
        if threshold not in rates:
            rates[threshold] = sum(w / bernoulli_arl(up, down, threshold, p) for w, p in nodes)
        return rates[threshold]

    threshold = smallest_threshold(rate, budget, max(1, math.ceil(math.log(target_arl) / unit)))
    if threshold is None:
        return None
    hi = threshold
    return BernoulliChart(
        up=up,
        down=down,
        threshold=hi,
        unit=unit,
        p0=p0,
        p1=p1,
        bound=beta_quantile(a_post, b_post, 0.95),
        target_arl=target_arl,
        arl0=1.0 / rate(hi),
    )


def smallest_threshold(
    rate: Callable[[int], float], budget: float, guess: int, limit: int = _MAX_STATES
) -> int | None:
    """The smallest integer threshold ``t >= 1`` with ``rate(t) <= budget``, or None past ``limit``.

    ``rate`` must decrease with ``t``. Each evaluation is a full exact ARL solve, so the search
    interpolates on ``log(rate)``, which is close to linear in the threshold (the ARL of a CUSUM
    grows about exponentially with it), then probes the neighbour of the guess so a good guess
    settles the bracket in two evaluations; a poor one still halves the bracket every round.
    """
    lo, r_lo = 0, 1.0  # the chart at threshold 0 alarms on every run
    hi = guess
    r_hi = rate(hi)
    while r_hi > budget:
        lo, r_lo = hi, r_hi
        hi = math.ceil(hi * 1.5) + 1
        if hi > limit:
            return None
        r_hi = rate(hi)
    log_budget = math.log(budget)
    bisect = False
    while hi - lo > 1:
        if bisect or r_hi <= 0.0:
            mid = (lo + hi) // 2
        else:
            frac = (math.log(r_lo) - log_budget) / (math.log(r_lo) - math.log(r_hi))
            mid = min(hi - 1, max(lo + 1, lo + round(frac * (hi - lo))))
        width = hi - lo
        r = rate(mid)
        if r <= budget:
            hi, r_hi, probe = mid, r, mid - 1
        else:
            lo, r_lo, probe = mid, r, mid + 1
        if lo < probe < hi:
            r = rate(probe)
            if r <= budget:
                hi, r_hi = probe, r
            else:
                lo, r_lo = probe, r
        bisect = (hi - lo) * 2 > width  # the guess did not halve the bracket: bisect next
    return hi


def _posterior_nodes(failures: int, n: int) -> list[tuple[float, float]]:
    a_post, b_post = failures + 0.5, n - failures + 0.5
    return [(w, beta_quantile(a_post, b_post, q)) for w, q in _STRATA]


def posterior_arl(up: int, down: int, threshold: int, failures: int, n: int) -> float:
    """In-control ARL of the integer chart averaged (as an alarm rate) over the Jeffreys
    posterior of the failure rate given ``failures`` in ``n`` baseline runs."""
    rate = sum(w / bernoulli_arl(up, down, threshold, p) for w, p in _posterior_nodes(failures, n))
    return 1.0 / rate


def siegmund_arl(k: float, h: float, drift: float = 0.0) -> float:
    """Siegmund's approximation to the ARL of ``S = max(0, S + z - k)`` with ``z ~ N(drift, 1)``."""
    delta = drift - k
    b = h + _SIEGMUND_OVERSHOOT
    if abs(delta) < 1e-9:
        return b * b
    return (math.exp(-2.0 * delta * b) + 2.0 * delta * b - 1.0) / (2.0 * delta * delta)


def _wald_arl(theta: float, mean: float, h: float, overshoot: float) -> float:
    # The same approximation for a general increment distribution: theta solves E[e^(theta w)]=1
    # and mean = E[w] < 0 (Siegmund 1985, eq. 2.55 family); for N(-k, 1) it reduces to the above.
    b = h + overshoot
    if theta * b > 700.0:  # past any ARL worth computing; math.exp would overflow
        return math.inf
    return (math.exp(theta * b) - theta * b - 1.0) / (theta * -mean)


def _solve_threshold(f: Callable[[float], float], target: float) -> float:
    """The smallest ``h >= 0`` with ``f(h) >= target`` for an increasing ``f`` (bisection)."""
    hi = 1.0
    while f(hi) < target:
        hi *= 2.0
        if hi > 1e6:
            raise InvalidArgument("target", target, "is out of the threshold search's reach")
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


def _empirical_tilt(increments: Sequence[float]) -> float | None:
    """The ``theta > 0`` with ``mean(exp(theta * w)) == 1``, or None if it does not exist."""
    n = len(increments)
    if n == 0 or math.fsum(increments) >= 0 or max(increments) <= 0:
        return None

    def mgf(theta: float) -> float:
        return math.fsum(math.exp(theta * w) for w in increments) / n

    hi = 1.0
    while mgf(hi) < 1.0:
        hi *= 2.0
        if hi > 1e4:
            return None
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if mgf(mid) < 1.0:
            lo = mid
        else:
            hi = mid
    return lo if lo > 0 else None


def calibrate_normal(
    values: Sequence[float],
    target_arl: float,
    shift: float,
    *,
    sd_floor: float = 0.05,
    clip_sd: float = 5.0,
    cap: float = 4.0,
    max_k: float = 1.0,
    mean_margin: float = 1.0,
) -> NormalChart:
    """A CUSUM for an upward shift of ``shift`` (same units as ``values``) in the mean.

    The baseline estimate is made conservative and robust: values are clipped to ``median +/-
    clip_sd * s`` (``s`` the MAD-based sd, at least ``sd_floor``); ``sd`` is the larger of the
    clipped sample sd and ``s`` (and the floor), inflated by its standard error; ``mean`` is the
    clipped mean plus ``mean_margin`` standard errors (default one; the duration bank takes none
    and averages its threshold over the mean's error instead). ``k = min(shift / (2 sd), max_k)``:
    the optimal reference for the design shift, capped because Siegmund's approximation degrades
    for large ``k`` and a chart built for a 2-sd shift already catches any larger one within a
    few runs.
    ``h`` is the larger of the Gaussian Siegmund threshold and the one from the baseline's own
    standardised increments (their empirical tilt and mean), so skew or heavy tails seen in the
    baseline raise the threshold instead of the false-alarm rate.
    """
    n = len(values)
    if n < 2:
        raise InvalidArgument("baseline values", n, "need at least 2")
    if target_arl <= 1 or shift <= 0:
        raise InvalidArgument(
            "(target_arl, shift)", (target_arl, shift), "need target_arl > 1, shift > 0"
        )
    ordered = sorted(values)
    median = _median(ordered)
    mad_sd = 1.4826 * _median(sorted(abs(v - median) for v in ordered))
    s = max(mad_sd, sd_floor)
    lower, upper = median - clip_sd * s, median + clip_sd * s
    clipped = [min(max(v, lower), upper) for v in ordered]
    mean = math.fsum(clipped) / n
    var = math.fsum((v - mean) ** 2 for v in clipped) / (n - 1)
    sd = max(math.sqrt(var), s) * (1.0 + 1.0 / math.sqrt(2.0 * (n - 1)))
    mean += mean_margin * sd / math.sqrt(n)
    k = min(shift / (2.0 * sd), max_k)
    h = _solve_threshold(lambda t: siegmund_arl(k, t), target_arl)
    chart = NormalChart(mean, sd, k, h, lower, upper, cap, target_arl, 2.0 * k)
    increments = [chart.standardise(v) - k for v in values]
    tilt = _empirical_tilt(increments)
    if tilt is not None:
        w_mean = math.fsum(increments) / n
        w_sd = math.sqrt(math.fsum((w - w_mean) ** 2 for w in increments) / (n - 1))
        h_emp = _solve_threshold(
            lambda t: _wald_arl(tilt, w_mean, t, _SIEGMUND_OVERSHOOT * w_sd), target_arl
        )
        if h_emp > h:
            h = h_emp
    return NormalChart(mean, sd, k, h, lower, upper, cap, target_arl, tilt or 2.0 * k)


def _median(ordered: Sequence[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def regularized_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)``, the Beta(a, b) distribution function (Lentz continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((a - 1.0 + m2) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1.0 + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 3e-14:
            break
    return h


def beta_quantile(a: float, b: float, q: float) -> float:
    """The ``q`` quantile of Beta(a, b), by bisection on :func:`regularized_beta`."""
    lo, hi = 0.0, 1.0
    for _ in range(64):
        mid = (lo + hi) / 2.0
        if regularized_beta(a, b, mid) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0
