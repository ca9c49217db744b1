"""Fleet-wide detection: a checker sees the runs every worker recorded into the store.

Workers record into one store (here two monitors on it, each its own writer); a checker that
records nothing itself refreshes its monitor from the store and its detector raises the alarm
for the agent whose runs degrade on the workers. The issue goes to the shared ledger, so a
second checker finds it open instead of raising it again.
"""

from __future__ import annotations

from pathlib import Path

from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store


def test_a_checker_detects_from_the_fleets_runs_and_shares_the_issue(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        workers = [PerformanceMonitor(store, baseline_n=40) for _ in range(2)]
        checker = PerformanceMonitor(store, baseline_n=40)
        detector = IssueDetector(baseline_n=40, monitor=checker, ledger=IssueLedger(store))
        try:
            for i in range(60):  # healthy on both workers
                workers[i % 2].record("solver", success=True, duration_ms=100.0)
            for worker in workers:
                worker.flush()
            assert checker.refresh() == 60
            assert detector.check() == []
            for i in range(40):  # then failing, on both
                workers[i % 2].record("solver", success=False, duration_ms=100.0, error="boom")
            for worker in workers:
                worker.flush()
            assert checker.refresh() == 40
            reports = detector.check()
            assert reports
            assert {r.agent_name for r in reports} == {"solver"}
            shared = IssueLedger(store).issues(active=True)  # what any other checker finds
            assert sorted(i.kind for i in shared) == sorted(r.error_type for r in reports)
            assert {i.agent for i in shared} == {"solver"}
        finally:
            for monitor in (*workers, checker):
                monitor.close()
