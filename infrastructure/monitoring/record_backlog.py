"""The bound on runs recorded but not yet stored, and what ``record()`` does when it is reached.

``record()`` accepts runs far faster than any store can write them (over a million a second
against tens of thousands), so without a bound a caller in a tight loop grows the backlog, and
the process's memory, without limit. The gate holds the backlog to ``limit`` runs with one of
two policies:

* ``"wait"`` (the default): backpressure. ``record()`` waits for the writer to make room, up to
  ``wait_s``, so a caller that outruns the store slows to the rate the store sustains; only a
  run that still finds no room after the wait is refused. While the store is failing (a full
  disk, a locked database) nothing makes room, so a full backlog refuses at once rather than
  slowing every caller by ``wait_s``.
* ``"drop"``: a full backlog refuses the newest run at once.

A refused run is counted (``refused``), never silently lost, and each episode of refusals is
logged twice: when it starts and, with its count, when the writer has made room again. Runs
already accepted are never dropped by the gate: the lossless guarantee holds for every run
recorded at a rate the writer sustains.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, get_args

from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.structured_logger import get_logger

__all__ = [
    "DEFAULT_MAX_BACKLOG",
    "DEFAULT_WAIT_S",
    "BacklogGate",
    "BacklogPolicy",
    "BacklogStatus",
]

log = get_logger(__name__)

BacklogPolicy = Literal["wait", "drop"]
DEFAULT_MAX_BACKLOG: Final = 100_000
"""About 30 MB of runs: a second or two of the writer's work, so close() stays short too."""
DEFAULT_WAIT_S: Final = 1.0
"""Long enough to ride out a write or a checkpoint, short enough not to hang a caller."""


@dataclass(frozen=True, slots=True)
class BacklogStatus:
    """What a status shows about the runs between ``record()`` and the store.

    Attributes:
        pending: runs recorded but not yet in the store (kept, written by the next flush).
        limit: the most runs ``pending`` may hold before ``record()`` waits or refuses.
        policy: ``"wait"`` (backpressure, then refuse) or ``"drop"`` (refuse at once).
        refused: runs ``record()`` could not keep because the backlog was full, since the
            monitor was opened.
        unwritten_at_close: runs the last ``close()`` could not write before its deadline
            (still kept and retried by the next ``close()`` or ``flush()``).
        write_error: why the last write failed, or None once one succeeds.
    """

    pending: int
    limit: int
    policy: BacklogPolicy
    refused: int
    unwritten_at_close: int
    write_error: str | None


class BacklogGate:
    """Admits runs past a full backlog by policy, counts the refused ones, wakes the waiters.

    Thread-safe. The monitor calls :meth:`admit` only from ``record()``'s slow path (the
    backlog is full) and :meth:`freed` after each write that made room.
    """

    __slots__ = ("_cond", "_episode", "limit", "policy", "refused", "wait_s")

    def __init__(self, limit: int, policy: str, wait_s: float) -> None:
        if limit < 1:
            raise ConfigurationError(f"PerformanceMonitor: max_backlog must be >= 1, got {limit}")
        if policy not in get_args(BacklogPolicy):
            raise ConfigurationError(
                f"PerformanceMonitor: backlog_policy must be one of "
                f"{get_args(BacklogPolicy)}, got {policy!r}"
            )
        if not wait_s >= 0:
            raise ConfigurationError(
                f"PerformanceMonitor: backlog_wait_s must be >= 0, got {wait_s}"
            )
        self.limit = limit
        self.policy: BacklogPolicy = policy  # type: ignore[assignment]
        self.wait_s = wait_s
        self.refused = 0
        self._episode = 0  # runs refused since the backlog last had room
        self._cond = threading.Condition()

    def admit(self, has_room: Callable[[], bool], *, may_wait: bool) -> bool:
        """Whether a run may join a full backlog: after waiting for room, by policy.

        Args:
            has_room: true once the writer has made room (checked under the gate's lock).
            may_wait: false while waiting cannot help (the store is failing, or the caller is
                the writer itself).

        Returns:
            True if the run may be appended; False if it was refused (and counted).
        """
        with self._cond:
            if self.policy == "wait" and may_wait and self.wait_s > 0:
                if self._cond.wait_for(has_room, timeout=self.wait_s):
                    return True
            elif has_room():
                return True
            self.refused += 1
            self._episode += 1
            if self._episode == 1:
                log.warning(
                    "record_backlog_full",
                    limit=self.limit,
                    policy=self.policy,
                    refused_total=self.refused,
                )
            return False

    def freed(self, has_room: bool) -> None:
        """The writer stored a batch: wake the waiters, and close an episode that has room."""
        with self._cond:
            self._cond.notify_all()
            if has_room and self._episode:
                log.warning(
                    "record_backlog_recovered",
                    refused=self._episode,
                    refused_total=self.refused,
                    limit=self.limit,
                )
                self._episode = 0

    def reinit_after_fork(self) -> None:
        """In a forked child: a new lock (the parent's may have been held) and no counts."""
        self._cond = threading.Condition()
        self.refused = 0
        self._episode = 0
