"""``agentmend store copy``: a whole history moves between SQLite and PostgreSQL, both ways."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from agentmend.faces.cli.app import main as agentmend
from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.decisions import record_decision, save_plan
from agentmend.infrastructure.changes.watch import ChangeWatcher
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.principal import ChangeAuthor, Principal
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.store import copying as store_copy
from agentmend.infrastructure.store.api import Store

_KEY = "copy-test-key-0123456789abcdef"
_COMPARED = {
    "executions": "id",
    "changes": "seq",
    "decisions": "id",
    "plans": "plan_id",
    "audit_log": "id",
    "run_totals": "agent",
    "release_blobs": "sha256",
    "releases": "version",
    "release_files": "version, path",
    "release_heads": "team_id",
    "change_watches": "watch_id",
}
ROOT = Path(__file__).resolve().parents[3]


def _history(url: str, files_dir: Path) -> None:
    with Store(url, files_dir=files_dir) as store:
        monitor = PerformanceMonitor(store, baseline_n=10)
        for i in range(250):
            monitor.record("writer", success=i % 5 != 0, duration_ms=1.5 * i, note=f"run {i}")
        monitor.close()
        manager = ImprovementManager(store=store, audit_hmac_key=_KEY)
        for n in range(3):
            action = ImprovementAction(
                target_agent="writer",
                action_type=ChangeType.PARAMETER_ADJUSTMENT,
                old_value=n,
                new_value=n + 1,
                rationale="more room",
                confidence_score=0.8,
            )
            change_id = manager.log_change(action, author=ChangeAuthor(via="person"))
            if n == 1:
                manager.rollback_by_id(change_id)
            else:
                manager.mark_kept(change_id)
        manager.close()
        save_plan(store, description="a plan", payload={"kind": "code", "root": "/r"})
        record_decision(store, "cycle.started", payload={"cycle_id": "c1"})
        # a release of a team's files and a change watched on live runs
        releases = ReleaseLog(store, "team-1", audit=AuditLog(store, hmac_key=_KEY))
        person = Principal(user_id="p", name="person", permissions=frozenset())
        releases.publish_directory(ROOT / "infrastructure" / "simulated_team", by=person)
        manager = ImprovementManager(store=store, audit_hmac_key=_KEY)
        team = files_dir / "team"
        team.mkdir(exist_ok=True)
        (team / "writer.md").write_text("old\n")
        ChangeWatcher(manager).start(
            ImprovementAction(
                target_agent="writer",
                action_type=ChangeType.PROMPT_MODIFICATION,
                old_value="old",
                new_value="new",
                confidence_score=0.8,
            ),
            path="writer.md",
            new_content="new\n",
            root=team,
            before=[random.Random(3).random() < 0.8 for _ in range(40)],
        )
        manager.close()


def _dump(url: str, files_dir: Path) -> dict[str, list[tuple[object, ...]]]:
    with Store(url, files_dir=files_dir) as store:
        conn = store.connection()
        dump: dict[str, list[tuple[object, ...]]] = {}
        for table, key in _COMPARED.items():
            cursor: Any = conn.execute(f"SELECT * FROM {table} ORDER BY {key}")
            # a run's position (PostgreSQL's transaction id) is the backend's, not the run's,
            # and so is whether a fold has added it to the rollups yet
            kept = [i for i, d in enumerate(cursor.description) if d[0] not in ("tx", "rolled")]
            dump[table] = [tuple(r[i] for i in kept) for r in cursor.fetchall()]
        return dump


@pytest.mark.parametrize("direction", ["sqlite_to_postgresql", "postgresql_to_sqlite"])
def test_copy_keeps_every_row_and_the_chain_and_the_target_goes_on(
    direction: str,
    pg_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTMEND_AUDIT_HMAC_KEY", _KEY)
    sqlite = str(tmp_path / "agentmend.db")
    source, target = (sqlite, pg_url) if direction == "sqlite_to_postgresql" else (pg_url, sqlite)
    _history(source, tmp_path)
    code = agentmend(["store", "copy", source, target, "--workspace", str(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["verified"] == {"source": True, "target": True}
    # 3 logged, 1 rolled back, the release's publication, the watched change
    assert out["rows"]["audit_log"] == 6
    assert _dump(target, tmp_path) == _dump(source, tmp_path)
    with Store(target, files_dir=tmp_path) as store:  # the target goes on from where it was
        manager = ImprovementManager(store=store, audit_hmac_key=_KEY)
        manager.log_change(
            ImprovementAction(
                target_agent="writer",
                action_type=ChangeType.PARAMETER_ADJUSTMENT,
                old_value=9,
                new_value=10,
                confidence_score=0.8,
            ),
            author=ChangeAuthor(via="person"),
        )
        assert manager.verify_audit_chain()
        newest = store.connection().execute("SELECT MAX(id) FROM audit_log").fetchone()[0]
        seq = store.connection().execute("SELECT MAX(seq) FROM changes").fetchone()[0]
        manager.close()
    assert (newest, seq) == (7, 5)


def test_copy_into_a_store_with_rows_is_refused(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite = str(tmp_path / "agentmend.db")
    _history(sqlite, tmp_path)
    _history(pg_url, tmp_path / "other")
    code = agentmend(["store", "copy", sqlite, pg_url, "--workspace", str(tmp_path)])
    assert code == 3
    assert "is not empty" in capsys.readouterr().err


def test_every_table_any_component_creates_is_copied() -> None:
    # a table added by a component but not to the copy would be lost by `store copy` silently
    created = {
        name
        for folder in ("infrastructure", "agents")
        for path in (ROOT / folder).rglob("*.py")
        for name in re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", path.read_text())
    }
    copied = {table for table, _ in store_copy._TABLES}
    # schema_versions: each store migrates itself; audit_counter: a counter copy_store sets;
    # run_fold: a PostgreSQL store's fold cursor, a position among its server's transaction
    # ids (copy_store adds the runs its source has not folded to the copied rollups instead)
    skipped = {"schema_versions", "audit_counter", "run_fold"}
    assert created - skipped <= copied, sorted(created - copied)
    migrated = {component for component, _ in store_copy.COMPONENTS}
    assert {"change_watches", "releases", "telemetry_receivers"} <= migrated
