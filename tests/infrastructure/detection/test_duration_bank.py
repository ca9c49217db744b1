"""The duration chart as a bank of CUSUMs: its budget split, its speed on small slowdowns."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from agentmend.infrastructure.detection.cusum import NormalChart, calibrate_normal
from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.detection.duration_bank import (
    DEFAULT_MEMBERS,
    MEAN_MARGIN,
    calibrate_duration_bank,
)
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.errors import InvalidArgument
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store

ARL = 20_000.0  # the duration chart's default budget: 0.001 * 0.05


def _baseline(rng: random.Random, sd: float, n: int = 500) -> list[float]:
    return [rng.gauss(0.0, sd) for _ in range(n)]


def test_members_split_the_budget_so_their_alarm_rates_add_up_to_it() -> None:
    values = _baseline(random.Random(1), 0.5)
    bank = calibrate_duration_bank(values, ARL, 1.5)
    assert len(bank.members) == len(DEFAULT_MEMBERS) == 2
    assert math.fsum(bank.weights) == pytest.approx(1.0)
    # the union bound: each member is held to weight * budget, so together to the budget
    assert math.fsum(1.0 / c.target_arl for c in bank.members) == pytest.approx(1.0 / ARL)
    for chart, (power, weight) in zip(bank.members, DEFAULT_MEMBERS, strict=True):
        alone = calibrate_normal(
            values, ARL / weight, power * math.log(1.5), mean_margin=MEAN_MARGIN
        )
        assert (chart.mean, chart.sd, chart.k) == (alone.mean, alone.sd, alone.k)
        assert chart.target_arl == alone.target_arl
        assert chart.h >= alone.h  # raised, never lowered, by the estimated-mean correction
    small, large = bank.members
    assert small.k < large.k  # tuned to a smaller and a larger slowdown than 1.5x


def test_a_short_baseline_raises_the_small_members_threshold_most() -> None:
    rng = random.Random(2)
    short, long = _baseline(rng, 1.0, 30), _baseline(rng, 1.0, 2000)
    raised = []
    for values in (short, long):
        bank = calibrate_duration_bank(values, ARL, 1.5)
        small = bank.members[0]
        plain = calibrate_normal(values, ARL / 0.6, 0.65 * math.log(1.5), mean_margin=MEAN_MARGIN)
        raised.append(small.h / plain.h)
    assert raised[0] > 1.5  # 30 runs say little about the mean: a much higher threshold
    assert raised[1] < 1.2


@pytest.mark.parametrize(
    "members",
    [(), ((0.65, 0.5), (1.6, 0.4)), ((0.0, 0.6), (1.6, 0.4)), ((0.65, 1.2), (1.6, -0.2))],
)
def test_a_bank_that_would_break_the_budget_is_refused(
    members: tuple[tuple[float, float], ...],
) -> None:
    with pytest.raises(InvalidArgument):
        calibrate_duration_bank([0.0, 0.1, 0.2], ARL, 1.5, members)


def _delay(charts: list[NormalChart], shift: float, sd: float, rng: random.Random) -> int:
    stats = [0.0] * len(charts)
    for t in range(1, 100_000):
        y = rng.gauss(shift, sd)
        for j, c in enumerate(charts):
            s = stats[j] + c.standardise(y) - c.k
            if s >= c.h:
                return t
            stats[j] = max(0.0, s)
    raise AssertionError("no alarm")


def test_the_bank_is_faster_than_one_chart_on_a_small_slowdown_and_as_fast_on_a_large() -> None:
    rng = random.Random(11)
    bank_small, one_small, bank_large, one_large = [], [], [], []
    for _ in range(150):
        values = _baseline(rng, 0.5)
        bank = list(calibrate_duration_bank(values, ARL, 1.5).members)
        one = [calibrate_normal(values, ARL, math.log(1.5))]
        bank_small.append(_delay(bank, math.log(1.25), 0.5, rng))
        one_small.append(_delay(one, math.log(1.25), 0.5, rng))
        bank_large.append(_delay(bank, math.log(2.0), 0.5, rng))
        one_large.append(_delay(one, math.log(2.0), 0.5, rng))
    assert statistics.fmean(bank_small) < 0.8 * statistics.fmean(one_small)
    assert statistics.fmean(bank_large) < 1.1 * statistics.fmean(one_large)


def _feed(m: PerformanceMonitor, rng: random.Random, n: int, median_ms: float) -> None:
    for _ in range(n):
        m.record("a", success=True, duration_ms=median_ms * math.exp(rng.gauss(0.0, 0.3)))


def test_a_restart_resumes_the_leading_member(tmp_path: Path) -> None:
    rng = random.Random(4)
    db = tmp_path / "s.db"
    with Store(db) as store, PerformanceMonitor(store, baseline_n=100) as m:
        d = IssueDetector(baseline_n=100, monitor=m, ledger=IssueLedger(store))
        _feed(m, rng, 100, 1000.0)
        d.check()
        _feed(m, rng, 6, 1400.0)  # some evidence of a slowdown, short of an alarm
        assert d.check() == []
        before = d.statistics("a")
        assert before is not None
        shown = before["cusum_log_duration"]
        assert 0.0 < shown["statistic"] < shown["threshold"]
    with Store(db) as store, PerformanceMonitor(store, baseline_n=100) as m:
        d = IssueDetector(baseline_n=100, monitor=m, ledger=IssueLedger(store))
        m.record("a", success=True, duration_ms=1000.0)
        assert d.check() == []
        after = d.statistics("a")
        assert after is not None
        resumed = after["cusum_log_duration"]
        # the same member, resumed (one typical run moves it by less than a step from zero)
        assert resumed["threshold"] == shown["threshold"]
        assert 0.0 < resumed["statistic"] < shown["statistic"]
