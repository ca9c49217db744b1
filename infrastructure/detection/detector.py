"""Turns the monitor's stream of runs into IssueReports: calibrated CUSUMs, or fixed rules.

Why not just fixed rules: thresholds ("success below 80 % over the last 10 runs")
raise about 0.5 false alarms per 1,000 healthy runs for an agent that succeeds 99 % of the time
but 3.6 for one at 95 % and 17 at 90 % (benchmarks/bench_detection.py), so a team of agents
with different healthy rates drowns in false alarms or misses real drops. The ``statistical``
mode (the default) compares each agent with *its own* baseline and has a false-alarm rate fixed
by construction:

* a Bernoulli CUSUM on failures (``cusum_failure_rate``), tuned to a 15 % relative drop of the
  success rate, and
* a normal CUSUM on log-duration (``cusum_log_duration``) designed for a 1.5x slowdown: a
  bank of two CUSUMs tuned to about 1.3x and 1.9x sharing its budget
  (``agentmend.infrastructure.detection.duration_bank``): 1.7-2.2x faster than one chart on a
  slowdown of half the design's (1.22-1.25x), as fast at 1.5x and 2x,

calibrated (``agentmend.infrastructure.detection.cusum``) against the agent's own baseline of ``n``
runs. The budget ``false_alarm_rate`` is split 95 % to failures and 5 % to durations
(``failure_share``), and what is promised is per agent:

* failure chart: for every true healthy failure rate ``p`` and every baseline size ``n`` at or
  above ``min_baseline_n`` (default 30), the expected false-alarm rate, taken over the baselines
  of size ``n`` that such an agent produces, is at most ``false_alarm_rate * failure_share``.
  Computed exactly (``agentmend.infrastructure.detection.guarantee``), not simulated.
* duration chart: the same statement for every log-normal healthy duration distribution, at most
  ``false_alarm_rate * (1 - failure_share)``; its calibration is an approximation made
  conservative (see ``calibrate_normal``), so this one is checked by simulation only.

Below ``min_baseline_n`` the charts do not run: an agent whose baseline is still filling is
*warming up* (``state`` in :meth:`IssueDetector.statistics`), and a detector configured with a
``baseline_n`` below the minimum runs the fixed rules instead, every alarm labelled as outside
the guarantee. Failures are what loses work, and durations
are the less trustworthy distributionally (heavy tails), so a smaller share there also buys
robustness. The duration chart's calibration is conservative (it raised 0.03 false alarms per 1,000
runs on a 0.1 share), so halving its share costs little in real alarms (0.01) and gives the failure
chart's threshold that room: about 1-2 % less delay on a failure-rate drop, for about 9 % more on a
1.5x slowdown (20 runs instead of 18.5). Detection starts once the agent's baseline (its first
``baseline_n`` runs since its last kept change, held by the monitor) is full; after an alarm a
statistic restarts at 0 against the same baseline.

One alarm per condition (``agentmend.infrastructure.detection.issue_ledger``): an alarm opens an
issue in the ledger, and while that agent's issue of that kind is open or held, its chart's later
crossings raise nothing. :meth:`IssueDetector.cycle_finished` records how the cycle ended: a
kept change resolves the issue, anything else holds it for ``backoff_runs`` runs (doubling per
repeat, at most ``backoff_max_runs``); an issue whose statistic stays at or below
``clear_level`` of its threshold for ``clear_window`` runs closes as cleared without change. The
suppression only removes alarms, so the false-alarm guarantee still bounds what is raised.

``rules`` is the classic trigger set (3 consecutive failures; success below 80 % over
the last 10 runs; mean duration of the last 10 above 1.5x the baseline mean; error rate above
30 % over the monitor's window), evaluated after every run and reported on each rising edge (a
condition that stays true is reported once).

``severity`` ranks issues for the orchestrator: 1 + the excess failure fraction for failure
issues (1..2: the share of previously successful runs now failing, estimated since the change),
``log2`` of the slowdown capped to 0..1 for duration issues, so any failure issue outranks any
slowdown and a bigger drop outranks a smaller one.

``check()`` does all the work, O(new runs); ``record()`` does none of it.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Literal

from agentmend.infrastructure.detection.cusum import BernoulliChart, NormalChart
from agentmend.infrastructure.detection.duration_bank import DurationBank, calibrate_duration_bank
from agentmend.infrastructure.detection.guarantee import DEFAULT_MIN_BASELINE_N, failure_chart
from agentmend.infrastructure.detection.issue_ledger import IssueLedger, IssueRow, SavedState
from agentmend.infrastructure.detection.series import POINT_EVERY_RUNS, StatisticPoint
from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.monitoring.agent_window import Baseline, log_duration
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.monitoring.run_feed import EventCursor, RunChunk
from agentmend.infrastructure.monitoring.run_series import BUCKET_S
from agentmend.infrastructure.structured_logger import get_logger

__all__ = [
    "CHART_OF_KIND",
    "OUTSIDE_GUARANTEE",
    "DetectionMode",
    "DetectorState",
    "IssueDetector",
    "RuleThresholds",
]

DetectionMode = Literal["statistical", "rules"]

CUSUM_FAILURE = "cusum_failure_rate"
CUSUM_DURATION = "cusum_log_duration"
LOW_SUCCESS = "low_success_rate"  # the kinds of issue the charts raise
SLOWDOWN = "performance_regression"

CHART_OF_KIND = {LOW_SUCCESS: CUSUM_FAILURE, SLOWDOWN: CUSUM_DURATION}
"""The chart that raises each kind of issue."""

log = get_logger(__name__)

DetectorState = Literal["warming_up", "watching", "outside_guarantee"]
"""``warming_up``: the baseline is still filling, nothing is tested yet; ``watching``: the
calibrated charts run, under the guarantee; ``outside_guarantee``: the fixed rules run (rules
mode, or a baseline below ``min_baseline_n``), with no promise on false alarms."""

OUTSIDE_GUARANTEE = "outside the false-alarm guarantee"


@dataclass(frozen=True, slots=True)
class RuleThresholds:
    """The fixed rules' thresholds (defaults: the classic trigger set)."""

    max_consecutive_failures: int = 3
    min_success_rate: float = 0.8
    success_window: int = 10
    performance_regression_factor: float = 1.5
    max_error_rate: float = 0.3
    min_runs: int = 10  # rate and duration rules wait for this many runs


@dataclass(frozen=True, slots=True)
class _Charts:
    failure: BernoulliChart | None
    duration: DurationBank | None


@dataclass(frozen=True, slots=True)
class _Alarm:
    agent: str
    detector: str
    error_type: str
    statistic: float
    threshold: float
    severity: float
    context: str
    baseline: Baseline
    charts: _Charts | None
    issue_id: str | None = None


class _Watch:
    """This process's view of an agent's active issue of one kind, and its hold counters."""

    __slots__ = ("hold_runs", "issue_id", "quiet", "runs_since", "status")

    def __init__(self, row: IssueRow, runs_since: int = 0, quiet: int = 0) -> None:
        self.issue_id = row.issue_id
        self.status = row.status
        self.hold_runs = row.hold_runs
        self.runs_since = runs_since  # runs since the issue was (re)opened or held
        self.quiet = quiet  # consecutive runs with the statistic near zero


class _AgentState:
    """One agent's detection state (statistics restart whenever its baseline changes)."""

    __slots__ = (
        "active_rules",
        "baseline",
        "charts",
        "dur_n",
        "dur_restore",
        "dur_sum",
        "errwin",
        "errwin_failures",
        "fail_k",
        "fail_n",
        "last_ts",
        "peak_dur",
        "peak_fail",
        "point_minute",
        "recent",
        "recent_durations",
        "recent_ok",
        "s_dur",
        "s_fail",
        "streak",
        "unpointed",
        "watches",
    )

    def __init__(self, baseline: Baseline, rules: RuleThresholds, window: int) -> None:
        self.baseline = baseline
        self.charts: _Charts | None = None
        self.s_fail = 0
        self.fail_n = 0  # runs since the failure statistic was last 0 ...
        self.fail_k = 0  # ... and the failures among them: the post-change estimate
        self.s_dur: list[float] = []  # per member of the duration bank (sized on calibration)
        self.dur_n: list[int] = []
        self.dur_sum: list[float] = []
        self.dur_restore: SavedState | None = None  # a restart's saved duration state
        # for the statistic's chart: the peaks since the last point (the failure chart's in its
        # own units, the bank's as the highest share of a member's threshold), the time of the
        # last run read, the runs read since the last point and the minute of that point
        self.peak_fail = 0
        self.peak_dur = 0.0
        self.last_ts = 0.0
        self.unpointed = 0
        self.point_minute = -1
        self.streak = 0
        self.recent: deque[bool] = deque(maxlen=rules.success_window)
        self.recent_durations: deque[float] = deque(maxlen=rules.success_window)
        self.recent_ok = 0
        self.errwin: deque[bool] = deque(maxlen=window)
        self.errwin_failures = 0
        self.active_rules: set[str] = set()
        self.watches: dict[str, _Watch] = {}


class IssueDetector:
    """Finds degraded agents in a :class:`PerformanceMonitor`'s runs.

    Args:
        mode: ``"statistical"`` (calibrated CUSUMs, the default) or ``"rules"`` (fixed thresholds).
        false_alarm_rate: expected alarms per healthy run, both CUSUMs together.
        baseline_n: runs in the baseline the CUSUMs are calibrated on: the first
            ``baseline_n`` of the monitor's baseline, so at most the monitor's ``baseline_n``
            (default 500), which None (the default) means.
        min_baseline_n: the smallest baseline the guarantee covers (default 30); with a
            smaller ``baseline_n`` the statistical mode runs the fixed rules, labelled
            ``OUTSIDE_GUARANTEE``.
        failure_share: the part of the false-alarm budget given to the failure CUSUM.
        relative_drop: the success-rate drop (relative) the failure CUSUM is tuned for.
        regression_factor: the slowdown the duration CUSUM is tuned for.
        rules: thresholds for ``"rules"`` mode.
        monitor: bind to this monitor now (else the first ``check`` binds it).
        ledger: where open issues and the detector's state are kept (default: in memory; an
            orchestrator passes one on its store, shared by every process on it).
        backoff_runs: after a cycle ends with no change, the issue is held (not raised again)
            for this many of the agent's runs, doubling at each repeat ...
        backoff_max_runs: ... up to this ceiling. An issue still open (no outcome recorded)
            is also raised again after ``backoff_runs`` runs, so a crashed cycle is retried.
        clear_window: an issue whose statistic stays at or below ``clear_level`` of its
            threshold for this many consecutive runs is closed as cleared without change.
        clear_level: what "near zero" means, as a fraction of the threshold.
    """

    def __init__(
        self,
        mode: DetectionMode = "statistical",
        *,
        false_alarm_rate: float = 0.001,
        baseline_n: int | None = None,
        min_baseline_n: int = DEFAULT_MIN_BASELINE_N,
        failure_share: float = 0.95,
        relative_drop: float = 0.15,
        regression_factor: float = 1.5,
        rules: RuleThresholds | None = None,
        monitor: PerformanceMonitor | None = None,
        ledger: IssueLedger | None = None,
        backoff_runs: int = 100,
        backoff_max_runs: int = 6400,
        clear_window: int = 100,
        clear_level: float = 0.25,
    ) -> None:
        if mode not in ("statistical", "rules"):
            raise ConfigurationError(f"IssueDetector: mode must be statistical or rules: {mode!r}")
        if not 0.0 < false_alarm_rate < 1.0:
            raise ConfigurationError(
                f"IssueDetector: false_alarm_rate must be in (0, 1), got {false_alarm_rate}"
            )
        if baseline_n is not None and baseline_n < 10:
            raise ConfigurationError(f"IssueDetector: baseline_n must be >= 10, got {baseline_n}")
        if min_baseline_n < 10:
            raise ConfigurationError(
                f"IssueDetector: min_baseline_n must be >= 10, got {min_baseline_n}"
            )
        if not 0.0 <= failure_share <= 1.0:
            raise ConfigurationError(
                f"IssueDetector: failure_share must be in [0, 1], got {failure_share}"
            )
        if not 0.0 < relative_drop < 1.0 or not regression_factor > 1.0:
            raise ConfigurationError(
                "IssueDetector: need 0 < relative_drop < 1 and regression_factor > 1, got "
                f"{relative_drop}, {regression_factor}"
            )
        if not 1 <= backoff_runs <= backoff_max_runs or clear_window < 1:
            raise ConfigurationError(
                "IssueDetector: need 1 <= backoff_runs <= backoff_max_runs and clear_window >= 1,"
                f" got {backoff_runs}, {backoff_max_runs}, {clear_window}"
            )
        if not 0.0 <= clear_level < 1.0:
            raise ConfigurationError(
                f"IssueDetector: clear_level must be in [0, 1), got {clear_level}"
            )
        self.mode: DetectionMode = mode
        self.ledger = ledger if ledger is not None else IssueLedger()
        self.backoff_runs = backoff_runs
        self.backoff_max_runs = backoff_max_runs
        self.clear_window = clear_window
        self.clear_level = clear_level
        self._saved = self.ledger.load_states()
        self._touched: set[str] = set()
        self.false_alarm_rate = false_alarm_rate
        self._baseline_n = baseline_n
        self.min_baseline_n = min_baseline_n
        self.failure_share = failure_share
        self.relative_drop = relative_drop
        self.regression_factor = regression_factor
        self.rules = rules or RuleThresholds()
        self._monitor: PerformanceMonitor | None = None
        self._cursor: EventCursor | None = None
        self._states: dict[str, _AgentState] = {}
        self._charts: weakref.WeakKeyDictionary[Baseline, _Charts] = weakref.WeakKeyDictionary()
        if monitor is not None:
            self._bind(monitor)

    # ----------------------------------------------------------------- public

    def check(self, monitor: PerformanceMonitor | None = None) -> list[IssueReport]:
        """Consume every run recorded since the last check; one report per threshold crossing.

        Reports are sorted most severe first. Each carries the monitor's metrics at check time
        and the statistic, threshold and baseline at the crossing.
        """
        mon = self._bind(monitor)
        assert self._cursor is not None
        chunks = mon.read_chunks(self._cursor)
        if not self.guaranteed:
            alarms = self._run_rules(chunks, mon.window)
        else:
            alarms = self._run_cusums(chunks)
            self._save_touched()
        if not alarms:
            return []
        return self._reports(mon, _once_per_issue(alarms))

    def judge_from_now(self) -> None:
        """Leave the runs the monitor already holds unjudged: the next check reads only runs
        recorded from now on. For a checker taking over from another, whose statistics (saved
        in the store) already count the runs it judged."""
        self._cursor = self._bind(None).subscribe(from_now=True)

    def cycle_finished(
        self, issue: IssueReport, *, kept: bool, outcome: str, change_id: str | None = None
    ) -> IssueRow | None:
        """Record how the cycle for ``issue`` ended on its issue row.

        A kept change resolves the issue. Anything else (no change proposed, refused, not
        proven, declined) holds it: the detector does not raise that kind of issue for that
        agent again until its statistic has stayed near zero for ``clear_window`` runs (then the
        issue closes as cleared without change) or the hold has passed (``backoff_runs``,
        doubled for each cycle that already ended this way, at most ``backoff_max_runs``).
        Returns the updated row (None for a report that no issue row stands behind, such as a
        requested analysis).
        """
        if issue.issue_id is None:
            return None
        st = self._states.get(issue.agent_name)
        watch = st.watches.get(issue.error_type) if st is not None else None
        if kept:
            if st is not None:
                st.watches.pop(issue.error_type, None)
            return self.ledger.resolve(issue.issue_id, change_id=change_id)
        current = self.ledger.get(issue.issue_id)
        if current is None:
            return None
        hold = min(self.backoff_max_runs, self.backoff_runs * 2**current.cycles)
        row = self.ledger.hold(issue.issue_id, outcome=outcome, hold_runs=hold)
        if watch is not None and row is not None and row.status == "held":
            watch.status, watch.hold_runs, watch.runs_since = "held", hold, 0
        log.info(
            "issue_held",
            agent=issue.agent_name,
            kind=issue.error_type,
            issue_id=issue.issue_id,
            outcome=outcome,
            hold_runs=hold,
        )
        return row

    def on_change_kept(
        self,
        agent_name: str,
        monitor: PerformanceMonitor | None = None,
        *,
        label: str | None = None,
    ) -> None:
        """A change to ``agent_name`` was kept: start its new baseline (see the monitor's);
        ``label`` names the change, which the errors from before it are shown with."""
        self._bind(monitor).start_new_baseline(agent_name, label=label)

    def on_change_rolled_back(
        self, agent_name: str, monitor: PerformanceMonitor | None = None
    ) -> bool:
        """The change was rolled back: reinstate the previous baseline. False if there was none."""
        return self._bind(monitor).restore_baseline(agent_name) is not None

    @property
    def baseline_n(self) -> int:
        """Baseline runs the CUSUMs use (the bound monitor's ``baseline_n`` unless set)."""
        if self._baseline_n is not None:
            return self._baseline_n
        return self._monitor.baseline_n if self._monitor is not None else 500

    @property
    def guaranteed(self) -> bool:
        """True when the calibrated charts run under the false-alarm guarantee."""
        return self.mode == "statistical" and self.baseline_n >= self.min_baseline_n

    def state(self, agent_name: str) -> DetectorState:
        """Whether the agent is warming up, watched under the guarantee, or outside it."""
        if not self.guaranteed:
            return "outside_guarantee"
        st = self._states.get(agent_name)
        if st is None or st.charts is None:
            return "warming_up"
        return "watching"

    @property
    def missed_runs(self) -> int:
        """Runs skipped: more than the monitor's ``detection_backlog`` arrived between checks."""
        return self._cursor.missed if self._cursor is not None else 0

    def statistics(self, agent_name: str) -> dict[str, Any] | None:
        """The agent's current statistics and thresholds (None before its first checked run).

        Before this detector has checked a run of the agent, the statistics its store saved
        (from a checker or an earlier process) are shown as they were saved, marked
        ``"state": "saved"``, so that every face shows the same chart values.
        """
        st = self._states.get(agent_name)
        if st is None:
            return self._saved_statistics(agent_name)
        charts = st.charts
        out: dict[str, Any] = {"baseline": st.baseline.summary(), "state": self.state(agent_name)}
        if st.watches:
            out["issues"] = {
                kind: {"issue_id": w.issue_id, "status": w.status} for kind, w in st.watches.items()
            }
        if self.mode == "rules" or not self.guaranteed:
            out["consecutive_failures"] = st.streak
            out["active_rules"] = sorted(st.active_rules)
        if charts is not None and charts.failure is not None:
            out[CUSUM_FAILURE] = {
                "statistic": st.s_fail * charts.failure.unit,
                "threshold": charts.failure.threshold * charts.failure.unit,
            }
        if charts is not None and charts.duration is not None and st.s_dur:
            j = _leading(st.s_dur, charts.duration)
            out[CUSUM_DURATION] = {
                "statistic": st.s_dur[j],
                "threshold": charts.duration.members[j].h,
            }
        return out

    def _saved_statistics(self, agent_name: str) -> dict[str, Any] | None:
        saved = {kind: state for (agent, kind), state in self._saved.items() if agent == agent_name}
        if not saved:
            return None
        out: dict[str, Any] = {"baseline": {"frozen": True}, "state": "saved"}
        for kind, state in saved.items():
            chart = CHART_OF_KIND.get(kind)
            if chart is not None:
                out[chart] = {
                    "statistic": state.statistic * state.scale,
                    "threshold": state.threshold,
                }
        return out

    # ----------------------------------------------------------------- statistical

    def _run_cusums(self, chunks: list[RunChunk]) -> list[_Alarm]:
        alarms: list[_Alarm] = []
        n_base = self.baseline_n
        states = self._states
        for base, start, rows, _ in chunks:
            st = states.get(base.agent)
            if st is None or st.baseline is not base:
                st = states[base.agent] = self._new_state(base, st)
            self._touched.add(base.agent)
            if start + len(rows) <= n_base:
                continue  # still the baseline: nothing to test yet
            charts = st.charts
            if charts is None:
                charts = st.charts = self._calibrate(base)
                if charts.duration is not None:
                    _size_duration(st, charts.duration)
            if start < n_base:
                rows = rows[n_base - start :]
            if rows:
                st.last_ts = float(rows[-1][8])
                st.unpointed += len(rows)
            if charts.failure is not None:
                self._failure_cusum(st, charts.failure, rows, alarms)
            if charts.duration is not None:
                self._duration_cusum(st, charts.duration, rows, alarms)
        return alarms

    def _failure_cusum(
        self, st: _AgentState, fc: BernoulliChart, rows: list[Any], alarms: list[_Alarm]
    ) -> None:
        s, runs, failures, peak = st.s_fail, st.fail_n, st.fail_k, st.peak_fail
        up, down, threshold = fc.up, fc.down, fc.threshold
        watch = st.watches.get(LOW_SUCCESS)
        quiet_level = threshold * self.clear_level
        for row in rows:
            if row[2]:
                s -= down
                if s <= 0:
                    s = runs = failures = 0
                else:
                    runs += 1
            else:
                s += up
                runs += 1
                failures += 1
                if s > peak:  # only a failure raises it
                    peak = s
            if s >= threshold:
                alarm = self._failure_alarm(st, fc, s, runs, failures)
                s = runs = failures = 0
                self._admit(st, alarm, alarms)
                watch = st.watches.get(LOW_SUCCESS)
            elif watch is not None and self._tick(st, watch, s <= quiet_level):
                watch = None
        st.s_fail, st.fail_n, st.fail_k, st.peak_fail = s, runs, failures, peak

    def _duration_cusum(
        self, st: _AgentState, bank: DurationBank, rows: list[Any], alarms: list[_Alarm]
    ) -> None:
        # Each member restarts only on its own alarm: the union bound on the bank's false alarms
        # (see duration_bank) needs exactly that.
        watch = st.watches.get(SLOWDOWN)
        quiet_levels = [dc.h * self.clear_level for dc in bank.members]
        stats, runs, totals = st.s_dur, st.dur_n, st.dur_sum
        members = list(enumerate(bank.members))
        peak = st.peak_dur
        for row in rows:
            y = log_duration(row[3])
            quiet, alarmed = True, False
            for j, dc in members:
                s = stats[j] + dc.standardise(y) - dc.k
                if s <= 0.0:
                    stats[j], runs[j], totals[j] = 0.0, 0, 0.0
                    continue
                if s > peak * dc.h:
                    peak = min(1.0, s / dc.h)
                if s >= dc.h:
                    alarm = self._duration_alarm(st, dc, s, runs[j] + 1, totals[j] + y)
                    stats[j], runs[j], totals[j] = 0.0, 0, 0.0
                    self._admit(st, alarm, alarms)
                    watch = st.watches.get(SLOWDOWN)
                    alarmed = True
                    continue
                stats[j], runs[j], totals[j] = s, runs[j] + 1, totals[j] + y
                if s > quiet_levels[j]:
                    quiet = False
            if watch is not None and not alarmed and self._tick(st, watch, quiet):
                watch = None
        st.peak_dur = peak

    def _new_state(self, base: Baseline, previous: _AgentState | None) -> _AgentState:
        """A fresh state for a new baseline: open issues carry over; a saved state of this very
        baseline (a restart) is resumed."""
        st = _AgentState(base, self.rules, 1)
        if previous is not None:
            st.watches = previous.watches
        for kind in (LOW_SUCCESS, SLOWDOWN):
            saved = self._saved.pop((base.agent, kind), None)
            if saved is None:
                continue
            if saved.epoch == base.epoch:
                if kind == LOW_SUCCESS:
                    st.s_fail, st.fail_n, st.fail_k = (
                        int(saved.statistic),
                        saved.runs,
                        int(saved.total),
                    )
                else:
                    st.dur_restore = saved  # applied once the bank is calibrated
            row = self.ledger.get(saved.issue_id) if saved.issue_id is not None else None
            if row is not None and row.status in ("open", "held") and kind not in st.watches:
                st.watches[kind] = _Watch(row, saved.runs_since_hold, saved.quiet_runs)
        return st

    def _admit(self, st: _AgentState, alarm: _Alarm, alarms: list[_Alarm]) -> None:
        """One alarm per condition: report ``alarm`` only if it opens (or re-opens) an issue."""
        agent, kind = alarm.agent, alarm.error_type
        watch = st.watches.get(kind)
        if watch is not None:
            row = self.ledger.get(watch.issue_id)  # another process may have settled it
            if row is None or row.status not in ("open", "held"):
                del st.watches[kind]
                watch = None
            else:
                watch.status, watch.hold_runs = row.status, row.hold_runs
        if watch is None:
            row, created = self.ledger.open(
                agent,
                kind,
                detector=alarm.detector,
                context=alarm.context,
                hold_runs=self.backoff_runs,
            )
            st.watches[kind] = _Watch(row)
            if created:
                alarms.append(replace(alarm, issue_id=row.issue_id))
            else:
                log.info("issue_already_open", agent=agent, kind=kind, issue_id=row.issue_id)
            return
        watch.quiet = 0
        if watch.runs_since < watch.hold_runs:
            return  # held, or open and being dealt with: the same condition, not a new issue
        if watch.status == "held":
            self.ledger.reopen(watch.issue_id, context=alarm.context)
        watch.status, watch.runs_since = "open", 0
        log.info("issue_raised_again", agent=agent, kind=kind, issue_id=watch.issue_id)
        alarms.append(replace(alarm, issue_id=watch.issue_id))

    def _tick(self, st: _AgentState, watch: _Watch, quiet: bool) -> bool:
        """Count one run for an active issue; True if it just cleared by itself (and is closed)."""
        watch.runs_since += 1
        watch.quiet = watch.quiet + 1 if quiet else 0
        if watch.quiet < self.clear_window:
            return False
        kind = next(k for k, w in st.watches.items() if w is watch)
        del st.watches[kind]
        self.ledger.clear(watch.issue_id)
        log.info(
            "issue_cleared_without_change",
            agent=st.baseline.agent,
            kind=kind,
            issue_id=watch.issue_id,
        )
        return True

    def _save_touched(self) -> None:
        """Keep the state of the agents this check moved in the ledger (for a restart)."""
        if self.ledger.store is None or not self._touched:
            self._touched.clear()
            return
        saved: list[SavedState] = []
        points: list[StatisticPoint] = []
        for agent in sorted(self._touched):
            st = self._states[agent]
            charts = st.charts
            if charts is None:
                continue
            shown: dict[str, tuple[float, float]] = {}  # kind: (unit, threshold as shown)
            if charts.failure is not None:
                fc = charts.failure
                shown[LOW_SUCCESS] = (fc.unit, fc.threshold * fc.unit)
            lead = 0
            if charts.duration is not None and st.s_dur:
                lead = _leading(st.s_dur, charts.duration)
                shown[SLOWDOWN] = (1.0, charts.duration.members[lead].h)
            minute = int(st.last_ts // BUCKET_S)
            alarmed = (charts.failure is not None and st.peak_fail >= charts.failure.threshold) or (
                st.peak_dur >= 1.0
            )
            due = st.unpointed >= POINT_EVERY_RUNS or minute != st.point_minute or alarmed
            if st.last_ts and due:
                peaks = {
                    LOW_SUCCESS: (st.peak_fail, float(st.s_fail)),
                    SLOWDOWN: (st.peak_dur, _member_state(st, lead)[0]),
                }
                for kind, (unit, threshold) in shown.items():
                    peak, statistic = peaks[kind]
                    if kind == LOW_SUCCESS:
                        peak = min(1.0, peak * unit / threshold)
                    points.append(
                        StatisticPoint(agent, kind, st.last_ts, peak, statistic * unit, threshold)
                    )
                st.peak_fail, st.peak_dur = st.s_fail, _share(st.s_dur, charts.duration)
                st.unpointed, st.point_minute = 0, minute
            for kind, statistic, runs, total in (
                (LOW_SUCCESS, float(st.s_fail), st.fail_n, float(st.fail_k)),
                (SLOWDOWN, *_member_state(st, lead)),
            ):
                if kind not in shown:
                    continue
                w = st.watches.get(kind)
                saved.append(
                    SavedState(
                        agent,
                        kind,
                        st.baseline.epoch,
                        statistic,
                        runs,
                        total,
                        w.issue_id if w is not None else None,
                        w.runs_since if w is not None else 0,
                        w.quiet if w is not None else 0,
                        *shown[kind],
                    )
                )
        self._touched.clear()
        self.ledger.save_states(saved, points)

    def _calibrate(self, base: Baseline) -> _Charts:
        charts = self._charts.get(base)
        if charts is None:
            n = self.baseline_n
            share = self.failure_share
            failure = duration = None
            if share > 0.0:
                failure = failure_chart(
                    sum(base.outcomes[:n]),
                    n,
                    self.false_alarm_rate * share,
                    self.relative_drop,
                )
            if share < 1.0:
                duration = calibrate_duration_bank(
                    base.log_durations[:n],
                    1.0 / (self.false_alarm_rate * (1.0 - share)),
                    self.regression_factor,
                )
            charts = self._charts[base] = _Charts(failure, duration)
        return charts

    def _failure_alarm(
        self, st: _AgentState, fc: BernoulliChart, s: int, runs: int, failures: int
    ) -> _Alarm:
        p_now = failures / runs if runs else 1.0
        excess = max(0.0, min(1.0, (p_now - fc.p0) / (1.0 - fc.p0)))
        agent = st.baseline.agent
        return _Alarm(
            agent=agent,
            detector=CUSUM_FAILURE,
            error_type=LOW_SUCCESS,
            statistic=s * fc.unit,
            threshold=fc.threshold * fc.unit,
            severity=1.0 + excess,
            context=(
                f"{agent}: failure rate rose from {fc.p0:.1%} in its {self.baseline_n}-run baseline"
                f" to {failures}/{runs} ({p_now:.0%}) since the estimated change; the failure"
                f" CUSUM reached {s * fc.unit:.2f} (threshold {fc.threshold * fc.unit:.2f},"
                f" about {fc.target_arl:.0f} healthy runs per false alarm)."
            ),
            baseline=st.baseline,
            charts=st.charts,
        )

    def _duration_alarm(
        self, st: _AgentState, dc: NormalChart, s: float, runs: int, total: float
    ) -> _Alarm:
        now_ms = math.exp(total / runs) if runs else math.exp(dc.upper)
        base_ms = math.exp(dc.mean)
        ratio = now_ms / base_ms
        agent = st.baseline.agent
        return _Alarm(
            agent=agent,
            detector=CUSUM_DURATION,
            error_type=SLOWDOWN,
            statistic=s,
            threshold=dc.h,
            severity=max(0.0, min(1.0, math.log2(ratio))) if ratio > 0 else 0.0,
            context=(
                f"{agent}: runs slowed to a typical {now_ms:.0f} ms over the last {runs} runs"
                f" against {base_ms:.0f} ms in its baseline ({ratio:.2f}x); the log-duration"
                f" CUSUM reached {s:.2f} (threshold {dc.h:.2f}, about {dc.target_arl:.0f}"
                " healthy runs per false alarm)."
            ),
            baseline=st.baseline,
            charts=st.charts,
        )

    # ----------------------------------------------------------------- rules

    def _run_rules(self, chunks: list[RunChunk], window: int) -> list[_Alarm]:
        alarms: list[_Alarm] = []
        for chunk in chunks:
            base = chunk.baseline
            st = self._states.get(base.agent)
            if st is None or st.baseline is not base:
                st = self._states[base.agent] = _AgentState(base, self.rules, window)
            for row in chunk.rows:
                self._apply_rules(st, bool(row[2]), row[3], alarms)
        return alarms

    def _apply_rules(
        self, st: _AgentState, success: bool, duration: float, alarms: list[_Alarm]
    ) -> None:
        rules = self.rules
        recent, errwin = st.recent, st.errwin
        if len(recent) == recent.maxlen and recent[0]:
            st.recent_ok -= 1
        recent.append(success)
        st.recent_durations.append(duration)
        if len(errwin) == errwin.maxlen and not errwin[0]:
            st.errwin_failures -= 1
        errwin.append(success)
        if success:
            st.recent_ok += 1
            st.streak = 0
        else:
            st.errwin_failures += 1
            st.streak += 1
        agent = st.baseline.agent
        n = len(recent)
        if _rising(st, "consecutive_failures", st.streak >= rules.max_consecutive_failures):
            alarms.append(
                _rule_alarm(
                    st,
                    "consecutive_failures",
                    float(st.streak),
                    float(rules.max_consecutive_failures),
                    1.0 + (n - st.recent_ok) / n,
                    f"{agent}: {st.streak} consecutive failures.",
                )
            )
        if n >= rules.min_runs and n == recent.maxlen:
            rate = st.recent_ok / n
            if _rising(st, "low_success_rate", rate < rules.min_success_rate):
                alarms.append(
                    _rule_alarm(
                        st,
                        "low_success_rate",
                        rate,
                        rules.min_success_rate,
                        2.0 - rate,
                        f"{agent}: success rate {rate:.0%} over the last {n} runs, below"
                        f" {rules.min_success_rate:.0%}.",
                    )
                )
        if len(errwin) >= rules.min_runs:
            err = st.errwin_failures / len(errwin)
            if _rising(st, "high_error_rate", err > rules.max_error_rate):
                alarms.append(
                    _rule_alarm(
                        st,
                        "high_error_rate",
                        err,
                        rules.max_error_rate,
                        1.0 + err,
                        f"{agent}: error rate {err:.0%} over the last {len(errwin)} runs, above"
                        f" {rules.max_error_rate:.0%}.",
                    )
                )
        base = st.baseline
        base_avg = base.avg_duration_ms
        if base_avg and base.n >= rules.min_runs and n >= rules.min_runs:
            ratio = sum(st.recent_durations) / n / base_avg
            if _rising(st, "performance_regression", ratio > rules.performance_regression_factor):
                alarms.append(
                    _rule_alarm(
                        st,
                        "performance_regression",
                        ratio,
                        rules.performance_regression_factor,
                        max(0.0, min(1.0, math.log2(ratio))),
                        f"{agent}: duration increased {ratio:.1f}x over its baseline average"
                        f" ({base_avg:.0f} ms).",
                    )
                )

    # ----------------------------------------------------------------- reports

    def _bind(self, monitor: PerformanceMonitor | None) -> PerformanceMonitor:
        if monitor is None:
            if self._monitor is None:
                raise ConfigurationError("IssueDetector: no monitor given and none bound yet")
            return self._monitor
        if self._monitor is None:
            if self._baseline_n is not None and self._baseline_n > monitor.baseline_n:
                raise ConfigurationError(
                    f"IssueDetector: baseline_n {self.baseline_n} exceeds the monitor's"
                    f" baseline_n {monitor.baseline_n}"
                )
            self._monitor = monitor
            self._cursor = monitor.subscribe()
        elif monitor is not self._monitor:
            raise ConfigurationError("IssueDetector: already bound to another monitor")
        return monitor

    def _reports(self, monitor: PerformanceMonitor, alarms: list[_Alarm]) -> list[IssueReport]:
        agents = monitor.agents()
        reports: list[IssueReport] = []
        metrics_cache: dict[str, dict[str, Any]] = {}
        for alarm in alarms:
            metrics = metrics_cache.get(alarm.agent)
            if metrics is None:
                current = monitor.get_agent_metrics(alarm.agent)
                metrics = metrics_cache[alarm.agent] = (
                    current.model_dump() if current is not None else {}
                )
            reports.append(
                IssueReport(
                    agent_name=alarm.agent,
                    error_type=alarm.error_type,
                    metrics=dict(metrics),
                    error_logs=list(metrics.get("recent_errors", ())),
                    context=alarm.context,
                    available_agents=agents,
                    detector=alarm.detector,
                    statistic=alarm.statistic,
                    threshold=alarm.threshold,
                    baseline=self._baseline_dict(alarm),
                    severity=alarm.severity,
                    issue_id=alarm.issue_id,
                )
            )
        reports.sort(key=lambda r: r.severity, reverse=True)
        return reports

    def _baseline_dict(self, alarm: _Alarm) -> dict[str, Any]:
        out = alarm.baseline.summary()
        charts = alarm.charts
        if charts is not None:
            out["n"] = min(out["n"], self.baseline_n)
            if charts.failure is not None:
                fc = charts.failure
                n = out["n"]
                out["failure_rate"] = sum(alarm.baseline.outcomes[:n]) / n if n else None
                out["failure_rate_reference"] = fc.p0
                out["failure_rate_upper_95"] = fc.bound
                out["target_failure_rate"] = fc.p1
            if charts.duration is not None:
                dc = charts.duration.reference
                out["mean_log_duration"] = dc.mean
                out["sd_log_duration"] = dc.sd
        return out


def _once_per_issue(alarms: list[_Alarm]) -> list[_Alarm]:
    """The first alarm of each issue: a long degraded stretch read in one check can cross the
    threshold again after the issue's hold, and that raises the same issue, not a second one."""
    seen: set[str] = set()
    first = []
    for alarm in alarms:
        key = alarm.issue_id or f"{alarm.agent}\0{alarm.error_type}"
        if key not in seen:
            seen.add(key)
            first.append(alarm)
    return first


def _rising(st: _AgentState, rule: str, firing: bool) -> bool:
    """True on a rule's rising edge: a condition that stays true is one issue, not one per run."""
    if not firing:
        st.active_rules.discard(rule)
        return False
    if rule in st.active_rules:
        return False
    st.active_rules.add(rule)
    return True


def _rule_alarm(
    st: _AgentState, rule: str, statistic: float, threshold: float, severity: float, context: str
) -> _Alarm:
    context = f"{context} (the fixed rules: {OUTSIDE_GUARANTEE})"
    return _Alarm(
        agent=st.baseline.agent,
        detector=f"rules:{rule}",
        error_type=rule,
        statistic=statistic,
        threshold=threshold,
        severity=severity,
        context=context,
        baseline=st.baseline,
        charts=None,
    )


def _leading(stats: list[float], bank: DurationBank) -> int:
    """The member closest to its threshold: the one shown and saved for the bank (a member that
    never alarms, its threshold infinite on a baseline too short for it, only if all do)."""
    members = bank.members
    return max(
        range(len(stats)), key=lambda j: (math.isfinite(members[j].h), stats[j] / members[j].h)
    )


def _share(stats: list[float], bank: DurationBank | None) -> float:
    """The bank's statistic as the highest share of a member's threshold (0 without a bank)."""
    if bank is None or not stats:
        return 0.0
    return max(
        (s / dc.h for s, dc in zip(stats, bank.members, strict=True) if math.isfinite(dc.h)),
        default=0.0,
    )


def _member_state(st: _AgentState, j: int) -> tuple[float, int, float]:
    if not st.s_dur:
        return 0.0, 0, 0.0
    return st.s_dur[j], st.dur_n[j], st.dur_sum[j]


def _size_duration(st: _AgentState, bank: DurationBank) -> None:
    """Start the bank's members at 0, or resume a restart's saved state.

    Only the leading member is saved (the ledger keeps one statistic per chart): it is matched
    by its threshold and resumed, and the other members start again at 0. That can only delay an
    alarm after a restart, never add one.
    """
    size = len(bank.members)
    st.s_dur, st.dur_n, st.dur_sum = [0.0] * size, [0] * size, [0.0] * size
    saved, st.dur_restore = st.dur_restore, None
    if saved is None:
        return
    for j, dc in enumerate(bank.members):
        if dc.h == saved.threshold:
            st.s_dur[j], st.dur_n[j], st.dur_sum[j] = saved.statistic, saved.runs, saved.total
            return
