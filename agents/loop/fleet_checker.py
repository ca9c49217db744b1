"""The fleet checker: one process per team judges every run the team's fleet records.

Runs reach the store from everywhere (the OTLP receiver, span processors, SDK hooks, monitors on
other hosts); a detector only judges the runs its monitor reads, so without a checker a fleet
seen only through OpenTelemetry is recorded and never judged. The checker reads every writer's
runs (``PerformanceMonitor.refresh``, the single reader of runs), runs the detector on them at a
fixed interval, and hands each issue the detector opens to its policy. It holds the team's seat
(:mod:`agentmend.infrastructure.detection.checker_seat`) while it does: any number of checkers
may run for a team, one judges and the others stand by, and a standby takes over within a term
when the holder dies.

A checker that takes the seat starts its detector then, from the statistics its predecessor
saved in the store, and judges the runs recorded from then on (never again those its predecessor
counted): runs recorded between the predecessor's last check and the takeover (at most about a
term) count in the agents' metrics but are not fed to the statistic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentmend.infrastructure.detection.checker_seat import CheckerSeat, SeatHolder
from agentmend.infrastructure.detection.detector import IssueDetector
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.loop.checker_policies import IssuePolicy, PolicyNote, ReportPolicy

__all__ = ["CheckerStep", "FleetChecker"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class CheckerStep:
    """What one step did: judged the runs (``issues`` it opened, what its policy did:
    ``notes``) or stood by for ``holder``."""

    holder: SeatHolder
    judging: bool
    issues: tuple[IssueReport, ...] = ()
    notes: tuple[PolicyNote, ...] = ()


class FleetChecker:
    """Judges a team's runs while it holds the team's seat.

    Args:
        seat: this process's claim on the team's checker seat.
        monitor: reads every writer's runs from the seat's store.
        detector: builds the detector when the seat is taken (bound to ``monitor``).
        on_issue: called once for each issue the detector opens or raises again (to show it).
        policy: what to do with those issues (:mod:`agentmend.loop.checker_policies`):
            ``ReportPolicy`` (the default) only opens them; ``CyclePolicy`` asks, or runs
            cycles unattended. Its turn comes after each check, while the seat is held; the
            caller closes it.
        interval_s: seconds between checks (and between a standby's asks for the seat).
    """

    def __init__(
        self,
        seat: CheckerSeat,
        monitor: PerformanceMonitor,
        detector: Callable[[PerformanceMonitor], IssueDetector],
        *,
        on_issue: Callable[[IssueReport], None] | None = None,
        policy: IssuePolicy | None = None,
        interval_s: float = 5.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        if interval_s >= seat.term_s:
            raise ValueError(
                f"the check interval ({interval_s} s) must be shorter than the seat's term "
                f"({seat.term_s} s), or the holder would lose the seat between its checks"
            )
        self.seat = seat
        self.monitor = monitor
        self.interval_s = interval_s
        self._make_detector = detector
        self._detector: IssueDetector | None = None
        self._on_issue = on_issue
        self.policy: IssuePolicy = policy if policy is not None else ReportPolicy()

    def step(self) -> CheckerStep:
        """Ask for the seat; while held, read the fleet's new runs and judge them."""
        holder = self.seat.take()
        if holder.holder != self.seat.holder_id:
            if self._detector is not None:
                log.warning("checker_seat_lost", team=self.seat.team_id, holder=holder.holder)
                self._detector = None
            return CheckerStep(holder, judging=False)
        self.monitor.refresh()
        if self._detector is None:
            self._detector = self._make_detector(self.monitor)
            self._detector.judge_from_now()
            log.info("checker_seat_taken", team=self.seat.team_id, holder=holder.holder)
        issues = tuple(self._detector.check())
        if not self.seat.checked(len(issues)):  # taken over while this check ran
            self._detector = None
            return CheckerStep(self.seat.take(), judging=False)
        notes: list[PolicyNote] = []
        for issue in issues:
            if self._on_issue is not None:
                self._on_issue(issue)
            note = self.policy.opened(issue)
            if note is not None:
                notes.append(note)
        notes.extend(self.policy.act())
        return CheckerStep(holder, judging=True, issues=issues, notes=tuple(notes))

    def run(
        self,
        stop: threading.Event,
        *,
        max_steps: int | None = None,
        on_step: Callable[[CheckerStep], None] | None = None,
    ) -> int:
        """Step every ``interval_s`` until ``stop`` is set (or ``max_steps``); the steps run.

        The seat is left on the way out, so a standby takes over at its next ask."""
        steps = 0
        try:
            while not stop.is_set() and (max_steps is None or steps < max_steps):
                started = time.monotonic()
                step = self.step()
                steps += 1
                if on_step is not None:
                    on_step(step)
                stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            if self._detector is not None:
                self.seat.leave()
        return steps
