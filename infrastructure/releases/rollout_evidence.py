"""A rollout's evidence: the live runs of each arm, and the decision they support.

Every run a worker serves under a rollout is recorded with ``release`` and ``rollout`` in its
``extra``; the rollout reads them in execution-id order (ids only grow in commit order). The runs
counted are the ones :func:`~agentmend.infrastructure.releases.rollout.Rollouts.advance` reads:
production runs tagged with this rollout, routed by a worker, or attributed by their release
label by a trusted receiver. Which receivers are trusted is set where the rollout is judged,
never by a run: ``AGENTMEND_TRUSTED_RECEIVERS`` (comma-separated receiver names, see
:func:`trusted_receivers`). A labelled run from any other source (no receiver identity, or a
receiver not listed) is recorded but counts for neither test; ``not_counted`` says how many and
why, so forged failures cannot roll a canary back and forged successes cannot promote it.

Two tests read them, each for one decision:

* **The guard** (rolls back):
  :class:`~agentmend.infrastructure.evaluation.canary_guard.CanaryGuard`, twice: on failures
  and on slow runs. Runs are cut into windows of consecutive runs (a window
  closes at the end of a step that gave it runs of both arms, or at ``WINDOW_RUNS``: on arm
  counts and poll times only, never on outcomes), and in each window the canary's share of the
  failures (of the slow runs: its durations' ranks among the window's) is compared with its
  share of the window's runs. A drifting base rate or traffic mix moves both arms alike, so it
  does not move the guard. Its false-alarm budget is ``guard_alpha``: the chance that a canary
  no worse than stable is ever rolled back by it, ``FAILURE_BUDGET`` of it spent on failures,
  the rest on slow runs (a canary up to ``SLOW_TOLERANCE`` times slower counts as no worse).
* **The promotion test**: each canary run paired with a stable run (the oldest one waiting, of
  at most the newest ``STABLE_WAITING``, so a pair is contemporaneous; which runs pair never
  depends on their outcomes) feeds the always-valid two-sample test
  (:class:`~agentmend.infrastructure.evaluation.sequential.TwoSampleTest`). A guard that only
  ever rolls back cannot promote a useless change; this test promotes only what it shows.

The evidence is plain data in the rollout record (the pairs as a string, replayed into the test
when a decision is needed; the guard's log-wealths and its open window), so any worker that reads
it next reaches the same decision.

Decision, in this order (``decided_by`` names the test, kept in the record and audit row):

1. The failure guard rejects: roll back now, reason ``worse`` (``failure_guard``).
2. The slow-run guard rejects: roll back now, reason ``slower`` (``slowness_guard``).
3. Promote: when the change claimed a fix, once the two-sample test shows the canary
   ``better``; otherwise once it is shown no worse than stable by more than ``margin``
   (reason ``better`` / ``no_worse``; ``two_sample``).
4. Limits: after ``max_canary_runs`` canary runs or ``max_hours``, roll back as ``not_proven``
   (``limits``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

from agentmend.infrastructure.errors import InvalidArgument
from agentmend.infrastructure.evaluation.canary_guard import (
    CanaryGuard,
    slowness_scores,
)
from agentmend.infrastructure.evaluation.sequential import TwoSampleTest

__all__ = [
    "STABLE_WAITING",
    "TRUSTED_RECEIVERS_SETTING",
    "WINDOW_RUNS",
    "Decision",
    "Evidence",
    "RolloutLimits",
    "decide",
    "trusted_receivers",
]

STABLE_WAITING = 256
"""The most stable runs kept waiting for a canary partner (the newest ones)."""

WINDOW_RUNS = 1000
"""The most runs in one guard window (a window that long closes mid-step: runs that far apart
may no longer share a base rate)."""

FAILURE_BUDGET = 0.7
"""The share of the guard's false-alarm budget spent on failures (the rest: slow runs)."""

SLOW_TOLERANCE = 1.2
"""A canary up to this many times slower than stable is not harm to the slow-run guard: a fix
that completes answers stable cut short takes longer (the simulated team's fix of a truncation
fault takes 1.13 times as long, and must still be promoted)."""

TRUSTED_RECEIVERS_SETTING = "AGENTMEND_TRUSTED_RECEIVERS"
"""The receivers whose labelled runs count in a rollout: names, comma-separated."""

GUARD_MIXTURE = 3
"""The guards' mixtures a new rollout starts with: 3, ``FAILURE_MULTIPLES`` and
``SLOWNESS_TILTS``; 2, ``LEGACY_FAILURE_MULTIPLES`` and ``SLOWNESS_TILTS``; 1 (a rollout
recorded before this field), ``LEGACY_FAILURE_MULTIPLES`` and ``LEGACY_SLOWNESS_TILTS``. A
rollout keeps its mixtures to the end."""

_MAX_SKIP_REASONS = 16  # distinct reasons kept in ``not_counted``; the rest count as "other"


def trusted_receivers(value: str | None = None) -> frozenset[str]:
    """The trusted receiver names in ``value`` (None: ``AGENTMEND_TRUSTED_RECEIVERS``).

    Read by the process that judges the rollout (a worker, the fleet checker), never from a
    run: empty (the default), no labelled run counts, only the runs agentmend's workers routed.
    """
    text = os.environ.get(TRUSTED_RECEIVERS_SETTING, "") if value is None else value
    return frozenset(name.strip() for name in text.split(",") if name.strip())


_LEGACY_LIMITS = ("latency_factor", "latency_min_runs")  # the mean-duration rule the guard replaced

Decision = Literal["continue", "promote", "roll_back"]


@dataclass(frozen=True, slots=True)
class RolloutLimits:
    """When a rollout decides and when it gives up (the documented defaults).

    Attributes:
        margin: a canary is "no worse" when shown within this many points of stable's
            success rate (0.02: two percentage points).
        alpha: the promotion test's: the chance of promoting a canary worse by more than
            ``margin`` (or, with a claimed fix, one not better), at any stopping time.
        guard_alpha: the guard's false-alarm budget: the most the chance may be that a canary
            no worse than stable is ever rolled back by the guard (``FAILURE_BUDGET`` of it on
            failures, the rest on slow runs). Lower it for fewer false rollbacks at the price
            of more exposure to a harmful canary; 0.2 is what lets the guard see harm after no
            more runs than the detector needs on a full rollout (docs/fleet/releases.md).
        max_hours: a rollout undecided after this long is rolled back as "not proven".
        max_canary_runs: likewise after this many canary runs (also the test's budget).
    """

    margin: float = 0.02
    alpha: float = 0.05
    max_hours: float = 24.0
    max_canary_runs: int = 5000
    guard_alpha: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 1.0:
            raise InvalidArgument("margin", self.margin, "must lie in [0, 1)")
        if not 0.0 < self.alpha < 1.0:
            raise InvalidArgument("alpha", self.alpha, "must lie strictly between 0 and 1")
        if self.max_hours <= 0 or self.max_canary_runs < 1:
            raise InvalidArgument("limits", (self.max_hours, self.max_canary_runs), "must be > 0")
        if not 0.0 < self.guard_alpha < 1.0:
            raise InvalidArgument(
                "guard_alpha", self.guard_alpha, "must lie strictly between 0 and 1"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RolloutLimits:
        fields = json.loads(text)
        for legacy in _LEGACY_LIMITS:  # a record started before the guard replaced that rule
            fields.pop(legacy, None)
        return cls(**fields)


@dataclass(slots=True)
class Evidence:
    """The runs of both arms so far; ``pairs`` holds two characters per pair (canary, stable).

    ``window`` is the guard's open window, one character per run (``C``/``c``: a canary run
    that succeeded / failed, ``S``/``s`` a stable one) with ``window_ms`` its durations;
    ``failure_guard`` and ``slowness_guard`` the guards' log-wealths (``guard_mixture``: which
    mixtures they belong to, see ``GUARD_MIXTURE``); ``decided_by`` the test that
    settled the rollout (empty while it runs).
    """

    canary_runs: int = 0
    canary_successes: int = 0
    canary_ms: float = 0.0
    stable_runs: int = 0
    stable_successes: int = 0
    stable_ms: float = 0.0
    pairs: str = ""
    canary_waiting: str = ""
    stable_waiting: str = ""
    window: str = ""
    window_ms: list[float] = field(default_factory=list)
    windows: int = 0
    failure_guard: list[float] = field(default_factory=list)
    slowness_guard: list[float] = field(default_factory=list)
    decided_by: str = ""
    not_counted: dict[str, int] = field(default_factory=dict)
    guard_mixture: int = GUARD_MIXTURE

    def skip(self, reason: str) -> None:
        """One run of the rollout left out of both tests, for ``reason``."""
        if reason not in self.not_counted and len(self.not_counted) >= _MAX_SKIP_REASONS:
            reason = "other"
        self.not_counted[reason] = self.not_counted.get(reason, 0) + 1

    def add(self, arm: str, success: bool, duration_ms: float) -> None:
        """One run of ``arm`` (``canary`` or ``stable``), paired when a partner waits.

        The guard's window closes only at :meth:`add_all`'s end (or at ``WINDOW_RUNS``):
        feed a step's runs through :meth:`add_all`, as a poll does.
        """
        bit = "1" if success else "0"
        self._to_window(arm, success, duration_ms)
        if arm == "canary":
            self.canary_runs += 1
            self.canary_successes += success
            self.canary_ms += duration_ms
            if self.stable_waiting:
                self.pairs += bit + self.stable_waiting[0]
                self.stable_waiting = self.stable_waiting[1:]
            else:
                self.canary_waiting += bit
        else:
            self.stable_runs += 1
            self.stable_successes += success
            self.stable_ms += duration_ms
            if self.canary_waiting:
                self.pairs += self.canary_waiting[0] + bit
                self.canary_waiting = self.canary_waiting[1:]
            else:
                self.stable_waiting = (self.stable_waiting + bit)[-STABLE_WAITING:]

    def add_all(self, runs: Iterable[tuple[str, bool, float]]) -> None:
        """One step's runs; the guard's window closes at its end if it holds both arms."""
        for arm, success, duration_ms in runs:
            self.add(arm, success, duration_ms)
        if any(c in self.window for c in "Cc") and any(c in self.window for c in "Ss"):
            self._close_window()

    def _to_window(self, arm: str, success: bool, duration_ms: float) -> None:
        code = "C" if arm == "canary" else "S"
        self.window += code if success else code.lower()
        self.window_ms.append(float(duration_ms))
        if len(self.window) >= WINDOW_RUNS:
            self._close_window()

    def _close_window(self) -> None:
        canary = [c in "Cc" for c in self.window]
        failures, slowness = self.guards()
        failures.observe_failures([c.islower() for c in self.window], canary)
        # The slow-run guard ranks the durations of the runs that succeeded: a failure's
        # duration says when it stopped, not how long the work takes (a fix that completes
        # answers a fault cut short makes runs longer and is no slower), and failures are the
        # failure guard's. Under no harm the arm is independent of a run's outcome and
        # duration, so the successes of a window are still a random split between the arms.
        # The canary's durations are scaled down by the tolerance first: the guard tests "more
        # than SLOW_TOLERANCE times slower", and a rank test on scaled-down canary durations
        # is conservative for every canary within it.
        kept = [i for i, c in enumerate(self.window) if c.isupper()]
        scaled = [
            self.window_ms[i] / SLOW_TOLERANCE if canary[i] else self.window_ms[i] for i in kept
        ]
        if kept:
            slowness.observe(slowness_scores(scaled), [canary[i] for i in kept])
        self.failure_guard, self.slowness_guard = failures.log_wealth, slowness.log_wealth
        self.windows += 1
        self.window, self.window_ms = "", []

    def guards(self) -> tuple[CanaryGuard, CanaryGuard]:
        """The failure guard and the slow-run guard, with every closed window so far."""
        return (
            CanaryGuard.for_failures(self.failure_guard, legacy=self.guard_mixture < 3),
            CanaryGuard.for_slowness(self.slowness_guard, legacy=self.guard_mixture < 2),
        )

    def test(self, limits: RolloutLimits) -> TwoSampleTest:
        """The two-sample test with every pair so far replayed into it."""
        test = TwoSampleTest(
            budget=limits.max_canary_runs, margin=limits.margin, alpha=limits.alpha
        )
        pairs = self.pairs
        for i in range(0, len(pairs), 2):
            test.add(pairs[i] == "1", pairs[i + 1] == "1")
        return test

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Evidence:
        # fields a newer version added are left out, so an older worker still reads the rollout
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in json.loads(text).items() if k in known}
        fields.setdefault("guard_mixture", 1)  # a rollout started before the field existed
        return cls(**fields)

    def summary(self, limits: RolloutLimits | None = None) -> dict[str, object]:
        """What an audit row keeps: runs and successes per arm, pairs, the test that decided,
        and (given the limits) each test's statistic beside its boundary."""
        found: dict[str, object] = {
            "canary": [self.canary_runs, self.canary_successes],
            "stable": [self.stable_runs, self.stable_successes],
            "pairs": len(self.pairs) // 2,
        }
        if self.decided_by:
            found["decided_by"] = self.decided_by
        if self.not_counted:
            found["not_counted"] = dict(self.not_counted)
        if limits is not None:
            test = self.test(limits)
            found["wealth"] = {k: round(v, 3) for k, v in test.wealths.items()}
            found["boundary"] = round(1.0 / test.alpha, 3)
            failures, slowness = self.guards()
            found["guard"] = {
                "failures": round(failures.wealth, 3),
                "failure_boundary": round(1.0 / (limits.guard_alpha * FAILURE_BUDGET), 3),
                "slow": round(slowness.wealth, 3),
                "slow_boundary": round(1.0 / (limits.guard_alpha * (1.0 - FAILURE_BUDGET)), 3),
                "windows": self.windows,
            }
        return found


def decide(
    evidence: Evidence,
    limits: RolloutLimits,
    *,
    claimed_fix: bool,
    age_hours: float,
) -> tuple[Decision, str, str]:
    """(decision, reason, the test that decided) for the evidence so far; see the module."""
    failures, slowness = evidence.guards()
    if failures.rejects(limits.guard_alpha * FAILURE_BUDGET):
        return "roll_back", "worse", "failure_guard"
    if slowness.rejects(limits.guard_alpha * (1.0 - FAILURE_BUDGET)):
        return "roll_back", "slower", "slowness_guard"
    test = evidence.test(limits)
    verdict = test.decision()
    if verdict == "better":
        return "promote", "better", "two_sample"
    if not claimed_fix and (test.shown_no_worse or verdict == "no_worse"):
        return "promote", "no_worse", "two_sample"
    if evidence.canary_runs >= limits.max_canary_runs or age_hours >= limits.max_hours:
        return "roll_back", "not_proven", "limits"
    return "continue", "", ""
