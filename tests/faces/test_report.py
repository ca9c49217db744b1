"""Seeing the loop: `agentmend status`, `show`, `improve`, `report` and `serve`, and the
downsampled series they draw from.

The scripted workspace is the demo's: the simulated team through a truncation fault fixed and
kept, a wrong fix rolled back, and a timeout fixed and kept.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cli_run import demo_workspace, fresh_demo_workspace, run_cli

from agentmend.faces.cli.app import main
from agentmend.faces.cli.common import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from agentmend.faces.report.data import STATUS_SCHEMA
from agentmend.faces.report.server import LatestPage
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.monitoring.run_series import (
    DURATION_BINS,
    MIGRATIONS,
    ROLLUP_WIDTHS,
    duration_quantile,
    read_series,
)
from agentmend.infrastructure.store.api import Store, _split_sql

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_workspace(tmp_path_factory.mktemp("report") / "ws")


def _executions(workspace: Path) -> dict[str, tuple[int, int]]:
    with sqlite3.connect(workspace / "agentmend.db") as conn:
        rows = conn.execute(
            "SELECT agent, COUNT(*), SUM(1 - success) FROM executions WHERE source = 'run' "
            "GROUP BY agent"
        ).fetchall()
    return {agent: (int(n), int(f)) for agent, n, f in rows}


# -- the series ---------------------------------------------------------------------------------


def test_the_series_is_kept_as_runs_are_written_and_equals_a_backfill(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    monitor = PerformanceMonitor(store)
    durations = [0.4, 1.0, 1.5, 3.0, 90.0, 250.0, 251.0, 1_000.0, 5_000.0, 1e9]
    for i, duration in enumerate(durations * 20):
        monitor.record("a", success=i % 7 != 0, duration_ms=duration)
    monitor.record("b", success=True, duration_ms=5.0)
    monitor.record("a", success=True, duration_ms=5.0, source="verification")
    monitor.flush()
    with store.transaction() as conn:
        live = conn.execute("SELECT * FROM run_series ORDER BY agent, bucket").fetchall()
        totals = conn.execute("SELECT agent, runs, failures FROM run_totals").fetchall()
        conn.execute("DROP TABLE run_series")
        conn.execute("DROP TABLE run_totals")
        for statement in _split_sql(MIGRATIONS[0]):
            conn.execute(statement)
        backfilled = conn.execute("SELECT * FROM run_series ORDER BY agent, bucket").fetchall()
    assert live == backfilled
    assert sorted(totals) == [("a", 200, 29), ("b", 1, 0)]  # verification runs left out
    for raw_runs in (0, 10_000):  # from the buckets, and from the runs themselves
        series = read_series(store, raw_runs=raw_runs)
        assert sum(p.runs for p in series["a"]) == 200
        assert sum(p.failures for p in series["a"]) == 29
    monitor.close()
    store.close()


def test_a_quantile_from_the_histogram_is_within_its_bin() -> None:
    bins = [0] * DURATION_BINS
    # 100 runs at 300 ms: bin of 300 ms is [2**(32/4), 2**(33/4)) = [256, 304.4)
    bins[33] = 100
    p95 = duration_quantile(bins, 0.95)
    assert 256.0 <= p95 < 304.5
    assert duration_quantile([0] * DURATION_BINS, 0.95) == 0.0


def test_opening_an_old_store_backfills_its_series(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = Store(path)
    monitor = PerformanceMonitor(store)
    for i in range(50):
        monitor.record("a", success=i % 5 != 0, duration_ms=100.0)
    monitor.close()
    with store.transaction() as conn:  # as a store written before the series existed
        conn.execute("DROP TABLE run_series")
        conn.execute("DROP TABLE run_totals")
        conn.execute("DROP TABLE run_rollups")
        conn.execute("DELETE FROM schema_versions WHERE component = 'run_series'")
    store.close()
    reopened = Store(path)
    PerformanceMonitor(reopened).close()
    assert sum(p.runs for p in read_series(reopened, raw_runs=0)["a"]) == 50
    with reopened.transaction() as conn:
        rollups = conn.execute("SELECT width, SUM(runs) FROM run_rollups GROUP BY width")
        assert dict(rollups.fetchall()) == dict.fromkeys(ROLLUP_WIDTHS, 50)
    reopened.close()


# -- status -------------------------------------------------------------------------------------


def test_status_json_has_a_schema_and_counts_every_run(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    code, out, _ = run_cli(capsys, "status", "--workspace", str(workspace), "--json")
    assert code == EXIT_OK
    report = json.loads(out)
    assert report["schema"] == STATUS_SCHEMA
    counted = _executions(workspace)
    assert {a["agent"]: (a["runs"], a["failures"]) for a in report["agents"]} == counted
    for agent in report["agents"]:
        assert set(agent) >= {"success_rate", "recent", "baseline", "warming_up", "detector"}
        assert agent["recent"]["p95_ms"] > 0
        assert agent["warming_up"] == (agent["baseline"]["runs"] < agent["baseline"]["needed"])
    # the baseline's fill, from the writer's counter, equals a count of the runs themselves
    with sqlite3.connect(workspace / "agentmend.db") as conn:
        for agent in report["agents"]:
            (epoch,) = conn.execute(
                "SELECT COALESCE(MAX(epoch), 0) FROM baseline_epochs"
                " WHERE agent = ? AND status = 'active'",
                (agent["agent"],),
            ).fetchone()
            segments = conn.execute(
                "SELECT start_id, end_id FROM baseline_segments WHERE agent = ? AND epoch = ?",
                (agent["agent"], epoch),
            ).fetchall() or [(0, None)]
            runs = sum(
                conn.execute(
                    "SELECT COUNT(*) FROM executions WHERE agent = ? AND source = 'run'"
                    " AND id > ? AND id <= ?",
                    (agent["agent"], start, end if end is not None else 2**62),
                ).fetchone()[0]
                for start, end in segments
            )
            needed = agent["baseline"]["needed"]
            assert agent["baseline"]["runs"] == min(needed, runs), agent["agent"]
    assert report["warming_up"] == [a["agent"] for a in report["agents"] if a["warming_up"]]


def test_status_as_a_table(capsys: pytest.CaptureFixture[str], workspace: Path) -> None:
    code, out, _ = run_cli(capsys, "status", "--workspace", str(workspace))
    assert code == EXIT_OK
    assert "research-agent" in out
    assert "p95 ms" in out


@pytest.mark.parametrize("command", ["status", "report", "serve"])
@pytest.mark.parametrize("kind", ["missing", "file", "no store"])
def test_an_unavailable_workspace_exits_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, kind: str
) -> None:
    target = tmp_path / "ws"
    if kind == "file":
        target.write_text("x")
    elif kind == "no store":
        target.mkdir()
    code, _out, err = run_cli(capsys, command, "--workspace", str(target))
    assert code == EXIT_UNAVAILABLE
    assert err.startswith("agentmend: workspace ")
    assert len(err.strip().splitlines()) == 1
    assert not (target / "agentmend.db").exists()


# -- show ---------------------------------------------------------------------------------------


def _changes(capsys: pytest.CaptureFixture[str], workspace: Path) -> list[dict[str, object]]:
    run_cli(capsys, "history", "--workspace", str(workspace), "--json")
    main(["history", "--workspace", str(workspace), "--json"])
    changes: list[dict[str, object]] = json.loads(capsys.readouterr().out)["changes"]
    return changes


def test_show_gives_the_diff_gates_scores_and_audit_of_a_change(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    kept = next(c for c in _changes(capsys, workspace) if c["status"] == "kept")
    code, out, _ = run_cli(
        capsys, "show", str(kept["change_id"]), "--workspace", str(workspace), "--json"
    )
    assert code == EXIT_OK
    shown = json.loads(out)
    assert shown["change"]["change_id"] == kept["change_id"]
    assert shown["cycle_id"]
    assert "max_tokens" in shown["diff"] or "timeout_s" in shown["diff"]
    assert shown["gates"]
    assert all(g["passed"] for g in shown["gates"])
    assert shown["verification"]["accepted"] is True
    assert shown["audit"]
    code, out, _ = run_cli(capsys, "show", str(kept["change_id"]), "--workspace", str(workspace))
    assert code == EXIT_OK
    assert "verification: score" in out
    assert "gate " in out


def test_show_of_an_unknown_change_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    code, out, err = run_cli(capsys, "show", "nope", "--workspace", str(workspace))
    assert code == EXIT_USAGE
    assert out == ""
    assert "unknown change id 'nope'" in err


# -- improve ------------------------------------------------------------------------------------


def test_improve_shows_each_step_as_plain_lines_off_a_terminal(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentmend.faces.cli",
            "improve",
            "research-agent",
            "--workspace",
            str(fresh_demo_workspace(tmp_path / "ws")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NO_COLOR": "1"},
    )
    # a healthy simulated agent: nothing is changed, and nothing is left open (exit 0). Either
    # its suite passes before any change, or the evidence since its last kept fix (the demo's)
    # shows nothing a change could cure: the errors from before that fix are history
    assert result.returncode == EXIT_OK, result.stdout[-2000:] + result.stderr
    last = result.stdout.splitlines()[-1]
    assert "no_action" in last or "not_reproduced" in last or "passes" in result.stdout
    assert "kept" not in result.stdout.splitlines()[-1]
    assert "\x1b[" not in result.stdout  # no terminal control codes in a pipe


def test_improve_of_an_unknown_agent_names_the_agents(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    code, _, err = run_cli(capsys, "improve", "nobody", "--workspace", str(workspace))
    assert code == EXIT_USAGE
    assert "nobody" in err
    assert "research-agent" in err


# -- report -------------------------------------------------------------------------------------


def test_the_report_is_one_self_contained_file_with_every_section(
    capsys: pytest.CaptureFixture[str], workspace: Path, tmp_path: Path
) -> None:
    target = tmp_path / "report.html"
    code, _out, err = run_cli(capsys, "report", "--workspace", str(workspace), "-o", str(target))
    assert code == EXIT_OK, err
    page = target.read_text(encoding="utf-8")
    # nothing loaded from anywhere: no external src/href, no @import, no url(http
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page
    assert "url(" not in page
    agents = _executions(workspace)
    for agent in agents:
        assert f'<div class="agent-chart" data-agent="{agent}">' in page
    assert page.count("<svg") == len(agents)
    # beneath each chart, the detector's statistic: its peak as the store keeps it
    with sqlite3.connect(workspace / "agentmend.db") as conn:
        peaks = conn.execute(
            "SELECT agent, kind, MAX(peak) FROM detector_series WHERE width = 0 GROUP BY 1, 2"
        ).fetchall()
    assert {agent for agent, _, _ in peaks} == set(agents)
    assert any(peak == 1.0 for _, _, peak in peaks)  # the demo's faults raised alarms
    for agent, kind, peak in peaks:
        chart = page[page.index(f'<div class="agent-chart" data-agent="{agent}">') :]
        chart = chart[: chart.index("</svg>")]
        assert f'<g class="statistic" data-kind="{kind}"' in chart
        assert f'data-peak="{peak:.4f}"' in chart[chart.index(f'data-kind="{kind}"') :]
    assert 'data-status="kept"' in page
    assert 'data-status="rolled_back"' in page
    assert page.count('<section class="cycle"') >= 3
    assert "audit chain verified" in page
    summary = json.loads(re.search(r"id='summary'>(.*?)</script>", page).group(1))  # type: ignore[union-attr]
    assert summary["audit_verified"] is True
    with sqlite3.connect(workspace / "agentmend.db") as conn:
        audit_rows = conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()[0]
    assert summary["audit_rows_checked"] == audit_rows  # the whole chain, not the rows shown
    assert summary["agents"] == len(agents)


def test_cycles_beyond_the_latest_are_a_table_row_each(
    capsys: pytest.CaptureFixture[str], workspace: Path, tmp_path: Path
) -> None:
    target = tmp_path / "report.html"
    args = ["report", "--workspace", str(workspace), "-o", str(target), "--cycles", "1"]
    code, _out, err = run_cli(capsys, *args)
    assert code == EXIT_OK, err
    page = target.read_text(encoding="utf-8")
    with sqlite3.connect(workspace / "agentmend.db") as conn:
        finished = conn.execute(
            "SELECT json_extract(payload, '$.cycle_id'), json_extract(payload, '$.data.status') "
            "FROM decisions WHERE kind = 'cycle.cycle_finished' ORDER BY id DESC"
        ).fetchall()
    assert len(finished) >= 3
    assert page.count('<section class="cycle"') == 1
    assert f'id="cycle-{finished[0][0]}"' in page  # the newest in full
    table = page[page.index("<table id='older-cycles'>") :]
    table = table[: table.index("</table>")]
    assert table.count("<tr") == len(finished)  # the header and one row per older cycle
    for cycle_id, status in finished[1:]:
        row = table[table.index(cycle_id) :]
        assert row[: row.index("</tr>")].endswith(f"<td>{status}</td>")


def test_the_report_marks_a_tampered_audit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ws = demo_workspace(tmp_path / "ws")
    with sqlite3.connect(ws / "agentmend.db") as conn:
        conn.execute("UPDATE audit_log SET new_value = 'forged' WHERE id = 1")
    target = tmp_path / "r.html"
    code, _, _ = run_cli(capsys, "report", "--workspace", str(ws), "-o", str(target))
    assert code == EXIT_OK
    assert "audit chain does NOT verify" in target.read_text(encoding="utf-8")


def test_report_into_a_folder_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], workspace: Path, tmp_path: Path
) -> None:
    code, _, err = run_cli(capsys, "report", "--workspace", str(workspace), "-o", str(tmp_path))
    assert code == EXIT_USAGE
    assert "is a folder" in err


# -- serve --------------------------------------------------------------------------------------


def start_server(workspace: Path, port: int = 0) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentmend.faces.cli",
            "serve",
            "--workspace",
            str(workspace),
            "--port",
            str(port),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
    if match is None:
        process.kill()
        process.wait(timeout=10)
        pytest.fail(
            f"serve did not start: {line!r} {process.stderr.read() if process.stderr else ''}"
        )
    return process, match.group(1)


def stop_server(process: subprocess.Popen[str]) -> None:
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_serve_shows_the_page_read_only_and_new_runs_appear(tmp_path: Path) -> None:
    ws = demo_workspace(tmp_path / "ws")
    process, url = start_server(ws)
    try:
        page = _get(url)
        assert "research-agent" in page
        assert "fetch('/main'" in page
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x"), timeout=10)
        assert refused.value.code == 405
        refused.value.close()
        before = _get(url + "main")
        store = Store(ws / "agentmend.db")
        monitor = PerformanceMonitor(store)
        monitor.record("a-new-agent", success=True, duration_ms=12.0)
        monitor.close()
        store.close()
        after = _get(url + "main")
        assert "a-new-agent" not in before
        assert "a-new-agent" in after
    finally:
        stop_server(process)


def test_serve_on_a_taken_port_is_one_line(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run_cli(capsys, "serve", "--workspace", str(workspace), "--port", str(port))
    assert code == EXIT_USAGE
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("port", ["70000", "-5"])
def test_serve_on_a_port_that_cannot_be_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], workspace: Path, port: str
) -> None:
    code, _, err = run_cli(capsys, "serve", "--workspace", str(workspace), "--port", port)
    assert code == EXIT_USAGE
    assert err == f"agentmend: --port {port}: a port is 0 to 65535 (0 picks a free one)\n"


def test_a_usage_error_is_one_line_under_python_m_too(workspace: Path, tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    command = [sys.executable, "-m", "agentmend.faces.cli", "report", "--cycles", "-1"]
    result = subprocess.run(
        [*command, "--workspace", str(workspace), "-o", str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_USAGE
    assert result.stderr == "agentmend: --cycles must be 0 or more\n"
    assert not target.exists()


def test_serve_renders_again_only_when_the_store_or_the_audit_head_changed() -> None:
    versions = iter([1, 1, 2, 2, 3])
    page = LatestPage(lambda: f"page {page.renderings}", lambda: next(versions))
    assert [page() for _ in range(5)] == ["page 0", "page 0", "page 1", "page 1", "page 2"]
    assert page.renderings == 3


def test_serve_shows_a_tampered_audit_at_once(tmp_path: Path) -> None:
    ws = demo_workspace(tmp_path / "ws")
    process, url = start_server(ws)
    try:
        assert "audit chain verified" in _get(url + "main")
        assert _get(url + "main").count("audit chain verified") == 1  # served again as it was
        with sqlite3.connect(ws / "agentmend.db") as conn:
            original = conn.execute("SELECT new_value FROM audit_log WHERE id = 1").fetchone()[0]
            conn.execute("UPDATE audit_log SET new_value = 'forged' WHERE id = 1")
        conn.close()
        assert "audit chain does NOT verify" in _get(url + "main")
        with sqlite3.connect(ws / "agentmend.db") as conn:
            conn.execute("UPDATE audit_log SET new_value = ? WHERE id = 1", (original,))
        conn.close()
        assert "audit chain verified" in _get(url + "main")
        head = ws / "agentmend.db.audit-head"
        head.write_bytes(b"x" * len(head.read_bytes()))  # the head file alone, same size
        assert "audit chain does NOT verify" in _get(url + "main")
    finally:
        stop_server(process)


def test_report_open_says_so_when_no_browser_opens(tmp_path: Path) -> None:
    ws = demo_workspace(tmp_path / "ws")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["BROWSER"] = "/bin/false"  # the only browser there is, and it fails
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentmend.faces.cli",
            "report",
            "--open",
            "--workspace",
            str(ws),
            "-o",
            str(tmp_path / "page.html"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == EXIT_OK, result.stderr
    assert "no browser could be opened here; open file://" in result.stdout
    assert (tmp_path / "page.html").is_file()
