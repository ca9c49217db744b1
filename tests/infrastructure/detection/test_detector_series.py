"""The detector's statistic over time: kept beside its state as it runs, downsampled like the
run series, and drawn beneath each agent's chart in the report."""

from __future__ import annotations

import math
import random
from pathlib import Path

from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.detection.series import (
    POINT_EVERY_RUNS,
    StatisticPoint,
    add_points,
    read_statistic_series,
)
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.monitoring.run_series import ROLLUP_WIDTHS
from agentmend.infrastructure.store.api import Store

BASE_N = 100


def _feed(m: PerformanceMonitor, rng: random.Random, n: int, p_success: float) -> None:
    for _ in range(n):
        ok = rng.random() < p_success
        m.record("a", success=ok, duration_ms=1000.0 * math.exp(rng.gauss(0.0, 0.2)))


def test_the_statistic_is_kept_as_the_detector_runs_and_peaks_at_an_alarm(
    tmp_path: Path,
) -> None:
    rng = random.Random(11)
    with Store(tmp_path / "s.db") as store, PerformanceMonitor(store, baseline_n=BASE_N) as m:
        d = IssueDetector(baseline_n=BASE_N, monitor=m, ledger=IssueLedger(store))
        _feed(m, rng, BASE_N, 0.97)
        assert d.check() == []
        healthy = []
        for _ in range(40):
            _feed(m, rng, 1, 0.97)
            assert d.check() == []
            healthy.append(d.statistics("a"))
        raised = []
        for _ in range(200):
            _feed(m, rng, 1, 0.3)
            raised += d.check()
            if raised:
                break
        assert len(raised) == 1
        m.flush()
        steps = read_statistic_series(store)[("a", "low_success_rate")]
        shown = d.statistics("a")
        assert shown is not None
        threshold = shown["cusum_failure_rate"]["threshold"]
        # points along the way: the alarm's peak at the threshold, the healthy ones below it
        assert max(s.peak for s in steps) == 1.0
        highest_healthy = max(h["cusum_failure_rate"]["statistic"] for h in healthy if h)
        assert any(0.0 <= s.peak < 1.0 for s in steps)
        assert highest_healthy < threshold
        # the last point is what status shows: the statistic restarted after the alarm
        assert steps[-1].threshold == threshold
        assert steps[-1].statistic == shown["cusum_failure_rate"]["statistic"] < threshold
        assert ("a", "performance_regression") in read_statistic_series(store)


def test_a_crossing_inside_one_check_still_shows_as_its_peak(tmp_path: Path) -> None:
    rng = random.Random(12)
    with Store(tmp_path / "s.db") as store, PerformanceMonitor(store, baseline_n=BASE_N) as m:
        d = IssueDetector(baseline_n=BASE_N, monitor=m, ledger=IssueLedger(store))
        _feed(m, rng, BASE_N, 0.97)
        d.check()
        _feed(m, rng, 80, 0.3)
        _feed(m, rng, 30, 1.0)  # the statistic crosses, restarts and falls back within the check
        assert len(d.check()) == 1
        m.flush()
        (step,) = read_statistic_series(store)[("a", "low_success_rate")]
        assert step.peak == 1.0
        assert step.statistic < step.threshold


def test_a_long_history_reads_the_peak_of_each_coarse_step(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        IssueLedger(store)  # migrates the series
        PerformanceMonitor(store).close()
        day = 86_400.0
        start = 1_700_000_000.0
        points = [
            StatisticPoint("a", "low_success_rate", start + i * 600.0, (i % 97) / 100, i, 5.0)
            for i in range(int(30 * day / 600))  # every 10 minutes for 30 days
        ]
        with store.transaction() as conn:
            conn.execute(
                "INSERT INTO run_totals (agent, runs, failures, first_ts, last_ts)"
                " VALUES ('a', 1000000, 0, ?, ?)",
                (points[0].ts, points[-1].ts),
            )
            add_points(conn, points, raw_runs=1000)
            widths = dict(
                conn.execute("SELECT width, COUNT(*) FROM detector_series GROUP BY width")
            )
        assert 0 not in widths  # a long history keeps no point as it is
        assert sorted(widths) == [60, *ROLLUP_WIDTHS]
        steps = read_statistic_series(store, max_points=100, raw_runs=0)[("a", "low_success_rate")]
        assert 50 <= len(steps) <= 100
        # each step: the highest peak and the latest statistic of the points it covers
        for step, following in zip(steps, [*steps[1:], None], strict=True):
            end = following.start_ts if following else math.inf
            covered = [p for p in points if step.start_ts <= p.ts < end]
            assert covered
            assert step.peak == max(p.peak for p in covered)
            assert step.statistic == covered[-1].statistic


def test_a_check_after_every_run_leaves_a_point_every_few_runs(tmp_path: Path) -> None:
    # a point at every check cost more than the check when one follows each task
    rng = random.Random(13)
    with Store(tmp_path / "s.db") as store, PerformanceMonitor(store, baseline_n=BASE_N) as m:
        d = IssueDetector(baseline_n=BASE_N, monitor=m, ledger=IssueLedger(store))
        _feed(m, rng, BASE_N + 1, 0.97)
        d.check()
        for _ in range(5 * POINT_EVERY_RUNS):
            _feed(m, rng, 1, 1.0)
            assert d.check() == []
        m.flush()
        points = (
            store.connection()
            .execute(
                "SELECT COUNT(*) FROM detector_series WHERE width = 0 AND kind = 'low_success_rate'"
            )
            .fetchone()[0]
        )
    # one at the first check, then one per POINT_EVERY_RUNS runs (and one per new minute)
    assert 5 <= points <= 5 + 1 + 2
