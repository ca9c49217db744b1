"""Runs agentmend did not route, attributed to the release they name by a label.

Runs that arrive through OpenTelemetry or the claude-agent-sdk hooks were served by the app,
not by a :class:`~agentmend.infrastructure.releases.follower.ReleaseFollower`, so agentmend cannot
route them; but when they carry a release label, their records carry the same tags as a routed run
(``release``, ``arm``, ``rollout``) and count in the rollout's two-sample test.

The label (:data:`RELEASE_ATTRIBUTE`, ``agentmend.release``) is the release's version (``7``,
``"7"`` or ``"v7"``) or its content hash (at least :data:`MIN_HASH_CHARS` hex digits: the
directory a worker materialized, ``.releases/v7-1a2b3c4d5e6f``, carries 12).
:data:`TEAM_ATTRIBUTE` (``agentmend.team``), when given, must name the attributing team.
:func:`linked_release_label` reads the label of the release a team link points at.

A labelled run whose release is the current canary or stable one gets that arm and the
rollout; an older release is attributed (``release``) without an arm, so it counts for
neither. A label naming no release of the team, or not a label at all, is kept on the record
as ``release_label`` with ``release_unattributed`` saying why: the run is recorded all the
same, never dropped. Unlabelled runs get no tags.

A label is written by the client, so it says which release a run claims, never whether the run
may be believed. ``source`` is the attributing receiver's own name, set where the receiver is
configured (``agentmend otel receive --name``): it is written into every attributed run as
``received_by`` after the client's attributes, so no span can carry it in. The rollout counts a
labelled run only when its ``received_by`` is one of the trusted receivers: the names in
``AGENTMEND_TRUSTED_RECEIVERS`` in the environment of the process that judges (a worker, the
fleet checker; :func:`~agentmend.infrastructure.releases.rollout_evidence.trusted_receivers`)
and those the store trusts (:func:`read_trusted`), which an administrator keeps with
``agentmend release trust NAME`` (``--remove``): the store's list is every judging process's,
however it was started; each change is an audit row, and on a PostgreSQL store with roles only
the administrator role may write it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.errors import (
    AgentmendError,
    InvalidArgument,
    NotFound,
    PermissionRequired,
)
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.release_labels import (
    RELEASE_ATTRIBUTE,
    TEAM_ATTRIBUTE,
    unattributed,
)
from agentmend.infrastructure.releases.log import ReleaseHeads, ReleaseLog
from agentmend.infrastructure.releases.settlement import RELEASE_AGENT
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import has_table

__all__ = [
    "MIN_HASH_CHARS",
    "RELEASE_ATTRIBUTE",
    "TEAM_ATTRIBUTE",
    "TRUST_COMPONENT",
    "TRUST_MIGRATIONS",
    "ReleaseAttribution",
    "linked_release_label",
    "read_trusted",
    "set_trusted",
    "unattributed",
]

MIN_HASH_CHARS = 8

_VERSION = re.compile(r"^v?([1-9][0-9]{0,17})$")
_HASH = re.compile(r"^[0-9a-f]+$")


class ReleaseAttribution:
    """Turns a run's release label into the tags its record carries (see the module).

    Args:
        releases: the team's release log (the team runs are attributed to).
        heads_ttl_s: how long the heads read are reused (a receiver under load reads one
            row per ``heads_ttl_s``, not one per run).
        source: the attributing receiver's configured name, recorded as ``received_by``
            (None: runs carry no receiver identity and never count in a rollout).
        clock: seconds, monotonic (injectable for tests).

    Thread-safe: receivers attribute on several threads.
    """

    def __init__(
        self,
        releases: ReleaseLog,
        *,
        heads_ttl_s: float = 0.5,
        source: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.releases = releases
        self.heads_ttl_s = heads_ttl_s
        self.source = source
        self._clock = clock
        self._lock = threading.Lock()
        self._heads: ReleaseHeads | None = None
        self._heads_at = 0.0
        self._known: set[int] = set()
        self._missing: dict[int, float] = {}  # version -> when it was last found missing
        self._hashes: dict[int, str] = {}
        self._listed_at: float | None = None

    @property
    def team_id(self) -> str:
        return self.releases.team_id

    def tags(self, label: object, team: object = None) -> dict[str, object]:
        """The tags for a run labelled ``label`` (of ``team``, when the run names one)."""
        if label is None:
            return {}
        if team is not None and team != self.team_id:
            return unattributed(label, f"the run names team {team!r}, not {self.team_id}")
        try:
            heads = self._current_heads()
            version = self._version(label, heads)
        except NotFound:
            return unattributed(label, f"team {self.team_id} has no release {label!r}")
        except ValueError as exc:
            return unattributed(label, str(exc))
        except AgentmendError as exc:  # the store is out of reach: record, say why
            return unattributed(label, f"releases could not be read: {exc}")
        found: dict[str, object] = {"release": version, "attributed_by": "label"}
        if self.source is not None:
            found["received_by"] = self.source
        if version == heads.canary:
            found["arm"] = "canary"
        elif version == heads.stable:
            found["arm"] = "stable"
        else:
            return found  # an older release: attributed, but in neither arm
        if heads.rollout_id is not None:
            found["rollout"] = heads.rollout_id
        return found

    def _current_heads(self) -> ReleaseHeads:
        now = self._clock()
        with self._lock:
            if self._heads is not None and now - self._heads_at < self.heads_ttl_s:
                return self._heads
        heads = self.releases.heads()
        with self._lock:
            self._heads, self._heads_at = heads, now
        return heads

    def _version(self, label: object, heads: ReleaseHeads) -> int:
        """The version ``label`` names. Raises NotFound (no such release) or ValueError."""
        if isinstance(label, bool) or not isinstance(label, int | str):
            raise ValueError(f"not a release version or content hash: {label!r}")
        text = str(label).strip().lower()
        match = _VERSION.match(text)
        if match is not None:
            version = int(match.group(1))
            try:
                if version not in self._known:
                    self._look_up(version)
                return version
            except NotFound:
                if len(text) < MIN_HASH_CHARS or not _HASH.match(text):
                    raise  # else a hash of digits only, tried below
        if len(text) < MIN_HASH_CHARS or not _HASH.match(text):
            raise ValueError(
                f"not a release version or content hash (at least {MIN_HASH_CHARS} hex "
                f"digits): {label!r}"
            )
        return self._by_hash(text, heads)

    def _look_up(self, version: int) -> None:
        """Raise NotFound unless the team has ``version`` (a miss is remembered for
        ``heads_ttl_s``: a flood of runs naming no release reads the store once per period)."""
        now = self._clock()
        with self._lock:
            missed = self._missing.get(version)
        if missed is not None and now - missed < self.heads_ttl_s:
            raise NotFound("release", str(version), f"for team {self.team_id}")
        try:
            self.releases.get(version)
        except NotFound:
            with self._lock:
                if len(self._missing) >= 1024:
                    self._missing.clear()
                self._missing[version] = now
            raise
        with self._lock:
            self._known.add(version)
            self._missing.pop(version, None)

    def _by_hash(self, prefix: str, heads: ReleaseHeads) -> int:
        """The release whose content hash starts with ``prefix``: a served one first (a
        rollback republishes its parent's content, so several versions share one hash), else
        the newest."""
        for attempt in range(2):
            now = self._clock()
            with self._lock:
                matches = [v for v, h in self._hashes.items() if h.startswith(prefix)]
                fresh = self._listed_at is not None and now - self._listed_at < self.heads_ttl_s
            if matches or attempt or fresh:  # the list is read again at most once a period
                break
            listed = {r.version: r.content_hash for r in self.releases.list(limit=100_000)}
            with self._lock:
                self._hashes, self._listed_at = listed, now
        if not matches:
            raise NotFound("release", prefix, f"for team {self.team_id}")
        for served in (heads.canary, heads.stable):
            if served in matches:
                return served
        return max(matches)


def linked_release_label(team_dir: str | Path) -> str | None:
    """The label of the release a worker's team link points at (None: not a release).

    For an app that reads a followed team directory itself (Claude Code reading
    ``.claude/agents``), e.g. to put ``agentmend.release`` in ``OTEL_RESOURCE_ATTRIBUTES``.
    """
    from agentmend.infrastructure.releases.materialize import MANIFEST

    try:
        manifest = json.loads((Path(team_dir).resolve() / MANIFEST).read_text("utf-8"))
        return str(int(manifest["version"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


# -- the receivers the store trusts -------------------------------------------------------

TRUST_COMPONENT = "trusted_receivers"
TRUST_MIGRATIONS = [
    """
    CREATE TABLE trusted_receivers (
        name TEXT PRIMARY KEY,
        added_by TEXT NOT NULL,
        added_at REAL NOT NULL
    )
    """
]

# a receiver's name as `otel receive --name` takes it: printable, no spaces or commas (the
# environment's list is comma-separated), bounded
_NAME = re.compile(r"[A-Za-z0-9_.@:/+-]{1,128}")


def read_trusted(store: Store) -> frozenset[str]:
    """The names the store trusts (empty before any was added); a plain read, no lock."""
    conn = store.connection()
    if not has_table(conn, "trusted_receivers"):
        return frozenset()
    return frozenset(str(r[0]) for r in conn.execute("SELECT name FROM trusted_receivers"))


def set_trusted(
    store: Store, audit: AuditLog, name: str, *, by: Principal, trusted: bool = True
) -> bool:
    """Trust receiver ``name`` (or, ``trusted=False``, stop trusting it), audited.

    Returns False when nothing changed (already so).

    Raises:
        PermissionRequired: ``by`` is not an administrator; nothing is written.
        InvalidArgument: ``name`` is not a receiver name.
    """
    if not by.is_admin:
        verb = "trust" if trusted else "stop trusting"
        raise PermissionRequired(by.user_id, ADMIN, f"{verb} a telemetry receiver")
    if not _NAME.fullmatch(name):
        raise InvalidArgument(
            "receiver name", name, "must be 1-128 letters, digits or . _ @ : / + -"
        )
    store.migrate(TRUST_COMPONENT, TRUST_MIGRATIONS)
    with audit.transaction() as txn:
        if trusted:
            changed = txn.conn.execute(
                "INSERT INTO trusted_receivers (name, added_by, added_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (name, by.user_id, time.time()),
            ).rowcount
        else:
            changed = txn.conn.execute(
                "DELETE FROM trusted_receivers WHERE name = ?", (name,)
            ).rowcount
        if changed:
            txn.append(
                agent_name=RELEASE_AGENT,
                edit_type="receiver_trusted" if trusted else "receiver_distrusted",
                old_value=None,
                new_value=name,
                user_id=by.user_id,
                user_name=by.name,
            )
    return bool(changed)
