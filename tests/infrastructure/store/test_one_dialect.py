"""SQL that only SQLite speaks stays where the backend is chosen: the SQLite store itself and
the dialect helpers that branch on the backend. Anywhere else it is a traceback on PostgreSQL
(``test_every_face_on_both_backends.py`` runs every face on both; this names the file)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SQLITE_ONLY = re.compile(
    r"json_each\(|json_extract\(|json_group_array\(|INSERT OR |sqlite_master|PRAGMA "
    # unary + on a column: SQLite's planner hint; PostgreSQL has no such operator for text
    r"|[\s\"'(]\+[a-z_]+ *[<>=]"
)
# each branches on the backend before it speaks SQLite
DIALECT_MODULES = {
    "infrastructure/store/sqlite.py",
    "infrastructure/store/sql.py",
    "infrastructure/store/usage.py",
    "infrastructure/store/snapshot.py",
}


def sqlite_only_lines(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for folder in ("agents", "infrastructure"):
        for path in sorted((root / folder).rglob("*.py")):
            lines = [
                line.strip()
                for line in path.read_text(encoding="utf-8").splitlines()
                if SQLITE_ONLY.search(line) and not line.strip().startswith("#")
            ]
            if lines:
                found[path.relative_to(root).as_posix()] = lines
    return found


def test_sqlite_only_sql_is_only_in_the_dialect_modules() -> None:
    outside = {
        path: lines
        for path, lines in sqlite_only_lines(ROOT).items()
        if path not in DIALECT_MODULES
    }
    assert outside == {}


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    module = tmp_path / "agents" / "loop" / "reader.py"
    module.parent.mkdir(parents=True)
    (tmp_path / "infrastructure").mkdir()
    module.write_text(
        'ROWS = "SELECT 1 FROM decisions WHERE +kind >= ?"\n'
        "HAS = \"EXISTS (SELECT 1 FROM json_each(payload, '$.ids'))\"\n"
        "# json_extract( in a comment is prose\n"
    )
    assert sqlite_only_lines(tmp_path) == {
        "agents/loop/reader.py": [
            'ROWS = "SELECT 1 FROM decisions WHERE +kind >= ?"',
            "HAS = \"EXISTS (SELECT 1 FROM json_each(payload, '$.ids'))\"",
        ]
    }
