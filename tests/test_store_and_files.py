"""The store core (migrations, transactions) and the shared file-safety helpers."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from infrastructure.errors import PathNotAllowed, StoreError
from infrastructure.files import atomic_delete, atomic_write, resolve_inside
from infrastructure.store import Store

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
        with pytest.raises(sqlite3.OperationalError):
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
