"""Sequential tests that stop as soon as the answer is clear: pure functions of counts, no I/O.

Model calls are what users pay for, and a fixed design (every case, every repeat, before and
after) spends the same whether the change obviously helps or obviously does nothing. These tests
look at the evidence after every batch and stay valid however often they look ("always valid"):
the chance that a change that does not help is ever accepted is at most ``alpha``, at any
stopping time (Ville's inequality).

Both tests are *testing by betting* (Shafer 2021, "Testing by betting", JRSS A 184(2); Waudby-
Smith and Ramdas 2024, "Estimating means of bounded random variables by betting", JRSS B 86(1)):
for a null hypothesis "the mean of X is at most m" on observations X in [-1, 1], the wealth
``K_n = prod(1 + lambda_i (X_i - m))`` with a bet ``lambda_i`` chosen from the past only is a
nonnegative supermartingale under the null, so ``K_n >= 1/alpha`` happens with probability at
most ``alpha``. The bet is the approximate GRAPA plug-in of Waudby-Smith and Ramdas (the running
mean excess over its second moment), capped at a share of the largest safe bet (``bet_share``),
the first bet a share of that cap (``opening``).

* :class:`PairedTest` (eval suites): a before/after pair of one case is concordant (no
  information about the change) or discordant: +1 (failed before, passes after) or -1 (passed
  before, fails after). The null "the change does not help" is mean <= 0 over discordant pairs,
  the sequential form of McNemar's test. It stops with ``helps`` when the wealth reaches
  ``1/alpha``; with ``does_not_help`` when the mirrored test shows it hurts, or for futility:
  after a round of pairs (``round_size``, one per case) no more cases fixed than broken, or after
  two rounds no evidence at all (wealth below 1); with ``underpowered`` when even the best
  possible remaining pairs could not reach ``1/alpha`` within the budget (too few cases can
  change for any valid test to decide; the caller falls back to a rule of its own); and with
  ``budget_spent`` otherwise. A pass -> fail pair is never ignored: it costs the wealth.
  Stopping for futility only ever rejects, so it cannot raise the chance of accepting a change
  that does not help; it costs some power, which ``benchmarks/bench_verification.py`` measures.
  Its bets are bolder than the two-sample test's (``bet_share`` 0.9, the first bet at the cap):
  a fix on a small suite gives few discordant pairs, and each must count.
* :class:`TwoSampleTest` (live runs, unpaired): the new arm's runs against the old arm's, one
  pair per new run, ``X = new - old`` in [-1, 1] with mean ``p_new - p_old``. ``no_worse``
  rejects "worse by more than ``margin``" (mean <= -margin), ``better`` rejects mean <= 0, and
  ``hurts`` rejects mean >= 0 (the mirrored wealth), which is the signal to roll back at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "BettingWealth",
    "PairedDecision",
    "PairedTest",
    "TwoSampleDecision",
    "TwoSampleTest",
]

PairedDecision = Literal["continue", "helps", "does_not_help", "underpowered", "budget_spent"]
TwoSampleDecision = Literal["continue", "better", "no_worse", "hurts", "budget_spent"]


@dataclass(slots=True)
class BettingWealth:
    """Wealth of a bettor against "mean <= ``null_mean``" on observations in [-1, 1].

    ``bet_share``: the most it bets, as a share of the largest bet that keeps every factor
    positive; ``opening``: its first bet, as a share of that most.
    """

    null_mean: float
    bet_share: float = 0.5
    opening: float = 0.5
    wealth: float = 1.0
    n: int = 0
    total: float = 0.0  # sum of (x - null_mean)
    total_sq: float = 0.0

    @property
    def max_bet(self) -> float:
        # 1 + lambda * (x - m) > 0 for every x >= -1 needs lambda < 1 / (1 + m)
        return self.bet_share / (1.0 + self.null_mean)

    def bet(self) -> float:
        """The next bet, from the past only (aGRAPA: mean excess over its second moment)."""
        if self.n == 0:
            return self.max_bet * self.opening
        mean = self.total / self.n
        second = self.total_sq / self.n
        raw = mean / second if second > 0 else self.max_bet
        return min(self.max_bet, max(0.0, raw))

    def observe(self, x: float) -> None:
        if not -1.0 <= x <= 1.0:
            raise ValueError(f"observations must lie in [-1, 1], got {x}")
        excess = x - self.null_mean
        self.wealth *= 1.0 + self.bet() * excess
        self.n += 1
        self.total += excess
        self.total_sq += excess * excess

    def best_case(self, remaining: int) -> float:
        """The wealth if every one of ``remaining`` further observations were +1 at the
        largest bet: an upper bound used to stop once the null can no longer be rejected."""
        return self.wealth * (1.0 + self.max_bet * (1.0 - self.null_mean)) ** remaining


@dataclass(slots=True)
class PairedTest:
    """Sequential McNemar-type test on before/after pairs of eval cases (one-sided, ``alpha``).

    Feed pairs with :meth:`add` (booleans: passed before, passes after); read :meth:`decision`
    after each batch. ``budget`` is the most pairs the caller will run; ``round_size`` the pairs
    in one round (one per case; 0: no stopping for futility).
    """

    budget: int
    alpha: float = 0.05
    round_size: int = 0
    fixed: int = 0
    broken: int = 0
    pairs: int = 0
    _helps: BettingWealth = field(default_factory=lambda: BettingWealth(0.0, 0.9, 1.0))
    _hurts: BettingWealth = field(default_factory=lambda: BettingWealth(0.0, 0.9, 1.0))

    def __post_init__(self) -> None:
        if self.budget < 1 or not 0.0 < self.alpha < 1.0 or self.round_size < 0:
            raise ValueError(
                "need budget >= 1, 0 < alpha < 1 and round_size >= 0, got "
                f"{self.budget}, {self.alpha}, {self.round_size}"
            )

    def add(self, passed_before: bool, passes_after: bool) -> None:
        self.pairs += 1
        if passed_before == passes_after:
            return  # concordant: says nothing about the change
        x = 1.0 if passes_after else -1.0
        if x > 0:
            self.fixed += 1
        else:
            self.broken += 1
        self._helps.observe(x)
        self._hurts.observe(-x)

    def decision(self) -> PairedDecision:
        threshold = 1.0 / self.alpha
        if self._helps.wealth >= threshold:
            return "helps"
        if self._hurts.wealth >= threshold:
            return "does_not_help"  # shown to hurt
        rounds = self.pairs / self.round_size if self.round_size else 0.0
        if rounds >= 1.0 and self.fixed <= self.broken:
            return "does_not_help"  # futility: a whole round fixed no more than it broke
        if rounds >= 2.0 and self._helps.wealth < 1.0:
            return "does_not_help"  # futility: two rounds and no evidence at all
        remaining = self.budget - self.pairs
        if self._helps.best_case(remaining) < threshold:
            return "underpowered"  # no valid test can show a help within the budget
        if remaining <= 0:
            return "budget_spent"
        return "continue"

    @property
    def evidence(self) -> float:
        """The wealth against "does not help" (an e-value: 1/alpha or more rejects)."""
        return self._helps.wealth


@dataclass(slots=True)
class TwoSampleTest:
    """Always-valid test of a new arm's success rate against the old arm's (unpaired runs).

    Call :meth:`add` with one new-arm outcome and one old-arm outcome (the pre-change runs,
    drawn in order); ``margin`` is the non-inferiority margin (``p_new >= p_old - margin`` is
    "no worse"). ``budget`` is the most new-arm runs the caller will watch.
    """

    budget: int
    margin: float = 0.05
    alpha: float = 0.05
    pairs: int = 0
    _better: BettingWealth = field(default_factory=lambda: BettingWealth(0.0))
    _no_worse: BettingWealth = field(init=False)
    _hurts: BettingWealth = field(default_factory=lambda: BettingWealth(0.0))

    def __post_init__(self) -> None:
        if self.budget < 1 or not 0.0 < self.alpha < 1.0 or not 0.0 <= self.margin < 1.0:
            raise ValueError(
                "need budget >= 1, 0 < alpha < 1 and 0 <= margin < 1, got "
                f"{self.budget}, {self.alpha}, {self.margin}"
            )
        self._no_worse = BettingWealth(-self.margin)

    def add(self, new_success: bool, old_success: bool) -> None:
        x = float(new_success) - float(old_success)
        self.pairs += 1
        self._better.observe(x)
        self._no_worse.observe(x)
        self._hurts.observe(-x)

    def decision(self) -> TwoSampleDecision:
        """``hurts`` first (roll back now), then ``better``, then ``no_worse``."""
        threshold = 1.0 / self.alpha
        if self._hurts.wealth >= threshold:
            return "hurts"
        if self._better.wealth >= threshold:
            return "better"
        if self.pairs >= self.budget:
            return "no_worse" if self._no_worse.wealth >= threshold else "budget_spent"
        return "continue"

    @property
    def shown_no_worse(self) -> bool:
        return self._no_worse.wealth >= 1.0 / self.alpha

    @property
    def wealths(self) -> dict[str, float]:
        """The evidence of each hypothesis (an e-value; ``1/alpha`` is the boundary)."""
        return {
            "better": self._better.wealth,
            "no_worse": self._no_worse.wealth,
            "hurts": self._hurts.wealth,
        }
