"""Team ids: one name for a team folder that every host agrees on, and the lock that uses it.

A team's root path differs on every host, so it cannot name the team in a store that many
hosts share. The id is a random hex string kept in ``<root>/.agent/team-id`` (made on first
use, written through the confined file layer) and registered in the store with the root this
host knows it by (``team_roots``: one row per team and host). Changes record it beside their
root, and :func:`team_guard` serializes apply, verification, rollback and recovery of one team:
the root's ``flock`` on this host, then the store's team lock, which on PostgreSQL is a
session-level advisory lock held across hosts (on SQLite the ``flock`` alone, as every worker
of a SQLite store is on one host).
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from infrastructure import confined
from infrastructure.changes.protocol_files import AGENT_DIR, root_lock
from infrastructure.errors import FileOperationError
from infrastructure.store import Store
from infrastructure.structured_logger import get_logger

__all__ = ["TEAM_ID_FILE", "team_guard", "team_id", "team_roots"]

log = get_logger(__name__)

TEAM_ID_FILE = "team-id"
_VALID = re.compile(r"^[0-9a-f]{32}$")

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


def team_id(root: Path, store: Store) -> str:
    """The id of the team at ``root`` (made and registered on first use).

    A new id is derived from the host and the folder's path, so a file that cannot be written
    (a full disk, a read-only folder) leaves the team known by the same id on this host until
    it can be: the change that needed the id then fails on its own file, as it would have. A
    file that does not hold an id (edited by hand, truncated) is replaced, the team starting a
    new identity (its path's) rather than borrowing a wrong one.
    """
    store.migrate("teams", _MIGRATIONS)
    rel = f"{AGENT_DIR}/{TEAM_ID_FILE}"
    host, where = socket.gethostname(), str(root.absolute())
    raw = confined.read(root, rel, max_bytes=256)
    text = raw.decode("utf-8", "replace").strip() if raw is not None else ""
    if not _VALID.match(text):
        fresh = uuid.uuid5(uuid.NAMESPACE_URL, f"agentmend-team://{host}{where}").hex
        text = fresh if raw is None else uuid.uuid4().hex
        try:
            confined.write(root, rel, text + "\n")
        except FileOperationError as exc:
            log.warning("team_id_not_written", root=where, error=str(exc))
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
    return text


def team_roots(store: Store, team: str) -> dict[str, str]:
    """Where each host that used team ``team`` keeps its folder: ``{host: root}``."""
    store.migrate("teams", _MIGRATIONS)
    rows = store.connection().execute(
        "SELECT host, root FROM team_roots WHERE team_id = ? ORDER BY host", (team,)
    )
    return {str(host): str(where) for host, where in rows}


@contextlib.contextmanager
def team_guard(store: Store, root: Path) -> Iterator[int]:
    """Hold the root's ``flock`` and then the store's lock on the team; yields the flock's fd."""
    with root_lock(root) as fd, store.team_lock(team_id(root, store)):
        yield fd
