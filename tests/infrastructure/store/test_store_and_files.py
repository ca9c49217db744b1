"""The store core (migrations, transactions) and the shared file-safety helpers."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from agentmend.infrastructure.errors import LockTimeout, PathNotAllowed, StoreError
from agentmend.infrastructure.files.atomic import (
    atomic_delete,
    atomic_write,
    atomic_write_or_delete,
    locked_file,
    read_if_exists,
    remove_atomic_write_leftovers,
    resolve_inside,
)
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.timeouts import StoreTimeouts

V1 = "CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT NOT NULL)"
V2 = "ALTER TABLE things ADD COLUMN colour TEXT; CREATE INDEX things_name ON things(name)"


def test_migrations_apply_in_order_and_only_once(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with Store(db) as store:
        store.migrate("things", [V1])
        assert store.schema_version("things") == 1
        with store.transaction() as conn:
            conn.execute("INSERT INTO things (name) VALUES ('x')")
    with Store(db) as store:
        store.migrate("things", [V1, V2])
        assert store.schema_version("things") == 2
        row = store.connection().execute("SELECT name, colour FROM things").fetchone()
        assert row == ("x", None)
        store.migrate("things", [V1, V2])  # idempotent
        assert store.connection().execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_newer_schema_than_known_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with Store(db) as store:
        store.migrate("things", [V1, V2])
    with Store(db) as store, pytest.raises(StoreError, match="newer than this agentmend knows"):
        store.migrate("things", [V1])


def test_a_failed_migration_leaves_the_previous_version(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with Store(db) as store:
        store.migrate("things", [V1])
    with Store(db) as store:
        with pytest.raises(StoreError, match="no such table: nope"):
            store.migrate("things", [V1, "ALTER TABLE nope ADD COLUMN x TEXT"])
        assert store.schema_version("things") == 1


def test_transaction_rolls_back_on_error(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as store:
        store.migrate("things", [V1])

        def write_then_fail() -> None:
            with store.transaction() as conn:
                conn.execute("INSERT INTO things (name) VALUES ('lost')")
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            write_then_fail()
        assert store.connection().execute("SELECT count(*) FROM things").fetchone()[0] == 0


def test_each_migration_commits_on_its_own(tmp_path: Path) -> None:
    """A failing script keeps the versions before it: each runs in its own transaction."""
    with Store(tmp_path / "a.db") as store:
        with pytest.raises(StoreError, match="nope"):
            store.migrate("things", [V1, "ALTER TABLE nope ADD COLUMN x TEXT"])
        assert store.schema_version("things") == 1
        assert store.connection().execute("SELECT count(*) FROM things").fetchone() == (0,)
        store.migrate("things", [V1, V2])  # carries on from version 1
        assert store.schema_version("things") == 2


def test_a_full_disk_inside_a_transaction_raises_the_real_error(tmp_path: Path) -> None:
    """SQLite ends the transaction itself on SQLITE_FULL; no ROLLBACK error may hide that."""
    with Store(tmp_path / "a.db") as store:
        store.migrate("blobs", ["CREATE TABLE blobs (data BLOB)"])
        store.connection().execute("PRAGMA max_page_count=20")

        def fill() -> None:
            with store.transaction(durable=True) as conn:
                for _ in range(50):
                    conn.execute("INSERT INTO blobs VALUES (?)", (b"x" * 4000,))

        with pytest.raises(StoreError, match="full") as caught:
            fill()
        assert caught.value.cause == "SQLITE_FULL"
        assert caught.value.path == str(tmp_path / "a.db")
        conn = store.connection()
        assert not conn.in_transaction
        assert _plain_sync_mode(store) == 1
        conn.execute("PRAGMA max_page_count=100000")
        with store.transaction() as c:  # the connection is usable again
            c.execute("INSERT INTO blobs VALUES (x'00')")
        assert conn.execute("SELECT count(*) FROM blobs").fetchone() == (1,)


def test_a_failed_commit_is_a_store_error_naming_the_database(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with Store(db) as store:
        store.migrate(
            "fk",
            [
                "CREATE TABLE parent (id INTEGER PRIMARY KEY);"
                " CREATE TABLE child (pid INTEGER REFERENCES parent (id)"
                " DEFERRABLE INITIALLY DEFERRED)"
            ],
        )

        def orphan() -> None:
            with store.transaction() as conn:
                conn.execute("INSERT INTO child VALUES (7)")  # checked only at COMMIT

        with pytest.raises(StoreError, match=f"cannot commit to {db}") as caught:
            orphan()
        assert isinstance(caught.value.__cause__, sqlite3.IntegrityError)
        conn = store.connection()
        assert not conn.in_transaction  # rolled back, not left open
        assert conn.execute("SELECT count(*) FROM child").fetchone() == (0,)


def test_a_begin_that_cannot_get_the_lock_is_a_lock_timeout_naming_the_database(
    tmp_path: Path,
) -> None:
    db = tmp_path / "a.db"
    with Store(db, timeouts=StoreTimeouts(lock_s=0.05)) as store:
        store.migrate("things", [V1])
        other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        try:
            other.execute("BEGIN IMMEDIATE")
            with (
                pytest.raises(LockTimeout, match=f"write lock on {db} after 0.05 s") as caught,
                store.transaction(durable=True),
            ):
                pass
            assert isinstance(caught.value, StoreError)  # what callers catch already
            assert caught.value.setting == "store_lock_timeout_s"
            assert caught.value.cause == "SQLITE_BUSY"
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert _plain_sync_mode(store) == 1  # the durable mode does not outlive the failure


def _sync_mode(store: Store) -> int:
    return int(store.connection().execute("PRAGMA synchronous").fetchone()[0])


def _plain_sync_mode(store: Store) -> int:
    """The sync mode a plain transaction commits with."""
    with store.transaction():
        return _sync_mode(store)


def test_a_durable_transaction_commits_with_full_sync_and_a_plain_one_after_it_without(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "a.db") as store:
        store.migrate("things", [V1])
        before = _plain_sync_mode(store)
        assert before == 1  # NORMAL: the store's everyday mode
        with store.transaction(durable=True) as conn:
            assert _sync_mode(store) == 2  # FULL while the commit is pending
            conn.execute("INSERT INTO things (name) VALUES ('kept')")
            with store.transaction() as inner:  # a plain one joins the durable one
                inner.execute("INSERT INTO things (name) VALUES ('joined')")
        with store.transaction(durable=True):
            assert _sync_mode(store) == 2  # a run of durable ones stays in FULL
        assert _plain_sync_mode(store) == before
    with Store(tmp_path / "a.db") as reopened:
        names = reopened.connection().execute("SELECT name FROM things ORDER BY id").fetchall()
        assert names == [("kept",), ("joined",)]


def test_a_durable_transaction_rolls_back_on_error_and_restores_the_mode(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as store:
        store.migrate("things", [V1])

        def write_then_fail() -> None:
            with store.transaction(durable=True) as conn:
                conn.execute("INSERT INTO things (name) VALUES ('lost')")
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            write_then_fail()
        assert _plain_sync_mode(store) == 1
        assert store.connection().execute("SELECT count(*) FROM things").fetchone()[0] == 0


def test_a_durable_transaction_refuses_to_nest_inside_an_open_one(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as store:
        store.migrate("things", [V1])
        with store.transaction() as conn:
            conn.execute("INSERT INTO things (name) VALUES ('outer')")
            with pytest.raises(StoreError, match="nested"), store.transaction(durable=True):
                pass
            assert _sync_mode(store) == 1  # the refusal changed nothing
        with store.transaction(durable=True):
            with pytest.raises(StoreError, match="nested"), store.transaction(durable=True):
                pass
            assert _sync_mode(store) == 2  # still the outer durable one's mode
        assert _plain_sync_mode(store) == 1
        assert store.connection().execute("SELECT name FROM things").fetchall() == [("outer",)]


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "history.json"
    bogus.write_text('[{"change_id": "abc"}]' * 100)
    with pytest.raises(StoreError, match=r"history\.json"):
        Store(bogus)
    assert bogus.read_text() == '[{"change_id": "abc"}]' * 100


def test_atomic_write_replaces_and_keeps_mode(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.md"
    atomic_write(target, "one")
    os.chmod(target, 0o640)
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in target.parent.iterdir()] == ["f.md"]
    atomic_delete(target)
    atomic_delete(target)  # already gone: no error
    assert not target.exists()


def test_write_or_delete_and_read_if_exists_round_trip_absence(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.md"
    assert read_if_exists(target) is None
    atomic_write_or_delete(target, b"one")
    assert read_if_exists(target) == b"one"
    atomic_write_or_delete(target, None)
    assert not target.exists()
    assert read_if_exists(target) is None
    atomic_write_or_delete(target, None)  # already absent: no error


def test_remove_atomic_write_leftovers_removes_only_the_targets_temp_files(
    tmp_path: Path,
) -> None:
    target = tmp_path / "f.md"
    atomic_write(target, b"kept")
    (tmp_path / ".f.md.abc123.tmp").write_bytes(b"half")  # a writer killed mid-write
    (tmp_path / ".g.md.abc123.tmp").write_bytes(b"other")  # another file's, left alone
    remove_atomic_write_leftovers(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".g.md.abc123.tmp", "f.md"]
    assert target.read_bytes() == b"kept"
    remove_atomic_write_leftovers(tmp_path / "missing" / "x.md")  # no folder: nothing to do


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("../x.md", "'..' is not allowed"),
        ("a/../../x.md", "'..' is not allowed"),
        ("/etc/passwd", "absolute paths are not allowed"),
        ("link/x.md", "symlink or outside"),
        ("notes.exe", "extension '.exe'"),
    ],
)
def test_resolve_inside_refuses_escapes(tmp_path: Path, path: str, problem: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(PathNotAllowed, match=problem) as info:
        resolve_inside(root, path, allowed_suffixes=frozenset({".md", ".py"}))
    assert info.value.path == path


def test_resolve_inside_accepts_nested_paths(tmp_path: Path) -> None:
    assert resolve_inside(tmp_path, "a/b/c.md") == tmp_path.resolve() / "a/b/c.md"
    inside = tmp_path.resolve() / "x.md"
    assert resolve_inside(tmp_path, inside, allow_absolute=True) == inside


def test_resolve_inside_a_resolved_root_answers_as_a_full_resolve(tmp_path: Path) -> None:
    """Below a root resolved already only the names under it are looked up: links inside,
    links out, loops, a file on the way and absent names give what resolving it all gives."""
    root = (tmp_path / "root").resolve()
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "f.md").write_text("x")
    (tmp_path / "outside").mkdir()
    (root / "in").symlink_to(root / "a")
    (root / "a" / "up").symlink_to(root)
    (root / "out").symlink_to(tmp_path / "outside")
    (root / "loop").symlink_to(root / "loop")
    paths = [
        "a/b/c.md", "a/f.md", "a/f.md/x.md", "gone/x.md", "a/gone/y/z.md", "in/f.md",
        "a/up/a/f.md", "out/x.md", "loop/x.md", "./a//f.md",
    ]  # fmt: skip
    for path in paths:
        try:
            full: Path | str = resolve_inside(root, path)
        except PathNotAllowed as exc:
            full = exc.problem
        try:
            quick: Path | str = resolve_inside(root, path, root_resolved=True)
        except PathNotAllowed as exc:
            quick = exc.problem
        assert quick == full, path
    assert resolve_inside(root, "in/f.md", root_resolved=True) == root / "a" / "f.md"


def _held_elsewhere(path: Path) -> bool:
    """Whether another open file description (as another process would have) is locked out."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def test_locked_file_creates_the_file_and_excludes_other_holders_until_released(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "sub" / "root.lock"
    with locked_file(lock) as fd:
        assert lock.is_file()
        assert fd >= 0
        assert _held_elsewhere(lock)
    assert not _held_elsewhere(lock)


def test_locked_file_is_reentrant_in_its_thread(tmp_path: Path) -> None:
    lock = tmp_path / "root.lock"
    with locked_file(lock) as outer:
        with locked_file(lock) as inner:
            assert inner == outer  # the same lock, not a second description that would block
        assert _held_elsewhere(lock)  # leaving the inner block keeps the outer one's lock
    assert not _held_elsewhere(lock)


def test_locked_file_makes_other_threads_wait_and_is_released_on_error(tmp_path: Path) -> None:
    lock = tmp_path / "root.lock"
    order: list[str] = []

    def other() -> None:
        with locked_file(lock):
            order.append("other")

    def hold_then_fail() -> None:
        with locked_file(lock):
            waiter.start()
            waiter.join(0.3)
            assert waiter.is_alive()  # blocked on the lock this thread holds
            order.append("holder")
            raise RuntimeError("boom")

    waiter = threading.Thread(target=other)
    with pytest.raises(RuntimeError, match="boom"):
        hold_then_fail()
    waiter.join(10)
    assert not waiter.is_alive()
    assert order == ["holder", "other"]
    assert not _held_elsewhere(lock)


def test_opening_a_new_store_waits_for_another_first_opener(tmp_path: Path) -> None:
    # another process is still creating the database (rollback journal, exclusive lock): the
    # switch to WAL must wait for it, not fail with "database is locked"
    db = tmp_path / "new.db"
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    other.execute("CREATE TABLE first_opener (x INTEGER)")
    timer = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    timer.start()
    try:
        with Store(db) as store:
            assert store.connection().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        timer.join()
        other.close()
