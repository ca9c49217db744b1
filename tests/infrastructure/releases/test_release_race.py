"""Races between hosts on the PostgreSQL test server: publishers at once, readers by id.

* Two processes publish stable releases of one team at once (each as its own host, unaudited,
  so nothing but the store serializes them): every publication gets its own version and its
  own parent, the releases form one line, the heads count every change.
* Four processes record runs while a reader follows them at a cursor, as a rollout does
  (``run_reader.runs_after``): the reader reads every run once. The writers take no
  store-wide lock, so a lower id may commit after a higher one; the cursor holds because it
  follows transaction ids below the oldest transaction still running, where nothing can
  appear later.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from crash_child import child_env
from pg_server import PgServer

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.monitoring.run_reader import last_run_id, runs_after
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.simulation import copy_team
from agentmend.infrastructure.store.api import Store

TESTS = Path(__file__).parents[2]
TEAM = "team-race"
EACH = 30  # publications per publisher
RECORDERS = 4
RUNS = 2000  # per recorder


def _n(p: int) -> list[str]:
    """The count and tag arguments of publisher ``p``."""
    return [str(EACH), f"p{p}"]


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", line


def test_two_publishers_at_once_never_share_a_version_or_a_parent(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database()
    source = copy_team(tmp_path / "team")
    with Store(url, files_dir=tmp_path / "host-0") as store:
        ReleaseLog(store, TEAM, audit=False).publish_directory(
            source, by=Principal("first", "first")
        )
    go = tmp_path / "go"
    publisher = [sys.executable, str(TESTS / "release_publisher.py"), url]
    procs = [
        subprocess.Popen(
            [*publisher, str(tmp_path / f"host-{p + 1}"), TEAM, str(source), str(go), *_n(p)],
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for p in range(2)
    ]
    try:
        for proc in procs:
            _wait_ready(proc)
        go.touch()
        outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0]
    by_version: dict[int, tuple[str, int]] = {}
    for p, out in enumerate(outputs):
        lines = [line.split() for line in out.splitlines() if line.startswith("PUBLISHED")]
        assert len(lines) == EACH
        for _, number, parent_number in lines:
            assert int(number) not in by_version
            by_version[int(number)] = (f"p{p}", int(parent_number))
    last = 1 + 2 * EACH
    assert sorted(by_version) == list(range(2, last + 1))
    # every publication was stable, so each one's parent is the release just before it
    assert all(parent == version - 1 for version, (_, parent) in by_version.items())
    order = [by_version[v][0] for v in range(2, last + 1)]
    assert order != sorted(order), "the publishers never overlapped: the race was not run"
    with Store(url, files_dir=tmp_path / "host-0") as store:
        log = ReleaseLog(store, TEAM)
        heads = log.heads()
        assert (heads.stable, heads.generation) == (last, last)
        for version, (tag_name, parent) in by_version.items():
            release = log.get(version)
            assert (release.parent, release.published_by) == (parent, f"publisher-{tag_name}")
            tag = release.reason.encode()
            assert tag in log.files(version)["research-agent.md"]  # its own content


def test_a_reader_by_cursor_never_misses_a_run_committed_by_concurrent_writers(
    pg_server: PgServer, tmp_path: Path
) -> None:
    url = pg_server.create_database()
    files_dir = tmp_path / "files"
    store = Store(url, files_dir=files_dir)
    PerformanceMonitor(store).close()  # the executions table
    recorder = [sys.executable, str(TESTS / "fleet_child.py"), "record", url, str(files_dir)]
    procs = [
        subprocess.Popen([*recorder, str(k), str(RUNS)], stdout=subprocess.DEVNULL, env=child_env())
        for k in range(RECORDERS)
    ]
    conn = store.connection()
    cursor, reads_with_rows, read = last_run_id(conn), 0, 0
    try:
        deadline = time.monotonic() + 180
        while True:
            running = any(proc.poll() is None for proc in procs)
            rows = runs_after(conn, cursor, 1000)  # what a rollout reads, at its cursor
            if rows:
                reads_with_rows += 1
                read += len(rows)
                cursor = rows[-1].id
            elif not running:
                break  # this read began after every writer had exited, and found nothing
            assert time.monotonic() < deadline, "the recorders did not finish"
            time.sleep(0.002)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert [proc.returncode for proc in procs] == [0] * RECORDERS
    stored = conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    assert stored == RECORDERS * RUNS
    # the last runs are read once every older write on the (shared) server has ended
    deadline = time.monotonic() + 30
    while read < stored and time.monotonic() < deadline:
        rows = runs_after(conn, cursor, 1000)
        read += len(rows)
        cursor = rows[-1].id if rows else cursor
        time.sleep(0 if rows else 0.05)
    assert runs_after(conn, cursor, 1000) == []
    assert reads_with_rows > 10  # the reader really read while the writers wrote
    assert read == stored, "the reader's cursor missed runs or read some twice"
    store.close()
