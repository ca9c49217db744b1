"""How big a store is, by kind of record: what ``agentmend store`` shows before and after a prune.

Each kind is a group of tables (with their indexes): runs, rollups, decisions, changes, audit,
issues. On SQLite the bytes come from its ``dbstat`` table (the pages each table and index
occupies; a SQLite built without it still gets row counts, with bytes left as None) and the
files are the database and its WAL. On PostgreSQL they come from ``pg_total_relation_size``
(a table with its indexes and TOAST) and the database's size is ``pg_database_size``; its WAL
belongs to the whole server, not to one database, so none is shown.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import StoreConnection, table_names

__all__ = ["KINDS", "KindUsage", "StoreUsage", "store_usage"]
KINDS: dict[str, tuple[str, ...]] = {
    "runs": ("executions",),
    "rollups": (
        "execution_totals",
        "baseline_runs",
        "baseline_epochs",
        "baseline_segments",
        "run_series",
        "run_totals",
        "run_rollups",
    ),
    "decisions": ("decisions", "plans"),
    "changes": ("changes", "change_files"),
    "audit": ("audit_log", "audit_head_events"),
    "issues": ("monitoring_issues", "monitoring_detector_state", "detector_series"),
}
"""Kinds of record, each the tables that hold it (counted rows: the first table's)."""


@dataclass(frozen=True, slots=True)
class KindUsage:
    """One kind's rows (of its main table) and bytes (tables and indexes; None if unknown)."""

    kind: str
    rows: int
    bytes: int | None


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """A store's size by kind, and its size on disk: the database (SQLite's file, or the
    PostgreSQL database) and SQLite's WAL (None on PostgreSQL, whose WAL is the server's)."""

    kinds: tuple[KindUsage, ...]
    file_bytes: int
    wal_bytes: int | None

    @property
    def runs(self) -> int:
        return next((k.rows for k in self.kinds if k.kind == "runs"), 0)


def store_usage(store: Store) -> StoreUsage:
    """The size of ``store`` by kind (reads only; consistent within one snapshot)."""
    with store.snapshot() as conn:
        tables = table_names(conn)
        if store.backend == "sqlite":
            owner = {
                name: table
                for name, table in conn.execute("SELECT name, tbl_name FROM sqlite_master")
            }
            sizes = _sqlite_sizes(conn, owner)
        else:
            sizes = _postgres_sizes(conn)
            database = int(
                conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
            )
        kinds = []
        for kind, members in KINDS.items():
            main = members[0]
            rows = (
                int(conn.execute(f"SELECT COUNT(*) FROM {main}").fetchone()[0])
                if main in tables
                else 0
            )
            size = None if sizes is None else sum(sizes.get(t, 0) for t in members)
            kinds.append(KindUsage(kind, rows, size))
    if store.backend != "sqlite":
        return StoreUsage(tuple(kinds), database, None)
    wal = store.path.with_name(store.path.name + "-wal")
    return StoreUsage(
        tuple(kinds),
        store.path.stat().st_size if store.path.exists() else 0,
        wal.stat().st_size if wal.exists() else 0,
    )


def _sqlite_sizes(conn: StoreConnection, owner: dict[str, str]) -> dict[str, int] | None:
    """Bytes per table, its indexes included; None without ``dbstat``."""
    try:
        rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
    except sqlite3.OperationalError:
        return None
    sizes: dict[str, int] = {}
    for name, size in rows:
        table = owner.get(name, name)
        sizes[table] = sizes.get(table, 0) + int(size)
    return sizes


def _postgres_sizes(conn: StoreConnection) -> dict[str, int]:
    """Bytes per table of the store's schema, with its indexes and TOAST."""
    rows = conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_catalog.pg_class c"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
    )
    return {str(name): int(size) for name, size in rows}
