"""Taking a file lock (``flock``) with a deadline: a holder that is stopped or stuck never
makes the next process wait forever.

``flock`` itself has no timeout, so the lock is tried without blocking and tried again after
a short sleep that doubles up to a tenth of a second, until the deadline; the first try costs
what a blocking ``flock`` does.
"""

from __future__ import annotations

import fcntl
import time
from dataclasses import dataclass

from agentmend.infrastructure.errors import LockTimeout

__all__ = ["LockWait", "flock_within"]

_FIRST_SLEEP_S = 0.002
_LONGEST_SLEEP_S = 0.1


@dataclass(frozen=True, slots=True)
class LockWait:
    """How long to wait for a file lock, and what to call it if the wait runs out.

    Attributes:
        seconds: the longest wait.
        lock: the lock as a person knows it (``the audit head's file lock``).
        setting: the ``Settings`` field that sets ``seconds``.
    """

    seconds: float
    lock: str
    setting: str


def flock_within(fd: int, wait: LockWait | None, where: str) -> None:
    """An exclusive ``flock`` on ``fd``, waiting at most ``wait.seconds`` (forever if None).

    Raises:
        LockTimeout: another open file description held the lock all along.
    """
    if wait is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + wait.seconds
    sleep = _FIRST_SLEEP_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LockTimeout(
                    wait.lock, where, wait.seconds, wait.setting, path=where
                ) from None
            time.sleep(min(sleep, left))
            sleep = min(sleep * 2, _LONGEST_SLEEP_S)
