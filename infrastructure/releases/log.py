"""``ReleaseLog``: a team's releases in the store: publish, read, compare, and what is served.

A release is immutable once published: a fleet-wide rollback publishes the parent's content as a
new version rather than rewriting history. Publication and its audit row commit together. The
change log stays the source of what changed and why; a release carries the ids of the changes
it holds.

What workers serve is the team's *heads* row (stable, canary and its share); a worker polls it
(:meth:`ReleaseLog.heads`, one indexed row) and materializes what it does not have yet. Every
write that reads the heads to change them locks that row first (:meth:`ReleaseLog.lock_heads`,
``SELECT ... FOR UPDATE`` on PostgreSQL), so two publishers on two hosts never take the same
version number or the same parent, whatever else serializes the store's writers; the primary key
``(team_id, version)`` stands behind it. Every change of the heads is announced in its own
transaction (:func:`~agentmend.infrastructure.releases.signals.announce`).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentmend.infrastructure.changes.audit.log import (
    AuditLog,
    AuditTransaction,
    audit_key_from_env,
)
from agentmend.infrastructure.changes.protocol.leases import Leases
from agentmend.infrastructure.errors import NotFound, PermissionRequired, StoreError
from agentmend.infrastructure.principal import ADMIN, PUBLISH_CANARY, PUBLISH_STABLE, Principal
from agentmend.infrastructure.releases.content import (
    check_release,
    content_hash,
    file_hashes,
    read_team_files,
    release_widening,
)
from agentmend.infrastructure.releases.errors import RolloutConflict
from agentmend.infrastructure.releases.settlement import (
    ACTIVE,
    RELEASE_AGENT,
    canary_change_in,
    read_record,
    settle_in,
)
from agentmend.infrastructure.releases.signals import announce
from agentmend.infrastructure.releases.tables import ensure_tables
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection, backend_of
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["RELEASE_AGENT", "Release", "ReleaseDiff", "ReleaseHeads", "ReleaseLog"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Release:
    """One published version of a team's definitions."""

    team_id: str
    version: int
    parent: int | None
    content_hash: str
    change_ids: tuple[str, ...]
    reason: str
    published_by: str
    published_at: float
    files: tuple[tuple[str, str], ...]  # (path, sha256), sorted by path


@dataclass(frozen=True, slots=True)
class ReleaseHeads:
    """What a team's workers serve now; ``generation`` grows on every change of it."""

    team_id: str
    stable: int | None
    canary: int | None
    share: float
    rollout_id: str | None
    generation: int


@dataclass(frozen=True, slots=True)
class ReleaseDiff:
    """The files two releases differ in, and a unified diff of the text."""

    old: int
    new: int
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    text: str


_RELEASE_COLUMNS = (
    "team_id, version, parent, content_hash, change_ids, reason, published_by, published_at"
)


class ReleaseLog:
    """The releases of one team in one store; safe to share between threads.

    Args:
        store: the store the fleet shares.
        team_id: the team's id (the same on every host).
        audit: where publications and rollout steps are audited: True (the default) the
            store's own audit log, keyed by ``AGENTMEND_AUDIT_HMAC_KEY`` when it is set; an
            ``AuditLog`` that one; False none (only for tests of the tables' own locking, which
            the audit's lock would serialize).
    """

    def __init__(self, store: Store, team_id: str, *, audit: AuditLog | bool = True) -> None:
        ensure_tables(store)
        self.store = store
        self.team_id = team_id
        if audit is True:
            # a worker settling a rollout is audited like the CLI is, however it was built
            audit = AuditLog(store, hmac_key=audit_key_from_env())
        self.audit: AuditLog | None = audit if isinstance(audit, AuditLog) else None
        self.leases = Leases(store)  # settling a rollout releases its changes
        # on SQLite the database file itself tells a detached volume (see :meth:`heads`)
        self._identity = _file_identity(store.path) if store.backend == "sqlite" else None

    @contextlib.contextmanager
    def write(
        self, *, safety: bool = False
    ) -> Iterator[tuple[StoreConnection, AuditTransaction | None]]:
        """A durable write transaction, audited when the log has an audit chain.

        Args:
            safety: a rollback, which a broken audit head never stops (see ``AuditLog``).
        """
        if self.audit is None:
            with self.store.transaction(durable=True) as conn:
                yield conn, None
        else:
            with self.audit.transaction(safety=safety) as txn:
                yield txn.conn, txn

    # -- publication -------------------------------------------------------------------------

    def publish_directory(
        self,
        directory: str | Path,
        *,
        by: Principal,
        change_ids: Sequence[str] = (),
        reason: str = "published",
        stable: bool = False,
        refuse_during_rollout: bool = False,
    ) -> Release:
        """Publish the files of a team directory; see :meth:`publish`."""
        return self.publish(
            read_team_files(directory),
            by=by,
            change_ids=change_ids,
            reason=reason,
            stable=stable,
            refuse_during_rollout=refuse_during_rollout,
        )

    def publish(
        self,
        files: Mapping[str, bytes],
        *,
        by: Principal,
        change_ids: Sequence[str] = (),
        reason: str = "published",
        stable: bool = False,
        refuse_during_rollout: bool = False,
    ) -> Release:
        """Publish ``files`` as the team's next version, its parent the current stable one.

        The team's first release becomes stable at once; later ones are served only when a
        rollout starts them as a canary, or at once with ``stable=True`` (a rollback).

        A stable publication meets a running rollout (a canary serving, or paused) this way:
        when ``files`` carry none of the canary's change (:func:`canary_change_in`), the rollout
        is rolled back first, in the same transaction (reason ``superseded``, its changes
        released to recovery, an audit row naming the new release); when they do, the
        publication is refused, naming the canary: a stable release never ships a change only
        a running canary carries. A release that is not stable is served by nobody and meets no
        rollout, unless ``refuse_during_rollout`` (a release about to be a canary) says so.

        Raises:
            ReleaseRefused: a file fails to parse (named); nothing is written.
            RolloutConflict: a running rollout refuses the publication (see above); nothing
                is written.
            PermissionRequired: ``by`` may not publish such a release (a fleet checker
                publishes canaries only); nothing is written.
        """
        return self._publish(
            files,
            by=by,
            change_ids=change_ids,
            reason=reason,
            stable=stable,
            refuse_during_rollout=refuse_during_rollout,
            judged=False,
        )

    def _publish(
        self,
        files: Mapping[str, bytes],
        *,
        by: Principal,
        change_ids: Sequence[str],
        reason: str,
        stable: bool,
        refuse_during_rollout: bool,
        judged: bool,
    ) -> Release:
        """:meth:`publish`; ``judged``: ``files`` are an earlier release's, which the fleet
        served before any running canary existed (a fleet-wide rollback)."""
        check_release(files)
        hashes = file_hashes(files)
        address = content_hash(hashes)
        now = time.time()
        with self.write() as (conn, txn):
            heads = self.lock_heads(conn)
            row = conn.execute(
                "SELECT MAX(version) FROM releases WHERE team_id = ?", (self.team_id,)
            ).fetchone()
            version = int(row[0] or 0) + 1
            parent = heads.stable
            # a release never widens what the agents may do without an administrator (an
            # earlier release's content, re-published by a fleet-wide rollback, was served)
            widens = (
                []
                if parent is None or judged
                else release_widening(self.files_in(conn, parent), files)
            )
            if widens and not by.is_admin:
                raise PermissionRequired(
                    by.user_id, ADMIN, "publish a release that widens " + "; ".join(widens)
                )
            if parent is None or stable:  # served to the whole fleet at once
                by.require(PUBLISH_STABLE, "publish a stable release")
            else:
                by.require(PUBLISH_CANARY, "publish a release")
            running = (
                read_record(conn, self.team_id, heads.rollout_id)
                if heads.rollout_id is not None
                else None
            )
            if running is not None and running.state in ACTIVE:
                if refuse_during_rollout:
                    raise RolloutConflict(
                        running.canary,
                        f"it is the canary now ({running.rollout_id}): a release to be "
                        "canaried is published once it is settled",
                    )
                if stable and parent is not None:
                    carried = (
                        None
                        if judged
                        else canary_change_in(
                            self.files_in(conn, running.stable),
                            self.files_in(conn, running.canary),
                            files,
                        )
                    )
                    if carried is not None:
                        raise RolloutConflict(
                            running.canary,
                            f"it is the canary now ({running.rollout_id}) and this stable "
                            f"release would carry its unjudged change to {carried}: promote "
                            "or abort it first",
                        )
                    settle_in(
                        self,
                        conn,
                        txn,
                        running,
                        "rolled_back",
                        "superseded",
                        running.evidence.summary(),
                        by=by,
                        superseded_by=version,
                    )
                    heads = self.heads_in(conn)
            for path, data in files.items():
                conn.execute(
                    "INSERT INTO release_blobs (sha256, data) VALUES (?, ?) "
                    "ON CONFLICT (sha256) DO NOTHING",
                    (hashes[path], data),
                )
            conn.execute(
                f"INSERT INTO releases ({_RELEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self.team_id,
                    version,
                    parent,
                    address,
                    json.dumps(list(change_ids)),
                    reason,
                    by.user_id,
                    now,
                ),
            )
            conn.executemany(
                "INSERT INTO release_files (team_id, version, path, sha256) VALUES (?, ?, ?, ?)",
                [(self.team_id, version, path, hashes[path]) for path in sorted(files)],
            )
            if parent is None or stable:
                self.set_heads(conn, stable=version, canary=None, share=0.0, rollout_id=None)
            else:
                announce(conn, self.team_id)  # served by nobody yet; followers may look
            if txn is not None:
                txn.append(
                    agent_name=RELEASE_AGENT,
                    edit_type="release_published",
                    old_value=parent,
                    new_value=json.dumps(
                        {
                            "team": self.team_id,
                            "version": version,
                            "hash": address,
                            "files": len(files),
                            "changes": list(change_ids),
                            "stable": parent is None or stable,
                            "reason": reason[:120],
                            **({"widens": widens} if widens else {}),
                        }
                    ),
                    user_id=by.user_id,
                    user_name=by.name,
                    change_id=change_ids[0] if change_ids else None,
                )
        log.info("release_published", team=self.team_id, version=version, hash=address[:12])
        return self.get(version)

    def publish_rollback(self, version: int, *, by: Principal, reason: str = "") -> Release:
        """Roll the fleet back from ``version``: its parent's content, published as new & stable.

        A running rollout is rolled back first (reason ``superseded``), in the same
        transaction: its canary was built on what is being rolled back.

        Raises:
            NotFound: no such release. RolloutConflict: it has no parent to go back to.
        """
        release = self.get(version)
        if release.parent is None:
            raise RolloutConflict(version, "the first release has no parent to roll back to")
        return self._publish(
            self.files(release.parent),
            by=by,
            change_ids=release.change_ids,
            reason=reason or f"rollback of {version} to the content of {release.parent}",
            stable=True,
            refuse_during_rollout=False,
            judged=True,
        )

    # -- reading -----------------------------------------------------------------------------

    def get(self, version: int) -> Release:
        """One release with its file hashes.

        Raises:
            NotFound: the team has no release ``version``.
        """
        conn = self.store.connection()
        row = conn.execute(
            f"SELECT {_RELEASE_COLUMNS} FROM releases WHERE team_id = ? AND version = ?",
            (self.team_id, version),
        ).fetchone()
        if row is None:
            raise NotFound("release", str(version), f"for team {self.team_id}")
        files = conn.execute(
            "SELECT path, sha256 FROM release_files WHERE team_id = ? AND version = ? "
            "ORDER BY path",
            (self.team_id, version),
        ).fetchall()
        return _release(row, tuple((str(p), str(h)) for p, h in files))

    def list(self, limit: int = 50) -> list[Release]:
        """The newest ``limit`` releases, newest first (file hashes omitted)."""
        rows = (
            self.store.connection()
            .execute(
                f"SELECT {_RELEASE_COLUMNS} FROM releases WHERE team_id = ? "
                "ORDER BY version DESC LIMIT ?",
                (self.team_id, limit),
            )
            .fetchall()
        )
        return [_release(row, ()) for row in rows]

    def files(self, version: int) -> dict[str, bytes]:
        """The bytes of every file of release ``version``.

        Raises:
            NotFound: the team has no release ``version``.
        """
        self.get(version)
        rows = (
            self.store.connection()
            .execute(
                "SELECT f.path, b.data FROM release_files f "
                "JOIN release_blobs b ON b.sha256 = f.sha256 "
                "WHERE f.team_id = ? AND f.version = ? ORDER BY f.path",
                (self.team_id, version),
            )
            .fetchall()
        )
        return {str(path): bytes(data) for path, data in rows}

    def files_in(self, conn: StoreConnection, version: int) -> dict[str, bytes]:
        """Release ``version``'s files as ``conn`` sees them (inside a write, say)."""
        rows = conn.execute(
            "SELECT f.path, b.data FROM release_files f "
            "JOIN release_blobs b ON b.sha256 = f.sha256 "
            "WHERE f.team_id = ? AND f.version = ?",
            (self.team_id, version),
        ).fetchall()
        return {str(path): bytes(data) for path, data in rows}

    def diff(self, old: int, new: int) -> ReleaseDiff:
        """What changed from release ``old`` to release ``new``."""
        before, after = self.files(old), self.files(new)
        changed = tuple(p for p in sorted(set(before) & set(after)) if before[p] != after[p])
        added = tuple(sorted(set(after) - set(before)))
        removed = tuple(sorted(set(before) - set(after)))
        lines: list[str] = []
        for path in (*removed, *changed, *added):
            a = before.get(path, b"").decode("utf-8").splitlines(keepends=True)
            b = after.get(path, b"").decode("utf-8").splitlines(keepends=True)
            lines.extend(difflib.unified_diff(a, b, f"{old}/{path}", f"{new}/{path}"))
        return ReleaseDiff(old, new, added, removed, changed, "".join(lines))

    def heads(self) -> ReleaseHeads:
        """What the team's workers serve now (a worker's poll).

        Raises:
            StoreError: the store cannot be reached (its file is gone, a statement failed).
        """
        # A detached volume or a replaced file: the open connections would go on reading the
        # old file, and a new one would create an empty database at the path.
        if self.store.backend == "sqlite" and _file_identity(self.store.path) != self._identity:
            raise StoreError(
                f"store {self.store.path} is unreachable: its file is gone or was replaced"
            )
        try:
            return self.heads_in(self.store.connection())
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read releases from {self.store.path}: {exc}") from exc
        except StoreError as exc:  # the server is down or cannot be reached
            raise StoreError(
                f"store {self.store.display} is unreachable: {exc}", cause=exc.cause
            ) from exc

    def heads_in(self, conn: StoreConnection) -> ReleaseHeads:
        """The heads as ``conn`` sees them (inside a write transaction: locked)."""
        row = conn.execute(
            "SELECT stable, canary, share, rollout_id, generation FROM release_heads "
            "WHERE team_id = ?",
            (self.team_id,),
        ).fetchone()
        if row is None:
            return ReleaseHeads(self.team_id, None, None, 0.0, None, 0)
        stable, canary, share, rollout_id, generation = row
        return ReleaseHeads(self.team_id, stable, canary, float(share), rollout_id, generation)

    def lock_heads(self, conn: StoreConnection) -> ReleaseHeads:
        """The heads, locked until ``conn``'s transaction ends (inside a write transaction).

        A team without a heads row gets an empty one first (generation 0, what :meth:`heads`
        reports for no row), so there is always a row to lock: two first publications at once
        wait for each other on it too.
        """
        conn.execute(
            "INSERT INTO release_heads "
            "(team_id, stable, canary, share, rollout_id, generation, updated_at) "
            "VALUES (?, NULL, NULL, 0.0, NULL, 0, ?) ON CONFLICT (team_id) DO NOTHING",
            (self.team_id, time.time()),
        )
        # SQLite has no FOR UPDATE and needs none: its write transactions are taken up front
        locking = " FOR UPDATE" if backend_of(conn) == "postgresql" else ""
        row = conn.execute(
            "SELECT stable, canary, share, rollout_id, generation FROM release_heads "
            f"WHERE team_id = ?{locking}",
            (self.team_id,),
        ).fetchone()
        stable, canary, share, rollout_id, generation = row
        return ReleaseHeads(self.team_id, stable, canary, float(share), rollout_id, generation)

    def rollout_of_heads(self, conn: StoreConnection) -> str | None:
        """The rollout the heads name, locked (inside a write transaction)."""
        return self.lock_heads(conn).rollout_id

    def set_heads(
        self,
        conn: StoreConnection,
        *,
        stable: int | None,
        canary: int | None,
        share: float,
        rollout_id: str | None,
    ) -> None:
        """Point the team's workers at new releases (inside the caller's transaction), and
        announce it to them when it commits."""
        conn.execute(
            "INSERT INTO release_heads "
            "(team_id, stable, canary, share, rollout_id, generation, updated_at) "
            "VALUES (?, ?, ?, ?, ?, 1, ?) "
            "ON CONFLICT (team_id) DO UPDATE SET stable = excluded.stable, "
            "canary = excluded.canary, share = excluded.share, "
            "rollout_id = excluded.rollout_id, "
            "generation = release_heads.generation + 1, updated_at = excluded.updated_at",
            (self.team_id, stable, canary, share, rollout_id, time.time()),
        )
        announce(conn, self.team_id)


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _release(row: tuple[object, ...], files: tuple[tuple[str, str], ...]) -> Release:
    team_id, version, parent, address, change_ids, reason, by, at = row
    return Release(
        team_id=str(team_id),
        version=int(str(version)),
        parent=int(str(parent)) if parent is not None else None,
        content_hash=str(address),
        change_ids=tuple(json.loads(str(change_ids))),
        reason=str(reason),
        published_by=str(by),
        published_at=float(str(at)),
        files=files,
    )
