"""The interactive session and the MCP server as workers: they serve their team's releases.

When the workspace's team has published releases, a face follows them (``follow_releases``:
``auto``, the default): a :class:`ServingFollower` materializes them into a folder of the
face's own, ``<workspace>/workers/<face>`` (``session``, ``mcp``; ``session-2`` ... when that
one is held by another live process: the claim is an advisory lock that dies with its process),
and every run of the team is served by the release its routing key draws, the canary for its
share, with release, arm and rollout in the run's record. ``on`` insists (no release is an
error naming the team), ``off`` serves the workspace's team folder as before; ``serve_release``
pins one release (no canary).

Why ``auto`` by default: once a team has releases, they are what its fleet serves, and a face
serving the folder instead would run definitions no rollout is judging (its runs carry no
release, so they count for neither arm), bypassing the canary. A team that never published one
is served from its folder exactly as before. The improvement cycle still works on the
workspace's team folder, and what it keeps is published as the next release (a canary).

While the store is out of reach a face goes on serving the release it last followed: each
question is answered (``MetaOrchestrator.execute_task`` skips the steps that need the store,
naming them in ``TaskResult.store_notice``), its runs wait in the monitor's backlog, and the
status line says the face is cut off and which release it runs.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentmend.infrastructure.definitions.team_id import TEAM_ID_FILE, team_id_for
from agentmend.infrastructure.errors import ConfigurationError, NotFound
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.releases.follower import (
    FollowerStatus,
    ReleaseChoice,
    ReleaseFollower,
)
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.routing import new_run_key

if TYPE_CHECKING:
    from agentmend.faces.workspace import Workspace
    from agentmend.infrastructure.store.api import Store
    from agentmend.loop.release_publishing import ReleasePublisher

__all__ = [
    "WORKERS_DIR",
    "FollowMode",
    "NoReleases",
    "ReleaseChanges",
    "ServedReleases",
    "ServingFollower",
    "WorkerCheck",
    "check_worker_folders",
    "release_change_lines",
    "release_status_data",
    "release_status_line",
    "serve_releases",
]

FollowMode = Literal["auto", "on", "off"]

WORKERS_DIR = "workers"
"""Under the workspace: one folder per face process following releases."""

_LOCK = ".worker.lock"
_MAX_SLOTS = 64
_REMEMBERED = 1024


class NoReleases(ConfigurationError):
    """Following was asked for (``on``) but the team has no published release."""

    def __init__(self, team: str) -> None:
        self.team = team
        super().__init__(
            f"team {team} has no published release to follow (follow_releases on): publish "
            "one with `agentmend release publish`, or follow with auto"
        )


class ServingFollower(ReleaseFollower):
    """A :class:`ReleaseFollower` that remembers which release served each routing key.

    A face reports the release behind its answer; the run's record has it too, but the face
    answers before the record is written.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._chosen: OrderedDict[str, ReleaseChoice] = OrderedDict()
        self._chosen_lock = threading.Lock()

    def choose(self, routing_key: object = None) -> ReleaseChoice:
        key = new_run_key() if routing_key is None else routing_key
        choice = super().choose(key)  # WrongArgumentType for a key that is not a string
        assert isinstance(key, str)
        with self._chosen_lock:
            self._chosen[key] = choice
            self._chosen.move_to_end(key)
            while len(self._chosen) > _REMEMBERED:
                self._chosen.popitem(last=False)
        return choice

    def chosen(self, routing_key: str) -> ReleaseChoice | None:
        """The release last chosen for ``routing_key`` (None: not among the recent keys)."""
        with self._chosen_lock:
            return self._chosen.get(routing_key)


class _WorkerFolder:
    """``<workspace>/workers/<face>[-n]``, held by an advisory lock for the process's life."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def claim(cls, workspace: Path, face: str) -> _WorkerFolder:
        import fcntl

        for n in range(1, _MAX_SLOTS + 1):
            name = f"{WORKERS_DIR}/{face if n == 1 else f'{face}-{n}'}"
            confined.make_dirs(str(workspace), name)  # following no symlink
            path = workspace / name
            fd = os.open(path / _LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            return cls(path, fd)
        raise ConfigurationError(
            f"{workspace / WORKERS_DIR}: {_MAX_SLOTS} {face} workers are running already"
        )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


@dataclass
class ServedReleases:
    """What a face needs to serve releases: the follower, the team's log, its folder."""

    follower: ServingFollower
    log: ReleaseLog
    folder: _WorkerFolder

    def publisher(self) -> ReleasePublisher:
        """Publishes what the face's cycles keep as the team's next release (a canary)."""
        from agentmend.loop.release_publishing import ReleasePublisher

        return ReleasePublisher(self.log)

    def close(self) -> None:
        self.follower.stop()
        self.folder.close()


def existing_team_id(team_dir: Path) -> str | None:
    """The team's id if it has one (never made here: a team without one has no releases)."""
    if (
        not Path(team_dir).is_dir()
        or confined.read(str(team_dir), TEAM_ID_FILE, max_bytes=1024) is None
    ):
        return None
    return team_id_for(team_dir)


def serve_releases(
    workspace: Workspace, *, face: str, mode: FollowMode, pin: int | None = None
) -> ServedReleases | None:
    """Start following the workspace's team's releases for ``face`` (None: not following).

    Raises:
        NoReleases: ``mode`` is ``on`` (or a release is pinned) and the team has none.
        NotFound: ``pin`` names a release the team does not have.
        ConfigurationError: a release is pinned while following is ``off``.
    """
    if mode == "off":
        if pin is not None:
            raise ConfigurationError(
                f"serve_release {pin} needs follow_releases auto or on, not off"
            )
        return None
    team_id = existing_team_id(workspace.team_dir)
    if team_id is None:
        if mode == "on" or pin is not None:
            raise NoReleases(str(workspace.team_dir))
        return None
    log = ReleaseLog(workspace.store, team_id, audit=workspace.manager.audit)
    if pin is not None:
        log.get(pin)  # NotFound before the worker's folder is made
    elif log.heads().stable is None:
        if mode == "on":
            raise NoReleases(team_id)
        return None
    folder = _WorkerFolder.claim(workspace.path, face)
    try:
        follower = ServingFollower(  # NotFound for a missing pin
            log,
            folder.path,
            pin=pin,
            verify_interval_s=workspace.settings.release_check_interval_s,
        )
        follower.start()
    except BaseException:
        folder.close()
        raise
    return ServedReleases(follower, log, folder)


@dataclass(frozen=True, slots=True)
class WorkerCheck:
    """One worker folder's served release, checked against the store."""

    worker: str
    version: int | None
    problem: str | None  # None: the release on disk is what was published


def check_worker_folders(
    workspace: Path, store: Store, *, team_dir: Path | None = None
) -> list[WorkerCheck]:
    """Every worker folder of the workspace (``workers/<face>``): is the release its team link
    serves what the store published? Reads only; the worker replaces a damaged release itself.

    Args:
        workspace: the workspace folder. store: its store.
        team_dir: the team's folder (default ``<workspace>/agents``).
    """
    from agentmend.infrastructure.releases.materialize import ReleaseDirectories

    base = workspace / WORKERS_DIR
    team_id = existing_team_id(team_dir or workspace / "agents")
    if team_id is None or not base.is_dir():
        return []
    log = ReleaseLog(store, team_id, audit=False)  # reads only
    found: list[WorkerCheck] = []
    for folder in sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink()):
        if not (folder / "agents").is_symlink():
            continue
        served = ReleaseDirectories(folder).linked()
        if served is None:
            found.append(WorkerCheck(folder.name, None, "its team link names no whole release"))
            continue
        problem = ReleaseDirectories(folder).check(served, full=True)
        if problem is None:
            try:
                published = log.get(served.version).content_hash
            except NotFound:
                published = None
            if published != served.content_hash:
                problem = f"its content address is not release {served.version}'s in the store"
        found.append(WorkerCheck(folder.name, served.version, problem))
    return found


def release_status_line(status: FollowerStatus, *, now: float | None = None) -> str:
    """One line: the release served (and the canary), or that the store is out of reach."""
    if status.stable is None:
        return f"releases of {status.team_id}: nothing served yet ({status.problem or 'starting'})"
    if status.pinned is not None:
        served = f"serving pinned release v{status.stable} of {status.team_id}"
    else:
        served = f"serving release v{status.stable} (stable) of {status.team_id}"
        if status.canary is not None:
            served += (
                f", canary v{status.canary} to {status.share:.0%} of runs ({status.rollout_id})"
            )
    if not status.connected and status.cut_off_since is not None:
        since = time.strftime("%H:%M:%S", time.localtime(status.cut_off_since))
        return (
            f"cut off from store since {since}, running last release v{status.stable}: "
            f"{status.problem}"
        )
    if status.last_contact is not None:
        ago = max(0.0, (now if now is not None else time.time()) - status.last_contact)
        served += f"; store reached {ago:.1f} s ago"
    if status.mismatch is not None and status.mismatch_at is not None:
        at = time.strftime("%H:%M:%S", time.localtime(status.mismatch_at))
        served += f"; at {at} {status.mismatch} (materialized again from the store)"
    return served


def release_change_lines(before: FollowerStatus, after: FollowerStatus) -> list[str]:
    """What a person serving releases should hear between two looks: a canary promoted or
    gone, a new stable, a canary started (nothing when nothing changed)."""
    lines: list[str] = []
    if before.canary is not None and after.canary != before.canary:
        if after.stable == before.canary:
            lines.append(
                f"canary v{before.canary} was promoted: every run is now served release "
                f"v{after.stable}"
            )
        else:
            lines.append(
                f"canary v{before.canary} left service without promotion (rolled back or "
                f"aborted: `agentmend release show {before.canary}` says why); serving "
                f"v{after.stable} (stable)"
            )
    elif after.stable is not None and after.stable != before.stable:
        was = f" (was v{before.stable})" if before.stable is not None else ""
        lines.append(f"release v{after.stable} is now stable{was}")
    if after.canary is not None and after.canary != before.canary:
        lines.append(
            f"canary v{after.canary} started on {after.share:.0%} of runs ({after.rollout_id})"
        )
    return lines


class ReleaseChanges:
    """The release changes a face announces: each one once, at the face's next look."""

    def __init__(self, follower: ServingFollower) -> None:
        self._follower = follower
        self._seen = follower.status()

    def since_last_look(self) -> list[str]:
        now = self._follower.status()
        lines, self._seen = release_change_lines(self._seen, now), now
        return lines


def release_status_data(status: FollowerStatus) -> dict[str, Any]:
    """The same facts as data (the MCP server's ``status``)."""
    return {
        "team": status.team_id,
        "stable": status.stable,
        "canary": status.canary,
        "share": status.share,
        "rollout": status.rollout_id,
        "pinned": status.pinned,
        "connected": status.connected,
        "problem": status.problem,
        "cutOffSince": status.cut_off_since,
        "mismatch": status.mismatch,
        "mismatchAt": status.mismatch_at,
        "text": release_status_line(status),
    }
