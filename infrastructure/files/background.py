"""A step run on a worker thread beside the caller's, for file work with no order between the two.

An apply must have the old file's backup link synced into its folder and the new bytes synced
into a temporary file before it renames the one over the target, but nothing orders those two
syncs against each other. ``os.fsync`` releases the GIL, so running the backup here while the
caller writes and syncs the new bytes lets the disk take both at once (on ext4 they may share
one journal commit) instead of one after the other.

The workers are started once and kept: a thread started per apply would cost more than the
sync it saves. A forked child drops the parent's pool (its threads did not survive the fork)
and starts its own when it first needs one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

__all__ = ["BackgroundStep"]

_WORKERS = 4  # threads applying at once each get a worker without queueing behind another
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="agentmend-files")
        return _pool


class BackgroundStep:
    """``step`` started on a worker thread; :meth:`result` waits for it and raises its error."""

    def __init__(self, step: Callable[[], None]) -> None:
        self._future: Future[None] = _executor().submit(step)

    def result(self) -> None:
        """Wait for the step; its exception, if it raised one, is raised here."""
        self._future.result()

    def settle(self) -> None:
        """Wait for the step without raising: the caller is handling an error of its own
        already, and must not return while the step may still be writing."""
        wait([self._future])


def _forget_pool_in_child() -> None:
    global _pool, _pool_lock
    _pool = None  # its threads stayed in the parent: submitting to it would wait forever
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # absent on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_pool_in_child)
