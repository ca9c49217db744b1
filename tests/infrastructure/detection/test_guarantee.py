"""The per-agent false-alarm guarantee of the failure chart, checked exactly on cells near budget.

Each cell's expected false-alarm rate (over the Binomial(n, p) baselines of an agent that truly
fails at p) is computed exactly, so the check is cheap and has no noise; the cells are the ones
closest to the budget, so the test fails if any of their rates were doubled.
"""

from __future__ import annotations

import math
import random

import pytest

from agentmend.infrastructure.detection.cusum import bernoulli_arl
from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.detection.guarantee import (
    ESTIMATION_MARGIN,
    binomial_support,
    failure_alarm_rate,
    failure_chart,
)
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor

BUDGET = 0.001 * 0.95  # the default false_alarm_rate times the default failure_share


@pytest.mark.slow
@pytest.mark.parametrize(("n", "p"), [(100, 0.03), (30, 0.10)])
def test_expected_false_alarm_rate_is_within_budget_and_near_it(n: int, p: float) -> None:
    rate = failure_alarm_rate(n, p, BUDGET)
    assert rate <= BUDGET
    assert 2 * rate > BUDGET  # a doubled rate would break the guarantee: the check has teeth


def test_the_sum_over_baselines_counts_the_unlucky_ones() -> None:
    # With n = 100 and p = 0.03, a baseline with no failure (probability 0.048) gets a chart
    # that alarms about 9 times per 1,000 healthy runs: far above budget for that agent.
    # The guarantee is the average over the baselines the agent may produce, and holds.
    chart = failure_chart(0, 100, BUDGET)
    assert chart is not None
    unlucky = 1.0 / bernoulli_arl(chart.up, chart.down, chart.threshold, 0.03)
    assert unlucky > 4 * BUDGET
    support, left_out = binomial_support(100, 0.03)
    assert left_out <= 1e-9
    assert math.isclose(sum(w for _, w in support) + left_out, 1.0, rel_tol=1e-12)
    assert dict(support)[0] == pytest.approx(0.97**100)
    assert failure_alarm_rate(100, 0.03, BUDGET) <= BUDGET


def test_the_detector_runs_the_guaranteed_chart() -> None:
    rng = random.Random(3)
    with PerformanceMonitor(baseline_n=100) as monitor:
        detector = IssueDetector(baseline_n=100, monitor=monitor)
        for _ in range(101):
            ok = rng.random() < 0.97
            monitor.record("a", success=ok, duration_ms=1000.0 * math.exp(rng.gauss(0, 0.3)))
        detector.check()
        stats = detector.statistics("a")
        assert stats is not None
        assert stats["state"] == "watching"
        base = monitor.baseline("a")
        assert base is not None
        chart = failure_chart(sum(base.outcomes[:100]), 100, BUDGET)
        assert chart is not None
        assert stats["cusum_failure_rate"]["threshold"] == pytest.approx(
            chart.threshold * chart.unit
        )
    assert 0 < ESTIMATION_MARGIN < 1


def test_below_the_minimum_baseline_the_rules_stand_in_labelled() -> None:
    with PerformanceMonitor(baseline_n=20) as monitor:
        detector = IssueDetector(baseline_n=20, monitor=monitor)
        assert not detector.guaranteed
        for _ in range(20):
            monitor.record("a", success=True, duration_ms=100.0)
        reports = []
        for _ in range(5):
            monitor.record("a", success=False, duration_ms=100.0)
            reports.extend(detector.check())
        assert reports
        assert all(r.detector.startswith("rules:") for r in reports)
        assert all("outside the false-alarm guarantee" in r.context for r in reports)
        assert detector.state("a") == "outside_guarantee"


def test_an_agent_is_warming_up_until_its_baseline_is_full() -> None:
    with PerformanceMonitor(baseline_n=50) as monitor:
        detector = IssueDetector(baseline_n=50, monitor=monitor)
        for _ in range(49):
            monitor.record("a", success=True, duration_ms=100.0)
        assert detector.check() == []
        assert detector.state("a") == "warming_up"
        stats = detector.statistics("a")
        assert stats is not None
        assert stats["state"] == "warming_up"
        monitor.record("a", success=True, duration_ms=100.0)
        monitor.record("a", success=True, duration_ms=100.0)
        detector.check()
        assert detector.state("a") == "watching"
