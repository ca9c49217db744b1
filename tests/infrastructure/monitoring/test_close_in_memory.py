"""Closing an in-memory monitor counts every run it took: there is no store to write, so no
deadline to cut the last buffered runs off its metrics, and nothing is reported lost."""

from __future__ import annotations

import logging

from log_capture import captured_records

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor


def test_every_run_counts_after_close_and_none_is_reported_lost() -> None:
    monitor = PerformanceMonitor(flush_interval_s=3600)
    for i in range(20_000):
        monitor.record("a" if i % 2 else "b", success=i % 5 != 0, duration_ms=1.0)
    with captured_records("agentmend", logging.WARNING) as logs:
        left = monitor.close()
    assert left == 0
    assert [getattr(r, "event", None) for r in logs] == []
    metrics = monitor.get_metrics()
    assert metrics["a"].executions + metrics["b"].executions == 20_000
    assert metrics["b"].executions == 10_000
    assert monitor.backlog_status().unwritten_at_close == 0
