"""A receiver's counts kept in the store, so ``agentmend status`` shows what came in and was lost.

An OTLP receiver counts every span it is sent and what became of it (``TelemetryCounts``), but
those counts live in its process: ``GET /status`` while it runs, a log line when it stops. A
person asking "are my traces arriving, and is anything dropped?" looks at ``agentmend status``,
another process, perhaps after the receiver stopped. So a receiver writes its counts to one row
of a small table every few seconds and when it stops: one row per receiver (its host and
address), counting since it started, with when it last wrote. Its log and metric counts
(``LogCounts``) ride in the same row, nested under ``logs``.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.snapshot import read_snapshot
from agentmend.infrastructure.store.sql import has_table
from agentmend.infrastructure.telemetry.assembly import TelemetryCounts
from agentmend.infrastructure.telemetry.claude_code_events import LogCounts

__all__ = ["ReceiverCounts", "read_receiver_counts", "receiver_name", "write_receiver_counts"]

COMPONENT = "telemetry_receivers"
MIGRATIONS = [
    """
    CREATE TABLE telemetry_receivers (
        receiver TEXT PRIMARY KEY,
        started_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        counts TEXT NOT NULL
    )
    """
]
_KNOWN = {f.name for f in fields(TelemetryCounts)}
_LOG_KNOWN = {f.name for f in fields(LogCounts)}
_LOGS_KEY = "logs"  # the log and metric counts, nested in the same row's counts


@dataclass(frozen=True, slots=True)
class ReceiverCounts:
    """One receiver's counts as last written: since ``started_at``, as of ``updated_at``."""

    receiver: str
    started_at: datetime
    updated_at: datetime
    counts: TelemetryCounts
    logs: LogCounts = field(default_factory=LogCounts)
    """What came in over ``/v1/logs`` and ``/v1/metrics`` (zero from a receiver before them)."""

    @property
    def dropped(self) -> int:
        """Spans lost: no agent could be named, the trace never completed, the request was
        malformed, or a span processor's queue was full. (Duplicates, agentmend's own spans and
        spans of no agent are not losses: nothing should have been recorded from them.)"""
        c = self.counts
        return c.unmappable + c.orphans + c.rejected + c.dropped_queue_full

    def as_json(self) -> dict[str, Any]:
        return {
            "receiver": self.receiver,
            "started_at": self.started_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "spans_received": self.counts.spans_received,
            "executions_recorded": self.counts.executions_recorded,
            "spans_dropped": self.dropped,
            "log_records_received": self.logs.log_records_received,
            "log_runs_recorded": self.logs.log_runs_recorded,
            "metric_points_received": self.logs.metric_points_received,
            "counts": asdict(self.counts),
            "log_counts": asdict(self.logs),
        }


def receiver_name(host: str, port: int) -> str:
    """The row a receiver writes: this machine's name and the address it listens on."""
    return f"{socket.gethostname()} {host}:{port}"


def write_receiver_counts(
    store: Store,
    receiver: str,
    started_at: float,
    counts: TelemetryCounts,
    logs: LogCounts | None = None,
) -> None:
    """Replace ``receiver``'s row with ``counts`` and ``logs`` (seconds since the epoch for
    ``started_at``).

    Raises:
        StoreError: the store cannot be written (the caller decides whether that matters).
    """
    store.migrate(COMPONENT, MIGRATIONS)
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO telemetry_receivers (receiver, started_at, updated_at, counts) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (receiver) DO UPDATE SET "
            "started_at = excluded.started_at, updated_at = excluded.updated_at, "
            "counts = excluded.counts",
            (receiver, started_at, time.time(), json.dumps(_document(counts, logs))),
        )


def read_receiver_counts(store: Store) -> list[ReceiverCounts]:
    """Every receiver's last written counts, by name; none when no receiver ever wrote.

    Reads only: a store no receiver wrote to has no table, and none is created.
    """
    with read_snapshot(store) as conn:
        if not has_table(conn, "telemetry_receivers"):
            return []
        rows = conn.execute(
            "SELECT receiver, started_at, updated_at, counts FROM telemetry_receivers "
            "ORDER BY receiver"
        ).fetchall()
    found = []
    for receiver, started, updated, counts in rows:
        document = json.loads(counts)
        logs = document.get(_LOGS_KEY)
        found.append(
            ReceiverCounts(
                receiver=str(receiver),
                started_at=datetime.fromtimestamp(float(started), UTC),
                updated_at=datetime.fromtimestamp(float(updated), UTC),
                # fields a later version added are dropped, ones it removed default to 0
                counts=TelemetryCounts(**{k: int(v) for k, v in document.items() if k in _KNOWN}),
                logs=LogCounts(**{k: int(v) for k, v in logs.items() if k in _LOG_KNOWN})
                if isinstance(logs, dict)
                else LogCounts(),
            )
        )
    return found


def _document(counts: TelemetryCounts, logs: LogCounts | None) -> dict[str, Any]:
    document: dict[str, Any] = asdict(counts)
    if logs is not None:
        document[_LOGS_KEY] = asdict(logs)
    return document
