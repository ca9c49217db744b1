"""The fleet checker in one process: the seat goes to one checker at a time, and the runs other
writers record are judged by the one that holds it. (Real processes, SIGKILL and takeover:
``tests/faces/test_fleet_watch.py``.)"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agentmend.infrastructure.detection.checker_seat import CheckerSeat, read_checkers
from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store
from agentmend.loop.fleet_checker import FleetChecker


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_one_seat_per_team_renewed_by_its_holder_taken_over_once_it_lapses(
    store_url: str, tmp_path: Path
) -> None:
    clock = Clock()
    with Store(store_url, files_dir=tmp_path) as store:
        first = CheckerSeat(store, "team-a", principal="checker", term_s=10, clock=clock)
        second = CheckerSeat(store, "team-a", principal="checker", term_s=10, clock=clock)
        other_team = CheckerSeat(store, "team-b", principal="checker", term_s=10, clock=clock)
        assert first.take().holder == first.holder_id
        assert second.take().holder == first.holder_id  # held: the second stands by
        assert other_team.take().holder == other_team.holder_id  # a seat per team
        clock.now += 9
        assert first.checked(issues_opened=2)  # a check renews
        clock.now += 9
        assert second.take().holder == first.holder_id  # renewed 9 s ago: still held
        clock.now += 2
        taken = second.take()  # 11 s without a renewal: lapsed, taken over
        assert taken.holder == second.holder_id
        assert (taken.checks, taken.issues_opened) == (0, 0)
        assert not first.checked(issues_opened=0)  # the old holder learns it lost the seat
        assert first.take().holder == second.holder_id
        second.leave()
        assert first.take().holder == first.holder_id  # a seat left is free at once
        seats = {s.team_id: s for s in read_checkers(store)}
        assert set(seats) == {"team-a", "team-b"}
        assert seats["team-a"].holder == first.holder_id


def test_a_bad_term_or_interval_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        with pytest.raises(ValueError, match="term_s"):
            CheckerSeat(store, "t", principal="c", term_s=0)
        seat = CheckerSeat(store, "t", principal="c", term_s=2)
        with (
            PerformanceMonitor(store) as monitor,
            pytest.raises(ValueError, match="shorter than the seat's term"),
        ):
            FleetChecker(seat, monitor, _detector(store), on_issue=print, interval_s=2)


def _detector(store: Store) -> Callable[[PerformanceMonitor], IssueDetector]:
    def make(monitor: PerformanceMonitor) -> IssueDetector:
        return IssueDetector(baseline_n=60, monitor=monitor, ledger=IssueLedger(store))

    return make


def test_runs_another_writer_records_are_judged_by_the_holder_alone(
    store_url: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    with Store(store_url, files_dir=tmp_path) as store:
        worker = PerformanceMonitor(store, baseline_n=60)  # a worker elsewhere in the fleet
        seen: dict[str, list[IssueReport]] = {"a": [], "b": []}
        checkers = []
        for name in ("a", "b"):
            seat = CheckerSeat(store, "team", principal=f"checker-{name}", term_s=30)
            checkers.append(
                FleetChecker(
                    seat,
                    PerformanceMonitor(store, baseline_n=60),
                    _detector(store),
                    on_issue=seen[name].append,
                    interval_s=1,
                )
            )
        holder, standby = checkers
        try:
            for _ in range(80):
                worker.record("writer", success=rng.random() < 0.97, duration_ms=100.0)
            worker.flush()
            assert holder.step().judging
            assert not standby.step().judging
            for _ in range(150):  # the fault: half the runs fail
                worker.record("writer", success=rng.random() < 0.5, duration_ms=100.0)
            worker.flush()
            steps = [holder.step(), standby.step(), holder.step()]
            assert [s.judging for s in steps] == [True, False, True]
            assert [(i.agent_name, i.error_type) for i in seen["a"]] == [
                ("writer", "low_success_rate")
            ]
            assert seen["b"] == []  # the standby judged nothing
            active = IssueLedger(store).issues(active=True)
            assert [i.issue_id for i in active] == [seen["a"][0].issue_id]
            (held,) = read_checkers(store)
            assert (held.principal, held.checks, held.issues_opened) == ("checker-a", 3, 1)
        finally:
            worker.close()
            for checker in checkers:
                checker.monitor.close()


def test_run_leaves_the_seat_on_the_way_out(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        seat = CheckerSeat(store, "team", principal="checker", term_s=30)
        with PerformanceMonitor(store) as monitor:
            checker = FleetChecker(
                seat,
                monitor,
                _detector(store),
                on_issue=print,
                interval_s=0.01,
            )
            assert checker.run(threading.Event(), max_steps=3) == 3
        assert read_checkers(store) == []
