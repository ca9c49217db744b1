"""Stopping a Claude Code CLI process at once when its run times out or is cancelled.

On cancellation the SDK closes the CLI's stdin and waits up to 5 s for it to exit before
sending SIGTERM (the CLI does not exit on EOF while a request is in flight). To end a timed
out or cancelled run at once, every run carries a marker variable (``AGENTMEND_RUN_ID``) in the
CLI's environment; on abort :func:`abort_run` finds its child process by that marker (Linux
``/proc``) and sends SIGTERM, then SIGKILL after a grace period. Elsewhere the SDK's own
close still stops the process, only later.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from typing import Any

from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["KILL_GRACE_S", "RUN_MARKER_ENV", "abort_run", "marked_children", "signal_all"]

log = get_logger(__name__)

RUN_MARKER_ENV = "AGENTMEND_RUN_ID"
"""Set in each CLI process's environment so an aborted run can find and stop its process."""

KILL_GRACE_S = 3.0
"""How long an aborted run's CLI has after SIGTERM before it gets SIGKILL."""


def marked_children(run_id: str) -> list[int]:
    """Pids of this process's children whose environment carries ``run_id`` (Linux only)."""
    if not os.path.isdir("/proc"):
        return []
    marker = f"{RUN_MARKER_ENV}={run_id}".encode()
    me = os.getpid()
    found: list[int] = []
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat_file:
                    stat = stat_file.read()
                # The command name is in parentheses and may contain spaces.
                if int(stat.rsplit(b")", 1)[1].split()[1]) != me:
                    continue
                with open(f"/proc/{entry.name}/environ", "rb") as environ_file:
                    environ = environ_file.read()
            except (OSError, ValueError, IndexError):
                continue
            if marker in environ.split(b"\0"):
                found.append(int(entry.name))
    return found


def signal_all(pids: Sequence[int], signum: int) -> None:
    """Send ``signum`` to each pid, skipping those already gone or not ours to signal."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


async def abort_run(task: asyncio.Task[Any], run_id: str) -> None:
    """Stop a run's CLI process at once, then let the SDK's cleanup finish."""
    pids = marked_children(run_id)
    signal_all(pids, signal.SIGTERM)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=KILL_GRACE_S)
    if not done:
        signal_all(marked_children(run_id), signal.SIGKILL)
        await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # consumed: the run's outcome is the abort, not this error
    log.info("run_aborted", run_id=run_id, signalled=len(pids))
