"""What one apply asks of the store: a bound on its round trips, so the count cannot grow back.

On PostgreSQL an apply waits for the server five times (counted from libpq's protocol trace of
every connection, the team lock's included): the team lock; ``BEGIN`` and the store's write lock
with the intent, its checks for unfinished work and the audit tail, ``COMMIT``; ``BEGIN`` and the
write lock with APPLIED, its audit rows and the tail read beside them (taken to be where the
intent found it), ``COMMIT``. The team's unlock is sent and not waited for (eight while
``BEGIN`` went alone and the unlock was waited for). When
another writer appends between the intent and the commit, the commit runs again reading the
tail first, and the audit chain stays whole. It was nineteen before the intent and the commit
were folded (21
in a team's first second, when its id file is read again at every use: its registration in the
store is now remembered, so that second costs nothing more, and it is the second measured here).
A group costs the same as one file: its rows travel in the same round trips. On SQLite, which has
no server, the bound is on the statements run (19, then 17; 15 since each transaction reads the
audit tail and the highest id handed out in one statement; 11 since a connection stays in the
durable sync mode between durable transactions: an apply after plain work on its thread switches
once more).

Beside the store's two commits, an apply syncs three things itself: the new file, its folder and
the audit head. The backup link's folder is not synced (four, before): the backup is for people
and nothing reads it back.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pg_server import PgServer
from round_trips import PgRoundTrips, SqliteStatements, count_round_trips

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.models import ChangeStatus, ChangeType, ImprovementAction
from agentmend.infrastructure.store.api import Store

PG_ROUND_TRIPS = 5
SQLITE_STATEMENTS = 11
FILE_SYNCS = 3  # the new file, its folder, the audit head

ACTION = ImprovementAction(
    target_agent="writer", action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
)


def _team(tmp_path: Path) -> Path:
    root = tmp_path / "team"
    (root / "agents").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (root / "agents" / f"{name}.md").write_text(f"{name} v0\n")
    return root


def test_the_trace_counts_each_wait_for_the_server_once() -> None:
    trace = "\n".join(
        [
            'F\t20\tQuery\t "BEGIN"',
            'B\t10\tCommandComplete\t "BEGIN"',
            "B\t5\tReadyForQuery\t T",
            'F\t21\tParse\t "" "SELECT $1" 1 NNNN',
            "F\t4\tSync",
            "B\t4\tParseComplete",
            "B\t5\tReadyForQuery\t T",
            'F\t11\tQuery\t "COMMIT"',
        ]
    )
    assert count_round_trips(trace) == 2  # the last message is still unanswered


def test_an_apply_on_postgresql_makes_at_most_five_round_trips(
    counter: PgRoundTrips, pg_server: PgServer, tmp_path: Path
) -> None:
    root = _team(tmp_path)
    with (
        Store(pg_server.create_database(), files_dir=tmp_path) as store,
        ImprovementManager(store=store, max_improvements_per_session=100) as manager,
    ):
        manager.apply(ACTION, path="agents/a.md", new_content="a v1\n", root=root)
        with counter.window() as one:
            manager.apply(ACTION, path="agents/a.md", new_content="a v2\n", root=root)
        with counter.window() as group:
            manager.apply_group(
                [(ACTION, f"agents/{name}.md", f"{name} v3\n") for name in ("a", "b", "c")],
                root=root,
            )
        assert (root / "agents" / "c.md").read_text() == "c v3\n"
        assert manager.verify_audit_chain()
    assert one.count <= PG_ROUND_TRIPS, one.statements
    assert group.count == one.count, group.statements


def test_an_apply_on_sqlite_runs_at_most_eleven_statements(tmp_path: Path) -> None:
    root = _team(tmp_path)
    with (
        Store(tmp_path / "agentmend.db") as store,
        ImprovementManager(store=store, max_improvements_per_session=100) as manager,
    ):
        manager.apply(ACTION, path="agents/a.md", new_content="a v1\n", root=root)
        conn = store.connection()
        assert isinstance(conn, sqlite3.Connection)
        with SqliteStatements(conn).window() as seen:
            manager.apply(ACTION, path="agents/a.md", new_content="a v2\n", root=root)
        assert (root / "agents" / "a.md").read_text() == "a v2\n"
    assert 0 < seen.count <= SQLITE_STATEMENTS, seen.statements


def test_an_audit_row_appended_between_intent_and_commit_moves_the_commit_after_it(
    pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _team(tmp_path)
    url = pg_server.create_database()
    with (
        Store(url, files_dir=tmp_path) as store,
        Store(url, files_dir=tmp_path) as other,
        ImprovementManager(store=store, max_improvements_per_session=100) as manager,
    ):
        other_log = AuditLog(other, head_path=manager.audit.head_path)
        write = confined.write_or_delete

        def write_then_someone_appends(*args: Any) -> None:
            write(*args)
            other_log.append(
                agent_name="other", edit_type="bench", old_value=1, new_value=2, user_id="x"
            )

        monkeypatch.setattr(confined, "write_or_delete", write_then_someone_appends)
        opened: list[bool] = []  # whether each of the apply's audit transactions speculated
        transaction = AuditLog.transaction

        def noted(audit: AuditLog, **options: Any) -> Any:
            if audit is manager.audit:
                opened.append(bool(options.get("speculate")))
            return transaction(audit, **options)

        monkeypatch.setattr(AuditLog, "transaction", noted)
        record = manager.apply(ACTION, path="agents/a.md", new_content="a v1\n", root=root)
        monkeypatch.undo()
        rows = manager.audit.entries()
        chain = manager.verify_audit_chain()
        applied = manager.get_change(record.change_id)
    assert opened == [False, True, False]  # the intent, the guess that missed, the commit
    assert [(r.agent_name, r.change_id) for r in rows] == [
        ("other", None),
        ("writer", record.change_id),
    ]
    assert applied is not None
    assert applied.status is ChangeStatus.APPLIED
    assert chain, chain.problems


def test_an_apply_syncs_the_new_file_its_folder_and_the_audit_head_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _team(tmp_path)
    synced: list[str] = []
    fsync, fdatasync = os.fsync, os.fdatasync

    def named(fd: int) -> str:
        return os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), tmp_path)

    def noted_fsync(fd: int) -> None:
        synced.append(named(fd))
        fsync(fd)

    def noted_fdatasync(fd: int) -> None:
        synced.append(named(fd))
        fdatasync(fd)

    with (
        Store(tmp_path / "agentmend.db") as store,
        ImprovementManager(store=store, max_improvements_per_session=100) as manager,
    ):
        manager.apply(ACTION, path="agents/a.md", new_content="a v1\n", root=root)
        monkeypatch.setattr(os, "fsync", noted_fsync)
        monkeypatch.setattr(os, "fdatasync", noted_fdatasync)
        manager.apply(ACTION, path="agents/a.md", new_content="a v2\n", root=root)
        monkeypatch.undo()
        backups = sorted(p.name for p in (root / ".agent" / "backups").iterdir())
    assert len(synced) == FILE_SYNCS, synced
    assert synced[1] == "team/agents", synced  # the file's folder, after the file itself
    assert synced[2].endswith(".audit-head"), synced
    assert not any("backups" in name for name in synced), synced
    assert len(backups) == 2  # the backups are still made, one per apply
