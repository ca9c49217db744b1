"""A note, not a lock-out, when a second session opens on the same workspace.

Two sessions on one workspace are safe (the store and the change protocol take their own
locks), but each keeps its own view of the team and its own prompts, which surprises a person
who forgot the first one. ``SessionLock`` holds an advisory lock on ``<workspace>/session.lock``
for the session's life; whoever opens second learns who holds it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

__all__ = ["SESSION_LOCK_NAME", "SessionLock"]

SESSION_LOCK_NAME = "session.lock"


class SessionLock:
    """Holds ``<workspace>/session.lock`` while open; ``held_by`` names another holder.

    ``held_by`` is None when this session got the lock (or the platform has no ``fcntl``),
    else a description of the session holding it (``pid 1234``). The lock goes with the
    process, so a killed session leaves none behind.
    """

    def __init__(self, workspace: Path) -> None:
        self.path = Path(workspace) / SESSION_LOCK_NAME
        self.held_by: str | None = None
        self._fd: int | None = None

    def __enter__(self) -> SessionLock:
        try:
            import fcntl
        except ImportError:  # no advisory locks here: say nothing rather than guess
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip()
            os.close(fd)
            self.held_by = f"pid {holder}" if holder.isdigit() else "another process"
            return self
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None
