"""One detection baseline per store, so that every face and every checker judge alike.

How many runs an agent's baseline holds (``Settings.baseline_n``) decides when detection starts
and what ``warming up (n/N)`` means. A session on the simulated team uses 30, the demo 40, a
production default is 500: read by each face from its own settings, the same agent was
``watched`` in the session and ``warming up 54/500`` in ``agentmend status``. The number is kept
in the store instead: the first process that opens the store for writing records the value it
uses; a value set explicitly (``AGENTMEND_BASELINE_N``, an argument) replaces it for everyone;
otherwise every process takes the store's. Readers (``status``, ``report``) only read it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from agentmend.infrastructure.settings import Settings
    from agentmend.infrastructure.store.api import Store

__all__ = ["COMPONENT", "MIGRATIONS", "read_team_baseline", "settle_team_baseline"]

log = get_logger(__name__)

COMPONENT = "detection_settings"
MIGRATIONS = [
    """
    CREATE TABLE detection_settings (
        name TEXT PRIMARY KEY,
        value INTEGER NOT NULL,
        updated_ts REAL NOT NULL
    )
    """
]
_BASELINE = "baseline_n"


def read_team_baseline(store: Store) -> int | None:
    """The store's baseline size, or None before any process recorded one (reads only)."""
    if store.schema_version(COMPONENT) < len(MIGRATIONS):
        return None
    row = (
        store.connection()
        .execute("SELECT value FROM detection_settings WHERE name = ?", (_BASELINE,))
        .fetchone()
    )
    return int(row[0]) if row is not None else None


def settle_team_baseline(
    store: Store, settings: Settings, *, default: int | None = None
) -> Settings:
    """``settings`` with the store's baseline size, recording it where this process decides it.

    Args:
        store: the store, open for writing.
        settings: an explicitly set ``baseline_n`` (in ``model_fields_set``) becomes the
            store's; otherwise the store's value is taken.
        default: the size to record when the store has none and nothing was set explicitly
            (a face's own default, such as the simulated team's); else ``settings.baseline_n``.
    """
    store.migrate(COMPONENT, MIGRATIONS)
    explicit = "baseline_n" in settings.model_fields_set
    wanted = settings.baseline_n if explicit or default is None else default
    # a plain read first: an open that changes nothing takes no write lock (a writer stopped
    # inside a transaction must not stop `status` or `release publish` from opening)
    kept = read_team_baseline(store)
    if kept is not None and (not explicit or kept == wanted):
        return settings.model_copy(update={"baseline_n": kept})
    try:
        with store.transaction() as conn:
            row = conn.execute(
                "SELECT value FROM detection_settings WHERE name = ?", (_BASELINE,)
            ).fetchone()
            if row is not None and not explicit:  # another process recorded it meanwhile
                return settings.model_copy(update={"baseline_n": int(row[0])})
            conn.execute(
                "INSERT INTO detection_settings (name, value, updated_ts) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value,"
                " updated_ts = excluded.updated_ts",
                (_BASELINE, wanted, time.time()),
            )
    except StoreError as exc:
        if not exc.refused_to_role:
            raise
        # a worker role records runs, not the team's settings: it judges by the store's value
        # (or its own, until a controller or administrator records one)
        log.warning("team_baseline_not_recorded", wanted=wanted, kept=kept, error=str(exc))
        return settings.model_copy(update={"baseline_n": kept if kept is not None else wanted})
    return settings.model_copy(update={"baseline_n": wanted})
