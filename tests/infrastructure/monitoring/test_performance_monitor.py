"""PerformanceMonitor: recording, tracking, metrics, durability, refresh and baselines."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentmend.infrastructure.monitoring.performance_monitor as performance_monitor
from agentmend.infrastructure.errors import ConfigurationError, StoreError
from agentmend.infrastructure.models import ExecutionRecord
from agentmend.infrastructure.monitoring import agent_window, record_backlog, run_feed, run_tracker
from agentmend.infrastructure.monitoring.performance_monitor import (
    InvalidExecution,
    MonitorClosed,
    PerformanceMonitor,
)
from agentmend.infrastructure.store.api import Store


@pytest.fixture
def monitor() -> Iterator[PerformanceMonitor]:
    m = PerformanceMonitor(window=5, baseline_n=4)
    yield m
    m.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "agentmend.db"


def _rows(path: Path, where: str = "1") -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM executions WHERE {where}").fetchone()[0])


# --------------------------------------------------------------------------- public names


def test_public_names_are_served_from_the_monitor_module() -> None:
    # The parts live in their own modules; every name callers import from here must still work.
    homes = {
        "Baseline": agent_window,
        "log_duration": agent_window,
        "RUN": agent_window,
        "VERIFICATION": agent_window,
        "SOURCES": agent_window,
        "EventCursor": run_feed,
        "RunChunk": run_feed,
        "Tracker": run_tracker,
        "BacklogStatus": record_backlog,
    }
    for name, home in homes.items():
        assert getattr(performance_monitor, name) is getattr(home, name), name
    assert set(performance_monitor.__all__) == {
        *homes,
        "InvalidExecution",
        "MonitorClosed",
        "PerformanceMonitor",
        "monitor_options",
    }


# --------------------------------------------------------------------------- metrics


def test_metrics_window_and_lifetime_fields(monitor: PerformanceMonitor) -> None:
    durations = [100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0]
    outcomes = [True, False, True, True, False, False, True]
    for i, (d, ok) in enumerate(zip(durations, outcomes, strict=True)):
        monitor.record(
            "writer",
            success=ok,
            duration_ms=d,
            error=None if ok else f"err{i}",
            input_tokens=10,
            output_tokens=2,
            cost_usd=0.5,
        )
    m = monitor.get_agent_metrics("writer")
    assert m is not None
    # lifetime
    assert (m.executions, m.successes, m.failures) == (7, 4, 3)
    assert (m.input_tokens, m.output_tokens) == (70, 14)
    assert m.cost_usd == pytest.approx(3.5)
    # window = last 5 runs: 300..700, outcomes T T F F T
    assert m.success_rate == pytest.approx(0.6)
    assert m.recent_outcomes == (True, True, False, False, True)
    assert m.error_rate == pytest.approx(0.4)
    assert m.avg_duration_ms == pytest.approx(500.0)
    assert m.p95_duration_ms == 700.0
    assert m.consecutive_failures == 0
    assert m.last_error == "err5"
    assert m.recent_errors == ("err1", "err4", "err5")
    # baseline = first 4 runs
    assert m.baseline_avg_duration_ms == pytest.approx(250.0)


def test_consecutive_failures_recent_errors_bounded(monitor: PerformanceMonitor) -> None:
    for i in range(13):
        monitor.record("a", success=False, duration_ms=1.0, error=f"e{i}")
    m = monitor.get_agent_metrics("a")
    assert m is not None
    assert m.consecutive_failures == 13
    assert m.recent_errors == tuple(f"e{i}" for i in range(3, 13))
    assert monitor.get_agent_metrics("missing") is None
    assert list(monitor.get_metrics()) == ["a"]
    assert monitor.agents() == ["a"]


def test_record_accepts_an_execution_record(monitor: PerformanceMonitor) -> None:
    monitor.record(
        ExecutionRecord(agent_name="r", success=False, duration_ms=12.5, error="x", cost_usd=1.0)
    )
    m = monitor.get_agent_metrics("r")
    assert m is not None
    assert (m.executions, m.failures, m.last_error, m.cost_usd) == (1, 1, "x", 1.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"success": True, "duration_ms": -1.0}, "duration_ms"),
        ({"success": True, "duration_ms": math.nan}, "duration_ms"),
        ({"success": True, "duration_ms": "5"}, "duration_ms"),
        ({"duration_ms": 5.0}, "success"),
        ({"success": True, "duration_ms": 5.0, "input_tokens": -3}, "input_tokens"),
        ({"success": True, "duration_ms": 5.0, "cost_usd": -0.1}, "cost_usd"),
        ({"success": True, "duration_ms": 5.0, "source": "prod"}, "source"),
    ],
)
def test_bad_input_is_refused_and_names_the_field(
    monitor: PerformanceMonitor, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidExecution, match=field):
        monitor.record("a", **kwargs)  # type: ignore[call-overload]
    assert monitor.get_metrics() == {}


def test_bad_agent_name_and_bad_object(monitor: PerformanceMonitor) -> None:
    with pytest.raises(InvalidExecution, match="agent_name"):
        monitor.record("", success=True, duration_ms=1.0)
    with pytest.raises(InvalidExecution, match="ExecutionRecord"):
        monitor.record(42)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="source"):
        monitor.get_metrics(source="nope")


def test_configuration_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="window"):
        PerformanceMonitor(window=0)
    with pytest.raises(ConfigurationError, match="flush_interval_s"):
        PerformanceMonitor(flush_interval_s=0)


def test_record_is_thread_safe(monitor: PerformanceMonitor) -> None:
    threads, per_thread = 8, 5000

    def work(t: int) -> None:
        for i in range(per_thread):
            monitor.record(f"agent{t % 2}", success=i % 10 != 0, duration_ms=float(i))
            if i % 1000 == 0:
                monitor.get_metrics()  # readers drain concurrently with writers

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    metrics = monitor.get_metrics()
    assert sum(m.executions for m in metrics.values()) == threads * per_thread
    assert sum(m.failures for m in metrics.values()) == threads * per_thread // 10
    assert metrics["agent0"].executions == metrics["agent1"].executions


# --------------------------------------------------------------------------- track


def test_track_context_manager_records_success_usage_and_handled_failure(
    monitor: PerformanceMonitor,
) -> None:
    with monitor.track("t", task="sum") as run:
        run.set_usage(input_tokens=5, output_tokens=7, cost_usd=0.25)
    with monitor.track("t") as run:
        run.fail("returned an empty answer")
    m = monitor.get_agent_metrics("t")
    assert m is not None
    assert (m.executions, m.failures, m.input_tokens, m.output_tokens) == (2, 1, 5, 7)
    assert m.last_error == "returned an empty answer"
    assert m.avg_duration_ms >= 0.0


def test_track_records_an_exception_as_failure_and_reraises(monitor: PerformanceMonitor) -> None:
    with pytest.raises(ValueError, match="bad input"), monitor.track("t"):
        raise ValueError("bad input")
    m = monitor.get_agent_metrics("t")
    assert m is not None
    assert (m.executions, m.failures, m.last_error) == (1, 1, "ValueError: bad input")


def test_track_as_sync_decorator(monitor: PerformanceMonitor) -> None:
    @monitor.track("deco")
    def work(x: int) -> int:
        if x < 0:
            raise RuntimeError("negative")
        return x * 2

    assert work(3) == 6
    assert work.__name__ == "work"
    with pytest.raises(RuntimeError):
        work(-1)
    m = monitor.get_agent_metrics("deco")
    assert m is not None
    assert (m.executions, m.failures, m.last_error) == (2, 1, "RuntimeError: negative")


async def test_track_as_async_decorator_and_context_manager(monitor: PerformanceMonitor) -> None:
    @monitor.track("async")
    async def work(x: int) -> int:
        await asyncio.sleep(0)
        if x < 0:
            raise KeyError("k")
        return x + 1

    assert await work(1) == 2
    with pytest.raises(KeyError):
        await work(-1)
    async with monitor.track("async"):
        await asyncio.sleep(0)
    m = monitor.get_agent_metrics("async")
    assert m is not None
    assert (m.executions, m.failures) == (3, 1)
    assert m.last_error is not None
    assert m.last_error.startswith("KeyError")


async def test_cancellation_is_not_recorded(monitor: PerformanceMonitor) -> None:
    @monitor.track("c")
    async def hang() -> None:
        await asyncio.sleep(3600)

    task = asyncio.create_task(hang())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert monitor.get_agent_metrics("c") is None


# --------------------------------------------------------------------------- verification


def test_verification_runs_are_apart(db: Path) -> None:
    with PerformanceMonitor(Store(db), baseline_n=2) as m:
        m.record("a", success=True, duration_ms=10.0)
        m.record("a", success=False, duration_ms=99.0, source="verification")
        with m.track("a", source="verification"):
            pass
        run = m.get_agent_metrics("a")
        ver = m.get_agent_metrics("a", source="verification")
        assert run is not None
        assert ver is not None
        assert (run.executions, run.failures) == (1, 0)
        assert (ver.executions, ver.failures) == (2, 1)
        assert ver.baseline_avg_duration_ms is None
        baseline = m.baseline("a")
        assert baseline is not None
        assert baseline.n == 1
    assert _rows(db, "source = 'verification'") == 2
    with PerformanceMonitor(Store(db)) as again:
        reloaded = again.get_agent_metrics("a", source="verification")
        assert reloaded is not None
        assert reloaded.executions == 2
        run_again = again.get_agent_metrics("a")
        assert run_again is not None
        assert run_again.executions == 1


# --------------------------------------------------------------------------- durability


def test_every_extra_is_stored_as_json_a_reader_parses_whatever_it_holds(db: Path) -> None:
    class Odd:
        def __str__(self) -> str:
            return "odd one"

    extras = [
        {"text": "café \u2603", "n": 10**30, "ratio": 0.25, "flag": False, "none": None},
        {"lone": "a\ud800b", "nul": "x\x00y"},  # refused by the fast encoder, and by jsonb raw
        {"nan": math.nan, "inf": math.inf},
        {"object": Odd(), "nested": {"list": [1, (2, 3)]}},
        {2: "two", "b": "mixed keys"},
        {2: "a\ud800", "b": "mixed keys, and a value only json writes"},
    ]
    with PerformanceMonitor(Store(db)) as m:
        for extra in extras:
            m.record("a", success=True, duration_ms=1.0, e=extra)
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT extra FROM executions ORDER BY id").fetchall()
    stored = [json.loads(row[0]) for row in rows]
    assert stored[0] == {"e": extras[0]}
    assert stored[1]["e"]["lone"] == "a\\ud800b"  # shown escaped: no store takes it raw
    assert stored[1]["e"]["nul"] == "x\\x00y"
    assert stored[2] == {"e": {"nan": None, "inf": None}}  # not JSON: stored as null
    assert stored[3] == {"e": {"object": "odd one", "nested": {"list": [1, [2, 3]]}}}
    assert stored[4] == {"e": {"2": "two", "b": "mixed keys"}}
    assert stored[5]["e"] == {"2": "a\\ud800", "b": "mixed keys, and a value only json writes"}


def test_an_extra_no_json_can_hold_is_refused_by_name_and_the_rest_is_stored(db: Path) -> None:
    cycle: dict[str, object] = {}
    cycle["self"] = cycle
    deep: object = "bottom"
    for _ in range(5_000):
        deep = {"a": deep}
    with PerformanceMonitor(Store(db)) as m:
        for bad in (cycle, deep):
            with pytest.raises(InvalidExecution, match="extra cannot be stored as JSON"):
                m.record("a", success=True, duration_ms=1.0, bad=bad)
        m.record("a", success=True, duration_ms=2.0, fine={(1, 2): "a tuple key"})
    assert _rows(db) == 1


def test_metrics_survive_close_and_reopen(db: Path) -> None:
    m = PerformanceMonitor(Store(db), window=3, baseline_n=2)
    for i in range(5):
        m.record(
            "a",
            success=i != 4,
            duration_ms=10.0 * (i + 1),
            error=None if i != 4 else "boom",
            input_tokens=1,
            cost_usd=0.1,
            note={"i": i},
        )
    before = m.get_agent_metrics("a")
    m.close()
    m.close()  # idempotent
    with pytest.raises(MonitorClosed):
        m.record("a", success=True, duration_ms=1.0)
    assert _rows(db) == 5
    with PerformanceMonitor(Store(db), window=3, baseline_n=2) as reopened:
        after = reopened.get_agent_metrics("a")
    assert before is not None
    assert after is not None
    assert after.model_dump() == before.model_dump()
    with sqlite3.connect(db) as conn:
        extra = conn.execute("SELECT extra FROM executions ORDER BY id LIMIT 1").fetchone()[0]
    assert json.loads(extra) == {"note": {"i": 0}}


def test_flush_makes_runs_durable_and_batches_them(db: Path) -> None:
    with PerformanceMonitor(Store(db), flush_interval_s=3600) as m:
        for _ in range(50):
            m.record("a", success=True, duration_ms=1.0)
        m.flush()
        assert _rows(db) == 50


def test_flusher_writes_on_batch_size_without_being_asked(db: Path) -> None:
    with PerformanceMonitor(Store(db), flush_interval_s=3600, flush_max_batch=20) as m:
        for _ in range(20):
            m.record("a", success=True, duration_ms=1.0)
        deadline = time.monotonic() + 10.0
        while _rows(db) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _rows(db) == 20


def test_refresh_sees_other_handles_rows_without_double_counting(db: Path) -> None:
    a = PerformanceMonitor(Store(db), baseline_n=3)
    b = PerformanceMonitor(Store(db), baseline_n=3)
    try:
        for _ in range(4):
            a.record("x", success=True, duration_ms=10.0)
        a.flush()
        assert b.get_agent_metrics("x") is None
        assert b.refresh() == 4
        assert b.refresh() == 0
        b.record("x", success=False, duration_ms=20.0, error="b-fail")
        b.flush()
        assert b.refresh() == 0  # its own row is not read back
        mb = b.get_agent_metrics("x")
        assert mb is not None
        assert (mb.executions, mb.failures) == (5, 1)
        assert a.refresh() == 1
        ma = a.get_agent_metrics("x")
        assert ma is not None
        assert (ma.executions, ma.failures, ma.last_error) == (5, 1, "b-fail")
        assert a.refresh() == 0
        assert _rows(db) == 5
    finally:
        a.close()
        b.close()
    with PerformanceMonitor(Store(db)) as reopened:
        total = reopened.get_agent_metrics("x")
    assert total is not None
    assert total.executions == 5


def test_in_memory_refresh_is_a_noop(monitor: PerformanceMonitor) -> None:
    monitor.record("a", success=True, duration_ms=1.0)
    assert monitor.refresh() == 0


# --------------------------------------------------------------------------- baselines


def _feed(m: PerformanceMonitor, agent: str, n: int, duration: float, ok: bool = True) -> None:
    for _ in range(n):
        m.record(agent, success=ok, duration_ms=duration)


def test_baseline_fills_freezes_and_is_replaced_and_restored(monitor: PerformanceMonitor) -> None:
    _feed(monitor, "a", 6, 100.0)
    base = monitor.baseline("a")
    assert base is not None
    assert base.frozen
    assert base.n == 4
    assert base.runs == 6
    _feed(monitor, "a", 3, 900.0)
    assert monitor.get_agent_metrics("a").baseline_avg_duration_ms == 100.0  # type: ignore[union-attr]
    fresh = monitor.start_new_baseline("a")
    assert fresh is monitor.baseline("a")
    assert fresh.n == 0
    assert not fresh.frozen
    _feed(monitor, "a", 2, 300.0)
    assert monitor.get_agent_metrics("a").baseline_avg_duration_ms == 300.0  # type: ignore[union-attr]
    restored = monitor.restore_baseline("a")
    assert restored is base
    assert monitor.get_agent_metrics("a").baseline_avg_duration_ms == 100.0  # type: ignore[union-attr]
    assert monitor.restore_baseline("a") is None  # nothing older


def test_baselines_persist_in_the_store(db: Path) -> None:
    with PerformanceMonitor(Store(db), baseline_n=3) as m:
        _feed(m, "a", 5, 100.0)
        m.start_new_baseline("a")
        _feed(m, "a", 2, 400.0)
    with PerformanceMonitor(Store(db), baseline_n=3) as m:
        base = m.baseline("a")
        assert base is not None
        assert base.n == 2
        assert base.avg_duration_ms == 400.0
        _feed(m, "a", 2, 500.0)  # fills the new baseline: 400, 400, 500
        assert m.baseline("a").frozen  # type: ignore[union-attr]
        restored = m.restore_baseline("a")
        assert restored is not None
        assert restored.frozen
        assert restored.avg_duration_ms == 100.0
    with PerformanceMonitor(Store(db), baseline_n=3) as m:
        base = m.baseline("a")
        assert base is not None
        assert base.avg_duration_ms == 100.0
        assert base.n == 3
        assert m.restore_baseline("a") is None


def test_refresh_adopts_a_baseline_another_process_started(db: Path) -> None:
    a = PerformanceMonitor(Store(db), baseline_n=3)
    b = PerformanceMonitor(Store(db), baseline_n=3)
    try:
        _feed(a, "x", 3, 100.0)
        a.flush()
        b.refresh()
        assert b.baseline("x").avg_duration_ms == 100.0  # type: ignore[union-attr]
        a.start_new_baseline("x")
        _feed(a, "x", 2, 700.0)
        a.flush()
        assert b.refresh() == 2
        base = b.baseline("x")
        assert base is not None
        assert base.n == 2
        assert base.avg_duration_ms == 700.0
    finally:
        a.close()
        b.close()


def test_detector_feed_is_bounded_and_counts_missed_runs() -> None:
    with PerformanceMonitor(detection_backlog=10, baseline_n=3) as m:
        cursor = m.subscribe()
        _feed(m, "a", 5, 1.0)
        chunks = m.read_chunks(cursor)
        assert sum(len(c.rows) for c in chunks) == 5
        assert chunks[0].start == 0
        assert chunks[0].baseline is m.baseline("a")
        for _ in range(35):  # one chunk per drain: many small chunks
            _feed(m, "a", 1, 1.0)
            m.get_metrics()
        seen = sum(len(c.rows) for c in m.read_chunks(cursor))
        assert 10 <= seen <= 20
        assert cursor.missed == 35 - seen
        assert m.read_chunks(cursor) == []
        late = m.subscribe()  # a late subscriber starts at the oldest retained run
        assert sum(len(c.rows) for c in m.read_chunks(late)) == seen


def test_store_backed_record_is_thread_safe_and_counted_once(db: Path) -> None:
    threads, per_thread = 4, 2000
    with PerformanceMonitor(Store(db), flush_max_batch=100) as m:

        def work(t: int) -> None:
            for i in range(per_thread):
                m.record(f"agent{t}", success=i % 4 != 0, duration_ms=1.0)

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        m.flush()
        assert _rows(db) == threads * per_thread
    with PerformanceMonitor(Store(db)) as again:
        metrics = again.get_metrics()
    assert sum(x.executions for x in metrics.values()) == threads * per_thread
    assert sum(x.failures for x in metrics.values()) == threads * per_thread // 4


def test_flusher_writes_on_age_without_being_asked(db: Path) -> None:
    with PerformanceMonitor(Store(db), flush_interval_s=0.05) as m:
        m.record("a", success=True, duration_ms=1.0)
        deadline = time.monotonic() + 10.0
        while _rows(db) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _rows(db) == 1


def test_runs_are_flushed_at_interpreter_exit(db: Path) -> None:
    script = (
        "from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor\n"
        "from agentmend.infrastructure.store.api import Store\n"
        f"m = PerformanceMonitor(Store({str(db)!r}), flush_interval_s=3600)\n"
        "for i in range(25):\n"
        "    m.record('a', success=True, duration_ms=1.0)\n"
    )
    root = Path(__file__).resolve().parents[3]
    subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=True,
        timeout=60,
    )
    assert _rows(db) == 25


_FAIL_INSERTS = (
    "CREATE TRIGGER fail_inserts BEFORE INSERT ON executions "
    "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
)


def _sql(path: Path, statement: str) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(statement)
    finally:
        conn.close()


def test_a_close_whose_write_failed_is_retried_by_the_next_close(db: Path) -> None:
    m = PerformanceMonitor(Store(db), flush_interval_s=3600)
    _sql(db, _FAIL_INSERTS)
    for _ in range(5):
        m.record("a", success=True, duration_ms=1.0)

    with pytest.raises(StoreError, match="5 runs"):
        m.close()
    with pytest.raises(MonitorClosed):  # closed all the same: no new runs pile up
        m.record("a", success=True, duration_ms=1.0)
    assert _rows(db) == 0

    _sql(db, "DROP TRIGGER fail_inserts")
    m.close()
    assert _rows(db) == 5
    m.close()  # everything written: nothing left to do
    assert _rows(db) == 5


@pytest.mark.parametrize("store_recovers", [True, False], ids=["recovers", "stays-broken"])
def test_the_exit_hook_retries_a_failed_close_and_logs_runs_it_loses(
    db: Path, store_recovers: bool
) -> None:
    script = (
        "import sqlite3\n"
        "from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor\n"
        "from agentmend.infrastructure.store.api import Store\n"
        f"db = {str(db)!r}\n"
        "m = PerformanceMonitor(Store(db), flush_interval_s=3600)\n"
        "conn = sqlite3.connect(db)\n"
        f"conn.execute({_FAIL_INSERTS!r}); conn.commit()\n"
        "for i in range(5):\n"
        "    m.record('a', success=True, duration_ms=1.0)\n"
        "try:\n"
        "    m.close()\n"
        "except Exception as exc:\n"
        "    print('first close failed:', type(exc).__name__)\n"
        f"if {store_recovers!r}:\n"
        "    conn.execute('DROP TRIGGER fail_inserts'); conn.commit()\n"
        "conn.close()\n"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    output = done.stdout + done.stderr
    assert "first close failed: StoreError" in output
    if store_recovers:
        assert _rows(db) == 5
        assert "runs_lost" not in output
    else:
        assert _rows(db) == 0
        assert "close_monitor_failed" in output
        assert "runs_lost=5" in output


def test_rows_of_an_unknown_source_are_skipped_by_refresh_and_load_alike(db: Path) -> None:
    # A row another version wrote under a source this one does not know may be a run kept
    # apart on purpose (like verification runs), so it must not feed the metrics either way.
    insert = (
        "INSERT INTO executions (agent, source, success, duration_ms, error, input_tokens,"
        " output_tokens, cost_usd, ts, extra, writer) VALUES"
        " ('a', '{source}', {success}, 5.0, {error}, 0, 0, 0.0, 0.0, NULL, 'other-process')"
    )
    with PerformanceMonitor(Store(db), flush_interval_s=3600) as live:
        live.record("a", success=True, duration_ms=1.0)
        live.flush()
        _sql(db, insert.format(source="replay", success=0, error="'boom'"))
        with PerformanceMonitor(Store(db)) as other:  # another process's run, written as it is
            other.record("a", success=True, duration_ms=5.0)
        assert live.refresh() == 1
        refreshed = live.get_agent_metrics("a")
    with PerformanceMonitor(Store(db)) as reopened:
        loaded = reopened.get_agent_metrics("a")
    assert refreshed is not None
    assert loaded is not None
    assert (refreshed.executions, refreshed.failures) == (2, 0)
    assert (loaded.executions, loaded.failures) == (2, 0)
    assert refreshed.last_error is None


def test_get_metrics_takes_agent_names_and_keeps_its_shape(monitor: PerformanceMonitor) -> None:
    monitor.record("writer", success=True, duration_ms=1.0)
    monitor.record("critic", success=False, duration_ms=2.0, error="e")
    assert list(monitor.get_metrics("writer")) == ["writer"]
    assert monitor.get_metrics("writer")["writer"] == monitor.get_agent_metrics("writer")
    assert list(monitor.get_metrics("writer", "critic", "nobody")) == ["critic", "writer"]
    assert monitor.get_metrics("nobody") == {}
    with pytest.raises(InvalidExecution, match="agent names are strings"):
        monitor.get_metrics(3)  # type: ignore[arg-type]
