"""The release tables: plain, standard SQL so the same statements serve another backend.

* ``release_blobs``: file contents by SHA-256, stored once however many releases hold them.
* ``releases`` / ``release_files``: one row per published version (never updated) and the
  hash of each of its files.
* ``release_heads``: per team, what workers serve: the stable version, the canary version and
  its share, and the rollout that owns the canary. ``generation`` grows on every change, so a
  worker's poll compares one number.
* ``rollouts``: one row per rollout; the record that owns it (state, limits, evidence, the
  cursor into the executions it has read), so whichever worker reads it next carries it on.
  ``lease_id`` is its lease in the ownership records: the changes the canary carries are
  owned by the rollout record, which recovery continues rather than rolls back.

Version numbers are ``max + 1`` under the store's write lock, with the primary key behind it.
Upserts use ``INSERT ... ON CONFLICT DO NOTHING``, which SQLite and PostgreSQL both take.
"""

from __future__ import annotations

from agentmend.infrastructure.store.api import Store

__all__ = ["COMPONENT", "ensure_tables"]

COMPONENT = "releases"

_MIGRATIONS = [
    """
    CREATE TABLE release_blobs (
        sha256 TEXT PRIMARY KEY,
        data BLOB NOT NULL
    );
    CREATE TABLE releases (
        team_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        parent INTEGER,
        content_hash TEXT NOT NULL,
        change_ids TEXT NOT NULL,
        reason TEXT NOT NULL,
        published_by TEXT NOT NULL,
        published_at REAL NOT NULL,
        PRIMARY KEY (team_id, version)
    );
    CREATE TABLE release_files (
        team_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        path TEXT NOT NULL,
        sha256 TEXT NOT NULL REFERENCES release_blobs (sha256),
        PRIMARY KEY (team_id, version, path)
    );
    CREATE TABLE release_heads (
        team_id TEXT PRIMARY KEY,
        stable INTEGER,
        canary INTEGER,
        share REAL NOT NULL,
        rollout_id TEXT,
        generation INTEGER NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE rollouts (
        rollout_id TEXT PRIMARY KEY,
        team_id TEXT NOT NULL,
        canary INTEGER NOT NULL,
        stable INTEGER NOT NULL,
        share REAL NOT NULL,
        claimed_fix INTEGER NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        limits TEXT NOT NULL,
        evidence TEXT NOT NULL,
        cursor INTEGER NOT NULL,
        started_at REAL NOT NULL,
        settled_at REAL,
        lease_id TEXT
    );
    CREATE INDEX rollouts_by_team ON rollouts (team_id, state)
    """,
    # the key of each rollout's routing hash: kept apart from the rollout's record, which
    # status, show and the audit repeat, so no caller can learn which keys a canary serves
    """
    CREATE TABLE rollout_secrets (
        rollout_id TEXT PRIMARY KEY,
        secret TEXT NOT NULL
    )
    """,
]


def ensure_tables(store: Store) -> None:
    """Create or upgrade the release tables (idempotent; cheap after the first call)."""
    store.migrate(COMPONENT, _MIGRATIONS)
