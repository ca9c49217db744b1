"""Worker processes that follow a team's releases (``tests/release_worker.py``), for tests that
check what a fleet serves after a publication or a rollout step.

    with FollowingWorkers(store_location, team, tmp_path, files_dir) as workers:
        workers.start(2)
        workers.wait("on 2", lambda s: s.get("stable") == 2)

Each worker polls every 0.1 s and carries the team's rollout on; its status file says what it
serves. Workers are stopped by pid (SIGTERM, then SIGKILL after 30 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

WORKER = Path(__file__).with_name("release_worker.py")


class FollowingWorkers:
    """The worker processes of one test, following ``team`` in the store at ``location``."""

    def __init__(self, location: str, team: str, tmp_path: Path, files_dir: Path) -> None:
        self.location = location
        self.team = team
        self.tmp = tmp_path
        self.files_dir = files_dir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, n: int, *extra: str, first: int | None = None) -> list[int]:
        """Start ``n`` workers numbered from ``first`` (default: after those running)."""
        started = []
        first = len(self.procs) if first is None else first
        for k in range(first, first + n):
            args = [sys.executable, str(WORKER), self.location, self.team, str(self.root(k))]
            args += [str(self.status_path(k)), "--seed", str(k), "--files-dir", str(self.files_dir)]
            self.procs[k] = subprocess.Popen(
                [*args, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            started.append(k)
        return started

    def root(self, k: int) -> Path:
        return self.tmp / f"follower-{k}"

    def status_path(self, k: int) -> Path:
        return self.tmp / f"follower-{k}.json"

    def status(self, k: int) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.status_path(k).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data

    def wait(
        self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60.0
    ) -> None:
        """Until every worker's status passes ``check`` (AssertionError naming ``what``)."""
        deadline = time.monotonic() + timeout
        while not all(check(self.status(k)) for k in self.procs):
            for k, proc in self.procs.items():
                assert proc.poll() is None, f"worker {k} exited ({proc.returncode})"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: " + ", ".join(
                json.dumps(self.status(k)) for k in self.procs
            )
            time.sleep(0.05)

    def kill(self, k: int, sig: int = signal.SIGKILL) -> None:
        """Send worker ``k`` ``sig`` by its pid and reap it."""
        proc = self.procs.pop(k)
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def __enter__(self) -> FollowingWorkers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
