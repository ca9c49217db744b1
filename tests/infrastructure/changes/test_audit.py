"""The tamper-evident audit log: rows, truncation, the chain, the head file, HMAC, crash order.

Each test runs on SQLite and on a real PostgreSQL server, in each backend's documented
configuration: a PostgreSQL store's log is keyed (``AGENTMEND_AUDIT_HMAC_KEY``) and its head
file is this host's, in the store's ``files_dir``. Tampering goes around the store, through a
plain database connection (:mod:`raw_sql`).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from raw_sql import raw_execute

from agentmend.infrastructure.changes.audit.head import read_head, write_head
from agentmend.infrastructure.changes.audit.head_events import record_head_event
from agentmend.infrastructure.changes.audit.log import (
    AUDIT_HMAC_KEY_ENV,
    GENESIS_HASH,
    AuditChainBroken,
    AuditLog,
    _same,
    audit_key_from_env,
    verify_audit_chain,
)
from agentmend.infrastructure.errors import AuditChainError, StoreError
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import set_next_id

KEY = b"kept-off-the-database-server"


@pytest.fixture
def store(store_url: str, tmp_path: Path) -> Iterator[Store]:
    with Store(store_url, files_dir=tmp_path) as s:
        yield s


def _audit(store: Store) -> AuditLog:
    """The store's log as documented: keyed on PostgreSQL, plain by default on SQLite."""
    return AuditLog(store, hmac_key=KEY if store.backend == "postgresql" else None)


def _fill(audit: AuditLog, n: int) -> None:
    for i in range(n):
        audit.append(
            agent_name=f"agent-{i % 2}",
            edit_type="prompt_modification",
            old_value=f"old {i}",
            new_value=f"new {i}",
            user_id="u1",
            user_name="Ada",
            change_id=f"c{i}",
        )


def _behind(store: Store, head_row: int, rows: int) -> str:
    """How verify notes a head ``rows`` rows behind, repaired: one commit after a crash on one
    host; on a fleet, any rows that verify under the key (other hosts' appends)."""
    if store.backend == "postgresql":
        return (
            f"head at row {head_row}; {rows} row(s) appended since verify under the key, "
            "moved forward"
        )
    return f"head behind by one commit ({rows} row(s)), repaired"


def _raw(store: Store, sql: str, *params: object) -> None:
    """Write behind the log's back, as a person with a database client would."""
    raw_execute(store.url, sql, *params)


def test_rows_hold_seed_002_fields_and_truncate_values_to_500(store: Store) -> None:
    audit = _audit(store)
    entry = audit.append(
        agent_name="writer",
        edit_type="system_prompt",
        old_value="o" * 900,
        new_value=12345,
        user_id="42",
        user_name="Grace",
    )
    (stored,) = audit.entries()
    assert stored == entry
    assert (stored.agent_name, stored.edit_type, stored.user_id, stored.user_name) == (
        "writer",
        "system_prompt",
        "42",
        "Grace",
    )
    assert stored.old_value == "o" * 500
    assert stored.new_value == "12345"
    assert stored.timestamp.tzinfo is not None
    assert stored.prev_hash == GENESIS_HASH


def test_entries_filter_by_agent_and_change_and_keep_oldest_first(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 6)
    assert [e.change_id for e in audit.entries(agent_name="agent-1")] == ["c1", "c3", "c5"]
    assert [e.change_id for e in audit.entries(limit=2)] == ["c4", "c5"]
    assert [e.id for e in audit.entries(change_id="c2")] == [3]


def test_a_remembered_row_counts_as_hashed_only_when_equal_and_of_the_same_types() -> None:
    """Values that compare equal but serialise apart (1, 1.0, True) are hashed again."""
    assert _same((1, "a", None), (1, "a", None))
    assert not _same((1, "a"), (1.0, "a"))
    assert not _same((1, "a"), (True, "a"))
    assert not _same((1, "a"), (1, "b"))
    assert not _same((1, "a"), (1,))


def test_an_untouched_chain_verifies_and_is_truthy(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 5)
    result = audit.verify_chain()
    assert result
    assert result.ok
    assert result.rows_checked == 5
    assert result.problems == ()
    assert result.notes == ()
    result.raise_for_problems()  # no error


def test_an_empty_log_verifies(store: Store) -> None:
    assert _audit(store).verify_chain()


def test_an_edited_row_is_found_by_id(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 5)
    _raw(store, "UPDATE audit_log SET new_value = 'sneaky' WHERE id = 3")
    result = audit.verify_chain()
    assert not result
    assert [(p.row_id, p.kind) for p in result.problems] == [(3, "edited")]
    with pytest.raises(AuditChainError, match="row 3: edited"):
        result.raise_for_problems()


def test_an_edit_with_a_recomputed_hash_breaks_the_next_link(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 5)
    _raw(store, "UPDATE audit_log SET row_hash = ? WHERE id = 2", "f" * 64)
    result = audit.verify_chain()
    assert {(p.row_id, p.kind) for p in result.problems} == {(2, "edited"), (3, "broken_link")}


def test_a_deleted_middle_row_is_found(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 5)
    _raw(store, "DELETE FROM audit_log WHERE id = 3")
    result = audit.verify_chain()
    assert [(p.row_id, p.kind) for p in result.problems] == [(4, "broken_link")]
    assert "rows 3..3 are missing" in result.problems[0].detail


def test_deleted_first_rows_are_found(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 3)
    _raw(store, "DELETE FROM audit_log WHERE id = 1")
    result = audit.verify_chain()
    assert [(p.row_id, p.kind) for p in result.problems] == [(2, "broken_link")]


def test_rows_cut_off_the_end_are_found_through_the_head_file(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 5)
    _raw(store, "DELETE FROM audit_log WHERE id >= 4")
    result = audit.verify_chain()
    assert [(p.row_id, p.kind) for p in result.problems] == [(None, "cut_off")]
    assert "head names row 5" in result.problems[0].detail


def test_rows_appended_after_a_cut_start_a_segment_that_reports_the_cut(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 5)
    _raw(store, "DELETE FROM audit_log WHERE id >= 4")
    with pytest.raises(AuditChainBroken):
        _fill(audit, 1)  # an ordinary append over the cut is refused
    with audit.transaction(safety=True) as txn:  # a rollback is not
        txn.append(agent_name="a", edit_type="rollback", old_value=1, new_value=0, user_id="u")
    result = audit.verify_chain()
    assert [(p.row_id, p.kind) for p in result.problems] == [(6, "chain_break")]
    assert "head file named row 5" in result.problems[0].detail
    assert [(e.id, e.edit_type) for e in audit.entries()[-2:]] == [
        (6, "audit_chain_break"),
        (7, "rollback"),
    ]


def test_a_deleted_head_file_is_reported(store: Store) -> None:
    """On a fleet (PostgreSQL, keyed) a missing head file is a host joining, which checks every
    row under the key (tests/infrastructure/changes/test_audit_fleet.py); an emptied one is reported
    there too."""
    audit = _audit(store)
    _fill(audit, 3)
    audit.head_path.unlink()
    result = audit.verify_chain(repair=False)
    if store.backend == "postgresql":
        assert result.ok, result
        assert result.notes == ("this host's head file joins the chain at row 3, not started",)
        audit.head_path.write_bytes(b" " * 256)
        result = audit.verify_chain()
    assert [(p.row_id, p.kind) for p in result.problems] == [(None, "head_missing")]


def test_an_unreadable_head_file_is_reported(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 2)
    data = bytearray(audit.head_path.read_bytes())
    data[30] = ord("9") if data[30] != ord("9") else ord("8")
    audit.head_path.write_bytes(bytes(data))
    result = audit.verify_chain()
    assert [p.kind for p in result.problems] == ["head_unreadable"]


def _garble(audit: AuditLog) -> None:
    audit.head_path.write_bytes(b"garbage".ljust(256))  # torn or overwritten


def test_an_unreadable_head_is_reported_and_never_rewritten_by_verify(store: Store) -> None:
    """Only the crash state is repaired: a rewrite would reset the tail's only witness."""
    audit = _audit(store)
    _fill(audit, 2)
    _garble(audit)
    for repair in (False, True, True):
        result = audit.verify_chain(repair=repair)
        assert [p.kind for p in result.problems] == ["head_unreadable"]
        assert str(audit.head_path) in result.problems[0].detail
        assert not result.repaired
    assert audit.head_path.read_bytes() == b"garbage".ljust(256)


def test_an_unreadable_head_is_reported_beside_rows_that_fail(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 3)
    _garble(audit)
    _raw(store, "UPDATE audit_log SET new_value = 'forged' WHERE id = 2")
    result = audit.verify_chain()
    assert {p.kind for p in result.problems} == {"edited", "head_unreadable"}
    assert not result.repaired
    assert audit.head_path.read_bytes() == b"garbage".ljust(256)


def test_a_safety_write_carries_on_past_an_unreadable_head_and_records_the_break(
    store: Store,
) -> None:
    """A damaged head must not stop a rollback, nor may its rewrite erase the evidence."""
    audit = _audit(store)
    _fill(audit, 2)
    _garble(audit)
    with pytest.raises(AuditChainBroken):
        _fill(audit, 1)
    with audit.transaction(safety=True):
        pass  # a transaction without rows records nothing
    assert audit.head_path.read_bytes() == b"garbage".ljust(256)
    with audit.transaction(safety=True) as txn:
        txn.append(agent_name="a", edit_type="rollback", old_value=1, new_value=0, user_id="u")
    assert audit.head_path.read_bytes() != b"garbage".ljust(256)
    for _ in range(2):  # reported on every run until acknowledged
        result = audit.verify_chain()
        assert [(p.row_id, p.kind) for p in result.problems] == [(3, "chain_break")]
        assert "nothing readable" in result.problems[0].detail
        assert str(audit.head_path) in result.problems[0].detail


def test_heads_rewritten_by_earlier_versions_stay_reported_until_a_repair_run(
    store: Store,
) -> None:
    audit = _audit(store)
    _fill(audit, 2)
    with store.transaction(durable=True) as conn:
        record_head_event(conn, audit.head_path, "garbled", 2, reported=False)
    assert [p.kind for p in audit.verify_chain(repair=False).problems] == ["head_was_unreadable"]
    assert not audit.verify_chain()  # reported here once more, and marked reported
    later = audit.verify_chain()
    assert later
    assert len(later.notes) == 1
    assert "rewritten (to name row 2) after being unreadable at" in later.notes[0]


def test_a_write_that_finds_the_head_unreadable_and_rolls_back_records_nothing(
    store: Store,
) -> None:
    audit = _audit(store)
    _fill(audit, 1)
    _garble(audit)

    def append_then_fail() -> None:
        with audit.transaction(safety=True) as txn:
            txn.append(agent_name="a", edit_type="e", old_value=1, new_value=2, user_id="u")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        append_then_fail()
    result = audit.verify_chain(repair=False)
    assert [p.kind for p in result.problems] == ["head_unreadable"]  # still there, still said
    assert len(audit.entries()) == 1


def test_a_head_one_row_behind_after_a_crash_is_repaired(store: Store) -> None:
    """The crash between the row's commit and the head write, reproduced byte for byte."""
    audit = _audit(store)
    _fill(audit, 3)
    head_before = audit.head_path.read_bytes()
    _fill(audit, 1)
    audit.head_path.write_bytes(head_before)  # the head write of row 4 never happened
    result = audit.verify_chain()
    assert result
    assert result.notes == (_behind(store, 3, 1),)
    assert result.repaired
    assert audit.head_path.read_bytes() != head_before
    again = audit.verify_chain()
    assert again
    assert again.notes == ()


def test_a_head_one_multi_row_commit_behind_is_repaired(store: Store) -> None:
    """A group of changes commits several rows at once; the crash leaves all of them ahead."""
    audit = _audit(store)
    _fill(audit, 2)
    head_before = audit.head_path.read_bytes()
    with audit.transaction() as txn:
        for i in range(3):
            txn.append(agent_name="g", edit_type="e", old_value=i, new_value=i, user_id="u")
    assert {e.batch for e in audit.entries()[-3:]} == {3}
    audit.head_path.write_bytes(head_before)
    result = audit.verify_chain()
    assert result
    assert result.notes == (_behind(store, 2, 3),)
    assert audit.verify_chain().notes == ()


def test_a_head_behind_by_part_of_a_commit_is_not_a_crash(store: Store) -> None:
    audit = _audit(store)
    with audit.transaction() as txn:
        for i in range(3):
            txn.append(agent_name="g", edit_type="e", old_value=i, new_value=i, user_id="u")
    audit.head_path.write_bytes(b"")  # as if the head write of the commit never happened
    assert audit.verify_chain(repair=False)  # the whole commit ahead: the crash case
    _raw(store, "DELETE FROM audit_log WHERE id = 1")  # now the commit is no longer whole
    result = audit.verify_chain()
    assert not result
    assert {p.kind for p in result.problems} == {"broken_link", "head_missing"}
    assert not result.repaired


def test_a_head_behind_after_the_first_row_is_repaired(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 1)
    audit.head_path.write_bytes(b"")  # created, never written
    result = audit.verify_chain()
    assert result
    assert result.repaired


def test_without_repair_the_crash_state_is_noted_and_left(store: Store) -> None:
    audit = _audit(store)
    _fill(audit, 2)
    head_before = audit.head_path.read_bytes()
    _fill(audit, 1)
    audit.head_path.write_bytes(head_before)
    result = audit.verify_chain(repair=False)
    assert result
    assert not result.repaired
    assert audit.head_path.read_bytes() == head_before


def test_a_head_two_rows_behind_is_not_a_crash_and_is_reported(store: Store) -> None:
    """On one host (SQLite) only; on a fleet the rows verify under the key and are accepted
    (another host's appends: tests/infrastructure/changes/test_audit_fleet.py)."""
    audit = _audit(store)
    _fill(audit, 2)
    head_before = audit.head_path.read_bytes()
    _fill(audit, 2)
    audit.head_path.write_bytes(head_before)
    result = audit.verify_chain()
    if store.backend == "postgresql":
        assert result.ok, result
        assert result.notes == (_behind(store, 2, 2),)
        return
    assert [p.kind for p in result.problems] == ["head_mismatch"]
    assert not result.repaired


def test_a_forged_unkeyed_chain_passes_without_a_key_and_fails_with_one(store: Store) -> None:
    """The threat model: without a key, whoever writes both db and head can forge the chain."""
    _fill(AuditLog(store, hmac_key=KEY), 3)
    assert AuditLog(store, hmac_key=KEY).verify_chain()
    assert not AuditLog(store, hmac_key=b"wrong key").verify_chain()
    # The attacker rewrites row 2 and recomputes every hash and the head, but has no key.
    forger = AuditLog(store)  # no key: plain SHA-256
    rows = store.connection().execute("SELECT id FROM audit_log ORDER BY id").fetchall()
    _raw(store, "DELETE FROM audit_log")
    with store.transaction() as conn:  # the ids start again at 1
        set_next_id(conn, "audit_log", 0)
    if store.backend == "postgresql":  # and the counter of ids handed out
        _raw(store, "UPDATE audit_counter SET last_id = 0")
    forger.head_path.write_bytes(b"")  # the head file too: this attacker writes both
    for i in range(len(rows)):
        forger.append(
            agent_name=f"agent-{i % 2}",
            edit_type="prompt_modification",
            old_value=f"old {i}",
            new_value="forged" if i == 1 else f"new {i}",
            user_id="u1",
            user_name="Ada",
            change_id=f"c{i}",
        )
    assert forger.verify_chain()  # out of scope without a key: the forgery holds
    keyed = AuditLog(store, hmac_key=KEY).verify_chain()
    assert not keyed
    assert {p.kind for p in keyed.problems} == {"unkeyed"}
    assert AuditLog(store).verify_chain()


def test_keyed_rows_cannot_be_checked_without_the_key(store: Store) -> None:
    _fill(AuditLog(store, hmac_key=b"k"), 2)
    result = AuditLog(store).verify_chain()
    assert [(p.row_id, p.kind) for p in result.problems] == [
        (1, "keyed_without_key"),
        (2, "keyed_without_key"),
    ]


def test_a_keyed_row_edited_with_a_plain_hash_is_caught(store: Store) -> None:
    key = "secret"
    audit = AuditLog(store, hmac_key=key)
    _fill(audit, 2)
    row = store.connection().execute("SELECT * FROM audit_log WHERE id = 2").fetchone()
    assert row is not None
    fields = [2, row[1], row[2], row[3], row[4], "forged", row[6], row[7], row[8], row[9]]
    message = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()
    _raw(
        store,
        "UPDATE audit_log SET new_value = 'forged', row_hash = ? WHERE id = 2",
        hashlib.sha256(message).hexdigest(),
    )
    problems = audit.verify_chain().problems
    assert (problems[0].row_id, problems[0].kind) == (2, "edited")


def test_an_empty_key_is_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="empty"):
        AuditLog(store, hmac_key=b"")


def test_the_key_comes_from_the_environment_only_when_asked() -> None:
    assert audit_key_from_env({AUDIT_HMAC_KEY_ENV: "k1"}) == b"k1"
    assert audit_key_from_env({}) is None
    assert audit_key_from_env({AUDIT_HMAC_KEY_ENV: ""}) is None


def test_rows_and_other_writes_commit_together_or_not_at_all(store: Store) -> None:
    audit = _audit(store)
    store.migrate("things", ["CREATE TABLE things (x INTEGER)"])

    def abort() -> None:
        with audit.transaction() as txn:
            txn.conn.execute("INSERT INTO things VALUES (1)")
            txn.append(agent_name="a", edit_type="e", old_value=None, new_value=None, user_id="u")
            raise RuntimeError("abort")

    with pytest.raises(RuntimeError):
        abort()
    assert audit.entries() == []
    assert store.connection().execute("SELECT count(*) FROM things").fetchone()[0] == 0
    assert audit.verify_chain()
    with audit.transaction() as txn:
        txn.conn.execute("INSERT INTO things VALUES (2)")
        txn.append(agent_name="a", edit_type="e", old_value=None, new_value=None, user_id="u")
        txn.append(agent_name="b", edit_type="e", old_value=None, new_value=None, user_id="u")
    assert [e.agent_name for e in audit.entries()] == ["a", "b"]
    assert audit.verify_chain()


def test_appends_from_many_threads_keep_one_chain(store: Store) -> None:
    audit = _audit(store)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(25):
                audit.append(
                    agent_name=f"t{n}", edit_type="e", old_value=i, new_value=i, user_id="u"
                )
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    result = audit.verify_chain()
    assert result
    assert result.rows_checked == 100
    assert result.notes == ()


def test_verify_audit_chain_accepts_a_path_or_a_store(tmp_path: Path) -> None:
    """SQLite only: a path names a SQLite file (a PostgreSQL store is passed as a Store)."""
    with Store(tmp_path / "agentmend.db") as store:
        _fill(AuditLog(store), 2)
        assert verify_audit_chain(store)
        assert verify_audit_chain(store.path).rows_checked == 2


def test_a_commit_that_fails_leaves_no_gap_that_reads_as_rows_removed(
    pg_url: str, tmp_path: Path
) -> None:
    """PostgreSQL: an append whose commit fails (a writer killed or cut off by the server before
    it commits) hands out no id for good: the next append follows on, and the chain verifies.

    The commit fails for real: a deferred constraint trigger refuses one row at COMMIT, after
    every statement of the transaction (the id counter's update included) has run."""
    with Store(pg_url, files_dir=tmp_path) as store:
        audit = AuditLog(store, hmac_key=KEY)
        _fill(audit, 2)
        raw_execute(
            pg_url,
            "CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.new_value = 'refused at commit' THEN RAISE EXCEPTION 'refused at commit'; "
            "END IF; RETURN NULL; END $$",
        )
        raw_execute(
            pg_url,
            "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON audit_log "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit()",
        )
        with pytest.raises(StoreError):
            audit.append(
                agent_name="agent-0",
                edit_type="prompt_modification",
                old_value="old",
                new_value="refused at commit",
                user_id="u1",
            )
        _fill(audit, 1)
        ids = [
            int(r[0]) for r in store.connection().execute("SELECT id FROM audit_log ORDER BY id")
        ]
        assert ids == [1, 2, 3]
        assert audit.verify_chain().ok, audit.verify_chain().problems


def test_the_head_read_is_what_the_file_holds_now_not_what_was_last_written(
    tmp_path: Path,
) -> None:
    # the last record written or read is remembered (no checksum for the same bytes again):
    # any other bytes are read afresh, an earlier record as much as a torn one
    path = tmp_path / "db.audit-head"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        write_head(fd, 1, "a" * 64)
        earlier = os.pread(fd, 256, 0)
        write_head(fd, 2, "b" * 64)
        assert read_head(fd, path) == (2, "b" * 64)
        os.pwrite(fd, earlier, 0)  # an older copy of the file put back
        assert read_head(fd, path) == (1, "a" * 64)
        os.pwrite(fd, earlier.replace(b"1 aaaa", b"1 aaab"), 0)  # edited: its checksum fails
        with pytest.raises(AuditChainError, match="checksum"):
            read_head(fd, path)
        os.pwrite(fd, b" " * 256, 0)
        assert read_head(fd, path) is None
    finally:
        os.close(fd)
