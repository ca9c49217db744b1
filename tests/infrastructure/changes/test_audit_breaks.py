"""The audit trail cannot be laundered: tampering done to the database alone stays reported.

Each tampering below is done with a plain database connection (:mod:`raw_sql`), as someone
with write access to the database (and not to the head file) would, and is followed by ordinary
work through the public API: applies and keeps are refused, rollbacks and recovery go on and
record the break, and ``verify`` keeps reporting it until an administrator acknowledges it.

Every test runs on SQLite and on a real PostgreSQL server, each in its documented
configuration: the PostgreSQL store's log is keyed (``AGENTMEND_AUDIT_HMAC_KEY``) and its head
file is this host's, in the store's ``files_dir``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from raw_sql import raw_execute, raw_rows

from agentmend.infrastructure.changes.audit.log import AuditChainBroken, AuditLog
from agentmend.infrastructure.changes.improvement_manager import (
    ChangeStatus,
    ChangeType,
    ImprovementAction,
    ImprovementManager,
)
from agentmend.infrastructure.errors import PermissionRequired
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.store.api import Store

ADMIN_USER = Principal("root-1", "Ada", frozenset({ADMIN}))
PLAIN_USER = Principal("u-2", "Bob")
KEY = b"kept-outside-the-workspace"


def _action() -> ImprovementAction:
    return ImprovementAction(
        target_agent="writer", action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
    )


@dataclass(frozen=True)
class Db:
    """The store under test: its URL, this host's files for it, the audit key it is run with."""

    url: str
    files: Path
    key: bytes | None

    @contextmanager
    def store(self) -> Iterator[Store]:
        with Store(self.url, files_dir=self.files) as store:
            yield store

    def audit(self, store: Store) -> AuditLog:
        return AuditLog(store, hmac_key=self.key)

    @contextmanager
    def manager(self) -> Iterator[ImprovementManager]:
        with self.store() as store, ImprovementManager(store=store, audit_hmac_key=self.key) as m:
            yield m


@pytest.fixture
def db(store_url: str, tmp_path: Path) -> Db:
    """SQLite plain by default; PostgreSQL keyed, as the README documents it."""
    return Db(store_url, tmp_path, KEY if store_url.startswith("postgres") else None)


def _sql(db: Db, sql: str, *params: object) -> None:
    raw_execute(db.url, sql, *params)


def _rows(db: Db) -> list[tuple[Any, ...]]:
    return raw_rows(db.url, "SELECT * FROM audit_log ORDER BY id")


def _rehash(db: Db, row_id: int, prev_hash: str, key: bytes | None = None) -> str:
    """Recompute a row's hash the way the log does (the scheme is public), link it to
    ``prev_hash`` and store it; returns the new hash."""
    row = next(r for r in _rows(db) if r[0] == row_id)
    fields = [row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], prev_hash]
    fields.append(row[12])
    message = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    digest = (
        hmac.new(key, message, hashlib.sha256).hexdigest()
        if key
        else hashlib.sha256(message).hexdigest()
    )
    _sql(
        db,
        "UPDATE audit_log SET prev_hash = ?, row_hash = ? WHERE id = ?",
        prev_hash,
        digest,
        row_id,
    )
    return digest


def _edit_newest(db: Db) -> None:
    _sql(db, "UPDATE audit_log SET new_value = 'nothing to see' WHERE id = 4")


def _delete_newest(db: Db) -> None:
    _sql(db, "DELETE FROM audit_log WHERE id = 4")


def _insert_after_newest(db: Db) -> None:
    last = _rows(db)[-1]
    _sql(
        db,
        "INSERT INTO audit_log (timestamp, agent_name, edit_type, old_value, new_value, user_id,"
        " user_name, change_id, prev_hash, row_hash, keyed, batch)"
        " VALUES (?, 'writer', 'prompt_modification', NULL, 'planted', 'admin', NULL, NULL,"
        " ?, ?, 0, ?)",
        last[1],
        last[10],
        "e" * 64,
        last[0] + 1,
    )


def _reorder_newest(db: Db) -> None:
    _sql(db, "UPDATE audit_log SET id = -1 WHERE id = 3")
    _sql(db, "UPDATE audit_log SET id = 3 WHERE id = 4")
    _sql(db, "UPDATE audit_log SET id = 4 WHERE id = -1")


def _truncate_tail(db: Db) -> None:
    _sql(db, "DELETE FROM audit_log WHERE id >= 3")


def _rehash_newest(db: Db) -> None:
    """Edit the two newest rows and recompute both hashes: the table alone is consistent."""
    _sql(db, "UPDATE audit_log SET new_value = 'rewritten', user_id = 'someone' WHERE id >= 3")
    prev = _rehash(db, 3, _rows(db)[1][10])
    _rehash(db, 4, prev)


TAMPERINGS: dict[str, Callable[[Db], None]] = {
    "edit": _edit_newest,
    "delete": _delete_newest,
    "insert": _insert_after_newest,
    "reorder": _reorder_newest,
    "truncate_tail": _truncate_tail,
    "rehash_newest": _rehash_newest,
}


def _team(tmp_path: Path) -> Path:
    root = tmp_path / "team"
    (root / "agents").mkdir(parents=True)
    (root / "agents" / "writer.md").write_text("v0")
    return root


def _four_applies(db: Db, root: Path) -> list[str]:
    with db.manager() as m:
        return [
            m.apply(_action(), path="agents/writer.md", new_content=f"v{i}", root=root).change_id
            for i in range(1, 5)
        ]


@pytest.mark.parametrize("tamper", sorted(TAMPERINGS))
def test_tampering_with_the_database_alone_is_reported_after_ordinary_work(
    db: Db, tmp_path: Path, tamper: str
) -> None:
    root = _team(tmp_path)
    ids = _four_applies(db, root)
    TAMPERINGS[tamper](db)
    with db.manager() as m:  # opening recovers: never refused
        before = root.joinpath("agents/writer.md").read_text()
        with pytest.raises(AuditChainBroken) as refused:
            m.apply(_action(), path="agents/writer.md", new_content="v9", root=root)
        assert root.joinpath("agents/writer.md").read_text() == before  # nothing written
        assert refused.value.expected.startswith("row 4")
        with pytest.raises(AuditChainBroken):
            m.log_change(_action(), ChangeStatus.APPLIED)
        with pytest.raises(AuditChainBroken):
            m.mark_kept(ids[-1])
        assert m.get_change(ids[-1]).status is ChangeStatus.APPLIED  # type: ignore[union-attr]
        # A rollback is never blocked; it starts a new segment that records the break.
        rolled = m.rollback_last(reason="ordinary work")
        assert rolled is not None
        assert rolled.status is ChangeStatus.ROLLED_BACK
        assert root.joinpath("agents/writer.md").read_text() == "v3"
        m.log_change(_action(), ChangeStatus.FAILED)  # not an apply: allowed, no audit row
        for repair in (False, True, True):
            found = m.verify_audit_chain(repair=repair)
            kinds = [p.kind for p in found.problems]
            assert "chain_break" in kinds, (tamper, kinds)
    with db.manager() as m:  # and after reopening, and more ordinary work
        assert m.rollback_last(reason="more ordinary work") is not None
        found = m.verify_audit_chain()
        (chain_break,) = [p for p in found.problems if p.kind == "chain_break"]
        assert "row 4" in chain_break.detail
        assert "agentmend audit acknowledge" in chain_break.detail


@pytest.mark.parametrize("tamper", sorted(TAMPERINGS))
def test_an_administrator_acknowledges_a_break_and_applies_resume(
    db: Db, tmp_path: Path, tamper: str
) -> None:
    root = _team(tmp_path)
    _four_applies(db, root)
    TAMPERINGS[tamper](db)
    with db.manager() as m:
        with pytest.raises(PermissionRequired, match="admin"):
            m.acknowledge_audit_breaks(PLAIN_USER)
        with pytest.raises(AuditChainBroken):  # the refused acknowledgement wrote nothing
            m.apply(_action(), path="agents/writer.md", new_content="v9", root=root)
        ack = m.acknowledge_audit_breaks(ADMIN_USER, note="restored from a backup")
        assert ack is not None
        assert ack.user_id == "root-1"
        assert m.acknowledge_audit_breaks(ADMIN_USER) is None  # nothing left to acknowledge
        found = m.verify_audit_chain()
        assert "chain_break" not in [p.kind for p in found.problems]
        assert any("acknowledged by Ada" in note for note in found.notes)
        # Rows whose content no longer matches their hash (rows rehashed without the key fail
        # their keyed hash too) were acknowledged with the break: named in the acknowledgement
        # and reported as notes from then on, so the chain verifies again.
        assert found.ok, found.problems
        edited = {"edit", "insert", "reorder"} | ({"rehash_newest"} if db.key else set())
        altered = [n for n in found.notes if " acknowledged by Ada" in n and n.startswith("row ")]
        assert bool(altered) == (tamper in edited)
        m.apply(_action(), path="agents/writer.md", new_content="v9", root=root)
        assert root.joinpath("agents/writer.md").read_text() == "v9"


def test_a_rollback_over_a_break_starts_a_segment_whose_first_row_records_it(
    db: Db, tmp_path: Path
) -> None:
    root = _team(tmp_path)
    _four_applies(db, root)
    _truncate_tail(db)
    with db.manager() as m:
        assert m.rollback_last() is not None
        entries = m.audit.entries()
    first_of_segment = entries[-2]
    assert first_of_segment.id == 5  # after the gap left by rows 3 and 4
    assert first_of_segment.edit_type == "audit_chain_break"
    assert str(first_of_segment.old_value).startswith("row 4")
    assert str(first_of_segment.new_value).startswith("row 2")
    assert entries[-1].edit_type == "rollback"
    assert entries[-1].batch == first_of_segment.id


def test_a_missing_head_file_counts_as_a_break(db: Db, tmp_path: Path) -> None:
    root = _team(tmp_path)
    _four_applies(db, root)
    with db.store() as store:
        audit = db.audit(store)
        if store.backend == "postgresql":
            # a missing file is a host joining the fleet
            # (tests/infrastructure/changes/test_audit_fleet.py); a head file that exists but was
            # emptied is the break
            audit.head_path.write_bytes(b" " * 256)
        else:
            audit.head_path.unlink()
        with pytest.raises(AuditChainBroken, match="missing or empty"):
            audit.append(agent_name="a", edit_type="e", old_value=1, new_value=2, user_id="u")
        assert audit.acknowledge_breaks(ADMIN_USER) is not None
        assert audit.verify_chain()


def test_an_unreadable_head_counts_as_a_break_and_is_not_repaired_by_verify(db: Db) -> None:
    with db.store() as store:
        audit = db.audit(store)
        audit.append(agent_name="a", edit_type="e", old_value=1, new_value=2, user_id="u")
        audit.head_path.write_bytes(b"garbage".ljust(256))
        for _ in range(2):
            assert [p.kind for p in audit.verify_chain().problems] == ["head_unreadable"]
        with pytest.raises(AuditChainBroken, match="nothing readable"):
            audit.append(agent_name="a", edit_type="e", old_value=1, new_value=2, user_id="u")
        with audit.transaction(safety=True) as txn:
            txn.append(agent_name="a", edit_type="rollback", old_value=2, new_value=1, user_id="u")
        assert [p.kind for p in audit.verify_chain().problems] == ["chain_break"]


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_a_forged_commit_looks_like_the_crash_state_only_without_a_key(
    store_url: str, tmp_path: Path, keyed: bool
) -> None:
    """Without a key a well-formed appended commit is the documented crash state; with one,
    its hash fails and it is a break."""
    db = Db(store_url, tmp_path, KEY if keyed else None)
    with db.store() as store:
        audit = db.audit(store)
        for i in range(2):
            audit.append(agent_name="a", edit_type="e", old_value=i, new_value=i, user_id="u")
    last = _rows(db)[-1]
    _sql(
        db,
        "INSERT INTO audit_log (id, timestamp, agent_name, edit_type, old_value, new_value,"
        " user_id, user_name, change_id, prev_hash, row_hash, keyed, batch)"
        " VALUES (3, ?, 'a', 'audit_break_acknowledged', NULL, '[]', 'u', NULL, NULL, ?,"
        " 'x', ?, 3)",
        last[1],
        last[10],
        int(keyed),
    )
    _rehash(db, 3, last[10], key=None)  # the forger has no key
    with db.store() as store:
        audit = db.audit(store)
        if not keyed:
            audit.append(agent_name="a", edit_type="e", old_value=3, new_value=3, user_id="u")
        else:
            with pytest.raises(AuditChainBroken, match="does not match its hash"):
                audit.append(agent_name="a", edit_type="e", old_value=3, new_value=3, user_id="u")


def test_a_forged_acknowledgement_does_not_count(db: Db, tmp_path: Path) -> None:
    root = _team(tmp_path)
    _four_applies(db, root)
    _truncate_tail(db)
    with db.manager() as m:
        m.rollback_last()
        break_id = m.audit.entries()[-2].id
    _sql(
        db,
        "INSERT INTO audit_log (timestamp, agent_name, edit_type, old_value, new_value, user_id,"
        " user_name, change_id, prev_hash, row_hash, keyed, batch)"
        " VALUES ('2030-01-01T00:00:00+00:00', '(audit)', 'audit_break_acknowledged', NULL, ?,"
        " 'root-1', NULL, NULL, 'x', 'y', 0, 99)",
        json.dumps([break_id]),
    )
    with db.manager() as m:
        kinds = [p.kind for p in m.verify_audit_chain().problems]
    assert "chain_break" in kinds


def test_the_errors_carry_their_fields_through_pickle() -> None:
    broken = pickle.loads(pickle.dumps(AuditChainBroken("row 4 (ab)", "row 2 (cd)")))
    assert (broken.expected, broken.found) == ("row 4 (ab)", "row 2 (cd)")
    denied = pickle.loads(pickle.dumps(PermissionRequired("u", ADMIN, "do it")))
    assert (denied.user_id, denied.permission, denied.action) == ("u", ADMIN, "do it")
