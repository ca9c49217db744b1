"""Team ids: one name for a team folder that every host agrees on, and the lock that uses it.

A team's root path differs on every host, so it cannot name the team in a store that many
hosts share. The id is the one releases key a team by, kept in ``<root>/.agent/team-id``
(:mod:`agentmend.infrastructure.definitions.team_id`), registered in the store with the root this
host knows it by (``team_roots``: one row per team and host). Changes record it beside their
root, and :func:`team_guard` serializes apply, verification, rollback and recovery of one team:
the root's ``flock`` on this host, then the store's team lock, which on PostgreSQL is a
session-level advisory lock held across hosts (on SQLite the ``flock`` alone, as every worker
of a SQLite store is on one host).

Every apply and rollback asks for its team's id (once: :func:`team_guard` hands the id it
locked to the work it guards), so each store remembers, per root, the id it read and
registered together with the id file's identity (device, inode, size, change times): the next
call costs one ``stat``, and a file replaced, rewritten or removed since is read again. A file
changed less than a second before it was read is not remembered: a rewrite of the same size
within the file system's timestamp granularity would leave its identity unchanged (git's
"racily clean" files). Its registration is remembered all the same (per store, host, root and
id): a file read again that still holds the same id asks nothing of the store.
"""

from __future__ import annotations

import functools
import os
import socket
import stat
import threading
import time
import uuid
import weakref
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType

from agentmend.infrastructure.changes.protocol.files import root_lock
from agentmend.infrastructure.definitions.team_id import TEAM_ID_FILE, team_id_for
from agentmend.infrastructure.errors import FileOperationError
from agentmend.infrastructure.files.lock_wait import LockWait
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.timeouts import TEAM_LOCK_SETTING
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["TEAM_ID_FILE", "team_guard", "team_id", "team_roots"]

log = get_logger(__name__)


_MIGRATIONS = [
    """
    CREATE TABLE teams (team_id TEXT PRIMARY KEY, created REAL NOT NULL);
    CREATE TABLE team_roots (
        team_id TEXT NOT NULL REFERENCES teams (team_id),
        host TEXT NOT NULL,
        root TEXT NOT NULL,
        seen REAL NOT NULL,
        PRIMARY KEY (team_id, host)
    )
    """
]


_FileIdentity = tuple[int, int, int, int, int]
# per store: (host, root) -> (the id file's identity when read, the id read and registered)
_known: weakref.WeakKeyDictionary[Store, dict[tuple[str, str], tuple[_FileIdentity, str]]] = (
    weakref.WeakKeyDictionary()
)
# per store: the (host, root, id) registered by this process (a registration never goes stale:
# it is only ever overwritten with what the same host reads from the same file)
_registered: weakref.WeakKeyDictionary[Store, set[tuple[str, str, str]]] = (
    weakref.WeakKeyDictionary()
)
_known_lock = threading.Lock()
_SETTLED_NS = 1_000_000_000  # a file older than this has a change time that tells rewrites apart


def _identity(root: str | Path) -> _FileIdentity | None:
    """The id file's identity, None if it is not a regular file (or cannot be looked at)."""
    try:
        st = os.stat(os.path.join(root, TEAM_ID_FILE), follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def team_id(root: str | Path, store: Store) -> str:
    """The id of the team at ``root`` (made on first use, as releases make it), registered in
    the store with the path this host knows the folder by.

    A file that cannot be written (a full disk, a read-only folder) leaves the team known by
    an id derived from the host and the path until it can be: the change that needed the id
    then fails on its own file, as it would have.

    Raises:
        ConfigurationError: the file holds something that is not an id.
    """
    host, where = socket.gethostname(), _absolute(root)
    before = _identity(root)
    with _known_lock:
        cached = _known.get(store, {}).get((host, where))
    if cached is not None and before is not None and cached[0] == before:
        return cached[1]
    text = _read_and_register(root, store, host, where)
    after = _identity(root)
    # not remembered if the file changed while being read, or if the registration may yet
    # roll back with a transaction it joined
    settled = after is not None and time.time_ns() - max(after[3], after[4]) > _SETTLED_NS
    if settled and (before is None or after == before) and not _joined(store):
        assert after is not None
        with _known_lock:
            _known.setdefault(store, {})[(host, where)] = (after, text)
    return text


def _absolute(root: str | Path) -> str:
    """``root`` as ``Path.absolute`` spells it; an absolute text is taken as it is spelled
    (the protocol passes the resolved root, which ``Path`` would spell the same)."""
    if isinstance(root, str) and root.startswith("/"):
        return root
    return str(Path(root).absolute())


def _joined(store: Store) -> bool:
    return store.connection().in_transaction


def _read_and_register(root: str | Path, store: Store, host: str, where: str) -> str:
    store.migrate("teams", _MIGRATIONS)
    try:
        text = team_id_for(root)
    except FileOperationError as exc:
        text = "team-" + uuid.uuid5(uuid.NAMESPACE_URL, f"agentmend-team://{host}{where}").hex[:12]
        log.warning("team_id_not_written", root=where, error=str(exc))
    with _known_lock:
        if (host, where, text) in _registered.get(store, ()):
            return text
    known = (
        store.connection()
        .execute(
            "SELECT root FROM team_roots WHERE team_id = ? AND host = ?",
            (text, host),
        )
        .fetchone()
    )
    if known is None or known[0] != where:
        now = time.time()
        with store.transaction() as conn:
            conn.execute(
                "INSERT INTO teams (team_id, created) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (text, now),
            )
            conn.execute(
                "INSERT INTO team_roots (team_id, host, root, seen) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (team_id, host) DO UPDATE SET root = excluded.root,"
                " seen = excluded.seen",
                (text, host, where, now),
            )
    if not _joined(store):  # else it may yet roll back with the transaction it joined
        with _known_lock:
            _registered.setdefault(store, set()).add((host, where, text))
    return text


def team_roots(store: Store, team: str) -> dict[str, str]:
    """Where each host that used team ``team`` keeps its folder: ``{host: root}``."""
    store.migrate("teams", _MIGRATIONS)
    rows = store.connection().execute(
        "SELECT host, root FROM team_roots WHERE team_id = ? ORDER BY host", (team,)
    )
    return {str(host): str(where) for host, where in rows}


def team_guard(store: Store, root: str | Path) -> AbstractContextManager[str]:
    """Hold the root's ``flock`` and then the store's lock on the team; yields the team's id
    (read under the root's lock, so the work inside records the id it locked).

    Each is waited for at most ``store.timeouts.team_lock_s``.

    Raises:
        LockTimeout: another process held one of them all along (a stopped one keeps them).
    """
    return _TeamGuard(store, root)


class _TeamGuard:
    """:func:`team_guard`'s block (a class rather than a generator: every apply takes one)."""

    __slots__ = ("_root", "_root_lock", "_store", "_team_lock")

    def __init__(self, store: Store, root: str | Path) -> None:
        self._store, self._root = store, root
        self._root_lock: AbstractContextManager[int] | None = None
        self._team_lock: AbstractContextManager[None] | None = None

    def __enter__(self) -> str:
        store = self._store
        root_held = self._root_lock = root_lock(self._root, _team_wait(store.timeouts.team_lock_s))
        root_held.__enter__()
        try:
            team = team_id(self._root, store)
            team_held = store.team_lock(team)
            team_held.__enter__()
        except BaseException as exc:
            root_held.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._team_lock = team_held
        return team

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._root_lock is not None
        assert self._team_lock is not None
        try:
            self._team_lock.__exit__(kind, exc, traceback)
        finally:
            self._root_lock.__exit__(kind, exc, traceback)


@functools.lru_cache(maxsize=8)
def _team_wait(seconds: float) -> LockWait:
    """The wait for a team's locks (one value per timeout, made once)."""
    return LockWait(seconds, "the team folder's lock", TEAM_LOCK_SETTING)
