"""The writer's tallies of a batch, summed a column at a time, give exactly what adding the runs
one at a time gives: the same rows, the same floats to the bit, the same errors."""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from typing import Any

import pytest

from agentmend.infrastructure.monitoring import execution_rollup, run_series
from agentmend.infrastructure.monitoring.agent_window import Row
from agentmend.infrastructure.monitoring.run_series import BUCKET_S, DURATION_BINS, ROLLUP_WIDTHS


def _reference_rollup(rows: list[Row]) -> tuple[list[tuple[Any, ...]], list[tuple[str, int]]]:
    """The rollup tally written the plain way: a run at a time, in order."""
    totals: dict[tuple[str, str], list[Any]] = {}
    for agent, source, success, _, _, tin, tout, cost, _, _ in rows:
        t = totals.setdefault((agent, source), [0, 0, 0, 0, 0.0, 0])
        t[0] += 1
        t[2] += tin
        t[3] += tout
        t[4] += cost
        if success:
            t[5] = 0
        else:
            t[1] += 1
            t[5] += 1
    keys = sorted(totals)
    return (
        [(a, s, *totals[(a, s)]) for a, s in keys],
        [(a, totals[(a, s)][0]) for a, s in keys if s == "run"],
    )


def _reference_series(rows: list[Row]) -> tuple[list[Any], list[Any], list[Any]] | None:
    """The series tally written the plain way: every run added to its minute, its totals and
    each of its coarser buckets, one at a time, in order."""
    edges = [2.0 ** (i / 4) for i in range(DURATION_BINS)]

    def empty() -> list[Any]:
        return [0, 0, 0.0, [0] * DURATION_BINS]

    minutes: dict[tuple[str, int], list[Any]] = {}
    totals: dict[str, list[Any]] = {}
    for agent, source, success, duration, _, _, _, _, ts, _ in rows:
        if source != "run":
            continue
        b = bisect_right(edges, duration)
        if b >= DURATION_BINS:
            if not math.isfinite(duration):
                raise OverflowError(f"a run's duration is not a finite number: {duration}")
            b = DURATION_BINS - 1
        m = minutes.setdefault((agent, int(ts // BUCKET_S)), empty())
        m[0] += 1
        m[1] += 0 if success else 1
        m[2] += duration
        m[3][b] += 1
        t = totals.setdefault(agent, [0, 0, float(ts), float(ts)])
        t[0] += 1
        t[1] += 0 if success else 1
        t[2], t[3] = min(t[2], float(ts)), max(t[3], float(ts))
    if not minutes:
        return None
    rollups: list[Any] = []
    finer, finer_width = minutes, BUCKET_S
    for width in ROLLUP_WIDTHS:  # each level summed from the one below, minutes in first-seen order
        coarser: dict[tuple[str, int], list[Any]] = {}
        for (agent, bucket), f in finer.items():
            c = coarser.setdefault((agent, bucket // (width // finer_width)), empty())
            c[0] += f[0]
            c[1] += f[1]
            c[2] += f[2]
            c[3] = [x + y for x, y in zip(c[3], f[3], strict=True)]
        rollups.extend((width, a, k, v[0], v[1], v[2], *v[3]) for (a, k), v in coarser.items())
        finer, finer_width = coarser, width
    return (
        [(a, k, v[0], v[1], v[2], *v[3]) for (a, k), v in sorted(minutes.items())],
        [(a, v[0], v[1], v[2], v[3]) for a, v in sorted(totals.items())],
        sorted(rollups, key=lambda r: (r[0], r[1], r[2])),
    )


def _batch(rng: random.Random, agents: int, shuffled: bool) -> list[Any]:
    """Runs of odd types on purpose too: 0/1 and 0.0/1.0 successes, float token counts."""
    start = 1_700_000_000.0 + rng.random() * 3_600
    span = rng.choice((0.2, 90.0, 4_000.0))  # within a minute, across a few, across hours
    stamps = sorted(start + rng.random() * span for _ in range(rng.randint(1, 400)))
    if shuffled:
        rng.shuffle(stamps)
    names = [f"agent-{i}" for i in range(agents)]
    return [
        (
            rng.choice(names),
            rng.choice(("run", "run", "run", "verification")),
            rng.choice((bool, bool, int, float))(rng.random() > rng.choice((0.0, 0.1, 0.9, 1.0))),
            rng.choice(
                (
                    rng.lognormvariate(4.0, 2.0),
                    float(rng.randint(0, 3)),
                    rng.random(),
                    2.0**24 * (1 + rng.random()),  # beyond the last edge
                    rng.randint(0, 5_000),  # an int duration
                    2.0 ** (rng.randint(0, 90) / 4),  # exactly on an edge
                )
            ),
            None,
            rng.randint(0, 10**6),
            rng.choice(
                (rng.randint(0, 10**6), rng.random() * 10)
            ),  # a float count, summed in order
            rng.random() / 7,
            ts,
            None,
        )
        for ts in stamps
    ]


@pytest.mark.parametrize("agents", [1, 3, 12])
@pytest.mark.parametrize("shuffled", [False, True])
def test_column_tallies_equal_run_at_a_time_tallies(agents: int, shuffled: bool) -> None:
    rng = random.Random(agents * 2 + shuffled)
    for _ in range(60):
        rows = _batch(rng, agents, shuffled)
        rollup = execution_rollup.tally(rows)
        assert (rollup.totals, rollup.baseline) == _reference_rollup(rows)
        series = run_series.tally(rows)
        expected = _reference_series(rows)
        assert (None if series is None else tuple(series)) == expected
        if series is not None:  # to the bit: == would let -0.0 pass for 0.0
            assert repr(series) == repr(run_series.SeriesTally(*expected))  # type: ignore[misc]


def test_a_batch_without_production_runs_adds_no_series() -> None:
    rows: list[Row] = [("a", "verification", True, 5.0, None, 0, 0, 0.0, 1e9, None)]
    assert run_series.tally(rows) is None
    assert run_series.tally([]) is None
    assert execution_rollup.tally([]) == ([], [])


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_a_duration_no_bin_holds_is_refused_by_name(bad: float) -> None:
    rows: list[Row] = [
        ("a", "run", True, 5.0, None, 0, 0, 0.0, 1e9, None),
        ("a", "run", False, bad, None, 0, 0, 0.0, 1e9 + 1, None),
    ]
    with pytest.raises(OverflowError, match="not a finite number"):
        _reference_series(rows)
    with pytest.raises(OverflowError, match=f"not a finite number: {bad}"):
        run_series.tally(rows)


def test_a_value_the_columns_refuse_raises_what_a_run_at_a_time_raises() -> None:
    rows: list[Row] = [
        ("a", "run", True, 5.0, None, 0, 0, 0.0, 1e9, None),
        ("a", "run", True, 5.0, None, "many", 0, 0.0, 1e9, None),  # type: ignore[list-item]
    ]
    with pytest.raises(TypeError, match="unsupported operand"):
        execution_rollup.tally(rows)
