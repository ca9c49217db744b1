"""After a kept change, the evidence is what happened since: older errors are labelled history."""

from __future__ import annotations

from pathlib import Path

from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store


def _fail(m: PerformanceMonitor, error: str, n: int = 3) -> None:
    for _ in range(n):
        m.record("a", success=False, duration_ms=10.0, error=error)


def test_errors_before_a_kept_change_are_history_labelled_with_it(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with Store(db) as store, PerformanceMonitor(store, baseline_n=10) as m:
        _fail(m, "max_tokens reached: answer truncated")
        detector = IssueDetector(baseline_n=10, monitor=m)
        detector.on_change_kept("a", label="change c1")
        metrics = m.get_agent_metrics("a")
        assert metrics is not None
        assert metrics.recent_errors == ()
        assert metrics.consecutive_failures == 0
        assert metrics.errors_before_change == ("max_tokens reached: answer truncated",) * 3
        assert metrics.errors_before_change_label == "change c1"
        _fail(m, "RateLimitError: 429", 1)
        metrics = m.get_agent_metrics("a")
        assert metrics is not None
        assert metrics.recent_errors == ("RateLimitError: 429",)
        assert metrics.last_error == "RateLimitError: 429"
    # a restart draws the same line, from the store
    with Store(db) as store, PerformanceMonitor(store, baseline_n=10) as m:
        metrics = m.get_agent_metrics("a")
        assert metrics is not None
        assert metrics.recent_errors == ("RateLimitError: 429",)
        assert metrics.errors_before_change == ("max_tokens reached: answer truncated",) * 3
        assert metrics.errors_before_change_label == "change c1"


def test_a_rolled_back_change_makes_its_earlier_errors_current_again() -> None:
    with PerformanceMonitor(baseline_n=5) as m:
        _fail(m, "tool denied: web_search")
        m.start_new_baseline("a", label="change c2")
        _fail(m, "tool denied: web_search", 1)
        assert m.restore_baseline("a") is not None
        metrics = m.get_agent_metrics("a")
        assert metrics is not None
        assert metrics.recent_errors == ("tool denied: web_search",) * 4
        assert metrics.errors_before_change == ()
        assert metrics.errors_before_change_label is None
