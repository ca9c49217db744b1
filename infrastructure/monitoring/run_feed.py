"""The bounded log of runs that detectors read from a monitor, each at its own cursor.

Detectors are pull-based: ``IssueDetector.check()`` reads every run recorded since its last
check, so ``record()`` never waits for detection. The monitor appends one :class:`RunChunk` per
agent per drained batch (the runs already grouped and tagged with the baseline they count
against); each reader holds an :class:`EventCursor`. Memory stays bounded by dropping the oldest
chunks once more than twice ``backlog`` runs are retained (amortised: one trim per ``backlog``
runs, not one per chunk); a reader that fell further behind than that skips them and finds the
count in its cursor's ``missed``, rather than holding the monitor's memory hostage.

Not synchronised: the monitor holds its state lock around every call.
"""

from __future__ import annotations

from typing import NamedTuple

from agentmend.infrastructure.monitoring.agent_window import Baseline, Row

__all__ = ["EventCursor", "RunChunk", "RunFeed"]


class RunChunk(NamedTuple):
    """Consecutive runs of one agent as detectors read them.

    ``rows[i]`` is the ``start + i``-th run since ``baseline`` started (so the runs with
    ``start + i < baseline_n`` *are* the baseline); ``rows[i][2]`` is its success flag and
    ``rows[i][3]`` its duration in ms. ``first_run`` numbers runs across all agents.
    """

    baseline: Baseline
    start: int
    rows: list[Row]
    first_run: int


class EventCursor:
    """A detector's position in the monitor's run chunks (see ``read_chunks``)."""

    __slots__ = ("__weakref__", "missed", "next_run", "position")

    def __init__(self, position: int, next_run: int) -> None:
        self.position = position
        self.next_run = next_run
        self.missed = 0


class RunFeed:
    """Run chunks in arrival order, the newest ``backlog`` to ``2 * backlog`` runs of them."""

    __slots__ = ("_backlog", "_base", "_chunks", "_retained", "_total")

    def __init__(self, backlog: int) -> None:
        self._backlog = backlog
        self._chunks: list[RunChunk] = []
        self._base = 0  # sequence number of _chunks[0]
        self._total = 0  # runs appended (the next run's number)
        self._retained = 0

    def append(self, baseline: Baseline, rows: list[Row]) -> None:
        """Add the next runs of ``baseline``'s agent; call before the baseline counts them."""
        self._chunks.append(RunChunk(baseline, baseline.runs, rows, self._total))
        self._total += len(rows)
        self._retained += len(rows)

    def trim(self) -> None:
        """Drop the oldest chunks if over twice the backlog (once per batch, after appending)."""
        if self._retained > 2 * self._backlog:
            chunks = self._chunks
            drop = 0
            while self._retained > self._backlog and drop < len(chunks) - 1:
                self._retained -= len(chunks[drop].rows)
                drop += 1
            del chunks[:drop]
            self._base += drop

    def subscribe(self, *, from_now: bool = False) -> EventCursor:
        """A cursor at the oldest retained run, or past the newest with ``from_now``."""
        if from_now:
            return EventCursor(self._base + len(self._chunks), self._total)
        first = self._chunks[0].first_run if self._chunks else self._total
        return EventCursor(self._base, first)

    def read(self, cursor: EventCursor) -> list[RunChunk]:
        """The chunks since ``cursor`` (which is advanced past them). O(new runs)."""
        chunks = self._chunks
        if cursor.position < self._base:
            first = chunks[0].first_run if chunks else self._total
            cursor.missed += first - cursor.next_run
            cursor.position = self._base
        new = chunks[cursor.position - self._base :]
        cursor.position += len(new)
        cursor.next_run = self._total
        return new
