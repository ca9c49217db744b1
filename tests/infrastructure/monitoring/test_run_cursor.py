"""The run cursor on PostgreSQL: positions from transaction ids, old cursors after an upgrade,
and text that needs escaping through the ``COPY`` path of the unlocked append."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from pg_server import PgServer

from agentmend.infrastructure.monitoring.agent_window import RUN
from agentmend.infrastructure.monitoring.execution_store import _MIGRATIONS, ExecutionStore
from agentmend.infrastructure.monitoring.run_fold import DEFERRED_ROWS
from agentmend.infrastructure.monitoring.run_reader import (
    POSITION_OFFSET,
    last_run_id,
    runs_after,
)
from agentmend.infrastructure.store.api import Store


def _row(agent: str, error: str | None = None, extra: str | None = None) -> tuple[Any, ...]:
    return (agent, RUN, error is None, 7.25, error, 1, 2, 0.5, time.time(), extra)


def test_cursors_kept_before_positions_existed_still_read_on(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database()
    store = Store(url, files_dir=tmp_path)
    store.migrate("executions", _MIGRATIONS[:3])  # the table as an older version left it
    conn = store.connection()
    for seq in range(1, 6):
        conn.execute(
            "INSERT INTO executions (agent, source, success, duration_ms, input_tokens,"
            " output_tokens, cost_usd, ts, writer, writer_seq) VALUES"
            " ('old', 'run', 1, 1.0, 0, 0, 0.0, 0.0, 'before', ?)",
            (seq,),
        )
    kept = 3  # a rollout's cursor from before the upgrade: an id
    store.close()
    store = Store(url, files_dir=tmp_path)  # the new version opens the store: it migrates
    table = ExecutionStore(store, uuid.uuid4().hex)
    table.insert([_row("new") for _ in range(4)])
    conn = store.connection()
    for _ in range(400):  # a run is read once every older write on the shared server ended
        rows = runs_after(conn, kept, 100)
        if len(rows) >= 6:
            break
        time.sleep(0.05)
    assert len(rows) == 2 + 4  # the old rows past the old cursor, then the new ones
    assert [r.id for r in rows[:2]] == [4, 5]  # an old row's position is its id
    assert all(r.id > POSITION_OFFSET for r in rows[2:])  # a new row's is above every id
    assert runs_after(conn, rows[-1].id, 100) == []
    assert last_run_id(conn) >= rows[-1].id
    store.close()


def test_text_that_copy_must_escape_is_stored_as_given(pg_server: PgServer, tmp_path: Path) -> None:
    url = pg_server.create_database()
    store = Store(url, files_dir=tmp_path)
    table = ExecutionStore(store, uuid.uuid4().hex)
    agent = "tab\there back\\slash new\nline cr\rend \\N"
    error = "boom\t\\N\\n\r\n"
    extra = '{"note": "a\\\\tb", "k": "\\\\N"}'
    rows = [_row(agent, error, extra) for _ in range(DEFERRED_ROWS + 1)]  # the COPY path
    table.insert(rows)
    table.insert([_row(agent, error, extra)])  # and a small batch's one INSERT
    stored = store.connection().execute("SELECT agent, error, extra FROM executions").fetchall()
    assert len(stored) == DEFERRED_ROWS + 2
    assert {tuple(r) for r in stored} == {(agent, error, extra)}
    store.close()
