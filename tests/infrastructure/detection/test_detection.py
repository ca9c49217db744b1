"""IssueDetector (rules and calibrated CUSUMs) and the calibration math behind it."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest

from agentmend.infrastructure.detection.cusum import (
    bernoulli_arl,
    beta_quantile,
    calibrate_bernoulli,
    calibrate_normal,
    integer_weights,
    posterior_arl,
    siegmund_arl,
)
from agentmend.infrastructure.detection.detector import IssueDetector, RuleThresholds
from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store

BASE_N = 200  # a smaller baseline keeps the tests quick; the math is the same


@pytest.fixture
def monitor() -> Iterator[PerformanceMonitor]:
    m = PerformanceMonitor(baseline_n=BASE_N)
    yield m
    m.close()


def _feed(
    m: PerformanceMonitor,
    rng: random.Random,
    agent: str,
    n: int,
    p_success: float,
    median_ms: float = 1000.0,
    sd_log: float = 0.3,
) -> None:
    for _ in range(n):
        ok = rng.random() < p_success
        m.record(
            agent,
            success=ok,
            duration_ms=median_ms * math.exp(rng.gauss(0.0, sd_log)),
            error=None if ok else "ToolError: search returned 503",
        )


def _detectors(reports: list[IssueReport]) -> list[str]:
    return [r.detector for r in reports]


# --------------------------------------------------------------------------- calibration math


def test_bernoulli_arl_matches_hand_solutions() -> None:
    # Alarm on the first failure: geometric run length.
    assert bernoulli_arl(1, 1, 1, 0.2) == pytest.approx(5.0)
    # Two states: L0 = 1 + p L1 + q L0, L1 = 1 + q L0.
    p, q = 0.3, 0.7
    l0 = (1 + p) / (1 - q - p * q)
    assert bernoulli_arl(1, 1, 2, p) == pytest.approx(l0)


def test_bernoulli_arl_matches_simulation() -> None:
    up, down, threshold, p = 7, 2, 15, 0.15
    rng = random.Random(7)
    total, trials = 0, 4000
    for _ in range(trials):
        s = t = 0
        while s < threshold:
            t += 1
            s = s + up if rng.random() < p else max(0, s - down)
        total += t
    assert total / trials == pytest.approx(bernoulli_arl(up, down, threshold, p), rel=0.05)


def _dense_arl(up: int, down: int, threshold: int, p: Fraction) -> Fraction:
    """The same chain solved densely in exact arithmetic: no band, no rounding."""
    n, q = threshold, 1 - p
    a = [[Fraction(int(i == j)) for j in range(n)] + [Fraction(1)] for i in range(n)]
    for i in range(n):
        a[i][max(0, i - down)] -= q
        if i + up < n:
            a[i][i + up] -= p
    for k in range(n):
        pivot = next(r for r in range(k, n) if a[r][k] != 0)
        a[k], a[pivot] = a[pivot], a[k]
        for i in range(n):
            if i != k and a[i][k] != 0:
                f = a[i][k] / a[k][k]
                a[i] = [x - f * y for x, y in zip(a[i], a[k], strict=True)]
    return a[0][n] / a[0][0]


@pytest.mark.parametrize(
    ("up", "down", "threshold", "p"),
    [
        (7, 2, 15, "3/20"),
        (3, 5, 30, "1/4"),
        (12, 3, 40, "1/20"),
        (1, 4, 9, "1/2"),
        (9, 9, 9, "1/3"),
    ],
)
def test_bernoulli_arl_equals_an_exact_dense_solution(
    up: int, down: int, threshold: int, p: str
) -> None:
    exact = _dense_arl(up, down, threshold, Fraction(p))
    assert bernoulli_arl(up, down, threshold, float(Fraction(p))) == pytest.approx(
        float(exact), rel=1e-9
    )


def test_integer_weights_approximate_the_ratio() -> None:
    up, down = integer_weights(1.35, 0.1625)
    assert abs(up / down - 1.35 / 0.1625) <= 0.02 * 1.35 / 0.1625
    assert 0.1625 / down <= 0.05


def test_beta_quantile_closed_forms() -> None:
    assert beta_quantile(1.0, 1.0, 0.3) == pytest.approx(0.3)
    assert beta_quantile(1.0, 4.0, 0.5) == pytest.approx(1 - 0.5 ** (1 / 4))


def test_siegmund_approximation_is_close_to_the_tabulated_arl() -> None:
    # Tabulated in-control ARL of the N(0,1) CUSUM with k=0.5, h=5: about 930.
    assert siegmund_arl(0.5, 5.0) == pytest.approx(930, rel=0.03)


def test_bernoulli_calibration_meets_the_budget_and_is_cached() -> None:
    chart = calibrate_bernoulli(25, 500, 1000.0)
    assert chart is not None
    assert chart.arl0 >= 1000.0
    assert posterior_arl(chart.up, chart.down, chart.threshold, 25, 500) == pytest.approx(
        chart.arl0
    )
    # The smallest threshold that meets the budget.
    assert posterior_arl(chart.up, chart.down, chart.threshold - 1, 25, 500) < 1000.0
    # Conservative at the point estimate, as averaging over the posterior must be.
    assert bernoulli_arl(chart.up, chart.down, chart.threshold, 0.05) >= 1000.0
    assert calibrate_bernoulli(25, 500, 1000.0) is chart
    assert calibrate_bernoulli(0, 500, 1000.0) is not None  # no failures in the baseline
    assert calibrate_bernoulli(480, 500, 1000.0) is None  # failing almost always


def test_normal_calibration_is_robust_to_one_outlier() -> None:
    rng = random.Random(3)
    values = [7.0 + rng.gauss(0, 0.3) for _ in range(300)]
    chart = calibrate_normal(values, 10_000.0, math.log(1.5))
    values[0] = 50.0  # a run that hung for hours
    robust = calibrate_normal(values, 10_000.0, math.log(1.5))
    assert robust.mean == pytest.approx(chart.mean, abs=0.02)
    assert robust.sd == pytest.approx(chart.sd, rel=0.1)
    assert robust.standardise(1e9) == robust.cap
    assert robust.cap - robust.k < robust.h  # one run cannot raise an alarm by itself


# --------------------------------------------------------------------------- rules


def test_rule_consecutive_failures_fires_on_the_rising_edge(monitor: PerformanceMonitor) -> None:
    only_streaks = RuleThresholds(min_success_rate=0.0, max_error_rate=1.0)
    detector = IssueDetector("rules", rules=only_streaks, monitor=monitor)
    for _ in range(20):
        monitor.record("a", success=True, duration_ms=100.0)
    for _ in range(2):
        monitor.record("a", success=False, duration_ms=100.0, error="boom")
    assert detector.check() == []
    monitor.record("a", success=False, duration_ms=100.0, error="boom")
    reports = detector.check()
    assert _detectors(reports) == ["rules:consecutive_failures"]
    (r,) = reports
    assert (r.error_type, r.statistic, r.threshold) == ("consecutive_failures", 3.0, 3.0)
    monitor.record("a", success=False, duration_ms=100.0, error="boom")
    assert "rules:consecutive_failures" not in _detectors(detector.check())
    monitor.record("a", success=True, duration_ms=100.0)
    for _ in range(3):
        monitor.record("a", success=False, duration_ms=100.0, error="boom")
    assert "rules:consecutive_failures" in _detectors(detector.check())


def test_rule_low_success_rate_over_last_ten(monitor: PerformanceMonitor) -> None:
    detector = IssueDetector("rules", monitor=monitor)
    pattern = [True, True, False, True, True, False, True, True, True, True]  # 80 %: fine
    for ok in pattern:
        monitor.record("a", success=ok, duration_ms=100.0)
    assert detector.check() == []
    monitor.record("a", success=False, duration_ms=100.0)  # last 10: 7/10
    reports = detector.check()
    assert _detectors(reports) == ["rules:low_success_rate"]
    assert reports[0].statistic == pytest.approx(0.7)


def test_rule_performance_regression_against_the_baseline(monitor: PerformanceMonitor) -> None:
    detector = IssueDetector("rules", monitor=monitor)
    for _ in range(30):
        monitor.record("a", success=True, duration_ms=100.0)
    assert detector.check() == []
    for _ in range(10):
        monitor.record("a", success=True, duration_ms=300.0)
    reports = detector.check()
    assert _detectors(reports) == ["rules:performance_regression"]
    assert reports[0].error_type == "performance_regression"
    assert reports[0].statistic is not None
    assert reports[0].statistic > 1.5


def test_rule_high_error_rate_over_the_window(monitor: PerformanceMonitor) -> None:
    rules = RuleThresholds(min_success_rate=0.0, max_consecutive_failures=99)
    detector = IssueDetector("rules", rules=rules, monitor=monitor)
    for i in range(30):
        monitor.record("a", success=i % 3 != 0, duration_ms=100.0)  # 10/30 failed
    reports = detector.check()
    assert _detectors(reports) == ["rules:high_error_rate"]
    assert reports[0].statistic is not None
    assert reports[0].statistic > 0.3


# --------------------------------------------------------------------------- CUSUM


def test_no_detection_before_the_baseline_is_full(monitor: PerformanceMonitor) -> None:
    detector = IssueDetector(baseline_n=BASE_N, monitor=monitor)
    for _ in range(50):
        monitor.record("a", success=True, duration_ms=100.0)
    for _ in range(BASE_N - 51):
        monitor.record("a", success=False, duration_ms=5000.0, error="down")
    assert detector.check() == []
    stats = detector.statistics("a")
    assert stats is not None
    assert "cusum_failure_rate" not in stats
    assert not stats["baseline"]["frozen"]


def test_detects_a_seeded_step_change_with_full_evidence(monitor: PerformanceMonitor) -> None:
    rng = random.Random(11)
    detector = IssueDetector(baseline_n=BASE_N, monitor=monitor)
    _feed(monitor, rng, "solver", BASE_N, 0.95)
    _feed(monitor, rng, "helper", BASE_N, 0.95)
    assert detector.check() == []
    found: list[IssueReport] = []
    runs = 0
    while not found and runs < 200:
        _feed(monitor, rng, "solver", 1, 0.70)
        runs += 1
        found = detector.check()
    assert found, "a 0.95 -> 0.70 drop went undetected for 200 runs"
    (r,) = found
    assert r.detector == "cusum_failure_rate"
    assert r.error_type == "low_success_rate"
    assert r.agent_name == "solver"
    assert r.statistic is not None
    assert r.threshold is not None
    assert r.statistic >= r.threshold
    assert set(r.baseline) >= {
        "n",
        "failure_rate",
        "mean_log_duration",
        "sd_log_duration",
        "frozen",
    }
    assert r.baseline["n"] == BASE_N
    assert r.baseline["frozen"] is True
    assert 0.0 <= r.baseline["failure_rate"] < 0.15
    assert r.metrics["executions"] == BASE_N + runs
    assert r.error_logs
    assert r.error_logs[-1] == "ToolError: search returned 503"
    assert r.available_agents == ("helper", "solver")
    assert "failure rate rose" in r.context
    assert r.severity > 1.0


def test_duration_cusum_detects_a_slowdown(monitor: PerformanceMonitor) -> None:
    rng = random.Random(5)
    detector = IssueDetector(baseline_n=BASE_N, monitor=monitor)
    _feed(monitor, rng, "a", BASE_N, 1.0, median_ms=800.0)
    assert detector.check() == []
    _feed(monitor, rng, "a", 40, 1.0, median_ms=1600.0)
    reports = detector.check()
    assert reports
    assert reports[0].detector == "cusum_log_duration"
    assert reports[0].error_type == "performance_regression"
    assert 0.0 < reports[0].severity <= 1.0
    assert "slowed" in reports[0].context


def test_reports_each_crossing_once_then_restarts(monitor: PerformanceMonitor) -> None:
    # backoff_runs=1: an open issue may be raised again at its next crossing
    detector = IssueDetector(baseline_n=BASE_N, failure_share=1.0, monitor=monitor, backoff_runs=1)
    rng = random.Random(2)
    _feed(monitor, rng, "a", BASE_N, 0.95)
    detector.check()
    crossings: list[int] = []
    for i in range(1, 41):
        monitor.record("a", success=False, duration_ms=1000.0)
        reports = detector.check()
        if reports:
            assert len(reports) == 1
            crossings.append(i)
            stats = detector.statistics("a")
            assert stats is not None
            assert stats["cusum_failure_rate"]["statistic"] == 0.0
    assert len(crossings) >= 3
    gaps = {b - a for a, b in itertools.pairwise(crossings)}
    assert len(gaps) == 1  # the same number of failures from 0 each time: a clean restart


def test_kept_change_starts_a_new_baseline_and_rollback_restores_it(
    monitor: PerformanceMonitor,
) -> None:
    rng = random.Random(9)
    detector = IssueDetector(baseline_n=BASE_N, monitor=monitor)
    _feed(monitor, rng, "a", BASE_N, 0.95)
    assert detector.check() == []
    old = monitor.baseline("a")
    assert old is not None
    detector.on_change_kept("a")
    assert monitor.baseline("a") is not old
    # The changed agent fails more; that is its new normal while its new baseline fills.
    _feed(monitor, rng, "a", BASE_N, 0.75)
    assert detector.check() == []
    stats = detector.statistics("a")
    assert stats is not None
    assert stats["baseline"]["frozen"]
    assert detector.on_change_rolled_back("a") is True
    assert monitor.baseline("a") is old
    # Against the restored (healthy) baseline the same behaviour is an issue at once.
    found: list[IssueReport] = []
    for _ in range(100):
        _feed(monitor, rng, "a", 1, 0.75)
        found = detector.check()
        if found:
            break
    assert found
    assert found[0].baseline["epoch"] == old.epoch
    assert detector.on_change_rolled_back("a") is False


def test_detector_configuration_errors(monitor: PerformanceMonitor) -> None:
    with pytest.raises(ConfigurationError, match="mode"):
        IssueDetector("magic")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="false_alarm_rate"):
        IssueDetector(false_alarm_rate=0.0)
    with pytest.raises(ConfigurationError, match="baseline_n"):
        IssueDetector(baseline_n=BASE_N + 1).check(monitor)
    with pytest.raises(ConfigurationError, match="no monitor"):
        IssueDetector().check()
    detector = IssueDetector(baseline_n=BASE_N, monitor=monitor)
    with (
        PerformanceMonitor(baseline_n=BASE_N) as other,
        pytest.raises(ConfigurationError, match="another monitor"),
    ):
        detector.check(other)


def test_store_backed_detection_uses_the_persisted_baseline(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    rng = random.Random(4)
    with PerformanceMonitor(Store(db), baseline_n=BASE_N) as m:
        _feed(m, rng, "a", BASE_N, 0.98)
    with PerformanceMonitor(Store(db), baseline_n=BASE_N) as m:
        detector = IssueDetector(baseline_n=BASE_N, monitor=m)
        _feed(m, rng, "a", 60, 0.5)
        reports = detector.check()
        assert reports
        assert reports[0].detector == "cusum_failure_rate"
        assert reports[0].baseline["n"] == BASE_N


@pytest.mark.slow
def test_false_alarm_rate_of_healthy_agents_is_bounded() -> None:
    """200k healthy runs at a 90 % success rate, 20 agents each with its own baseline.

    The target is 1 alarm per 1,000 runs (both CUSUMs); the expected count is at most ~200 and
    its spread across seeds is ~+-30 %, so 2x the target is a generous bound that a detector
    without calibration (seed 003's rules raise ~12 per 1,000 here) fails by an order of
    magnitude. Deterministic: fixed seed.

    Checked every 50 runs, less than the issue's hold of 100: one check reports an issue at
    most once, so a check over a longer stretch would count issues, not alarms.
    """
    rng = random.Random(20240901)
    agents, runs, every = 20, 10_000, 50
    alarms = rule_alarms = 0
    with PerformanceMonitor(baseline_n=500, detection_backlog=runs + 1000) as m:
        statistical = IssueDetector(monitor=m)
        rules = IssueDetector("rules", monitor=m)
        assert every < statistical.backoff_runs
        for a in range(agents):
            for _ in range((500 + runs) // every):
                _feed(m, rng, f"agent{a}", every, 0.90, sd_log=0.4)
                alarms += len(statistical.check())
                rule_alarms += len(rules.check())
        assert statistical.missed_runs == 0
    budget = 0.001 * agents * runs
    print(f"statistical: {alarms}, rules: {rule_alarms}, budget: {budget:.0f}")
    assert alarms <= 2 * budget
    assert rule_alarms > 5 * budget


def test_a_baseline_with_far_outlying_fast_failures_still_calibrates() -> None:
    # typical log-durations and two very fast transient failures (a case seen in the cycle
    # benchmark): the threshold search overflowed computing the ARL of a huge threshold
    values = [*_TYPICAL_LOG_DURATIONS, 5.648, 5.801]
    chart = calibrate_normal(values, target_arl=1e5, shift=math.log(1.5))
    assert math.isfinite(chart.h)
    assert chart.h > 0


_TYPICAL_LOG_DURATIONS = [
    9.56,
    9.638,
    9.536,
    9.498,
    9.446,
    9.526,
    9.4,
    9.562,
    9.449,
    9.564,
    9.587,
    9.472,
    9.628,
    9.483,
    9.415,
    9.642,
    9.467,
    9.49,
    9.402,
    9.537,
    9.643,
    9.497,
    9.486,
    9.534,
    9.588,
    9.546,
    9.584,
    9.416,
    9.609,
    9.649,
    9.385,
    9.554,
    9.394,
    9.499,
    9.473,
    9.601,
    9.468,
    9.597,
    9.569,
    9.639,
    9.576,
    9.548,
    9.438,
    9.434,
    9.485,
    9.589,
    9.571,
    9.455,
]
