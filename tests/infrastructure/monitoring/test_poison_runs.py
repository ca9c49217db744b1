"""Poison input never stops the monitor's writer: every value is made storable before the
batch, and a row the server still refuses is kept apart with its reason while the batch goes on.

Real PostgreSQL (the ``pg_server`` fixture) and real SQLite; the writer is the monitor's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import run_cli

from agentmend.faces.cli.common import EXIT_OK
from agentmend.infrastructure.monitoring.agent_window import Row
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.quarantine import quarantined_counts
from agentmend.infrastructure.store.storable import MAX_NAME_CHARS


def _agents(store: Store) -> list[str]:
    with store.snapshot() as conn:
        return [str(a) for (a,) in conn.execute("SELECT agent FROM executions ORDER BY id")]


def test_a_nul_in_an_agent_name_does_not_stop_the_writer_on_postgresql(
    pg_url: str, tmp_path: Path
) -> None:
    with Store(pg_url, files_dir=tmp_path) as store:
        with PerformanceMonitor(store, flush_interval_s=3600) as monitor:
            monitor.record("bad\x00name", success=False, duration_ms=1.0, error="x\x00y")
            monitor.flush()
            monitor.record("later", success=True, duration_ms=2.0)
            monitor.flush()
            assert monitor.write_backlog() == (0, None)
            assert monitor.get_agent_metrics("bad\\x00name") is not None  # counted as stored
        agents = _agents(store)
    assert agents == ["bad\\x00name", "later"]


def test_values_no_store_takes_are_stored_escaped_and_bounded(
    store_url: str, tmp_path: Path
) -> None:
    huge = "n" * 2_000_000
    with Store(store_url, files_dir=tmp_path) as store:
        with PerformanceMonitor(store, flush_interval_s=3600) as monitor:
            monitor.record(huge, success=True, duration_ms=float("inf"), input_tokens=10**30)
            monitor.record("lone\ud800", success=False, duration_ms=1.0, error="e\udfff" * 5000)
            monitor.record("extra", success=True, duration_ms=1.0, note="a\x00b", cut="x" * 10**6)
            monitor.flush()
        with store.snapshot() as conn:
            rows = conn.execute(
                "SELECT agent, duration_ms, input_tokens, error, extra FROM executions ORDER BY id"
            ).fetchall()
    (long_name, inf_ms, tokens, _, _), (lone, _, _, error, _), (_, _, _, _, extra) = rows
    assert len(long_name) == MAX_NAME_CHARS
    assert long_name.startswith("nnnn")
    assert "2,000,000 chars" in long_name
    assert inf_ms == 1e12
    assert tokens == 10**12
    assert lone == "lone\\ud800"
    assert error.startswith("e\\udfffe\\udfff")
    assert len(error) <= 4000
    fields = json.loads(extra)
    assert fields["note"] == "a\\x00b"
    assert len(fields["cut"]) <= 4000


def _row(agent: str, duration_ms: float = 1.0) -> Row:
    return (agent, "run", True, duration_ms, None, 0, 0, 0.0, 1.0, None)


def test_a_row_the_store_refuses_is_set_apart_and_the_batch_goes_on(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the table written directly, as if the monitor's checks had missed these values
    batch = [_row("a"), _row("lone\ud800"), _row("b"), _row("inf", float("inf")), _row("c")]
    with Store(store_url, files_dir=tmp_path) as store:
        ExecutionStore(store, "w1").insert(batch)
        ExecutionStore(store, "w2").insert([_row("d")])
        assert _agents(store) == ["a", "b", "c", "d"]
        assert quarantined_counts(store) == {"executions": 2}
        with store.snapshot() as conn:
            reasons = [
                r for (r, t) in conn.execute("SELECT reason, row_text FROM quarantined_rows")
            ]
        assert any("UnicodeEncodeError" in r for r in reasons)
        assert any("OverflowError" in r for r in reasons)
    if not store_url.startswith("postgresql"):
        code, out, err = run_cli(capsys, "status", "--workspace", str(tmp_path), "--json")
        assert code == EXIT_OK, err
        assert json.loads(out)["quarantined_rows"] == {"executions": 2}
        code, out, _ = run_cli(capsys, "status", "--workspace", str(tmp_path))
        assert "2 executions rows the store refused are set apart" in out


def test_status_of_a_store_with_nothing_set_apart_counts_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Store(tmp_path / "agentmend.db").close()
    code, out, err = run_cli(capsys, "status", "--workspace", str(tmp_path), "--json")
    assert code == EXIT_OK, err
    assert json.loads(out)["quarantined_rows"] == {}
