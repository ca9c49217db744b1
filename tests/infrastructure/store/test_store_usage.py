"""``agentmend store`` on both backends: rows and bytes by kind of record, from the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmend.faces.cli.app import main as agentmend
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.usage import store_usage


def test_the_store_command_shows_rows_and_bytes_by_kind(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ws"
    with Workspace.open(folder, settings=Settings(store_url=store_url), create=True) as ws:
        empty = store_usage(ws.store)
        monitor = PerformanceMonitor(ws.store)
        for i in range(500):
            monitor.record("writer", success=i % 7 != 0, duration_ms=float(i), error="x" * 200)
        monitor.close()
        audit = AuditLog(ws.store)
        with audit.transaction() as txn:
            txn.append(agent_name="writer", edit_type="t", old_value=1, new_value=2, user_id="u")
        grown = store_usage(ws.store)
        display = ws.store.display
    assert grown.runs == empty.runs + 500
    runs = {k.kind: k for k in grown.kinds}["runs"]
    assert runs.bytes is not None
    assert runs.bytes > {k.kind: k for k in empty.kinds}["runs"].bytes  # type: ignore[operator]
    on_postgres = store_url.startswith("postgresql")
    if on_postgres:
        assert grown.wal_bytes is None  # the server's WAL is no one database's
        assert grown.file_bytes >= runs.bytes
    else:  # not checkpointed yet: the pages are in the WAL
        assert grown.wal_bytes is not None
        assert grown.file_bytes + grown.wal_bytes >= runs.bytes

    common = ["--workspace", str(folder), "--store", store_url]
    assert agentmend(["store", *common, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["path"] == display
    assert shown["kinds"]["runs"]["rows"] == grown.runs
    assert shown["kinds"]["runs"]["bytes"] >= runs.bytes
    assert shown["kinds"]["audit"]["rows"] >= 1
    assert agentmend(["store", *common]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(display)
    assert ("WAL" in first) is not on_postgres


def test_usage_reads_one_snapshot_and_writes_nothing(store_url: str, tmp_path: Path) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        monitor = PerformanceMonitor(store)
        monitor.record("writer", success=True, duration_ms=1.0)
        monitor.close()
        before = store_usage(store)
        assert store_usage(store).kinds == before.kinds
        assert not store.connection().in_transaction
