"""A monitor pushed past what its store can write stays bounded, and says what it could not keep.

Real overload: threads calling ``record()`` in tight loops against a real SQLite store, the
process's resident memory sampled from ``/proc``; a real child process whose exit hook meets
its deadline with a backlog it cannot write in time.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from log_capture import captured_records
from tiny_project import PYTEST, make_project

from agentmend.faces.mcp.tools import AgentmendTools
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.errors import ConfigurationError, StoreError
from agentmend.infrastructure.monitoring.performance_monitor import (
    MonitorClosed,
    PerformanceMonitor,
)
from agentmend.infrastructure.settings import InvalidSetting, Settings, load_settings
from agentmend.infrastructure.store.api import Store

_ROOT = Path(__file__).resolve().parents[3]
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0])


def _hammer(monitor: PerformanceMonitor, runs: int, threads: int) -> list[int]:
    """``threads`` threads each calling record() ``runs`` times as fast as they can; returns
    how many calls each made (every call returns: a refused run is not an exception)."""
    made = [0] * threads

    def loop(slot: int) -> None:
        record = monitor.record
        for _ in range(runs):
            record("solver", success=True, duration_ms=12.5)
        made[slot] = runs

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    return made


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc to sample RSS")
def test_an_overloaded_monitor_stays_under_its_bound_and_its_counts_add_up(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    limit = 20_000
    monitor = PerformanceMonitor(Store(db), max_backlog=limit, backlog_policy="drop")
    samples: list[int] = []
    pending: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(_rss_bytes())
            pending.append(monitor.backlog_status().pending)
            time.sleep(0.01)

    before = _rss_bytes()
    sampler = threading.Thread(target=sample)
    sampler.start()
    with captured_records("agentmend", logging.WARNING) as logs:
        made = _hammer(monitor, 400_000, threads=2)
        stop.set()
        sampler.join()
        left = monitor.close(timeout_s=60)
    recorded = sum(made)
    status = monitor.backlog_status()
    assert left == 0
    # Nothing vanished: every call is either stored or counted as refused.
    assert _rows(db) + status.refused == recorded == 800_000
    assert status.refused > 0  # the store cannot take 800k runs at the rate they came
    # The backlog never went past its bound (a few runs of slack per racing thread) ...
    assert max(pending) <= limit + 2
    # ... and neither did memory: the 800k runs as tuples would take well over 100 MB.
    assert max(samples) - before < 60 * 1024 * 1024
    events = [getattr(record, "event", None) for record in logs]
    assert "record_backlog_full" in events  # said once when the episode started
    assert events.count("record_backlog_full") <= events.count("record_backlog_recovered") + 1


def test_waiting_for_room_keeps_every_run_at_the_rate_the_writer_sustains(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    limit = 5_000
    # A generous wait: the writer always makes room in time, so nothing may be refused.
    monitor = PerformanceMonitor(Store(db), max_backlog=limit, backlog_wait_s=30.0)
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(monitor.backlog_status().pending)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    made = _hammer(monitor, 60_000, threads=3)
    stop.set()
    sampler.join()
    assert monitor.close(timeout_s=60) == 0
    status = monitor.backlog_status()
    assert status.refused == 0
    assert _rows(db) == sum(made) == 180_000
    assert max(seen) <= limit + 3
    metrics = PerformanceMonitor(Store(db)).get_agent_metrics("solver")
    assert metrics is not None
    assert metrics.executions == 180_000


def test_a_full_backlog_over_a_failing_store_refuses_at_once_and_keeps_what_it_holds(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    monitor = PerformanceMonitor(
        Store(db), max_backlog=50, backlog_wait_s=30.0, flush_interval_s=3600
    )
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TRIGGER fail_inserts BEFORE INSERT ON executions"
            " BEGIN SELECT RAISE(FAIL, 'disk is full'); END"
        )
    for _ in range(50):
        monitor.record("a", success=True, duration_ms=1.0)
    with pytest.raises(StoreError):
        monitor.flush()
    started = time.monotonic()
    for _ in range(10):  # the store is failing: waiting cannot help, so no 30 s waits
        monitor.record("a", success=True, duration_ms=1.0)
    assert time.monotonic() - started < 10.0
    status = monitor.backlog_status()
    assert (status.pending, status.refused) == (50, 10)
    assert status.write_error is not None
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER fail_inserts")
    assert monitor.close() == 0
    assert _rows(db) == 50


@pytest.mark.slow
def test_close_meets_its_deadline_with_a_huge_backlog_and_says_what_is_left(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    runs = 400_000
    monitor = PerformanceMonitor(
        Store(db), max_backlog=1_000_000, flush_interval_s=3600, flush_max_batch=10_000_000
    )
    for _ in range(runs):
        monitor.record("a", success=True, duration_ms=1.0)
    with captured_records("agentmend", logging.WARNING) as logs:
        left = monitor.close(timeout_s=0.2)
    stored = _rows(db)
    assert left > 0
    assert stored + left == runs  # written in committed batches: nothing half-written
    assert monitor.backlog_status().unwritten_at_close == left
    said = [r for r in logs if getattr(r, "event", None) == "close_deadline_passed"]
    assert getattr(said[0], "runs_unwritten", None) == left
    with pytest.raises(MonitorClosed):
        monitor.record("a", success=True, duration_ms=1.0)
    assert monitor.close(timeout_s=120) == 0  # what was left is kept and written later
    assert _rows(db) == runs


def test_the_exit_hook_gives_up_at_its_deadline_and_logs_the_runs_lost(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    runs = 600_000
    script = (
        "import time\n"
        "from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor\n"
        "from agentmend.infrastructure.store.api import Store\n"
        f"m = PerformanceMonitor(Store({str(db)!r}), max_backlog=10_000_000,"
        " flush_interval_s=3600, flush_max_batch=10_000_000, close_timeout_s=0.3)\n"
        f"for _ in range({runs}):\n"
        "    m.record('a', success=True, duration_ms=1.0)\n"
        "print('exiting', time.monotonic(), flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=_ROOT,
        env={**os.environ, "PYTHONPATH": str(_ROOT)},
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    finished = time.monotonic()
    exiting = float(done.stdout.split()[1])
    assert finished - exiting < 10.0  # writing all 600k runs would take longer than that
    assert "close_monitor_runs_lost" in done.stderr
    lost = int(done.stderr.split("runs_lost=")[1].split()[0])
    assert lost > 0
    assert _rows(db) + lost == runs


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_backlog", 0),
        ("backlog_policy", "block"),
        ("backlog_wait_s", -1.0),
        ("close_timeout_s", -1.0),
    ],
)
def test_a_bad_backlog_setting_is_a_named_configuration_error(option: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=option):
        PerformanceMonitor(**{option: value})  # type: ignore[arg-type]


async def test_the_mcp_status_shows_the_runs_refused_by_a_full_backlog(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj")
    settings = Settings(test_command=PYTEST, max_record_backlog=10, record_backlog_policy="drop")
    tools = AgentmendTools(project / ".agentmend", project_root=project, settings=settings)
    try:
        monitor = tools.workspace().monitor
        made = _hammer(monitor, 20_000, threads=1)
        refused = monitor.backlog_status().refused
        assert 0 < refused < sum(made)
        shown = await tools.status()
    finally:
        await tools.aclose()
    assert shown.data["refusedRuns"] == refused
    assert f"Runs refused because the record backlog was full: {refused}" in shown.text


def test_the_backlog_settings_reach_the_monitor_a_workspace_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTMEND_MAX_RECORD_BACKLOG", "7")
    monkeypatch.setenv("AGENTMEND_RECORD_BACKLOG_POLICY", "drop")
    monkeypatch.setenv("AGENTMEND_CLOSE_TIMEOUT_S", "3")
    folder = tmp_path / "ws"
    with Workspace.open(folder, settings=load_settings(workspace=folder), create=True) as opened:
        status = opened.monitor.backlog_status()
        assert (status.limit, status.policy) == (7, "drop")
        assert opened.monitor.close_timeout_s == 3.0
    monkeypatch.setenv("AGENTMEND_RECORD_BACKLOG_POLICY", "block")
    with pytest.raises(InvalidSetting) as caught:
        load_settings()
    assert caught.value.setting == "AGENTMEND_RECORD_BACKLOG_POLICY"
