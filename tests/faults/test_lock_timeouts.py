"""A process stopped while it holds a store lock never makes another wait forever.

A real child (``tests/lock_holder_child.py``) takes a lock, a write transaction or its team's
guard, and is stopped with SIGSTOP. ``agentmend status`` and ``report`` still answer, and a
worker following the team's releases still polls them; ``agentmend release publish`` ends
with :class:`LockTimeout`'s one line after the configured wait; a team's guard gives up the
same way. Once the holder is cut off (on PostgreSQL by the server, whose idle-in-transaction
timeout ends the stopped session; on SQLite by killing it) work proceeds and the holder's
uncommitted write is gone. Every child is resumed, killed and reaped.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agentmend.faces.cli.common import EXIT_OK, EXIT_UNAVAILABLE
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.protocol.team_registry import team_guard, team_id
from agentmend.infrastructure.definitions.team_id import team_id_for
from agentmend.infrastructure.errors import LockTimeout
from agentmend.infrastructure.releases.follower import ReleaseFollower
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.settings import load_settings
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.timeouts import StoreTimeouts

CHILD = Path(__file__).resolve().parents[1] / "lock_holder_child.py"
LOCK_S = 1  # AGENTMEND_STORE_LOCK_TIMEOUT_S for the commands
# the holder's AGENTMEND_STORE_IDLE_TRANSACTION_TIMEOUT_S when the server is to cut it off, and
# when it is not (while the commands meet it, however slowly a loaded machine runs them)
CUT_OFF_S = 2
NEVER_S = 600
WAIT_S = 60  # the longest any step may take before the test fails (a wait that never ends)

pytestmark = pytest.mark.slow


def _workspace(tmp_path: Path, url: str | None) -> Path:
    folder = tmp_path / "ws"
    overrides = {"store_url": url} if url else {}
    with Workspace.open(folder, settings=load_settings(**overrides), create=True):
        pass
    return folder


def _env(url: str | None, idle_s: int = NEVER_S) -> dict[str, str]:
    env = {
        **os.environ,
        "AGENTMEND_STORE_LOCK_TIMEOUT_S": str(LOCK_S),
        "AGENTMEND_STORE_IDLE_TRANSACTION_TIMEOUT_S": str(idle_s),
        "NO_COLOR": "1",
    }
    if url:
        env["AGENTMEND_STORE_URL"] = url
    return env


def _agentmend(
    env: dict[str, str], workspace: Path, *argv: str
) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agentmend.faces.cli", *argv, "--workspace", str(workspace)],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env=env,
    )
    print(
        f"agentmend {' '.join(argv)}: exit {done.returncode} in {time.monotonic() - started:.2f} s"
    )
    return done


@contextmanager
def _stopped_holder(
    mode: str, workspace: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[str]]:
    """The child holding ``mode``'s lock, stopped; resumed, killed and reaped at the end."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(workspace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], WAIT_S)
        line = proc.stdout.readline().strip() if ready else "(nothing)"
        assert line == "HELD", f"{line}: {proc.stderr.read() if proc.poll() is not None else ''}"
        proc.send_signal(signal.SIGSTOP)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=WAIT_S)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _resume(proc: subprocess.Popen[str]) -> str:
    """Let the stopped holder go on (it ends its lock's block); what it printed then."""
    proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(input="\n", timeout=WAIT_S)
    return out


def _assert_gave_up_on_write_lock(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert lines[0].startswith("agentmend: gave up waiting for the store's write lock on ")
    assert f"after {LOCK_S} s" in lines[0]
    assert "AGENTMEND_STORE_LOCK_TIMEOUT_S" in lines[0]


def _assert_a_follower_polls(location: str, workspace: Path, worker: Path) -> None:
    """A worker following the team's releases reads them without waiting for the writer."""
    with Store(location, files_dir=workspace, timeouts=StoreTimeouts(lock_s=LOCK_S)) as store:
        releases = ReleaseLog(store, team_id_for(workspace / "agents"))
        status = ReleaseFollower(releases, worker).poll()
    assert status.connected, status.problem
    assert status.stable == 1


def _holder_row(url: str) -> object:
    with Store(url) as store:
        return (
            store.connection()
            .execute("SELECT version FROM schema_versions WHERE component = 'frozen-holder'")
            .fetchone()
        )


def _wait_until_cut_off(url: str) -> None:
    """Until the server has ended every session idle inside a transaction on the database."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if _sessions_idle_in_transaction(url) == 0:
            return
        time.sleep(0.1)
    pytest.fail(f"the server did not end the stopped session within {WAIT_S} s")


def _sessions_idle_in_transaction(url: str) -> int:
    with Store(url) as store:
        (idle,) = (
            store.connection()
            .execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state LIKE 'idle in transaction%'"
            )
            .fetchone()
        )
        return int(idle)


def test_a_writer_stopped_on_postgresql_is_cut_off_by_the_server(
    pg_url: str, tmp_path: Path
) -> None:
    workspace, env = _workspace(tmp_path, pg_url), _env(pg_url)
    assert _agentmend(env, workspace, "release", "publish").returncode == EXIT_OK
    page = tmp_path / "report.html"
    with _stopped_holder("transaction", workspace, env):  # never cut off: it meets them all
        status = _agentmend(env, workspace, "status")
        assert status.returncode == EXIT_OK, status.stderr  # reads never wait for the writer
        report = _agentmend(env, workspace, "report", "--output", str(page))
        assert report.returncode == EXIT_OK, report.stderr
        assert page.stat().st_size > 0
        _assert_a_follower_polls(pg_url, workspace, tmp_path / "worker")
        _assert_gave_up_on_write_lock(_agentmend(env, workspace, "release", "publish"))
        assert _sessions_idle_in_transaction(pg_url) == 1  # the holder was there all along
    with _stopped_holder("transaction", workspace, _env(pg_url, CUT_OFF_S)) as holder:
        _wait_until_cut_off(pg_url)
        published = _agentmend(env, workspace, "release", "publish")
        assert published.returncode == EXIT_OK, published.stderr
        assert "published release 2" in published.stdout
        assert _resume(holder).startswith("LOST ")  # its commit is refused, not half done
    assert _holder_row(pg_url) is None


def test_an_audited_writer_stopped_on_postgresql_leaves_the_chain_whole(
    pg_url: str, tmp_path: Path
) -> None:
    workspace, env = _workspace(tmp_path, pg_url), _env(pg_url)
    with _stopped_holder("audit", workspace, _env(pg_url, CUT_OFF_S)) as holder:
        status = _agentmend(env, workspace, "status", "--json")
        assert status.returncode == EXIT_OK, status.stderr
        # it holds this host's audit head (a file lock, which outlives its server session):
        # status checks the rows without the head, and says so
        audit = json.loads(status.stdout)["audit"]
        assert audit["ok"], audit["problems"]
        assert "was not checked: another process held its lock" in audit["head_unchecked"]
        _wait_until_cut_off(pg_url)
        assert _resume(holder).startswith("LOST ")  # its row never committed
    published = _agentmend(env, workspace, "release", "publish")
    assert published.returncode == EXIT_OK, published.stderr
    status = _agentmend(env, workspace, "status", "--json")
    audit = json.loads(status.stdout)["audit"]
    assert (audit["ok"], audit["head_unchecked"], audit["problems"]) == (True, None, [])
    with Store(pg_url) as store:
        kinds = store.connection().execute("SELECT agent_name FROM audit_log").fetchall()
    assert ("frozen-holder",) not in kinds
    assert kinds  # the publication's own rows


def test_a_writer_stopped_on_sqlite_is_waited_for_only_as_configured(tmp_path: Path) -> None:
    workspace, env = _workspace(tmp_path, None), _env(None)
    db = str(workspace / "agentmend.db")
    assert _agentmend(env, workspace, "release", "publish").returncode == EXIT_OK
    with _stopped_holder("transaction", workspace, env) as holder:
        status = _agentmend(env, workspace, "status")
        assert status.returncode == EXIT_OK, status.stderr  # WAL readers never wait
        _assert_a_follower_polls(db, workspace, tmp_path / "worker")
        _assert_gave_up_on_write_lock(_agentmend(env, workspace, "release", "publish"))
        holder.kill()  # no server to cut it off: its death ends the lock
        holder.wait(timeout=WAIT_S)
    published = _agentmend(env, workspace, "release", "publish")
    assert published.returncode == EXIT_OK, published.stderr
    assert "published release 2" in published.stdout
    assert _holder_row(db) is None


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_team_lock_holder_stopped_is_waited_for_only_as_configured(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue("pg_url")) if backend == "postgresql" else None
    workspace, env = _workspace(tmp_path, url), _env(url)
    location = url or str(workspace / "agentmend.db")
    short = StoreTimeouts(team_lock_s=0.5)
    with _stopped_holder("team", workspace, env):
        status = _agentmend(env, workspace, "status")
        assert status.returncode == EXIT_OK, status.stderr
        with Store(location, files_dir=workspace, timeouts=short) as store:
            team = team_id(workspace / "agents", store)
            # on this host the team folder's lock file is met first
            with (
                pytest.raises(LockTimeout, match="the team folder's lock") as on_host,
                team_guard(store, workspace / "agents"),
            ):
                pass
            assert on_host.value.setting == "team_lock_timeout_s"
            assert "AGENTMEND_TEAM_LOCK_TIMEOUT_S" in str(on_host.value)
            if url is not None:  # another host meets the server's advisory lock
                with (
                    pytest.raises(LockTimeout, match=f"team {team}'s lock") as in_store,
                    store.team_lock(team),
                ):
                    pass
                assert in_store.value.cause == "55P03"
    # the holder is dead: the kernel dropped its file lock, the server its session's lock
    patient = StoreTimeouts(team_lock_s=WAIT_S)
    with (
        Store(location, files_dir=workspace, timeouts=patient) as store,
        team_guard(store, workspace / "agents"),
    ):
        pass
