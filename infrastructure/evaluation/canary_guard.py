"""The canary guard: an always-valid test that a new arm does no harm, judged window by window.

A canary serves a share of live runs beside the stable release. Comparing it with a rate measured
before it started blames it for whatever the traffic did meanwhile (a harder mix of questions, a
slower provider); comparing it with the stable runs of the same moments does not. So the runs
are cut into **windows** of consecutive runs of both arms, and in each window the question is
only: do the canary's runs hold more than their share of the window's bad runs?

Each run gets a score ``u``: 1 for a failure and 0 otherwise (:func:`failure_scores`), or the
normal score of its duration's rank among the window's runs that succeeded
(:func:`slowness_scores`: a run slower than most of its window scores high; failures are left
out, their durations say when they stopped). Under no harm (within a window, a run's chance to
fail and its duration do not depend on the arm that served it, however they drift from one
window to the next) the canary's runs are a uniformly random subset of their window, so for
every ``theta >= 0``::

    e(theta) = exp(theta * S) / E[exp(theta * S)]

(``S``: the sum of the canary's ``u``; ``E``: the mean over every way the window's canary runs
could have fallen among its runs, see :func:`subset_log_mgf`) has expectation exactly 1. For
failures that is the conditional likelihood ratio of Fisher's noncentral hypergeometric law.
For slow runs, when the smaller arm of a window is too large to enumerate, the denominator is
the moment generating function of a sum drawn with replacement, which dominates it (Hoeffding
1963, "Probability inequalities for sums of bounded random variables", JASA 58, Theorem 4), so
the expectation is at most 1. The product over windows is then a nonnegative supermartingale
for each ``theta``, and so is any fixed mixture of them over a grid of
``theta`` (a mixture sequential probability ratio test; for failures ``exp(theta)`` is the
canary's failure rate as a multiple of stable's). By Ville's inequality the chance that the
mixture ever reaches ``1 / alpha`` is at most ``alpha``, at whatever moment it is looked at:
the guard rejects, and the canary is rolled back, the first time it does.

Where a window's boundaries fall must not depend on the outcomes in it (the caller closes a
window on arm counts and poll times only). The windows are what makes the test valid when the
traffic mix drifts; what they cannot undo is arms that serve different traffic (sticky routing
keys of a few very different users): the benchmark (``benchmarks/bench_rollout.py``) measures
the false rollbacks with a drifting mix and a fixed set of users per arm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

__all__ = [
    "EXACT_SUBSET_MAX",
    "FAILURE_MULTIPLES",
    "LEGACY_FAILURE_MULTIPLES",
    "LEGACY_SLOWNESS_TILTS",
    "SLOWNESS_TILTS",
    "CanaryGuard",
    "failure_scores",
    "slowness_scores",
    "subset_log_mgf",
]

FAILURE_MULTIPLES: tuple[tuple[float, float], ...] = ((2.25, 0.6), (3.0, 0.4))
"""(the canary's failure rate as a multiple of stable's, its weight) in the failure guard's
mixture. All the weight is near the smallest harm worth seeing as soon as the detector would
on a full rollout, a canary failing twice as often, and a little above it: half of such canaries
are caught on windows luckier than average, where a multiple above the true one reaches the
boundary sooner (a mixture centred on 2 itself catches them later in the median, one centred on
3 later on average). A larger harm earns its evidence in a few runs at these multiples too
(``benchmarks/bench_rollout.py`` part 1)."""

SLOWNESS_TILTS: tuple[tuple[float, float], ...] = ((0.6, 0.7), (1.2, 0.3))
"""(tilt in normal-score units, its weight) in the slow-run guard's mixture. The guard's
smallest harm worth seeing as fast as the detector would is a canary half as slow again: with
the canary's durations first divided by the 1.2 tolerance, its best tilt on varied traffic is
about 0.6, where most of the weight goes; a larger slowdown earns its evidence quickly even
there, and the tilt of 1.2 serves it best (``benchmarks/bench_rollout.py`` part 1)."""

LEGACY_SLOWNESS_TILTS: tuple[tuple[float, float], ...] = ((0.5, 0.3), (1.0, 0.4), (2.0, 0.3))
"""The slow-run guard's mixture before ``SLOWNESS_TILTS``: a rollout keeps the mixture it
started with (its log-wealths are per tilt, so changing tilts midway would break the test)."""

LEGACY_FAILURE_MULTIPLES: tuple[tuple[float, float], ...] = (
    (2.0, 0.5),
    (3.0, 0.2),
    (5.0, 0.15),
    (12.0, 0.15),
)
"""The failure guard's mixture before ``FAILURE_MULTIPLES``, kept for the rollouts that started
with it (likewise per multiple)."""

_NORMAL = NormalDist()


def failure_scores(failed: Sequence[bool]) -> list[float]:
    """A window's runs scored for the failure guard: 1 for a failure, 0 for a success."""
    return [1.0 if f else 0.0 for f in failed]


def slowness_scores(durations_ms: Sequence[float]) -> list[float]:
    """A window's runs scored for the slowness guard: the normal score of each run's rank.

    The rank is among all the window's runs, of both arms (ties share their mean rank), so the
    score is the same function of the window for every run, whichever arm served it.
    """
    n = len(durations_ms)
    order = sorted(range(n), key=lambda i: durations_ms[i])
    ranks = [0.0] * n
    start = 0
    while start < n:
        end = start
        while end + 1 < n and durations_ms[order[end + 1]] == durations_ms[order[start]]:
            end += 1
        mean_rank = (start + end) / 2.0 + 1.0  # 1-based, ties share their mean
        for k in range(start, end + 1):
            ranks[order[k]] = mean_rank
        start = end + 1
    return [_NORMAL.inv_cdf((rank - 0.5) / n) for rank in ranks]


EXACT_SUBSET_MAX = 64
"""The largest arm (the smaller of the two) whose sum's law :func:`subset_log_mgf` computes
exactly; a larger one takes the with-replacement bound (more runs than that in the smaller arm
of one window: the bound's loss, a finite-population factor, is small there)."""


def subset_log_mgf(scores: Sequence[float], size: int, theta: float) -> float:
    """log E[exp(theta * sum of ``size`` scores drawn without replacement)], or an upper bound.

    Exact (the mean over every subset, by the elementary symmetric recursion) when the smaller
    of the subset and its complement holds at most ``EXACT_SUBSET_MAX`` runs; otherwise the
    with-replacement moment generating function, which bounds it (Hoeffding 1963, Theorem 4).
    Either way ``exp(theta * S - result)`` has expectation at most 1 for a uniform subset, and
    the exact one makes it exactly 1: the bound's slack is evidence a harmful canary loses (a
    window's canary runs are a tenth of it at the default share, a finite-population factor
    of about 0.9 on the variance the bound charges).
    """
    n = len(scores)
    if not 0 < size < n:
        raise ValueError(f"need a subset of 1 to {n - 1} of {n} scores, got {size}")
    centre = math.fsum(scores) / n
    deviations = [u - centre for u in scores]
    # The complement's sum is the total minus the subset's: recurse over the smaller side.
    side, sign = (size, 1.0) if size <= n - size else (n - size, -1.0)
    spread = max(abs(d) for d in deviations)
    # elementary[j]: the sum over the j-subsets of the runs seen so far of the product of their
    # exp(sign * theta * deviation); centred, it stays below comb(n, j) * exp(theta*spread*j)
    headroom = abs(theta) * spread * side + _log_comb(n, side)
    if side > EXACT_SUBSET_MAX or headroom > 700.0:  # beyond what doubles hold
        top = max(scores)
        log_mean = math.log(math.fsum(math.exp(theta * (u - top)) for u in scores) / n)
        return size * (theta * top + log_mean)
    elementary = [1.0] + [0.0] * side
    for m, d in enumerate(deviations, start=1):
        x = math.exp(sign * theta * d)
        for j in range(min(side, m), 0, -1):
            elementary[j] += x * elementary[j - 1]
    return theta * size * centre + math.log(elementary[side]) - _log_comb(n, side)


def _hypergeometric_law(n: int, n_canary: int, failures: int) -> list[tuple[int, float]]:
    """(k, log P(K = k)) for the canary's failures K when ``failures`` of ``n`` runs fail and
    ``n_canary`` of the runs are drawn at random (hypergeometric)."""
    low, high = max(0, failures - (n - n_canary)), min(failures, n_canary)
    whole = _log_comb(n, n_canary)
    return [
        (k, _log_comb(failures, k) + _log_comb(n - failures, n_canary - k) - whole)
        for k in range(low, high + 1)
    ]


def _log_mean_exp(terms: Sequence[tuple[float, float]]) -> float:
    """log E[exp(value)] over (value, log probability) pairs: a law's log-mgf, kept finite."""
    top = max(v + lp for v, lp in terms)
    return top + math.log(math.fsum(math.exp(v + lp - top) for v, lp in terms))


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


@dataclass(slots=True)
class CanaryGuard:
    """The mixture test over ``tilts`` (``weights``: equal unless given), fed one window at a time.

    ``log_wealth`` holds one log-wealth per tilt, plain numbers (a rollout keeps them in its
    record, so any worker continues the same test); the test :meth:`rejects` at ``alpha`` once
    the mixture's wealth reaches ``1 / alpha``.
    """

    tilts: tuple[float, ...]
    log_wealth: list[float] = field(default_factory=list)
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.tilts or any(t <= 0 for t in self.tilts):
            raise ValueError(f"need positive tilts, got {self.tilts}")
        if not self.weights:
            self.weights = tuple(1.0 / len(self.tilts) for _ in self.tilts)
        if len(self.weights) != len(self.tilts) or abs(sum(self.weights) - 1.0) > 1e-9:
            raise ValueError(f"need one weight per tilt, summing to 1, got {self.weights}")
        if not self.log_wealth:
            self.log_wealth = [0.0] * len(self.tilts)
        elif len(self.log_wealth) != len(self.tilts):
            raise ValueError(f"{len(self.log_wealth)} wealths for {len(self.tilts)} tilts")

    @classmethod
    def for_failures(cls, log_wealth: Sequence[float] = (), *, legacy: bool = False) -> CanaryGuard:
        """The failure guard; ``legacy``: with the mixture of rollouts started before
        ``FAILURE_MULTIPLES`` (``LEGACY_FAILURE_MULTIPLES``)."""
        mixture = LEGACY_FAILURE_MULTIPLES if legacy else FAILURE_MULTIPLES
        tilts = tuple(math.log(m) for m, _ in mixture)
        return cls(tilts, list(log_wealth), tuple(w for _, w in mixture))

    @classmethod
    def for_slowness(cls, log_wealth: Sequence[float] = (), *, legacy: bool = False) -> CanaryGuard:
        """The slow-run guard; ``legacy``: with the mixture of rollouts started before
        ``SLOWNESS_TILTS`` (``LEGACY_SLOWNESS_TILTS``)."""
        mixture = LEGACY_SLOWNESS_TILTS if legacy else SLOWNESS_TILTS
        return cls(tuple(t for t, _ in mixture), list(log_wealth), tuple(w for _, w in mixture))

    def observe_failures(self, failed: Sequence[bool], canary: Sequence[bool]) -> None:
        """One closed window, for the failure guard (tilts ``log(multiple)``): the window's
        failures are the sample, the canary's share of its runs their share under no harm.

        Under no harm the canary's failures ``k``, given the window's ``f``, are hypergeometric;
        each tilt's e-value is ``multiple ** k`` over its exact expectation (the conditional
        likelihood ratio of Fisher's noncentral hypergeometric law), so it averages exactly 1.
        """
        if len(failed) != len(canary):
            raise ValueError(f"{len(failed)} outcomes for {len(canary)} runs")
        n_canary, n = sum(canary), len(canary)
        if n_canary == 0 or n_canary == n:
            return
        f = sum(failed)
        k = sum(1 for bad, c in zip(failed, canary, strict=True) if bad and c)
        law = _hypergeometric_law(n, n_canary, f)
        for j, theta in enumerate(self.tilts):
            self.log_wealth[j] += theta * k - _log_mean_exp([(theta * c, lp) for c, lp in law])

    def observe(self, scores: Sequence[float], canary: Sequence[bool]) -> None:
        """One closed window: each run's score and whether the canary served it."""
        if len(scores) != len(canary):
            raise ValueError(f"{len(scores)} scores for {len(canary)} runs")
        n_canary = sum(canary)
        if n_canary == 0 or n_canary == len(scores):
            return  # one arm only: nothing to compare (e = 1, or at most 1)
        canary_sum = sum(u for u, c in zip(scores, canary, strict=True) if c)
        for j, theta in enumerate(self.tilts):
            self.log_wealth[j] += theta * canary_sum - subset_log_mgf(scores, n_canary, theta)

    @property
    def wealth(self) -> float:
        """The mixture's wealth (an e-value; ``1 / alpha`` or more rejects at ``alpha``)."""
        if max(self.log_wealth) > 700.0:
            return math.inf
        return sum(w * math.exp(lw) for w, lw in zip(self.weights, self.log_wealth, strict=True))

    def rejects(self, alpha: float) -> bool:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha}")
        return self.wealth >= 1.0 / alpha
