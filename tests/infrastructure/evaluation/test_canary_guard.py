"""The canary guard: valid whatever the base rate does, and quick to see real harm.

Validity is checked twice: exactly, by enumerating every way a small window's canary runs can
fall (the expectation of each window's e-value under no harm is at most 1), and by simulation
over a fixed set of seeds in which the base failure rate, the durations and the canary's share
all drift during the canary. Power is checked against a canary that fails three times as often
and one that is half as slow again.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentmend.infrastructure.evaluation import canary_guard
from agentmend.infrastructure.evaluation.canary_guard import (
    CanaryGuard,
    failure_scores,
    slowness_scores,
    subset_log_mgf,
)
from agentmend.infrastructure.releases.rollout_evidence import Evidence

ALPHA = 0.1
SEEDS = range(300)


def _window_e(guard: CanaryGuard, values: list[int], canary: list[bool], slow: bool) -> float:
    fresh = CanaryGuard(guard.tilts, weights=guard.weights)
    if slow:  # durations, ties included
        fresh.observe(slowness_scores([float(v) for v in values]), canary)
    else:  # a value above 2 is a failure
        fresh.observe_failures([v > 2 for v in values], canary)
    return fresh.wealth


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.integers(min_value=0, max_value=5), min_size=2, max_size=10),
    n_canary=st.integers(min_value=1, max_value=9),
    slow=st.booleans(),
    legacy=st.booleans(),
)
def test_each_window_is_an_e_value_under_no_harm(
    values: list[int], n_canary: int, slow: bool, legacy: bool
) -> None:
    # Under no harm the canary's runs are a uniformly random subset of the window: average
    # the window's e-value over every such subset, exactly (today's mixtures and those that
    # rollouts already running keep).
    n = len(values)
    n_canary = min(n_canary, n - 1)
    if slow:
        guard = CanaryGuard.for_slowness(legacy=legacy)
    else:
        guard = CanaryGuard.for_failures(legacy=legacy)
    subsets = list(itertools.combinations(range(n), n_canary))
    mean = sum(
        _window_e(guard, values, [i in chosen for i in range(n)], slow) for chosen in subsets
    ) / len(subsets)
    assert mean <= 1.0 + 1e-9


@settings(max_examples=60, deadline=None)
@given(
    scores=st.lists(
        st.floats(min_value=-3.0, max_value=3.0, allow_nan=False), min_size=2, max_size=9
    ),
    size=st.integers(min_value=1, max_value=8),
    theta=st.floats(min_value=-2.5, max_value=2.5, allow_nan=False),
)
def test_a_windows_e_value_averages_exactly_one_over_every_subset(
    scores: list[float], size: int, theta: float
) -> None:
    # The denominator is the exact mean over subsets (either side of the window), so the
    # e-value wastes none of the evidence a with-replacement bound would.
    size = min(size, len(scores) - 1)
    subsets = list(itertools.combinations(range(len(scores)), size))
    log_mgf = subset_log_mgf(scores, size, theta)
    mean = sum(math.exp(theta * sum(scores[i] for i in s) - log_mgf) for s in subsets)
    assert mean / len(subsets) == pytest.approx(1.0, rel=1e-9)


def test_a_window_too_large_to_enumerate_takes_the_bound_above_the_exact_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(3)
    scores = slowness_scores([rng.lognormvariate(0.0, 0.5) for _ in range(60)])
    exact = subset_log_mgf(scores, 6, 0.6)
    monkeypatch.setattr(canary_guard, "EXACT_SUBSET_MAX", 5)
    bound = subset_log_mgf(scores, 6, 0.6)
    # the finite-population factor: the bound charges about 60/54 of the exact variance term
    assert exact < bound < exact * 1.25
    with pytest.raises(ValueError, match="subset"):
        subset_log_mgf(scores, 60, 0.6)


def _failure_tilts(mixture: tuple[tuple[float, float], ...]) -> tuple[float, ...]:
    return tuple(math.log(m) for m, _ in mixture)


def test_a_rollout_keeps_the_mixtures_it_started_with() -> None:
    fresh = Evidence()
    failures, slowness = fresh.guards()
    assert failures.tilts == _failure_tilts(canary_guard.FAILURE_MULTIPLES)
    assert slowness.tilts == tuple(t for t, _ in canary_guard.SLOWNESS_TILTS)
    assert Evidence.from_json(fresh.to_json()).guard_mixture == fresh.guard_mixture
    # a record written before the mixture was recorded continues with the mixtures it began
    started_before = Evidence.from_json(
        '{"failure_guard": [0.4, 0.3, 0.2, 0.1], "slowness_guard": [0.1, 0.2, 0.3]}'
    )
    failures, slowness = started_before.guards()
    assert failures.tilts == _failure_tilts(canary_guard.LEGACY_FAILURE_MULTIPLES)
    assert slowness.tilts == tuple(t for t, _ in canary_guard.LEGACY_SLOWNESS_TILTS)
    assert slowness.log_wealth == [0.1, 0.2, 0.3]
    # one started under today's slow-run mixture but the failure mixture before today's
    # keeps both, and its next window moves the wealths it has, one per multiple it began with
    second = Evidence(failure_guard=[0.4, 0.3, 0.2, 0.1], slowness_guard=[0.1, 0.2])
    second.guard_mixture = 2
    second = Evidence.from_json(second.to_json())
    failures, slowness = second.guards()
    assert failures.tilts == _failure_tilts(canary_guard.LEGACY_FAILURE_MULTIPLES)
    assert failures.weights == tuple(w for _, w in canary_guard.LEGACY_FAILURE_MULTIPLES)
    assert slowness.tilts == tuple(t for t, _ in canary_guard.SLOWNESS_TILTS)
    second.add_all([("canary", False, 900.0), ("stable", True, 1000.0), ("stable", True, 950.0)])
    assert second.windows == 1
    assert len(second.failure_guard) == len(canary_guard.LEGACY_FAILURE_MULTIPLES)
    assert second.failure_guard[0] > 0.4  # the canary's failure is evidence for every multiple


def test_slowness_scores_are_rank_normal_scores_with_shared_ties() -> None:
    scores = slowness_scores([30.0, 10.0, 20.0, 20.0])
    assert scores[1] < scores[2] == scores[3] < scores[0]
    assert abs(sum(scores)) < 1e-9  # symmetric around 0
    assert failure_scores([True, False]) == [1.0, 0.0]


def _drifting_canary(
    seed: int, *, failure_multiple: float = 1.0, slowdown: float = 1.0, windows: int = 60
) -> tuple[bool, bool, int]:
    """(failure guard rejected, slowness guard rejected, canary runs at the first rejection)
    for one canary whose traffic drifts: the base failure rate climbs from 2 % to 20 %,
    durations double, and the canary's share of runs moves from 5 % to 25 %."""
    rng = random.Random(seed)
    failures, slowness = CanaryGuard.for_failures(), CanaryGuard.for_slowness()
    canary_runs = 0
    first: int | None = None
    for w in range(windows):
        progress = w / (windows - 1)
        base = 0.02 + 0.18 * progress
        share = 0.05 + 0.20 * progress
        failed, canary, durations = [], [], []
        for _ in range(50):
            is_canary = rng.random() < share
            rate = min(1.0, base * (failure_multiple if is_canary else 1.0))
            failed.append(rng.random() < rate)
            canary.append(is_canary)
            ms = math.exp(rng.gauss(math.log(1000.0 * (1.0 + progress)), 0.3))
            durations.append(ms * (slowdown if is_canary else 1.0))
            canary_runs += is_canary
        failures.observe_failures(failed, canary)
        slowness.observe(slowness_scores(durations), canary)
        if first is None and (failures.rejects(ALPHA) or slowness.rejects(ALPHA)):
            first = canary_runs
    return failures.rejects(ALPHA), slowness.rejects(ALPHA), first or canary_runs


@pytest.mark.slow
def test_false_alarms_stay_within_alpha_when_the_traffic_drifts() -> None:
    # A fixed-rate comparison would blame the canary for the climb (the base rate rises
    # tenfold); the guard compares it with stable runs of the same window only.
    results = [_drifting_canary(seed) for seed in SEEDS]
    failure_alarms = sum(f for f, _, _ in results)
    slowness_alarms = sum(s for _, s, _ in results)
    assert failure_alarms / len(SEEDS) <= ALPHA, failure_alarms
    assert slowness_alarms / len(SEEDS) <= ALPHA, slowness_alarms


@pytest.mark.slow
def test_a_canary_that_fails_three_times_as_often_is_caught_while_traffic_drifts() -> None:
    results = [_drifting_canary(seed, failure_multiple=3.0) for seed in range(40)]
    assert sum(f for f, _, _ in results) >= 38
    assert sorted(n for _, _, n in results)[20] < 200  # median canary runs to the alarm


def test_a_canary_half_as_slow_again_is_caught_within_a_few_windows() -> None:
    results = [_drifting_canary(seed, slowdown=1.5, windows=10) for seed in range(40)]
    assert all(s for _, s, _ in results)


def test_a_guard_refuses_what_it_cannot_be() -> None:
    with pytest.raises(ValueError, match="positive tilts"):
        CanaryGuard((0.0,))
    with pytest.raises(ValueError, match="weight"):
        CanaryGuard((1.0, 2.0), weights=(0.9, 0.9))
    with pytest.raises(ValueError, match="alpha"):
        CanaryGuard.for_failures().rejects(1.5)
    guard = CanaryGuard.for_failures()
    guard.observe_failures([True, True], [True, True])  # one arm only: no evidence
    assert guard.wealth == 1.0


def _windows_to_catch(seed: int, guard: CanaryGuard, slowdown: float, alpha: float) -> int:
    """Windows of 50 runs (a tenth of them the canary's, its durations ``slowdown`` times
    longer and then divided by a 1.2 tolerance) until ``guard`` rejects; 100 at most."""
    rng = random.Random(seed)
    for window in range(1, 101):
        canary = [rng.random() < 0.1 for _ in range(50)]
        durations = [rng.lognormvariate(0.0, 0.4) * (slowdown / 1.2 if c else 1.0) for c in canary]
        guard.observe(slowness_scores(durations), canary)
        if guard.rejects(alpha):
            return window
    return 100


def test_the_exact_e_value_and_its_mixture_catch_a_canary_half_as_slow_again_sooner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same windows judged by today's guard and by the one before: the with-replacement
    # bound in every window and the mixture that put 0.3 of its weight near the best tilt.
    seeds = range(60)
    now = [_windows_to_catch(s, CanaryGuard.for_slowness(), 1.5, 0.06) for s in seeds]
    monkeypatch.setattr(canary_guard, "EXACT_SUBSET_MAX", 0)
    before = [_windows_to_catch(s, CanaryGuard.for_slowness(legacy=True), 1.5, 0.06) for s in seeds]
    assert max(now) < 100
    assert sum(now) < 0.9 * sum(before), (sum(now), sum(before))


def _canary_runs_to_catch(seed: int, guard: CanaryGuard, multiple: float) -> int:
    """Canary runs until ``guard`` rejects at the failure guard's share of the default budget
    (0.7 of 0.2), over windows of 50 runs, a tenth of them the canary's, stable failing 2.8 %
    of its runs and the canary ``multiple`` times as often; 200 windows at most."""
    rng = random.Random(seed)
    canary_runs = 0
    for _ in range(200):
        canary = [rng.random() < 0.1 for _ in range(50)]
        failed = [rng.random() < 0.028 * (multiple if c else 1.0) for c in canary]
        canary_runs += sum(canary)
        guard.observe_failures(failed, canary)
        if guard.rejects(0.14):
            break
    return canary_runs


def test_the_failure_mixture_catches_a_canary_failing_twice_as_often_sooner() -> None:
    # The same windows judged by today's failure mixture and by the one before, which put
    # half its weight on doubling itself: half of such canaries are caught on luckier windows
    # than average, where a multiple a little above 2 reaches the boundary sooner.
    seeds = range(400)
    now = [_canary_runs_to_catch(s, CanaryGuard.for_failures(), 2.0) for s in seeds]
    before = [_canary_runs_to_catch(s, CanaryGuard.for_failures(legacy=True), 2.0) for s in seeds]
    assert statistics.median(now) < 0.9 * statistics.median(before)
    assert statistics.mean(now) < statistics.mean(before)
    # a canary failing four times as often is caught about as soon as before
    now = [_canary_runs_to_catch(s, CanaryGuard.for_failures(), 4.0) for s in range(200)]
    before = [
        _canary_runs_to_catch(s, CanaryGuard.for_failures(legacy=True), 4.0) for s in range(200)
    ]
    assert statistics.mean(now) < 1.05 * statistics.mean(before)
