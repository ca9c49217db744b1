"""How long the store waits, so nothing waits forever: locks, statements, idle transactions.

Each bound comes from :class:`~agentmend.infrastructure.settings.Settings`; a wait that runs out
ends in :class:`~agentmend.infrastructure.errors.LockTimeout`, which names the lock, the wait and
the setting to raise. On PostgreSQL the bounds are the session's own settings, so the server
enforces them: ``lock_timeout`` (the store's write lock and every row or table lock), and
``statement_timeout`` and ``idle_in_transaction_session_timeout``, the last of which ends the
session of a process stopped inside a transaction and so frees what it held. Migrations (and
their backfills) and ``store copy`` lift the last two: they may run long, by design.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agentmend.infrastructure.settings import Settings

__all__ = ["LOCK_SETTING", "TEAM_LOCK_SETTING", "StoreTimeouts"]

LOCK_SETTING = "store_lock_timeout_s"
TEAM_LOCK_SETTING = "team_lock_timeout_s"
_DEFAULTS = Settings.model_fields


@dataclass(frozen=True, slots=True)
class StoreTimeouts:
    """The store's bounds, in seconds; None for no bound (``statement_s`` and ``idle_s``)."""

    lock_s: float = float(_DEFAULTS[LOCK_SETTING].default)
    """A write waiting for the store's write lock, a table or row lock, or a store file lock."""
    team_lock_s: float = float(_DEFAULTS[TEAM_LOCK_SETTING].default)
    """An apply, rollback or recovery waiting for its team's lock (held for a whole change)."""
    statement_s: float | None = float(_DEFAULTS["store_statement_timeout_s"].default)
    """One statement on PostgreSQL, before the server cancels it."""
    idle_s: float | None = float(_DEFAULTS["store_idle_transaction_timeout_s"].default)
    """A PostgreSQL session idle inside a transaction, before the server ends it."""
    transaction_pooler: bool = False
    """PostgreSQL is reached through a transaction pooler: sessions start with none of these
    bounds (a pooler refuses startup options) and keep nothing between transactions."""

    @classmethod
    def from_settings(cls, settings: Settings) -> StoreTimeouts:
        return cls(
            lock_s=settings.store_lock_timeout_s,
            team_lock_s=settings.team_lock_timeout_s,
            statement_s=settings.store_statement_timeout_s,
            idle_s=settings.store_idle_transaction_timeout_s,
            transaction_pooler=settings.store_transaction_pooler,
        )

    def for_bulk_work(self) -> StoreTimeouts:
        """These bounds without the statement and idle ones (a whole-store copy)."""
        return replace(self, statement_s=None, idle_s=None)

    def pg_options(self) -> str:
        """The ``options`` a PostgreSQL session starts with (``-c name=value``, in ms)."""
        values = {
            "lock_timeout": self.lock_s,
            "statement_timeout": self.statement_s,
            "idle_in_transaction_session_timeout": self.idle_s,
        }
        return " ".join(f"-c {name}={_ms(value)}" for name, value in values.items())

    def pg_team_lock_options(self) -> str:
        """The ``options`` of a session that holds team locks: it waits ``team_lock_s`` for
        one and is never in a transaction, so no other bound applies."""
        return f"-c lock_timeout={_ms(self.team_lock_s)} -c statement_timeout=0"


def _ms(seconds: float | None) -> int:
    """PostgreSQL's milliseconds; 0 is no bound (at least 1 ms for any bound given)."""
    return 0 if seconds is None else max(1, round(seconds * 1000))
