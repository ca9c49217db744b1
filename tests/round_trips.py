"""Counting what a store operation costs in exchanges with the database, for tests and benchmarks.

On PostgreSQL a round trip is the client sending and then waiting for the server's answer, however
many statements went in one message or one pipeline. :class:`PgRoundTrips` counts them from
libpq's own protocol trace of every connection the process opens (pooled ones too): each run of
messages the client sent followed by the server's reply is one round trip. On SQLite there is no
server; :class:`SqliteStatements` counts the statements a connection runs (``BEGIN``, ``PRAGMA``,
``COMMIT`` included), each a call into the library.

    counter = PgRoundTrips.install()      # before the store opens its connections
    with counter.window() as seen:
        manager.apply(...)
    seen.count                            # round trips inside the block
"""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = ["PgRoundTrips", "Seen", "SqliteStatements", "count_round_trips"]


@dataclass
class Seen:
    """What a counting window saw: filled in when the window closes. ``statements`` is for
    reading a failure: on PostgreSQL the statements parsed (one psycopg prepared earlier and
    runs again by name is not listed), on SQLite every statement run."""

    count: int = 0
    statements: list[str] = field(default_factory=list)


def count_round_trips(trace: str) -> int:
    """Round trips in a libpq trace: each run of frontend (``F``) lines answered by the backend."""
    trips, sending = 0, False
    for line in trace.splitlines():
        side = line[:1]
        if side == "F":
            sending = True
        elif side == "B" and sending:
            trips, sending = trips + 1, False
    return trips


class PgRoundTrips:
    """Traces every psycopg connection opened after :meth:`install` (until :meth:`uninstall`)."""

    def __init__(self) -> None:
        self._connections: list[Any] = []
        self._traces: dict[int, IO[bytes]] = {}
        self._lock = threading.Lock()
        self._original: Any = None
        self._counting = False

    @classmethod
    def install(cls) -> PgRoundTrips:
        import psycopg

        counter = cls()
        original = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
        counter._original = original

        def connect(klass: Any, *args: Any, **kwargs: Any) -> Any:
            conn = original(klass, *args, **kwargs)
            with counter._lock:
                counter._connections.append(conn)
                if counter._counting:
                    counter._trace(conn)
            return conn

        psycopg.Connection.connect = classmethod(connect)  # type: ignore[method-assign,assignment]
        psycopg.connect = psycopg.Connection.connect  # the module's name was bound at import
        return counter

    def uninstall(self) -> None:
        import psycopg

        if self._original is not None:
            psycopg.Connection.connect = classmethod(self._original)  # type: ignore[method-assign,assignment]
            psycopg.connect = psycopg.Connection.connect
            self._original = None

    def _trace(self, conn: Any) -> None:
        from psycopg import pq

        if conn.closed:
            return
        out = tempfile.TemporaryFile()  # noqa: SIM115 (closed when its window ends)
        conn.pgconn.trace(out.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        self._traces[id(conn)] = out

    @contextlib.contextmanager
    def window(self) -> Iterator[Seen]:
        """Count the round trips of every connection while the block runs."""
        seen = Seen()
        with self._lock:
            self._connections = [c for c in self._connections if not c.closed]
            for conn in self._connections:
                self._trace(conn)
            self._counting = True
        try:
            yield seen
        finally:
            with self._lock:
                self._counting = False
                for conn in self._connections:
                    out = self._traces.pop(id(conn), None)
                    if out is None:
                        continue
                    if not conn.closed:
                        conn.pgconn.untrace()  # flushes libpq's buffered trace
                    out.seek(0)
                    text = out.read().decode("utf-8", errors="replace")
                    out.close()
                    seen.count += count_round_trips(text)
                    seen.statements.extend(
                        line.split("\t", 3)[-1]
                        for line in text.splitlines()
                        if line.startswith("F") and ("\tQuery\t" in line or "\tParse\t" in line)
                    )


class SqliteStatements:
    """Counts the statements one SQLite connection runs inside :meth:`window`."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @contextlib.contextmanager
    def window(self) -> Iterator[Seen]:
        seen = Seen()
        self._conn.set_trace_callback(seen.statements.append)
        try:
            yield seen
        finally:
            self._conn.set_trace_callback(None)
            seen.count = len(seen.statements)
