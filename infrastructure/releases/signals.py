"""How a worker learns that its team's releases changed: PostgreSQL ``NOTIFY``, or the next poll.

Every write that changes what workers serve (a publication, a rollout's start, pause, resume,
promotion or rollback) calls :func:`announce` inside its transaction. On PostgreSQL that is a
``NOTIFY`` on :data:`CHANNEL` with the team id as payload, which the server delivers only when
the transaction commits, so a listener never hears of a release it cannot read yet. On SQLite
it does nothing: workers there poll.

:class:`ReleaseWakeup` is the follower's sleep between polls. On PostgreSQL it listens
(``LISTEN``) on a connection of its own (never one the store hands out: a listening connection
must stay idle in autocommit, outside any transaction) and returns as soon as its team is
announced; on SQLite, or while that connection cannot be had, it sleeps the whole interval.
The poll that follows every wait stays the fallback: a notification sent while the listener was
reconnecting is lost, and the next poll reads the heads anyway.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection, backend_of
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["CHANNEL", "ReleaseWakeup", "announce"]

log = get_logger(__name__)

CHANNEL = "agentmend_releases"
"""The PostgreSQL notification channel; the payload is the team id."""

_CONNECT_TIMEOUT_S = 2  # a listener that cannot connect must not hold the poll up for long
_RECONNECT_EVERY_S = 5.0
_STOP_CHECK_S = 0.25  # the longest a stopping follower waits for its listener to look up


def announce(conn: StoreConnection, team_id: str) -> None:
    """Tell the team's listening workers, when ``conn``'s transaction commits, to poll now."""
    if backend_of(conn) == "postgresql":
        conn.execute("SELECT pg_notify(?, ?)", (CHANNEL, team_id))


class ReleaseWakeup:
    """Waits out the interval between two polls, cut short when the team is announced.

    Used by one thread (the follower's); :meth:`close` may come from another.
    """

    def __init__(
        self, store: Store, team_id: str, *, reconnect_every_s: float = _RECONNECT_EVERY_S
    ) -> None:
        self.team_id = team_id
        self.reconnect_every_s = reconnect_every_s
        self.listening = store.backend == "postgresql"
        self._url = store.url
        self._conn: Any = None
        self._next_attempt = 0.0
        self._lock = threading.Lock()
        self.wakeups = 0  # waits cut short by a notification (for status and tests)

    @property
    def connected(self) -> bool:
        """Whether the listening connection is up (always False on SQLite)."""
        return self._conn is not None

    @property
    def backend_pid(self) -> int | None:
        """The server process of the listening connection (None: not listening)."""
        conn = self._conn
        return int(conn.info.backend_pid) if conn is not None else None

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout`` seconds; True when cut short by an announcement of the team.

        Returns early (False) when ``stop`` is set.
        """
        conn = self._listener() if self.listening else None
        if conn is None:
            stop.wait(timeout)
            return False
        deadline = time.monotonic() + timeout
        try:
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                slice_s = min(left, _STOP_CHECK_S)
                for notice in conn.notifies(timeout=slice_s, stop_after=1):
                    if notice.payload == self.team_id:
                        self.wakeups += 1
                        return True
        except Exception as exc:  # the server went away: poll until the listener is back
            log.warning("release_listen_lost", team=self.team_id, error=str(exc))
            self._drop()
        return False

    def _listener(self) -> Any:
        with self._lock:
            if self._conn is not None and not self._conn.closed and not self._conn.broken:
                return self._conn
            self._conn = None
            if time.monotonic() < self._next_attempt:
                return None
            self._next_attempt = time.monotonic() + self.reconnect_every_s
            try:
                import psycopg

                conn = psycopg.connect(
                    self._url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S
                )
                conn.execute(f"LISTEN {CHANNEL}")
            except Exception as exc:  # no server now: the interval's poll goes on regardless
                log.info("release_listen_unavailable", team=self.team_id, error=str(exc))
                return None
            self._conn = conn
            return conn

    def _drop(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception as exc:  # already broken: nothing more to release
                log.debug("release_listen_close_failed", error=str(exc))

    def close(self) -> None:
        self._drop()
