"""``agentmend store copy``: a whole history moves between SQLite and PostgreSQL, both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.faces.cli import main as agentmend
from infrastructure.changes.decisions import record_decision, save_plan
from infrastructure.changes.improvement_manager import ImprovementManager
from infrastructure.models import ChangeType, ImprovementAction
from infrastructure.monitoring.performance_monitor import PerformanceMonitor
from infrastructure.store import Store

_KEY = "copy-test-key-0123456789abcdef"
_COMPARED = {
    "executions": "id",
    "changes": "seq",
    "decisions": "id",
    "plans": "plan_id",
    "audit_log": "id",
    "run_totals": "agent",
}


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
            change_id = manager.log_change(action, applied_by="person")
            if n == 1:
                manager.rollback_by_id(change_id)
            else:
                manager.mark_kept(change_id)
        manager.close()
        save_plan(store, description="a plan", payload={"kind": "code", "root": "/r"})
        record_decision(store, "cycle.started", payload={"cycle_id": "c1"})


def _dump(url: str, files_dir: Path) -> dict[str, list[tuple[object, ...]]]:
    with Store(url, files_dir=files_dir) as store:
        conn = store.connection()
        return {
            table: [tuple(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY {key}")]
            for table, key in _COMPARED.items()
        }


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
    assert out["rows"]["audit_log"] == 4  # 3 applied, 1 rolled back
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
            applied_by="person",
        )
        assert manager.verify_audit_chain()
        newest = store.connection().execute("SELECT MAX(id) FROM audit_log").fetchone()[0]
        seq = store.connection().execute("SELECT MAX(seq) FROM changes").fetchone()[0]
        manager.close()
    assert (newest, seq) == (5, 4)


def test_copy_into_a_store_with_rows_is_refused(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite = str(tmp_path / "agentmend.db")
    _history(sqlite, tmp_path)
    _history(pg_url, tmp_path / "other")
    code = agentmend(["store", "copy", sqlite, pg_url, "--workspace", str(tmp_path)])
    assert code == 3
    assert "is not empty" in capsys.readouterr().err
