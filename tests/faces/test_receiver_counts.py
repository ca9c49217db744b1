"""The OTLP receiver's counts kept in the store and shown by `agentmend status`: the real
program writes them when it starts, while it serves and when it stops; a store that cannot take
them never stops it from serving."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_cli
from log_capture import captured_records
from otel_helpers import TEST_TOKEN, Recorder, SpanFactory, post

from agentmend.faces.cli.common import EXIT_OK
from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.telemetry.assembly import TelemetryCounts, TraceAssembler
from agentmend.infrastructure.telemetry.receiver import OtlpReceiver
from agentmend.infrastructure.telemetry.receiver_counts import (
    read_receiver_counts,
    receiver_name,
    write_receiver_counts,
)

pytestmark = pytest.mark.usefixtures("restore_logging")

CLAUDE_CODE_LOGS = Path(__file__).parents[1] / "otel_fixtures" / "claude_code_logs"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _status(capsys: pytest.CaptureFixture[str], workspace: Path) -> dict[str, object]:
    code, out, err = run_cli(capsys, "status", "--workspace", str(workspace), "--json")
    assert code == EXIT_OK, err
    report: dict[str, object] = json.loads(out)
    return report


def test_the_receiver_writes_its_counts_and_status_shows_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    workspace, port = tmp_path / "ws", _free_port()
    command = [sys.executable, "-m", "agentmend.otel_receiver", "--port", str(port)]
    command += ["--token", TEST_TOKEN]
    process = subprocess.Popen(
        [*command, "--workspace", str(workspace)],
        stderr=subprocess.PIPE,
        text=True,
    )
    spans, nameless = SpanFactory(), SpanFactory(service="")
    try:
        assert process.stderr is not None
        assert f"127.0.0.1:{port}/v1/traces" in process.stderr.readline()
        started = _status(capsys, workspace)["telemetry_receivers"]
        assert isinstance(started, list)
        (row,) = started
        assert row["receiver"] == receiver_name("127.0.0.1", port)
        assert (row["spans_received"], row["spans_dropped"]) == (0, 0)  # there from the start

        url = f"http://127.0.0.1:{port}/v1/traces"
        spans.agent_run("writer", chats=[(9, 9)])
        body = spans.body()
        assert post(url, body)[0] == 200
        assert post(url, body)[0] == 200  # an exporter's retry: duplicates, not losses
        nameless.agent_run(None, chats=[(1, 1)])  # an agent span no rule can name
        assert post(url, nameless.body())[0] == 200
        # Claude Code's default telemetry: events and metrics, its run recorded at the stop
        claude_code = json.loads((CLAUDE_CODE_LOGS / "one_prompt.json").read_text())
        for signal in ("logs", "metrics"):
            (document,) = claude_code[signal]
            answer = post(
                f"http://127.0.0.1:{port}/v1/{signal}",
                json.dumps(document).encode(),
                content_type="application/json",
            )
            assert answer == (200, b"{}")
    finally:
        spans.close()
        nameless.close()
        process.terminate()
        process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
    assert process.returncode == 0

    (row,) = _status(capsys, workspace)["telemetry_receivers"]  # type: ignore[misc]
    assert row["spans_received"] == 6
    assert row["executions_recorded"] == 1
    assert row["spans_dropped"] == 1
    assert row["counts"]["duplicates"] == 2
    assert row["counts"]["unmappable"] == 1
    code, out, _ = run_cli(capsys, "status", "--workspace", str(workspace))
    assert code == EXIT_OK
    line = next(x for x in out.splitlines() if x.startswith("OpenTelemetry receiver"))
    assert "6 spans received, 1 runs recorded from them, 1 dropped (1 naming no agent" in line
    assert (row["log_records_received"], row["log_runs_recorded"]) == (7, 1)
    assert row["metric_points_received"] == 7
    assert row["log_counts"]["log_runs_cut_short"] == 1  # recorded when the receiver stopped
    words = " ".join(out.split())  # the console wraps long lines
    assert "7 log events received, 1 runs recorded from them (1 before their session" in words
    assert "0 runs open; 7 metric points received" in words
    store = Store(workspace / "agentmend.db")
    with PerformanceMonitor(store) as monitor:
        researcher = monitor.get_metrics()["researcher"]
    store.close()
    assert (researcher.executions, researcher.input_tokens, researcher.output_tokens) == (
        1,
        321,
        45,
    )


def test_status_of_a_store_no_receiver_wrote_to_shows_none_and_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    Store(workspace / "agentmend.db").close()
    assert _status(capsys, workspace)["telemetry_receivers"] == []
    with sqlite3.connect(workspace / "agentmend.db") as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "telemetry_receivers" not in tables


def test_a_receiver_writes_one_row_that_each_write_replaces(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        write_receiver_counts(store, "r", 100.0, TelemetryCounts(spans_received=3))
        write_receiver_counts(store, "r", 100.0, TelemetryCounts(spans_received=7, orphans=2))
        write_receiver_counts(store, "other", 50.0, TelemetryCounts())
        rows = read_receiver_counts(store)
    assert [(r.receiver, r.counts.spans_received, r.dropped) for r in rows] == [
        ("other", 0, 0),
        ("r", 7, 2),
    ]
    assert rows[1].started_at.timestamp() == 100.0


def test_a_store_that_cannot_take_the_counts_never_stops_the_receiver(
    recorder: Recorder,
) -> None:
    attempts: list[TelemetryCounts] = []

    def refuse(counts: TelemetryCounts) -> None:
        attempts.append(counts)
        raise StoreError("the disk is full")

    receiver = OtlpReceiver(
        TraceAssembler(recorder),
        port=0,
        token=TEST_TOKEN,
        publish=refuse,
        expire_every_s=0.01,
        publish_every_s=0,
    )
    spans = SpanFactory()
    with captured_records("agentmend", logging.ERROR) as records:
        receiver.start()
        try:
            spans.agent_run("writer")
            assert post(receiver.endpoint + "/v1/traces", spans.body())[0] == 200
            spans.agent_run("writer")
            assert post(receiver.endpoint + "/v1/traces", spans.body())[0] == 200
        finally:
            spans.close()
            receiver.close()
    assert attempts
    assert attempts[-1].spans_received == 4  # the last word, at close
    assert len(recorder.records) == 2
    assert any(r.getMessage().startswith("otlp_counts_not_written") for r in records)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()
