"""The session (``main.py``) and the MCP server keep answering while their server is down.

Each test starts a PostgreSQL server of its own and stops it by pid under a running face (the
postmaster's fast shutdown ends every session, as a crashed or restarted database host does).
While it is down the face answers on the release it last served, keeps the runs in its
monitor's bounded backlog, skips what needs the store with a notice, and says in its status
that the store is unreachable and which release it serves. When the server is back the runs
are written (none is lost) and the face follows the next publication.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult
from pg_server import PgServer, _alive
from test_release_faces import Session, _env, until

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.definitions.team_id import team_id_for
from agentmend.infrastructure.models import ChangeStatus, IssueReport
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime
from agentmend.infrastructure.store.api import Store
from agentmend.loop.meta_orchestrator import MetaOrchestrator

OPS = Principal("ops", "Operator", frozenset({ADMIN}))
AGENT = "research-agent"
TEAM_SIZE = 6
TIMEOUT_S = 60.0


class OwnServer:
    """A workspace whose store is a database on a PostgreSQL server of the test's own."""

    def __init__(self, tmp_path: Path, server: PgServer) -> None:
        self.server = server
        self.url = server.create_database()
        self.workspace = tmp_path / "ws"
        Workspace.open(self.workspace, settings=Settings(store_url=self.url)).close()
        self.team = self.workspace / "agents"
        self.team_id = team_id_for(self.team)
        self.store: Store | None = None
        self.connect()
        self.publish()  # release 1, stable

    def connect(self) -> None:
        self.store = Store(self.url, files_dir=self.workspace)

    def log(self) -> ReleaseLog:
        assert self.store is not None
        return ReleaseLog(self.store, self.team_id, audit=AuditLog(self.store))

    def publish(self, edit: tuple[str, str] | None = None) -> int:
        """Publish the team folder (with ``edit`` made to the research agent) as the stable."""
        if edit is not None:
            agent = self.team / f"{AGENT}.md"
            agent.write_text(agent.read_text().replace(*edit, 1))
        return self.log().publish_directory(self.team, by=OPS, stable=True).version

    def releases_run(self) -> Counter[int]:
        assert self.store is not None
        rows = self.store.connection().execute("SELECT extra FROM executions").fetchall()
        return Counter(int(json.loads(extra)["release"]) for (extra,) in rows)

    def stop_server(self) -> None:
        """The postmaster's fast shutdown, by pid: every session of every process ends."""
        assert self.store is not None
        self.store.close()  # the test's own connections would only break
        self.store = None
        pid = self.server.pid
        assert pid is not None
        os.kill(pid, signal.SIGINT)
        until("the server to stop", lambda: not _alive(pid))

    def start_server(self) -> None:
        self.server.start()
        self.connect()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


@pytest.fixture
def own_server(pg_server: PgServer, tmp_path: Path) -> Any:
    """A server of the test's own (``pg_server`` only checks that PostgreSQL is installed)."""
    server = PgServer()
    try:
        made = OwnServer(tmp_path, server)
        try:
            yield made
        finally:
            made.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_a_session_answers_on_its_last_release_while_the_server_is_down(
    own_server: OwnServer, tmp_path: Path
) -> None:
    session = Session(
        ["--workspace", str(own_server.workspace), "--store", own_server.url], tmp_path
    )
    try:
        at = session.wait_for("serving release v1 (stable)")
        session.send("/traffic 3")
        at = session.wait_for("ran 3 question(s)", since=at)
        until("the runs written", lambda: own_server.releases_run()[1] >= 3 * TEAM_SIZE)

        own_server.stop_server()
        at = session.status_until("cut off from store since", since=at)
        at = session.wait_for("running last release v1", since=at)
        asked = at
        session.send("/traffic 4")
        at = session.wait_for("ran 4 question(s)", since=at)
        session.send("What is a limit?")
        at = session.wait_for("Q: What is a limit?", since=at)  # its answer
        # the writer's first failure may not be in yet: until it is, the runs read as on their
        # way to the store (the writer catching up), then as not yet written, with the error
        at = session.status_until("runs not yet written to the store", since=at)
        assert "running last release v1" in session.output[asked:at]
        during = session.output[asked:at]
        assert "error:" not in during, during
        assert "store unreachable" in during, during  # the notice of the skipped steps

        own_server.start_server()
        at = session.status_until("serving release v1 (stable)", since=at)
        # the runs answered while the server was down are written now: none is lost
        until("the backlog written", lambda: own_server.releases_run()[1] >= 8 * TEAM_SIZE)
        assert own_server.releases_run() == Counter({1: 8 * TEAM_SIZE})
        v2 = own_server.publish(("max_tokens: 2048", "max_tokens: 4096"))
        at = session.status_until(f"serving release v{v2} (stable)", since=at)
        session.send("/traffic 2")
        at = session.wait_for("ran 2 question(s)", since=at)
        until("runs on v2", lambda: own_server.releases_run()[v2] >= 2 * TEAM_SIZE)
        session.send("/quit")
        assert session.close() == 0, session.output[-3000:]
        assert "Traceback" not in session.output
    finally:
        session.close()


def _data(result: CallToolResult) -> dict[str, Any]:
    text = "\n".join(getattr(block, "text", "") for block in result.content)
    assert not result.is_error, text
    data: dict[str, Any] | None = result.structured_content
    assert data is not None
    return data


async def _status_until(client: Client, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        status = _data(await client.call_tool("status", {}))
        if check(status):
            return status
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_the_mcp_server_runs_on_its_last_release_while_the_server_is_down(
    own_server: OwnServer, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agentmend.mcp_server", "--workspace", str(own_server.workspace),
              "--root", str(project)],
        env=_env(AGENTMEND_STORE_URL=own_server.url),
        cwd=str(project),
    )  # fmt: skip
    errlog = (tmp_path / "server.stderr").open("w")
    try:
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60) as c:
            first = _data(await c.call_tool("run", {"prompt": "Explain limits"}))
            assert first["release"]["release"] == 1
            assert first["storeNotice"] is None
            until("the runs written", lambda: own_server.releases_run()[1] >= TEAM_SIZE)

            own_server.stop_server()
            status = await _status_until(c, lambda s: s["releases"]["connected"] is False)
            assert status["releases"]["stable"] == 1
            assert "running last release v1" in status["releases"]["text"]
            for n in range(3):  # the whole team, then one agent
                answer = _data(await c.call_tool("run", {"prompt": f"Explain series {n}"}))
                assert answer["release"]["release"] == 1
                assert len(answer["runs"]) == TEAM_SIZE
                assert answer["storeNotice"].startswith("store unreachable, skipped ")
                assert "detection" in answer["storeNotice"]
            alone = _data(await c.call_tool("run", {"prompt": "Explain", "agent": AGENT}))
            assert alone["release"]["release"] == 1
            result = await c.call_tool("status", {})
            status = _data(result)
            assert status["releases"]["connected"] is False
            assert status["unwrittenRuns"] >= 3 * TEAM_SIZE + 1  # kept, to be written
            assert own_server.url in status["storeUnreachable"]
            text = str(result.content[0])
            assert "Releases: cut off from store since" in text
            assert "running last release v1" in text
            assert "Store unreachable:" in text

            own_server.start_server()
            await _status_until(c, lambda s: s["releases"]["connected"] is True)
            until(
                "the backlog written",
                lambda: own_server.releases_run()[1] >= 4 * TEAM_SIZE + 1,
            )
            assert own_server.releases_run() == Counter({1: 4 * TEAM_SIZE + 1})
            v2 = own_server.publish(("max_tokens: 2048", "max_tokens: 4096"))
            await _status_until(c, lambda s: s["releases"]["stable"] == v2)
            after = _data(await c.call_tool("run", {"prompt": "Explain limits"}))
            assert after["release"]["release"] == v2
    finally:
        errlog.close()
    until("runs on v2", lambda: own_server.releases_run()[v2] >= TEAM_SIZE)
    assert "Traceback" not in (tmp_path / "server.stderr").read_text()


@pytest.mark.slow
async def test_a_run_of_a_watched_agent_stands_while_the_server_is_down_and_the_watch_goes_on(
    pg_server: PgServer, tmp_path: Path
) -> None:
    """Each run of an agent whose change is watched on live runs advances the watch, which
    needs the store: with the server down the run is answered and kept all the same, and the
    watch goes on once the server is back."""
    server = PgServer()
    try:
        store = Store(server.create_database(), files_dir=tmp_path / "files")
        orchestrator = MetaOrchestrator.offline_simulated(
            tmp_path / "team",
            seed=5,
            runtime=SimulatedRuntime(5, base_failure_rate=0.02),
            store=store,
            settings=Settings(baseline_n=20, detection_mode="rules"),
        )
        try:
            await _watched_through_an_outage(orchestrator, server, store)
        finally:
            orchestrator.close()
            store.close()
    finally:
        server.stop()


async def _watched_through_an_outage(
    orchestrator: MetaOrchestrator, server: PgServer, store: Store
) -> None:
    (orchestrator.team.directory / f"{AGENT}.evals.yaml").unlink()  # watched, not evaluated
    runtime = orchestrator.team.runtime
    assert isinstance(runtime, SimulatedRuntime)
    for i in range(30):
        await orchestrator.team.run(AGENT, f"question {i}")
    runtime.inject(AGENT, FaultKind.TRUNCATION)
    for i in range(30):
        await orchestrator.team.run(AGENT, f"failing {i}")
    metrics = orchestrator.monitor.get_agent_metrics(AGENT)
    assert metrics is not None
    issue = IssueReport(
        agent_name=AGENT,
        error_type="low_success_rate",
        metrics=metrics.model_dump(),
        error_logs=list(metrics.recent_errors),
        context="raised for the test",
        available_agents=orchestrator.team.names,
    )
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "watching", cycle.summary()
    orchestrator.monitor.flush()
    before = _executions(store)

    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGINT)
    until("the server to stop", lambda: not _alive(pid))
    for i in range(3):  # each run's listener advances the watch: the store fails under it
        result = await orchestrator.team.run(AGENT, f"while down {i}")
        assert result.agent_name == AGENT
    task = await orchestrator.execute_task("a question while down")
    assert len(task.results) == TEAM_SIZE
    assert task.store_notice is not None
    assert "watched changes" in task.store_notice
    assert task.issues == []

    server.start()
    orchestrator.monitor.flush()  # the runs answered while it was down are written now
    assert _executions(store) == before + 3 + TEAM_SIZE
    for n in range(60):  # the watch goes on and, the fix being real, keeps the change
        await orchestrator.team.run(AGENT, f"after {n}")
        if not orchestrator.watcher.open_watches(AGENT):
            break
    assert not orchestrator.watcher.open_watches(AGENT)
    (record,) = orchestrator.manager.get_history()
    assert record.status is ChangeStatus.KEPT


def _executions(store: Store) -> int:
    return int(store.connection().execute("SELECT COUNT(*) FROM executions").fetchone()[0])
