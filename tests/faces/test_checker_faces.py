"""The session and the MCP server beside a fleet checker that holds their team: the issues a
question finds are left to it (no cycle started or offered), their status names the checker and
its questions, a person answers those questions from either face (audited), and a cycle asked
for by name still runs unless the checker's claim on the issue says otherwise. On SQLite and on
a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from agentmend.faces.mcp.server import build_server
from agentmend.faces.mcp.tools import AgentmendTools
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.cycle_requests import CycleRequests, read_requests
from agentmend.infrastructure.changes.protocol.team_registry import team_id
from agentmend.infrastructure.detection.checker_seat import CheckerSeat
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime
from agentmend.infrastructure.store.api import Store

ROOT = Path(__file__).resolve().parents[2]
AGENT = "research-agent"

pytestmark = pytest.mark.usefixtures("restore_logging")


def _settings(store_url: str) -> Settings:
    return Settings(store_url=store_url, baseline_n=30, min_baseline_n=30)


async def _a_task_with_an_issue(folder: Path, store_url: str) -> tuple[Any, Any]:
    """A session-like orchestrator that would run every cycle itself, and a task that finds
    research-agent's truncation issue while the checker holds the team."""
    ws = Workspace.open(folder, settings=_settings(store_url), create=False)
    orchestrator = ws.orchestrator(auto_improve=True, approval_callback=lambda _change: True)
    runtime = orchestrator.team.runtime
    assert isinstance(runtime, SimulatedRuntime)
    for n in range(35):
        await orchestrator.team.run(AGENT, f"healthy question {n}")
    runtime.inject(AGENT, FaultKind.TRUNCATION)
    for n in range(30):
        await orchestrator.team.run(AGENT, f"question {n} under the fault")
    task = await orchestrator.execute_task("one more question")
    return ws, task


@pytest.mark.slow
def test_the_session_and_mcp_leave_the_checkers_issues_to_it(
    store_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "ws"
    with Workspace.open(folder, settings=_settings(store_url), create=True) as ws:
        team = team_id(ws.team_dir, ws.store)
    checker = Principal.fleet_checker(team)
    with Store(store_url, files_dir=folder) as store:
        seat = CheckerSeat(store, team, principal=checker.user_id, term_s=600)
        assert seat.take().holder == seat.holder_id

        ws, task = asyncio.run(_a_task_with_an_issue(folder, store_url))
        try:
            orchestrator = ws._orchestrators[0]
            (issue,) = [i for i in task.left_to_checker if i.agent_name == AGENT]
            assert task.cycles == []  # auto_improve, yet nothing started: the checker's
            assert task.checker is not None
            assert task.checker.holder == seat.holder_id
            # the checker asks about the issue, and has claimed it for its cycle
            requests = CycleRequests(store)
            requests.ask(team, issue, by=checker)
            assert issue.issue_id is not None
            assert orchestrator.detector.ledger.claim(issue.issue_id, "checker", stale_after_s=600)
            asked_for = asyncio.run(orchestrator.run_improvement_cycle(issue))
            assert asked_for.status == "claimed_elsewhere"  # asked for by name: the claim decides
        finally:
            ws.close()

        session = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentmend.faces.cli",
                "session",
                "--workspace",
                str(folder),
                "--store",
                store_url,
            ],
            cwd=ROOT,
            input=f"/status\n/issue\n/issue decline {issue.issue_id}\n/quit\n",
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        )
        assert session.returncode == 0, session.stdout[-2000:] + session.stderr[-2000:]
        out = " ".join(session.stdout.split())
        assert f"the team is held by its fleet checker, {checker.user_id}" in out
        assert f"/issue approve {issue.issue_id}" in out
        assert f"issue {issue.issue_id}: a cycle for {AGENT} declined" in out
        (answered,) = read_requests(store)
        assert answered.state == "declined"

        answers = anyio.run(_mcp_status_and_answer, folder, store_url, issue.issue_id)
        status = answers["status"].structured_content
        assert status["fleetChecker"]["holder"] == seat.holder_id
        assert status["checkerQuestions"] == []  # answered from the session already
        assert answers["approve"].is_error  # answered once: the MCP client learns by whom
        assert "answered already" in answers["approve"].content[0].text
        assert not answers["list"].is_error


async def _mcp_status_and_answer(folder: Path, store_url: str, issue_id: str) -> dict[str, Any]:
    tools = AgentmendTools(folder, project_root=folder.parent, settings=_settings(store_url))
    answers: dict[str, Any] = {}
    try:
        async with Client(build_server(tools), read_timeout_seconds=60) as client:
            answers["status"] = await client.call_tool("status", {})
            answers["approve"] = await client.call_tool(
                "issue", {"action": "approve", "issueId": issue_id}
            )
            answers["list"] = await client.call_tool("issue", {"action": "list"})
    finally:
        await tools.aclose()
    return answers


def test_an_mcp_client_answers_a_checkers_question_audited(store_url: str, tmp_path: Path) -> None:
    from agentmend.infrastructure.models import IssueReport

    folder = tmp_path / "ws"
    Workspace.open(folder, settings=_settings(store_url), create=True).close()
    with Store(store_url, files_dir=folder) as store:
        report = IssueReport(agent_name=AGENT, error_type="low_success_rate", issue_id="iss-1")
        CycleRequests(store).ask("team-x", report, by=Principal.fleet_checker("team-x"))

    async def answer() -> Any:
        tools = AgentmendTools(folder, project_root=folder.parent, settings=_settings(store_url))
        try:
            async with Client(build_server(tools), read_timeout_seconds=60) as client:
                unknown = await client.call_tool("issue", {"action": "approve", "issueId": "x"})
                assert unknown.is_error
                return await client.call_tool("issue", {"action": "approve", "issueId": "iss-1"})
        finally:
            await tools.aclose()

    done = anyio.run(answer)
    assert not done.is_error, done.content
    assert done.structured_content["request"]["state"] == "approved"
    with Store(store_url, files_dir=folder) as store:
        (request,) = read_requests(store)
        assert (request.state, request.answered_by) == ("approved", "mcp")
        rows = (
            store.connection()
            .execute("SELECT user_id FROM audit_log WHERE edit_type = 'issue_cycle_approved'")
            .fetchall()
        )
        assert [r[0] for r in rows] == ["mcp"]
