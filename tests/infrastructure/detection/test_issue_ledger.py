"""One alarm per condition: open issues and detector state kept in the store (IssueLedger)."""

from __future__ import annotations

import math
import random
from pathlib import Path

from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store

BASE_N = 100


def _feed(
    m: PerformanceMonitor, rng: random.Random, n: int, p_success: float, median_ms: float = 1000.0
) -> None:
    for _ in range(n):
        ok = rng.random() < p_success
        m.record(
            "a",
            success=ok,
            duration_ms=median_ms * math.exp(rng.gauss(0.0, 0.2)),
            error=None if ok else "RateLimitError: 429 from the provider",
        )


def _run(
    m: PerformanceMonitor,
    d: IssueDetector,
    rng: random.Random,
    n: int,
    p: float,
    median_ms: float = 1000.0,
) -> list[IssueReport]:
    found: list[IssueReport] = []
    for _ in range(n):
        _feed(m, rng, 1, p, median_ms)
        found.extend(d.check())
    return found


def _detector(m: PerformanceMonitor, ledger: IssueLedger, **options: int) -> IssueDetector:
    return IssueDetector(baseline_n=BASE_N, monitor=m, ledger=ledger, **options)  # type: ignore[arg-type]


def test_a_condition_no_fix_cures_is_one_issue_held_with_doubling_backoff(tmp_path: Path) -> None:
    rng = random.Random(1)
    with Store(tmp_path / "s.db") as store, PerformanceMonitor(store, baseline_n=BASE_N) as m:
        ledger = IssueLedger(store)
        d = _detector(m, ledger, backoff_runs=50, backoff_max_runs=120)
        _feed(m, rng, BASE_N, 0.97)
        assert d.check() == []
        first = _run(m, d, rng, 45, 0.3)
        # before: an alarm every few runs; now one issue, open until a cycle says how it ended
        assert [r.error_type for r in first] == ["low_success_rate"]
        issue = first[0]
        assert issue.issue_id is not None
        assert ledger.get(issue.issue_id).status == "open"  # type: ignore[union-attr]
        # an issue left open with no outcome (its cycle's process died) is raised once more
        # after the back-off, so it is not lost
        retried = _run(m, d, rng, 60, 0.3)
        assert [r.issue_id for r in retried] == [issue.issue_id]

        held = d.cycle_finished(issue, kept=False, outcome="no_action")
        assert held is not None
        assert held.status == "held"
        assert held.hold_runs == 50
        assert held.outcome == "no_action"
        assert held.cycles == 1
        quiet = _run(m, d, rng, 45, 0.3)
        assert quiet == []  # within the hold the same condition raises nothing
        again = _run(m, d, rng, 60, 0.3)
        assert [r.issue_id for r in again] == [issue.issue_id]  # the same issue, re-opened
        assert ledger.get(issue.issue_id).status == "open"  # type: ignore[union-attr]
        second = d.cycle_finished(again[0], kept=False, outcome="refused")
        assert second is not None
        assert second.hold_runs == 100
        assert second.cycles == 2
        assert _run(m, d, rng, 95, 0.3) == []
        third = _run(m, d, rng, 40, 0.3)
        assert [r.issue_id for r in third] == [issue.issue_id]
        capped = d.cycle_finished(third[0], kept=False, outcome="no_action")
        assert capped is not None
        assert capped.hold_runs == 120


def test_another_kind_still_fires_while_one_is_held() -> None:
    rng = random.Random(2)
    with PerformanceMonitor(baseline_n=BASE_N) as m:
        d = _detector(m, IssueLedger(), backoff_runs=10_000, backoff_max_runs=10_000)
        _feed(m, rng, BASE_N, 0.97)
        d.check()
        failures = _run(m, d, rng, 100, 0.3)
        assert [r.error_type for r in failures] == ["low_success_rate"]
        d.cycle_finished(failures[0], kept=False, outcome="no_action")
        slow = _run(m, d, rng, 100, 0.3, median_ms=3000.0)
        assert [r.error_type for r in slow] == ["performance_regression"]


def test_a_condition_that_clears_by_itself_closes_as_cleared_without_change() -> None:
    rng = random.Random(3)
    with PerformanceMonitor(baseline_n=BASE_N) as m:
        ledger = IssueLedger()
        d = _detector(m, ledger, backoff_runs=10_000, backoff_max_runs=10_000, clear_window=60)
        _feed(m, rng, BASE_N, 0.97)
        d.check()
        storm = _run(m, d, rng, 100, 0.2)
        assert len(storm) == 1
        assert storm[0].issue_id is not None
        d.cycle_finished(storm[0], kept=False, outcome="no_action")
        assert _run(m, d, rng, 300, 0.99) == []  # the storm passed
        row = ledger.get(storm[0].issue_id)
        assert row is not None
        assert row.status == "cleared_without_change"
        assert ledger.issues(active=True) == []
        # a later condition is a new issue, raised at once (the hold went with the old one)
        later = _run(m, d, rng, 100, 0.2)
        assert len(later) == 1
        assert later[0].issue_id not in (None, storm[0].issue_id)


def test_a_kept_change_resolves_the_issue() -> None:
    rng = random.Random(4)
    with PerformanceMonitor(baseline_n=BASE_N) as m:
        ledger = IssueLedger()
        d = _detector(m, ledger)
        _feed(m, rng, BASE_N, 0.97)
        d.check()
        (issue,) = _run(m, d, rng, 100, 0.3)
        row = d.cycle_finished(issue, kept=True, outcome="kept", change_id="c1")
        assert row is not None
        assert row.status == "resolved"
        assert row.change_id == "c1"
        assert (
            d.cycle_finished(issue.model_copy(update={"issue_id": None}), kept=False, outcome="x")
            is None
        )


def test_a_second_process_sees_the_issue_open_and_raises_nothing(tmp_path: Path) -> None:
    rng = random.Random(5)
    db = tmp_path / "s.db"
    with (
        Store(db) as store_a,
        Store(db) as store_b,
        PerformanceMonitor(store_a, baseline_n=BASE_N) as ma,
        PerformanceMonitor(store_b, baseline_n=BASE_N) as mb,
    ):
        da = _detector(ma, IssueLedger(store_a))
        db_ = _detector(mb, IssueLedger(store_b))
        _feed(ma, rng, BASE_N, 0.97)
        ma.flush()
        mb.refresh()
        assert da.check() == []
        assert db_.check() == []
        _feed(ma, rng, 100, 0.3)
        ma.flush()
        mb.refresh()
        seen_a, seen_b = da.check(), db_.check()
        assert len(seen_a) == 1  # the first to see the alarm opens the issue
        assert seen_b == []  # the second finds it open: no second cycle
        stats = db_.statistics("a")
        assert stats is not None
        assert stats["issues"]["low_success_rate"]["issue_id"] == seen_a[0].issue_id


def test_detector_state_survives_a_restart(tmp_path: Path) -> None:
    rng = random.Random(6)
    db = tmp_path / "s.db"
    with Store(db) as store, PerformanceMonitor(store, baseline_n=BASE_N) as m:
        d = _detector(m, IssueLedger(store), backoff_runs=10_000, backoff_max_runs=10_000)
        _feed(m, rng, BASE_N, 0.97)
        d.check()
        (issue,) = _run(m, d, rng, 100, 0.3)
        d.cycle_finished(issue, kept=False, outcome="no_action")
        _feed(m, rng, 3, 0.0)
        d.check()
        before = d.statistics("a")
        assert before is not None
    with Store(db) as store, PerformanceMonitor(store, baseline_n=BASE_N) as m:
        d = _detector(m, IssueLedger(store), backoff_runs=10_000, backoff_max_runs=10_000)
        _feed(m, rng, 1, 1.0)
        assert d.check() == []
        after = d.statistics("a")
        assert after is not None
        assert after["issues"] == {
            "low_success_rate": {"issue_id": issue.issue_id, "status": "held"}
        }
        # resumed, not restarted from zero: one success takes the statistic down by one step
        fail_before = before["cusum_failure_rate"]["statistic"]
        fail_after = after["cusum_failure_rate"]["statistic"]
        assert 0.0 < fail_after < fail_before
        # and the held condition raises nothing more in the new process
        assert _run(m, d, rng, 100, 0.3) == []


def test_status_reads_open_issues_and_detector_state_from_the_store(tmp_path: Path) -> None:
    from agentmend.faces.report.data import agent_statuses

    rng = random.Random(7)
    with Store(tmp_path / "s.db") as store, PerformanceMonitor(store, baseline_n=BASE_N) as m:
        d = _detector(m, IssueLedger(store))
        _feed(m, rng, BASE_N, 0.97)
        d.check()
        (issue,) = _run(m, d, rng, 45, 0.3)
        m.flush()
        (status,) = agent_statuses(store, baseline_n=BASE_N)
        assert [i["issue_id"] for i in status.open_issues] == [issue.issue_id]
        assert status.open_issues[0]["status"] == "open"
        assert status.detector is not None
        shown = d.statistics("a")
        assert shown is not None
        assert status.detector["cusum_failure_rate"] == shown["cusum_failure_rate"]


def test_a_new_process_shows_the_saved_statistics_before_its_first_check(tmp_path: Path) -> None:
    """The session's /status and `agentmend status` show the same chart values at once."""
    from agentmend.faces.report.data import agent_statuses

    rng = random.Random(8)
    db = tmp_path / "s.db"
    with Store(db) as store, PerformanceMonitor(store, baseline_n=BASE_N) as m:
        d = _detector(m, IssueLedger(store))
        _feed(m, rng, BASE_N, 0.97)
        d.check()
        _feed(m, rng, 20, 0.6)
        d.check()
        m.flush()
    with Store(db) as store, PerformanceMonitor(store, baseline_n=BASE_N) as m:
        fresh = _detector(m, IssueLedger(store))
        shown = fresh.statistics("a")
        assert shown is not None
        assert shown["state"] == "saved"
        (status,) = agent_statuses(store, baseline_n=BASE_N)
        assert status.detector is not None
        assert shown["cusum_failure_rate"]["statistic"] > 0
        assert shown["cusum_failure_rate"] == status.detector["cusum_failure_rate"]
        assert fresh.statistics("nobody") is None
