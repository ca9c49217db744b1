"""A rollout's evidence: the live runs of each arm, paired, and the decision they support.

Every run a worker serves under a rollout is recorded with ``release`` and ``rollout`` in its
``extra``; the rollout reads them in execution-id order (ids only grow in commit order) and pairs
each canary run with a stable run (the oldest one waiting, of at most the newest
``STABLE_WAITING`` stable runs, so a pair is contemporaneous). Which runs pair never depends on
their outcomes, so the pairs are draws from the two arms and the always-valid two-sample test
(:class:`~agentmend.infrastructure.evaluation.sequential.TwoSampleTest`) holds at any stopping time.

The evidence is plain data in the rollout record (the pairs as a string, replayed into the test
when a decision is needed), so any worker that reads it next reaches the same decision.

Decision, in this order:

1. ``hurts`` (the canary is shown worse): roll back now, reason ``worse``.
2. Latency guard: after ``latency_min_runs`` canary runs, a canary mean duration above
   ``latency_factor`` times the stable one rolls back (reason ``slower``). A guard, not a test.
3. Promote: when the change claimed a fix, once the canary is shown ``better``; otherwise once it
   is shown no worse than stable by more than ``margin`` (reason ``better`` / ``no_worse``).
4. Limits: after ``max_canary_runs`` canary runs or ``max_hours``, roll back as ``not_proven``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

from agentmend.infrastructure.errors import InvalidArgument
from agentmend.infrastructure.evaluation.sequential import TwoSampleTest

__all__ = [
    "STABLE_WAITING",
    "Decision",
    "Evidence",
    "RolloutLimits",
    "decide",
]

STABLE_WAITING = 256
"""The most stable runs kept waiting for a canary partner (the newest ones)."""

Decision = Literal["continue", "promote", "roll_back"]


@dataclass(frozen=True, slots=True)
class RolloutLimits:
    """When a rollout decides and when it gives up (the documented defaults).

    Attributes:
        margin: a canary is "no worse" when shown within this many points of stable's
            success rate (0.02: two percentage points).
        alpha: the chance of promoting a canary worse by more than ``margin``, or of rolling
            back a good one as shown worse, at any stopping time.
        max_hours: a rollout undecided after this long is rolled back as "not proven".
        max_canary_runs: likewise after this many canary runs (also the test's budget).
        latency_factor: the canary's mean duration may be at most this many times stable's.
        latency_min_runs: canary runs before the latency guard looks.
    """

    margin: float = 0.02
    alpha: float = 0.05
    max_hours: float = 24.0
    max_canary_runs: int = 5000
    latency_factor: float = 1.5
    latency_min_runs: int = 50

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 1.0:
            raise InvalidArgument("margin", self.margin, "must lie in [0, 1)")
        if not 0.0 < self.alpha < 1.0:
            raise InvalidArgument("alpha", self.alpha, "must lie strictly between 0 and 1")
        if self.max_hours <= 0 or self.max_canary_runs < 1:
            raise InvalidArgument("limits", (self.max_hours, self.max_canary_runs), "must be > 0")
        if self.latency_factor <= 1.0 or self.latency_min_runs < 1:
            raise InvalidArgument("latency_factor", self.latency_factor, "must be above 1")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RolloutLimits:
        return cls(**json.loads(text))


@dataclass(slots=True)
class Evidence:
    """The runs of both arms so far; ``pairs`` holds two characters per pair (canary, stable)."""

    canary_runs: int = 0
    canary_successes: int = 0
    canary_ms: float = 0.0
    stable_runs: int = 0
    stable_successes: int = 0
    stable_ms: float = 0.0
    pairs: str = ""
    canary_waiting: str = ""
    stable_waiting: str = ""

    def add(self, arm: str, success: bool, duration_ms: float) -> None:
        """One run of ``arm`` (``canary`` or ``stable``), paired when a partner waits."""
        bit = "1" if success else "0"
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
        for arm, success, duration_ms in runs:
            self.add(arm, success, duration_ms)

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
        return cls(**json.loads(text))

    def summary(self, test: TwoSampleTest | None = None) -> dict[str, object]:
        """What an audit row keeps: runs and successes per arm, pairs, the statistic."""
        found: dict[str, object] = {
            "canary": [self.canary_runs, self.canary_successes],
            "stable": [self.stable_runs, self.stable_successes],
            "pairs": len(self.pairs) // 2,
        }
        if test is not None:
            found["wealth"] = {k: round(v, 3) for k, v in test.wealths.items()}
            found["boundary"] = round(1.0 / test.alpha, 3)
        return found


def decide(
    evidence: Evidence,
    limits: RolloutLimits,
    *,
    claimed_fix: bool,
    age_hours: float,
) -> tuple[Decision, str, TwoSampleTest]:
    """(decision, reason, the test) for the evidence so far; see the module docstring."""
    test = evidence.test(limits)
    verdict = test.decision()
    if verdict == "hurts":
        return "roll_back", "worse", test
    if evidence.canary_runs >= limits.latency_min_runs and evidence.stable_runs > 0:
        canary_mean = evidence.canary_ms / evidence.canary_runs
        stable_mean = evidence.stable_ms / evidence.stable_runs
        if canary_mean > limits.latency_factor * stable_mean:
            return "roll_back", "slower", test
    if verdict == "better":
        return "promote", "better", test
    if not claimed_fix and (test.shown_no_worse or verdict == "no_worse"):
        return "promote", "no_worse", test
    if evidence.canary_runs >= limits.max_canary_runs or age_hours >= limits.max_hours:
        return "roll_back", "not_proven", test
    return "continue", "", test
