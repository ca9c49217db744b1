"""Writing to a store behind its back, as someone with a database client would: a plain
``sqlite3`` connection to the file, or a plain ``psycopg`` one to the PostgreSQL database.

The tamper tests use it on both backends; it never goes through :class:`Store`, so nothing the
store does on its own connections (its write lock, its adapters) helps or hides the tampering.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from agentmend.infrastructure.store.postgres import translate_statement

__all__ = ["raw_execute", "raw_rows"]

_SQLITE = "sqlite://"


def raw_execute(url: str, sql: str, *params: object) -> None:
    """Run one statement (``?`` parameters) on the store at ``url`` and commit it."""
    if url.startswith("postgres"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute(translate_statement(sql) if params else sql, params or None)
        return
    conn = sqlite3.connect(url.removeprefix(_SQLITE))
    try:
        conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def raw_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """The rows of one query on the store at ``url``."""
    if url.startswith("postgres"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            return [tuple(row) for row in pg.execute(sql).fetchall()]
    conn = sqlite3.connect(url.removeprefix(_SQLITE))
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()
