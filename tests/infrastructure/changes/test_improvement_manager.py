"""ImprovementManager: the log, the budget, apply, rollback, groups, conflicts, recovery, locks."""

from __future__ import annotations

import itertools
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agentmend.infrastructure.changes.audit.log import AuditChainBroken, AuditLog, AuditTransaction
from agentmend.infrastructure.changes.improvement_manager import (
    ChangeRecord,
    ChangeStatus,
    ChangeType,
    ImprovementAction,
    ImprovementManager,
    PartialRollback,
)
from agentmend.infrastructure.changes.protocol.change_log import ChangeLog, StoredFile
from agentmend.infrastructure.changes.protocol.decisions import (
    get_plan,
    list_decisions,
    list_plans,
    record_decision,
    save_plan,
    update_plan,
)
from agentmend.infrastructure.changes.protocol.steps import ChangeProtocol
from agentmend.infrastructure.errors import (
    ChangeNotFound,
    ChangeStateError,
    ConfigurationError,
    PathNotAllowed,
    RollbackConflict,
    StoreError,
)
from agentmend.infrastructure.files.atomic import locked_file, sha256_bytes
from agentmend.infrastructure.models import utc_now
from agentmend.infrastructure.principal import ChangeAuthor
from agentmend.infrastructure.store.api import Store


def _action(agent: str = "writer", **fields: Any) -> ImprovementAction:
    fields.setdefault("action_type", ChangeType.PROMPT_MODIFICATION)
    fields.setdefault("confidence_score", 0.9)
    return ImprovementAction(target_agent=agent, **fields)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "team"
    (r / "agents").mkdir(parents=True)
    (r / "agents" / "writer.md").write_bytes(b"---\nname: writer\n---\nold prompt\r\n\x00")
    return r


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ImprovementManager]:
    with ImprovementManager(tmp_path / "history.json") as m:
        yield m


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).parts[0] != ".agent"
    }


# -- the log and the session ----------------------------------------------------------------


def test_a_json_named_history_file_is_a_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "improvement_history.json"
    with ImprovementManager(path) as m:
        m.log_change(_action())
    assert path.read_bytes().startswith(b"SQLite format 3")


def test_history_is_this_session_and_get_history_is_durable(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    with ImprovementManager(path) as first:
        ids = [first.log_change(_action(new_value=i)) for i in range(3)]
        assert [r.change_id for r in first.history] == ids
    with ImprovementManager(path) as second:
        assert second.history == []
        new_id = second.log_change(_action("reviewer"))
        assert [r.change_id for r in second.history] == [new_id]
        assert [r.change_id for r in second.get_history()] == [*ids, new_id]
        assert [r.change_id for r in second.get_history(limit=2)] == [ids[2], new_id]
        assert [r.change_id for r in second.get_history(agent_name="reviewer")] == [new_id]
        assert second.get_history(agent_name="nobody") == []


def test_history_reflects_later_state_changes(manager: ImprovementManager) -> None:
    cid = manager.log_change(_action())
    assert manager.rollback_by_id(cid)
    assert manager.history[0].status is ChangeStatus.ROLLED_BACK


def test_records_keep_the_action_and_verification(manager: ImprovementManager) -> None:
    action = _action(old_value={"t": 0.7}, new_value=[1, 2], rationale="why", target_field="t")
    cid = manager.log_change(
        action, verification_result={"score": 0.8}, author=ChangeAuthor(via="person")
    )
    record = manager.get_change(cid)
    assert record is not None
    assert record.action == action
    assert record.verification_result == {"score": 0.8}
    assert record.applied_by == "person"
    assert record.files == ()
    assert manager.get_change("nope") is None


def test_logging_a_change_is_one_insert_and_its_audit_row(manager: ImprovementManager) -> None:
    for _ in range(5):
        manager.log_change(_action())
    statements: list[str] = []
    conn = manager.store.connection()
    assert isinstance(conn, sqlite3.Connection)  # the trace is SQLite's
    conn.set_trace_callback(statements.append)
    try:
        manager.log_change(_action())
    finally:
        conn.set_trace_callback(None)
    writes = [s.split("(")[0].strip() for s in statements if s.lstrip().startswith(
        ("INSERT", "UPDATE", "DELETE"))]  # fmt: skip
    assert writes == ["INSERT INTO changes", "INSERT INTO audit_log"]


def test_values_that_are_not_json_are_stored_as_their_repr(manager: ImprovementManager) -> None:
    marker = object()
    cid = manager.log_change(
        _action(old_value=marker, new_value={3}), verification_result={"seen": marker}
    )
    record = manager.get_change(cid)
    assert record is not None
    assert record.action.old_value == repr(marker)
    assert record.verification_result == {"seen": str(marker)}


def test_a_store_object_can_be_shared_and_is_not_closed(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        with ImprovementManager(store=store) as m:
            m.log_change(_action())
        assert store.connection().execute("SELECT count(*) FROM changes").fetchone()[0] == 1
        with pytest.raises(ConfigurationError):
            ImprovementManager(tmp_path / "x.db", store=store)


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text('[{"change_id": "abc"}]')
    with pytest.raises(StoreError):
        ImprovementManager(path)


def test_the_budget_counts_changes_applied_this_session(manager: ImprovementManager) -> None:
    manager.max_improvements_per_session = 3
    manager.log_change(_action(), status=ChangeStatus.FAILED)
    manager.log_change(_action(), status=ChangeStatus.PENDING)
    assert manager.session_improvement_count == 0
    kept = manager.log_change(_action())
    manager.mark_kept(kept)
    rolled = manager.log_change(_action())
    manager.rollback_by_id(rolled)
    assert manager.session_improvement_count == 2  # kept and rolled back still count
    assert manager.can_make_improvement() == (True, "OK")
    manager.log_change(_action())
    allowed, reason = manager.can_make_improvement()
    assert not allowed
    assert reason == "Max improvements (3) reached"


def test_three_rollbacks_in_the_last_five_changes_stop_improvements(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    with ImprovementManager(path) as m:
        for _ in range(3):
            m.rollback_by_id(m.log_change(_action()))
        m.log_change(_action())
    with ImprovementManager(path) as fresh:  # instability outlives the session
        allowed, reason = fresh.can_make_improvement()
        assert not allowed
        assert "Too many recent rollbacks" in reason
        fresh.log_change(_action())
        fresh.log_change(_action())
        assert fresh.can_make_improvement() == (True, "OK")  # two are now out of the window


def test_statistics_count_the_durable_history(manager: ImprovementManager) -> None:
    manager.log_change(_action("a"))
    manager.mark_kept(manager.log_change(_action("a")))
    manager.rollback_by_id(manager.log_change(_action("b")))
    manager.log_change(_action("b"), status=ChangeStatus.FAILED)
    stats = manager.get_statistics()
    assert stats == {
        "total_changes": 4,
        "applied": 1,
        "kept": 1,
        "rolled_back": 1,
        "failed": 1,
        "pending": 0,
        "success_rate": 0.5,
        "by_agent": {"a": 2, "b": 2},
        "session_count": 3,
    }


def test_state_transitions_are_checked(manager: ImprovementManager) -> None:
    pending = manager.log_change(_action(), status=ChangeStatus.PENDING)
    with pytest.raises(ChangeStateError):
        manager.mark_kept(pending)
    assert manager.mark_applied(pending).status is ChangeStatus.APPLIED
    assert manager.session_improvement_count == 1
    with pytest.raises(ChangeStateError, match="roll it back instead"):
        manager.mark_failed(pending)
    kept = manager.mark_kept(pending, {"passed": True})
    assert (kept.status, kept.verification_result) == (ChangeStatus.KEPT, {"passed": True})
    with pytest.raises(ChangeStateError):
        manager.mark_kept(pending)
    other = manager.log_change(_action(), status=ChangeStatus.PENDING)
    failed = manager.mark_failed(other, reason="gate refused")
    assert failed.status is ChangeStatus.FAILED
    assert failed.rollback_info is not None
    assert failed.rollback_info["reason"] == "gate refused"
    with pytest.raises(ChangeNotFound):
        manager.mark_kept("unknown")


def test_rollback_of_a_logged_change_is_a_status_change(manager: ImprovementManager) -> None:
    cid = manager.log_change(_action(old_value=0.7, new_value=0.5))
    assert manager.rollback_by_id(cid) is True
    record = manager.get_change(cid)
    assert record is not None
    assert record.status is ChangeStatus.ROLLED_BACK
    assert record.rollback_info is not None
    assert record.rollback_info["restored"] == ()
    assert "logged only" in record.rollback_info["note"]
    assert manager.rollback_by_id(cid) is False  # only once
    assert manager.rollback_by_id("no-such-id") is False


def test_rollback_last_takes_the_newest_applied_and_skips_kept(
    manager: ImprovementManager,
) -> None:
    assert manager.rollback_last() is None
    first = manager.log_change(_action())
    second = manager.log_change(_action())
    manager.mark_kept(second)
    rolled = manager.rollback_last()
    assert rolled is not None
    assert (rolled.change_id, rolled.status) == (first, ChangeStatus.ROLLED_BACK)
    assert rolled.rollback_info is not None
    assert rolled.rollback_info["reason"] == "manual_rollback"
    assert manager.rollback_last() is None
    assert manager.rollback_by_id(second)  # a KEPT change rolls back when asked by id


# -- apply ------------------------------------------------------------------------------------


def test_apply_changes_the_file_and_records_hashes(manager: ImprovementManager, root: Path) -> None:
    target = root / "agents" / "writer.md"
    old = target.read_bytes()
    record = manager.apply(_action(), path="agents/writer.md", new_content="new prompt", root=root)
    assert target.read_text() == "new prompt"
    assert record.status is ChangeStatus.APPLIED
    (file,) = record.files
    assert file.path == str(target.resolve())
    assert (file.old_sha256, file.new_sha256) == (sha256_bytes(old), sha256_bytes(b"new prompt"))
    assert manager.get_change(record.change_id) == record
    assert manager.history == [record]
    assert manager.session_improvement_count == 1


def test_apply_creates_and_deletes_files(manager: ImprovementManager, root: Path) -> None:
    created = manager.apply(_action(), path="agents/new/doc.md", new_content=b"\x00\x01", root=root)
    assert (root / "agents/new/doc.md").read_bytes() == b"\x00\x01"
    assert created.files[0].old_sha256 is None
    deleted = manager.apply(_action(), path="agents/writer.md", new_content=None, root=root)
    assert not (root / "agents/writer.md").exists()
    assert deleted.files[0].new_sha256 is None


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("../outside.md", "'..'"),
        ("/etc/passwd", "absolute"),
        ("agents", "directory"),
        (".agent/backups/x.bak", "reserved"),
        ("agents/writer.md/deeper/x.md", "is a file, not a directory"),
    ],
)
def test_apply_refuses_bad_paths_and_leaves_everything(
    manager: ImprovementManager, root: Path, path: str, problem: str
) -> None:
    before = _tree(root)
    with pytest.raises(PathNotAllowed, match=problem):
        manager.apply(_action(), path=path, new_content="x", root=root)
    assert _tree(root) == before
    assert manager.get_history() == []


def test_apply_refuses_a_symlink_out_of_the_root(
    manager: ImprovementManager, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.md"
    outside.write_text("keep")
    (root / "link.md").symlink_to(outside)
    with pytest.raises(PathNotAllowed):
        manager.apply(_action(), path="link.md", new_content="x", root=root)
    assert outside.read_text() == "keep"


def test_apply_refuses_a_missing_root(manager: ImprovementManager, tmp_path: Path) -> None:
    with pytest.raises(PathNotAllowed, match="root"):
        manager.apply(_action(), path="a.md", new_content="x", root=tmp_path / "missing")


def test_backups_are_written_for_humans_and_never_collide(
    manager: ImprovementManager, root: Path
) -> None:
    (root / "agents" / "docs").mkdir()
    (root / "agents" / "docs" / "writer.md").write_text("docs v1")
    one = manager.apply(_action(), path="agents/writer.md", new_content="v2", root=root)
    two = manager.apply(_action(), path="agents/writer.md", new_content="v3", root=root)
    three = manager.apply(_action(), path="agents/docs/writer.md", new_content="d2", root=root)
    backups = sorted((root / ".agent" / "backups").iterdir())
    names = [b.name for b in backups]
    assert len(names) == 3
    assert any(n.startswith("agents__writer.md_") and one.change_id in n for n in names)
    assert any(two.change_id in n for n in names)
    assert any(n.startswith("agents__docs__writer.md_") and three.change_id in n for n in names)
    contents = {b.read_bytes() for b in backups}
    assert contents == {b"---\nname: writer\n---\nold prompt\r\n\x00", b"v2", b"docs v1"}


def test_apply_and_rollback_write_audit_rows(manager: ImprovementManager, root: Path) -> None:
    long_prompt = "p" * 800
    record = manager.apply(
        _action(old_value="old prompt", new_value=long_prompt),
        path="agents/writer.md",
        new_content=long_prompt,
        root=root,
        author=ChangeAuthor(user_id="42", user_name="Ada"),
    )
    manager.rollback_by_id(record.change_id, author=ChangeAuthor(user_id="7", user_name="Bob"))
    applied, rolled = manager.audit.entries(change_id=record.change_id)
    assert (applied.edit_type, applied.old_value, applied.user_id, applied.user_name) == (
        "prompt_modification",
        "old prompt",
        "42",
        "Ada",
    )
    assert applied.new_value == "p" * 500
    assert (rolled.edit_type, rolled.user_id, rolled.user_name) == ("rollback", "7", "Bob")
    assert rolled.old_value == "p" * 500
    assert rolled.new_value == "old prompt"
    assert manager.verify_audit_chain()


def test_audit_rows_show_file_text_when_the_action_has_no_values(
    manager: ImprovementManager, root: Path
) -> None:
    record = manager.apply(_action(), path="agents/x.md", new_content="hello", root=root)
    (row,) = manager.audit.entries(change_id=record.change_id)
    assert (row.old_value, row.new_value, row.user_id) == ("(absent)", "hello", "self-improver")


# -- rollback ---------------------------------------------------------------------------------


def test_rollback_restores_exact_bytes(manager: ImprovementManager, root: Path) -> None:
    before = _tree(root)
    record = manager.apply(_action(), path="agents/writer.md", new_content="x", root=root)
    assert manager.rollback_by_id(record.change_id) is True
    assert _tree(root) == before
    rolled = manager.get_change(record.change_id)
    assert rolled is not None
    assert rolled.status is ChangeStatus.ROLLED_BACK
    assert rolled.rollback_info is not None
    assert rolled.rollback_info["restored"] == (str((root / "agents/writer.md").resolve()),)
    assert rolled.rollback_info["cascade"] is False


def test_rollback_of_a_created_file_removes_it(manager: ImprovementManager, root: Path) -> None:
    before = _tree(root)
    record = manager.apply(_action(), path="agents/new.md", new_content="x", root=root)
    manager.rollback_last()
    assert _tree(root) == before
    assert record.files[0].old_sha256 is None


def test_rollback_of_a_deletion_brings_the_file_back(
    manager: ImprovementManager, root: Path
) -> None:
    before = _tree(root)
    manager.apply(_action(), path="agents/writer.md", new_content=None, root=root)
    manager.rollback_last()
    assert _tree(root) == before


def test_a_file_changed_since_is_a_conflict_unless_forced(
    manager: ImprovementManager, root: Path
) -> None:
    target = root / "agents/writer.md"
    original = target.read_bytes()
    record = manager.apply(_action(), path="agents/writer.md", new_content="mine", root=root)
    target.write_text("edited by hand")
    with pytest.raises(RollbackConflict) as info:
        manager.rollback_by_id(record.change_id)
    assert info.value.paths == (str(target.resolve()),)
    assert target.read_text() == "edited by hand"
    current = manager.get_change(record.change_id)
    assert current is not None
    assert current.status is ChangeStatus.APPLIED
    assert manager.rollback_by_id(record.change_id, force=True)
    assert target.read_bytes() == original
    rolled_backups = list((root / ".agent/backups").glob("*.rolled-back.bak"))
    assert [b.read_text() for b in rolled_backups] == ["edited by hand"]  # nothing lost


def test_later_changes_on_the_file_need_cascade(manager: ImprovementManager, root: Path) -> None:
    target = root / "agents/writer.md"
    original = target.read_bytes()
    first = manager.apply(_action(), path="agents/writer.md", new_content="v2", root=root)
    second = manager.apply(_action(), path="agents/writer.md", new_content="v3", root=root)
    manager.mark_kept(second.change_id)
    with pytest.raises(RollbackConflict) as info:
        manager.rollback_by_id(first.change_id)
    assert info.value.dependents == (second.change_id,)
    assert target.read_text() == "v3"
    with pytest.raises(RollbackConflict):
        manager.rollback_by_id(first.change_id, force=True)  # force is not cascade
    assert manager.rollback_by_id(first.change_id, cascade=True)
    assert target.read_bytes() == original
    infos = {c: manager.get_change(c) for c in (first.change_id, second.change_id)}
    assert all(r is not None and r.status is ChangeStatus.ROLLED_BACK for r in infos.values())
    dep = infos[second.change_id]
    assert dep is not None
    assert dep.rollback_info is not None
    assert dep.rollback_info["cascade"] is True
    assert dep.rollback_info["requested"] == first.change_id
    # the audit shows the dependent undone first
    rows = [e.change_id for e in manager.audit.entries() if e.edit_type == "rollback"]
    assert rows == [second.change_id, first.change_id]


def test_rolled_back_later_changes_are_not_dependents(
    manager: ImprovementManager, root: Path
) -> None:
    first = manager.apply(_action(), path="agents/writer.md", new_content="v2", root=root)
    second = manager.apply(_action(), path="agents/writer.md", new_content="v3", root=root)
    manager.rollback_by_id(second.change_id)
    third = manager.apply(_action(), path="agents/other.md", new_content="o", root=root)
    assert manager.rollback_by_id(first.change_id)
    assert (root / "agents/other.md").read_text() == "o"
    still = manager.get_change(third.change_id)
    assert still is not None
    assert still.status is ChangeStatus.APPLIED


def test_a_group_commits_and_rolls_back_whole(manager: ImprovementManager, root: Path) -> None:
    before = _tree(root)
    records = manager.apply_group(
        [
            (_action("writer"), "agents/writer.md", "w2"),
            (_action("reviewer"), "agents/reviewer.md", "r1"),
            (_action("writer"), "agents/docs/style.md", b"s1"),
        ],
        root=root,
    )
    assert len({r.group_id for r in records}) == 1
    assert records[0].group_id is not None
    assert _tree(root)["agents/reviewer.md"] == b"r1"
    assert manager.rollback_by_id(records[1].change_id)  # one member takes the whole group
    assert _tree(root) == before
    for r in records:
        now = manager.get_change(r.change_id)
        assert now is not None
        assert now.status is ChangeStatus.ROLLED_BACK


def test_a_group_refuses_the_same_file_twice_and_writes_nothing(
    manager: ImprovementManager, root: Path
) -> None:
    before = _tree(root)
    (root / "alias").symlink_to(root / "agents")
    with pytest.raises(PathNotAllowed, match="twice"):
        manager.apply_group(
            [(_action(), "agents/a.md", "1"), (_action(), "alias/a.md", "2")], root=root
        )
    with pytest.raises(PathNotAllowed, match="twice"):
        manager.apply_group(
            [(_action(), "agents/a.md", "1"), (_action(), "./agents/a.md", "2")], root=root
        )
    with pytest.raises(ConfigurationError):
        manager.apply_group([], root=root)
    assert _tree(root) == before
    assert manager.get_history() == []


def test_a_cascade_takes_the_dependents_whole_group(
    manager: ImprovementManager, root: Path
) -> None:
    before = _tree(root)
    first = manager.apply(_action(), path="agents/writer.md", new_content="v2", root=root)
    group = manager.apply_group(
        [(_action(), "agents/writer.md", "v3"), (_action(), "agents/extra.md", "e")], root=root
    )
    with pytest.raises(RollbackConflict) as info:
        manager.rollback_by_id(first.change_id)
    assert set(info.value.dependents) == {g.change_id for g in group}
    assert manager.rollback_by_id(first.change_id, cascade=True)
    assert _tree(root) == before


def test_the_rollback_closure_is_what_a_cascade_undoes_newest_first(
    manager: ImprovementManager, root: Path
) -> None:
    first = manager.apply(_action(), path="agents/writer.md", new_content="v2", root=root)
    group = manager.apply_group(
        [(_action(), "agents/writer.md", "v3"), (_action(), "agents/extra.md", "e")], root=root
    )
    on_extra = manager.apply(_action(), path="agents/extra.md", new_content="e2", root=root)
    apart = manager.apply(_action(), path="agents/apart.md", new_content="a", root=root)

    closure = [row.change_id for row in manager.rollback_closure(first.change_id)]

    assert closure == [on_extra.change_id, group[1].change_id, group[0].change_id, first.change_id]
    assert [r.change_id for r in manager.rollback_closure(group[1].change_id)] == closure[:3]
    assert [r.change_id for r in manager.rollback_closure(apart.change_id)] == [apart.change_id]
    assert manager.rollback_by_id(first.change_id, cascade=True)
    undone = {r.change_id for r in manager.get_history() if r.status is ChangeStatus.ROLLED_BACK}
    assert undone == set(closure)
    assert manager.rollback_closure(first.change_id) == []  # nothing live is left to undo
    with pytest.raises(ChangeNotFound):
        manager.rollback_closure("nope")


# -- rolling back an unproven group ---------------------------------------------------------


def _unproven_group(manager: ImprovementManager, root: Path) -> list[ChangeRecord]:
    """writer (its prompt and a doc), reviewer and editor changed as one group."""
    return manager.apply_group(
        [
            (_action("writer"), "agents/writer.md", "writer after\n"),
            (_action("writer"), "agents/docs/style.md", "a doc the change created\n"),
            (_action("reviewer"), "agents/reviewer.md", "reviewer after\n"),
            (_action("editor"), "agents/editor.md", None),  # deleted (if there was one)
        ],
        root=root,
    )


def test_an_unproven_group_leaves_an_agent_edited_since_and_restores_the_rest(
    manager: ImprovementManager, root: Path
) -> None:
    (root / "agents" / "editor.md").write_bytes(b"editor before\n")
    (root / "agents" / "reviewer.md").write_bytes(b"reviewer before\n")
    before = _tree(root)
    writer, doc, reviewer, editor = _unproven_group(manager, root)
    edited = root / "agents" / "docs" / "style.md"
    edited.write_bytes(b"a doc the change created\nand an owner's note\n")
    expected = {**before, "agents/writer.md": b"writer after\n"}
    expected["agents/docs/style.md"] = edited.read_bytes()

    undone = manager.rollback_unproven(writer.change_id, reason="verification failed")

    assert _tree(root) == expected  # writer's files as they are, the others byte for byte
    resolved = root.resolve() / "agents"
    assert undone.rolled_back == (reviewer.change_id, editor.change_id)
    assert undone.rolled_back_agents == ("reviewer", "editor")
    assert undone.blocked == (writer.change_id, doc.change_id)
    assert undone.blocked_agents == ("writer",)
    assert undone.left == (str(resolved / "writer.md"), str(resolved / "docs/style.md"))
    assert undone.edited == (str(resolved / "docs/style.md"),)
    assert undone.conflict == f"{resolved / 'docs/style.md'} changed since it was applied"
    for record, agent_file in ((writer, "writer.md"), (doc, "docs/style.md")):
        now = manager.get_change(record.change_id)
        assert now is not None
        assert now.status is ChangeStatus.FAILED
        info = now.rollback_info
        assert info is not None
        assert info["needs_attention"] is True
        assert info["left_unchanged"] == (str(resolved / agent_file),)
        assert info["edited_since_apply"] == (
            (str(resolved / agent_file),) if agent_file == "docs/style.md" else ()
        )
        assert info["conflict"] == undone.conflict
        assert info["reason"] == "verification failed"
    for record in (reviewer, editor):
        now = manager.get_change(record.change_id)
        assert now is not None
        assert now.status is ChangeStatus.ROLLED_BACK
        assert now.rollback_info is not None
        assert now.rollback_info["cascade"] is False
    rows = manager.audit.entries(agent_name="writer")
    assert [r.edit_type for r in rows][-2:] == ["rollback_blocked", "rollback_blocked"]
    assert [r.edit_type for r in manager.audit.entries(agent_name="reviewer")][-1] == "rollback"
    assert manager.verify_audit_chain()
    # settled: nothing is live, so neither a second call nor "the last change" touches it
    assert manager.rollback_unproven(writer.change_id, reason="again") == PartialRollback()
    assert manager.rollback_last() is None
    assert _tree(root) == expected


def test_an_unproven_group_nobody_edited_is_rolled_back_whole(
    manager: ImprovementManager, root: Path
) -> None:
    (root / "agents" / "reviewer.md").write_bytes(b"reviewer before\n")
    before = _tree(root)
    records = _unproven_group(manager, root)

    undone = manager.rollback_unproven(records[2].change_id, reason="verification failed")

    assert _tree(root) == before
    assert undone.rolled_back == tuple(r.change_id for r in records)
    assert undone.blocked == undone.left == undone.edited == ()
    assert undone.conflict is None
    statuses = {r.status for r in manager.get_history()}
    assert statuses == {ChangeStatus.ROLLED_BACK}
    assert manager.verify_audit_chain()


def test_an_unproven_change_others_built_on_is_left_whole(
    manager: ImprovementManager, root: Path
) -> None:
    """A later change the hashes cannot show (it wrote the same bytes) leaves every agent."""
    records = _unproven_group(manager, root)
    later = manager.apply(
        _action("reviewer"), path="agents/reviewer.md", new_content="reviewer after\n", root=root
    )
    files = _tree(root)

    undone = manager.rollback_unproven(records[0].change_id, reason="verification failed")

    assert _tree(root) == files
    assert undone.rolled_back == ()
    assert undone.blocked == tuple(r.change_id for r in records)
    assert undone.edited == ()
    assert undone.conflict is not None
    assert later.change_id in undone.conflict
    now = manager.get_change(later.change_id)
    assert now is not None
    assert now.status is ChangeStatus.APPLIED  # not part of the group: untouched
    assert manager.verify_audit_chain()


def test_an_unproven_rollback_waits_for_the_root_lock(
    manager: ImprovementManager, root: Path
) -> None:
    records = _unproven_group(manager, root)
    lock = root.resolve() / ".agent" / "agentmend.lock"
    done: list[PartialRollback] = []
    with locked_file(lock):
        worker = threading.Thread(
            target=lambda: done.append(
                manager.rollback_unproven(records[0].change_id, reason="verification failed")
            )
        )
        worker.start()
        worker.join(0.3)
        assert worker.is_alive()  # blocked on the root lock, nothing decided yet
        # an edit made while the lock is held is seen by the check that follows it
        (root / "agents" / "reviewer.md").write_bytes(b"edited while waiting\n")
    worker.join(10)
    assert not worker.is_alive()
    (undone,) = done
    assert undone.blocked_agents == ("reviewer",)
    assert (root / "agents" / "reviewer.md").read_bytes() == b"edited while waiting\n"


def test_an_unproven_logged_change_or_an_unknown_id(manager: ImprovementManager) -> None:
    change_id = manager.log_change(_action())
    undone = manager.rollback_unproven(change_id, reason="verification failed")
    assert undone == PartialRollback(rolled_back=(change_id,), rolled_back_agents=("writer",))
    now = manager.get_change(change_id)
    assert now is not None
    assert now.status is ChangeStatus.ROLLED_BACK
    assert manager.rollback_unproven("nope", reason="r") == PartialRollback()


def test_a_failed_write_puts_back_the_group_and_records_why(
    manager: ImprovementManager, root: Path
) -> None:
    before = _tree(root)
    with pytest.raises(PathNotAllowed, match=r"agents/x.*not a directory"):
        manager.apply_group(
            [
                (_action(), "agents/writer.md", "written first"),
                (_action(), "agents/x", "a file where the next change needs a directory"),
                (_action(), "agents/x/y.md", "cannot be written"),
            ],
            root=root,
        )
    assert _tree(root) == before
    assert list((root / ".agent" / "backups").iterdir()) == []  # the change never happened
    with pytest.raises(PathNotAllowed, match="not a directory"):  # refused up front
        manager.apply(_action(), path="agents/writer.md/x.md", new_content="x", root=root)
    history = manager.get_history()
    assert [r.status for r in history] == [ChangeStatus.FAILED] * 3
    assert history[0].rollback_info is not None
    assert history[0].rollback_info["reason"].startswith("apply failed:")
    assert manager.session_improvement_count == 0
    assert manager.audit.entries() == []


def test_a_backup_that_fails_stops_the_apply_before_the_file_is_replaced(
    manager: ImprovementManager, root: Path, tmp_path: Path
) -> None:
    """A backup that cannot be made ends the apply with the file's old bytes and no
    temporary file left; recovery settles the change once the backups folder is usable."""
    before = _tree(root)
    (root / ".agent").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / ".agent" / "backups").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PathNotAllowed, match="symlink"):
        manager.apply(_action(), path="agents/writer.md", new_content="new", root=root)
    assert _tree(root) == before
    assert sorted(p.name for p in (root / "agents").iterdir()) == ["writer.md"]
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert manager.audit.entries() == []
    # recovery walks the same folder: once it is a folder again the change is settled
    (root / ".agent" / "backups").unlink()
    assert [r.status for r in manager.recover()] == [ChangeStatus.FAILED]
    assert _tree(root) == before


# -- recovery ---------------------------------------------------------------------------------


def _intent(
    store: Store, root: Path, files: dict[str, bytes | None], *, group: str | None = None
) -> list[str]:
    """Record an apply's intent exactly as step 3 of the protocol does, and nothing more."""
    log = ChangeLog(store)
    ids = []
    with store.transaction(durable=True) as conn:
        for rel, new in files.items():
            target = (root / rel).resolve()
            old = target.read_bytes() if target.exists() else None
            cid = ChangeLog.new_id()
            ids.append(cid)
            seq = log.insert(
                conn,
                change_id=cid,
                action=_action(),
                status=ChangeStatus.PENDING,
                applied_by="crashed",
                session_id="dead",
                created=utc_now(),
                group_id=group,
                root=str(root.resolve()),
            )
            log.insert_file(
                conn,
                StoredFile(
                    cid,
                    seq,
                    str(target),
                    rel,
                    None if old is None else sha256_bytes(old),
                    None if new is None else sha256_bytes(new),
                    old,
                ),
            )
    return ids


def test_an_interrupted_apply_is_rolled_back_whole_on_open(tmp_path: Path, root: Path) -> None:
    before = _tree(root)
    db = tmp_path / "h.db"
    with Store(db) as store:
        ChangeLog(store)
        ids = _intent(
            store,
            root,
            {"agents/writer.md": b"half done", "agents/new.md": b"created", "agents/c.md": b"c"},
            group="g-dead",
        )
    # the crashed process got as far as writing two of the three files
    (root / "agents/writer.md").write_bytes(b"half done")
    (root / "agents/new.md").write_bytes(b"created")
    (root / "agents/.new.md.abc123.tmp").write_bytes(b"crea")  # atomic_write's leftover
    restored: set[str] = set()
    with ImprovementManager(db) as m:
        for cid in ids:
            record = m.get_change(cid)
            assert record is not None
            assert record.status is ChangeStatus.FAILED
            assert record.rollback_info is not None
            assert record.rollback_info["reason"] == "interrupted"
            restored.update(Path(p).name for p in record.rollback_info["restored"])
    assert restored == {"writer.md", "new.md"}
    assert _tree(root) == before


def test_a_file_changed_outside_is_left_and_noted(tmp_path: Path, root: Path) -> None:
    db = tmp_path / "h.db"
    with Store(db) as store:
        ChangeLog(store)
        (cid,) = _intent(store, root, {"agents/writer.md": b"planned"})
    (root / "agents/writer.md").write_bytes(b"somebody else")
    with ImprovementManager(db) as m:
        record = m.get_change(cid)
        assert record is not None
        assert record.status is ChangeStatus.FAILED
        assert record.rollback_info is not None
        assert record.rollback_info["left_unchanged"] == (
            str((root / "agents/writer.md").resolve()),
        )
    assert (root / "agents/writer.md").read_bytes() == b"somebody else"


def test_an_interrupted_rollback_is_completed_on_open(tmp_path: Path, root: Path) -> None:
    before = _tree(root)
    db = tmp_path / "h.db"
    with ImprovementManager(db) as m:
        first = m.apply(_action(), path="agents/writer.md", new_content="v2", root=root)
        second = m.apply(_action(), path="agents/writer.md", new_content="v3", root=root)
        ids = [first.change_id, second.change_id]
        request = {"reason": "cascade test", "requested": first.change_id, "forced": False}
        with m.store.transaction(durable=True) as conn:
            m.changes.mark_rolling_back(conn, ids, request)
    (root / "agents/writer.md").write_text("v2")  # crashed midway through the restore
    with ImprovementManager(db) as reopened:
        for cid in ids:
            record = reopened.get_change(cid)
            assert record is not None
            assert record.status is ChangeStatus.ROLLED_BACK
            assert record.rollback_info is not None
            assert record.rollback_info["recovered"] is True
            assert record.rollback_info["reason"] == "cascade test"
        assert reopened.verify_audit_chain()
    assert _tree(root) == before


def test_a_damaged_audit_head_blocks_no_open_or_rollback_and_refuses_applies(
    tmp_path: Path, root: Path
) -> None:
    """A garbled head is a break: safety work goes on and records it, applies wait."""
    before = _tree(root)
    db = tmp_path / "h.db"
    with ImprovementManager(db) as m:
        first = m.apply(_action(), path="agents/writer.md", new_content="v1", root=root)
        second = m.apply(_action(), path="agents/writer.md", new_content="v2", root=root)
        head = m.audit.head_path
    head.write_bytes(b"garbage".ljust(256))
    with ImprovementManager(db) as m:  # opening recovers, which may write: no error
        with pytest.raises(AuditChainBroken, match="nothing readable"):
            m.apply(_action(), path="agents/writer.md", new_content="v3", root=root)
        with pytest.raises(AuditChainBroken):
            m.log_change(_action(), ChangeStatus.APPLIED)
        assert (root / "agents/writer.md").read_text() == "v2"
        assert m.rollback_by_id(second.change_id)
        assert (root / "agents/writer.md").read_text() == "v1"
        found = m.verify_audit_chain()
        assert [p.kind for p in found.problems] == ["chain_break"]
        assert str(head) in found.problems[0].detail
        assert m.rollback_by_id(first.change_id)
        assert [p.kind for p in m.verify_audit_chain().problems] == ["chain_break"]
    assert _tree(root) == before


class _FailingCommitAudit(AuditLog):
    """An audit log whose next ``failures`` commits fail after their writes, like a full disk."""

    failures = 0

    @contextmanager
    def transaction(self, *, safety: bool = False, **folded: Any) -> Iterator[AuditTransaction]:
        with super().transaction(safety=safety, **folded) as txn:
            yield txn
            if self.failures:
                self.failures -= 1
                raise sqlite3.OperationalError("disk I/O error")


def _failing_audit(m: ImprovementManager, failures: int) -> _FailingCommitAudit:
    audit = _FailingCommitAudit(m.store)
    audit.failures = failures
    m.audit = audit
    m.protocol = ChangeProtocol(m.store, m.changes, audit)
    return audit


def test_a_rollback_whose_status_commit_fails_once_is_completed_at_once(
    manager: ImprovementManager, root: Path
) -> None:
    """Files restored, status not committed: the rollback must not leave them APPLIED."""
    before = _tree(root)
    applied = manager.apply(_action(), path="agents/writer.md", new_content="v2", root=root)
    audit = _failing_audit(manager, failures=1)
    assert manager.rollback_by_id(applied.change_id, reason="undo it")
    assert audit.failures == 0  # the first status commit did fail
    record = manager.get_change(applied.change_id)
    assert record is not None
    assert record.status is ChangeStatus.ROLLED_BACK
    assert record.rollback_info is not None
    assert record.rollback_info["reason"] == "undo it"
    assert _tree(root) == before
    [undo] = [e for e in manager.audit.entries() if e.edit_type == "rollback"]
    assert undo.old_value == f"(sha256 {sha256_bytes(b'v2')})"  # the v2 it undid, by hash
    assert manager.verify_audit_chain()


def test_a_rollback_whose_status_commit_keeps_failing_is_completed_on_the_next_open(
    tmp_path: Path, root: Path
) -> None:
    before = _tree(root)
    db = tmp_path / "h.db"
    with ImprovementManager(db) as m:
        applied = m.apply(_action(), path="agents/writer.md", new_content="v2", root=root)
        _failing_audit(m, failures=10)
        with pytest.raises(StoreError, match="disk I/O error"):
            m.rollback_by_id(applied.change_id, reason="undo it")
        assert _tree(root) == before  # the files are restored ...
        row = m.changes.get(applied.change_id)
        assert row is not None  # ... the status could not say so, but the intent does
        assert (row.status, row.rollback_pending is not None) == (ChangeStatus.APPLIED, True)
    with ImprovementManager(db) as reopened:
        record = reopened.get_change(applied.change_id)
        assert record is not None
        assert record.status is ChangeStatus.ROLLED_BACK
        assert record.rollback_info is not None
        assert (record.rollback_info["reason"], record.rollback_info["recovered"]) == (
            "undo it",
            True,
        )
        assert [e.edit_type for e in reopened.audit.entries()] == [
            "prompt_modification",
            "rollback",
        ]
        assert reopened.verify_audit_chain()
        assert reopened.rollback_last() is None
    assert _tree(root) == before


def test_recovery_waits_for_a_live_writer_instead_of_undoing_it(tmp_path: Path, root: Path) -> None:
    """A PENDING change whose owner holds the root lock is in flight, not interrupted."""
    db = tmp_path / "h.db"
    with Store(db) as store:
        log = ChangeLog(store)
        lock = root.resolve() / ".agent" / "agentmend.lock"
        opened: list[ImprovementManager] = []
        with locked_file(lock):
            (cid,) = _intent(store, root, {"agents/writer.md": b"in flight"})
            (root / "agents/writer.md").write_bytes(b"in flight")
            opener = threading.Thread(target=lambda: opened.append(ImprovementManager(db)))
            opener.start()
            opener.join(0.3)
            assert opener.is_alive()  # blocked on the root lock
            with store.transaction(durable=True) as conn:
                log.set_status(conn, [cid], ChangeStatus.APPLIED)
        opener.join(10)
        assert not opener.is_alive()
        opened[0].close()
        row = log.get(cid)
        assert row is not None
        assert row.status is ChangeStatus.APPLIED
    assert (root / "agents/writer.md").read_bytes() == b"in flight"


def test_two_writers_on_one_file_never_interleave(tmp_path: Path, root: Path) -> None:
    db = tmp_path / "h.db"
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            with ImprovementManager(db) as m:
                for i in range(15):
                    m.apply(_action(), path="agents/writer.md", new_content=f"{n}-{i}", root=root)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with ImprovementManager(db) as m:
        history = m.get_history(limit=100)
        assert len(history) == 45
        for prev, nxt in itertools.pairwise(history):
            assert nxt.files[0].old_sha256 == prev.files[0].new_sha256  # each saw the last write
        assert (
            sha256_bytes((root / "agents/writer.md").read_bytes())
            == history[-1].files[0].new_sha256
        )
        assert m.verify_audit_chain()


# -- plans and decisions ----------------------------------------------------------------------


def test_plans_round_trip_and_update(tmp_path: Path) -> None:
    with Store(tmp_path / "p.db") as store:
        plan = save_plan(store, description="fix the writer", payload={"steps": [1, 2]})
        assert plan.status == "draft"
        assert get_plan(store, plan.plan_id) == plan
        updated = update_plan(store, plan.plan_id, status="done", payload={"steps": []})
        assert (updated.status, updated.payload, updated.description) == (
            "done",
            {"steps": []},
            "fix the writer",
        )
        assert updated.updated >= plan.updated
        save_plan(store, description="second", plan_id="p2")
        assert [p.plan_id for p in list_plans(store)] == [plan.plan_id, "p2"]
        assert [p.plan_id for p in list_plans(store, status="done")] == [plan.plan_id]
        assert get_plan(store, "missing") is None
        with pytest.raises(KeyError, match=r"no plan with id .missing."):
            update_plan(store, "missing", status="x")


def test_plans_filter_by_status_and_payload_in_sql_without_a_cap(tmp_path: Path) -> None:
    with Store(tmp_path / "p.db") as store:
        wanted = save_plan(
            store, description="old", payload={"kind": "code", "root": "/a"}, status="executing"
        )
        save_plan(store, description="other root", payload={"kind": "code", "root": "/b"},
                  status="executing")  # fmt: skip
        for i in range(60):
            save_plan(store, description=f"n{i}", payload={"kind": "x"}, status="executing")
        assert wanted not in list_plans(store, status="executing")  # the default keeps 50
        match = {"kind": "code", "root": "/a"}
        assert list_plans(store, status="executing", limit=None, payload=match) == [wanted]
        assert list_plans(store, status="done", limit=None, payload=match) == []
        assert len(list_plans(store, limit=None)) == 62
        with pytest.raises(ValueError, match="not a plain field name"):
            list_plans(store, payload={"a.b": "x"})


def test_decisions_are_appended_and_filtered(tmp_path: Path) -> None:
    with Store(tmp_path / "d.db") as store:
        first = record_decision(store, "gate", agent_name="writer", payload={"allowed": True})
        record_decision(store, "keep", agent_name="reviewer")
        record_decision(store, "gate", agent_name="reviewer", payload={"allowed": False})
        assert first.id == 1
        assert [d.payload for d in list_decisions(store, kind="gate")] == [
            {"allowed": True},
            {"allowed": False},
        ]
        assert [d.kind for d in list_decisions(store, agent_name="reviewer")] == ["keep", "gate"]
        assert [d.id for d in list_decisions(store, limit=1)] == [3]


# -- property: any sequence of applies and rollbacks restores exact bytes --------------------

_FILES = ("a.md", "docs/b.md", "docs/deep/c.txt")
_INITIAL = {"a.md": b"initial a\r\n", "docs/b.md": b"\x00initial b"}
_LIVE_STATES = ("applied", "kept")
_content = st.one_of(st.none(), st.binary(max_size=24))
_edits = st.one_of(
    st.tuples(st.just("apply"), st.integers(0, 2), _content),
    st.tuples(
        st.just("group"),
        st.lists(
            st.tuples(st.integers(0, 2), _content), min_size=1, max_size=3, unique_by=lambda t: t[0]
        ),
    ),
    st.tuples(st.just("keep"), st.integers(0, 63)),
    st.tuples(st.just("log")),
)
_ops = st.one_of(
    _edits,
    st.tuples(st.just("rollback"), st.integers(0, 63), st.booleans(), st.booleans()),
    st.tuples(st.just("rollback"), st.integers(0, 63), st.booleans(), st.booleans()),
    st.tuples(st.just("rollback_last")),
    st.tuples(st.just("external"), st.integers(0, 2), st.binary(max_size=8)),
)


@dataclass
class _Model:
    """What the tree and the history should be, computed without the store."""

    tree: dict[str, bytes]
    changes: list[dict[str, Any]] = field(default_factory=list)  # oldest first

    def group(self, c: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            x
            for x in self.changes
            if x["status"] in _LIVE_STATES
            and (x is c or (c["group"] is not None and x["group"] == c["group"]))
        ]

    def closure(self, c: dict[str, Any]) -> list[dict[str, Any]]:
        selected: dict[str, dict[str, Any]] = {}
        frontier = self.group(c)
        while frontier:
            selected.update((m["id"], m) for m in frontier)
            found: dict[str, dict[str, Any]] = {}
            for m in frontier:
                for later in self.changes[self.changes.index(m) + 1 :]:
                    if (
                        m["path"] is not None
                        and later["path"] == m["path"]
                        and later["status"] in _LIVE_STATES
                        and later["id"] not in selected
                    ):
                        found.update((g["id"], g) for g in self.group(later))
            frontier = list(found.values())
        return sorted(selected.values(), key=self.changes.index)

    def rollback(self, c: dict[str, Any], force: bool, cascade: bool) -> str:
        """The outcome the manager must report: false, dependents, changed or ok."""
        if c["status"] not in _LIVE_STATES:
            return "false"
        if c["path"] is None:
            c["status"] = "rolled_back"
            return "ok"
        chosen = self.closure(c)
        own = {m["id"] for m in self.group(c)}
        if any(m["id"] not in own for m in chosen) and not cascade:
            return "dependents"
        paths = {m["path"] for m in chosen}
        newest = {m["path"]: m["new"] for m in chosen}
        oldest = {m["path"]: m["old"] for m in reversed(chosen)}
        if any(self.tree.get(p) != newest[p] for p in paths) and not force:
            return "changed"
        for p in paths:
            _set(self.tree, p, oldest[p])
        for m in chosen:
            m["status"] = "rolled_back"
        return "ok"


def _set(tree: dict[str, bytes], path: str, data: bytes | None) -> None:
    if data is None:
        tree.pop(path, None)
    else:
        tree[path] = data


def _run(manager: ImprovementManager, root: Path, model: _Model, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind in ("apply", "group"):
        entries = [(op[1], op[2])] if kind == "apply" else op[1]
        items = [(_action(), _FILES[i], content) for i, content in entries]
        records = (
            [manager.apply(items[0][0], path=items[0][1], new_content=items[0][2], root=root)]
            if kind == "apply"
            else manager.apply_group(items, root=root)
        )
        for record, (i, content) in zip(records, entries, strict=True):
            path = _FILES[i]
            model.changes.append(
                {"id": record.change_id, "group": record.group_id, "path": path,
                 "old": model.tree.get(path), "new": content, "status": "applied"}
            )  # fmt: skip
            _set(model.tree, path, content)
    elif kind in ("rollback", "rollback_last"):
        if kind == "rollback":
            if not model.changes:
                return
            target = model.changes[op[1] % len(model.changes)]
            force, cascade = op[2], op[3]
        else:
            applied = [c for c in model.changes if c["status"] == "applied"]
            if not applied:
                assert manager.rollback_last() is None
                return
            target, force, cascade = applied[-1], False, False
        expected = model.rollback(target, force, cascade)
        event(f"{kind}: {expected}")
        if expected in ("dependents", "changed"):

            def attempt() -> object:
                if kind == "rollback":
                    return manager.rollback_by_id(target["id"], force=force, cascade=cascade)
                return manager.rollback_last()

            with pytest.raises(RollbackConflict) as info:
                attempt()
            assert bool(info.value.dependents) == (expected == "dependents")
        elif kind == "rollback":
            assert manager.rollback_by_id(target["id"], force=force, cascade=cascade) == (
                expected == "ok"
            )
        else:
            rolled = manager.rollback_last()
            assert rolled is not None
            assert rolled.change_id == target["id"]
    elif kind == "keep":
        if not model.changes:
            return
        target = model.changes[op[1] % len(model.changes)]
        if target["status"] != "applied":
            with pytest.raises(ChangeStateError):
                manager.mark_kept(target["id"])
            return
        manager.mark_kept(target["id"])
        for m in model.group(target):
            m["status"] = "kept"
    elif kind == "external":
        outside = root / _FILES[op[1]]
        outside.parent.mkdir(parents=True, exist_ok=True)
        outside.write_bytes(op[2])
        model.tree[_FILES[op[1]]] = op[2]
    else:
        cid = manager.log_change(_action())
        model.changes.append(
            {"id": cid, "group": None, "path": None, "old": None, "new": None, "status": "applied"}
        )


@pytest.mark.slow
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    # a run of changes first, so later ones build on earlier ones, then anything
    st.builds(
        lambda head, tail: head + tail,
        st.lists(_edits, min_size=3, max_size=10),
        st.lists(_ops, min_size=3, max_size=20),
    )
)
def test_any_sequence_of_applies_and_rollbacks_restores_exact_bytes(
    ops: list[tuple[Any, ...]],
) -> None:
    # tmpfs where there is one: this property is about bytes, not durability, and a fresh
    # database on ext4 pays a journal commit per fsync while its WAL grows
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        root = Path(tmp) / "root"
        for rel, data in _INITIAL.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        model = _Model(dict(_INITIAL))
        db = Path(tmp) / "h.db"
        with ImprovementManager(db) as manager:
            for op in ops:
                _run(manager, root, model, op)
                assert _tree(root) == model.tree, op
            for change in model.changes:
                record = manager.get_change(change["id"])
                assert record is not None
                assert record.status.value == change["status"]
            assert manager.verify_audit_chain()
        with ImprovementManager(db) as reopened:  # nothing is left for recovery to do
            assert reopened.recover() == []
        assert _tree(root) == model.tree


class _Clock:
    """Stands in for the manager's wall clock, so an hour passes at once."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def time(self) -> float:
        return self.now


def test_a_rolling_budget_refuses_while_full_and_frees_up_as_changes_age_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentmend.infrastructure.changes.improvement_manager as improvement_manager

    clock = _Clock()
    monkeypatch.setattr(improvement_manager, "time", clock)
    with ImprovementManager(
        tmp_path / "h.db", improvement_window_s=3600, max_improvements_per_window=2
    ) as manager:
        first = clock.now
        manager.log_change(_action())
        clock.now += 600
        manager.log_change(_action())
        assert manager.improvements_left() == 0
        allowed, reason = manager.can_make_improvement()
        assert not allowed
        frees_up_at = manager.budget_frees_up_at()
        assert frees_up_at is not None
        assert frees_up_at.timestamp() == first + 3600  # when the first change ages out
        assert reason.endswith(f"the budget frees up at {frees_up_at:%Y-%m-%d %H:%M:%S} UTC")
        clock.now = first + 3600  # the first change leaves the window
        assert manager.can_make_improvement() == (True, "OK")
        assert manager.improvements_left() == 1
        assert manager.budget_frees_up_at() is None
        manager.log_change(_action())
        assert not manager.can_make_improvement()[0]
        clock.now += 10 * 3600  # weeks later in a long-running process: improving resumes
        assert manager.can_make_improvement() == (True, "OK")
        assert manager.improvements_left() == 2
        assert manager.session_improvement_count == 3  # the session count is still kept


def test_the_session_budget_never_frees_up_in_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentmend.infrastructure.changes.improvement_manager as improvement_manager

    clock = _Clock()
    monkeypatch.setattr(improvement_manager, "time", clock)
    with ImprovementManager(tmp_path / "h.db", max_improvements_per_session=1) as manager:
        manager.log_change(_action())
        clock.now += 10 * 3600
        assert manager.can_make_improvement() == (False, "Max improvements (1) reached")
        assert manager.budget_frees_up_at() is None


def test_a_rolling_window_that_is_not_positive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="improvement_window_s must be > 0"):
        ImprovementManager(tmp_path / "h.db", improvement_window_s=0)
