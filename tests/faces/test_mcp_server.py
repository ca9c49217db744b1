"""The MCP server through the official ``mcp`` client: in memory for the many bad requests,
over stdio (a real ``python -m agentmend.mcp_server`` process) for the code-update round trip."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult
from tiny_project import CALC, CALC_BROKEN, CALC_EXTENDED, PYTEST, make_project, snapshot

from agentmend.faces.mcp.server import build_server
from agentmend.faces.mcp.tools import AgentmendTools, BadRequest
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.llm.anthropic_runtime import AnthropicRuntime
from agentmend.infrastructure.monitoring.performance_monitor import VERIFICATION
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import FaultKind

ROOT = Path(__file__).resolve().parents[2]
TOOLS = {"self_improve", "analyze", "run", "status", "memory", "issue"}
TIMEOUT_S = 60.0

DIFF_EXTEND = (
    "--- a/calc/__init__.py\n+++ b/calc/__init__.py\n@@ -1,2 +1,6 @@\n"
    " def add(a, b):\n     return a + b\n+\n+\n+def mul(a, b):\n+    return a * b\n"
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


@pytest.fixture
async def tools(project: Path) -> AsyncIterator[AgentmendTools]:
    settings = Settings(test_command=PYTEST, test_timeout_s=TIMEOUT_S)
    served = AgentmendTools(project / ".agentmend", project_root=project, settings=settings)
    yield served
    await served.aclose()


def _client(tools: AgentmendTools) -> Client:
    """An in-memory client (entered in the test itself: anyio scopes stay in one task)."""
    return Client(build_server(tools), read_timeout_seconds=TIMEOUT_S)


def _text(result: CallToolResult) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def _data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, _text(result)
    data: dict[str, Any] | None = result.structured_content
    assert data is not None
    return data


def _counts(db: Path) -> dict[str, int]:
    """Rows per table of the store (read with a separate connection)."""
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}


def _state(project: Path) -> tuple[dict[str, bytes], dict[str, int]]:
    """Every file of the project (the store's shared-memory index aside) and the store's rows."""
    workspace = project / ".agentmend"
    files = snapshot(project, skip=(workspace / "agentmend.db-shm",))
    return files, _counts(workspace / "agentmend.db")


async def test_the_five_tools_are_listed_with_their_schemas(tools: AgentmendTools) -> None:
    async with _client(tools) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(listed) == TOOLS
    schema = listed["self_improve"].input_schema
    assert schema["required"] == ["action"]
    assert schema["properties"]["action"]["enum"] == [
        "plan",
        "approve",
        "execute",
        "status",
        "rollback",
    ]
    assert {"planId", "description", "files", "diff", "reason"} <= set(schema["properties"])
    item = schema["$defs"]["FileArg"]
    assert item["required"] == ["path", "operation"]
    assert item["properties"]["operation"]["enum"] == ["create", "modify", "delete"]
    memory = listed["memory"].input_schema
    assert memory["properties"]["query"]["enum"] == ["history", "decisions", "audit", "config"]
    assert listed["status"].annotations is not None
    assert listed["status"].annotations.read_only_hint is True
    # analyze applies nothing but runs the agents (and records), so it claims no read-only
    analyze = listed["analyze"]
    assert analyze.annotations is not None
    assert analyze.annotations.read_only_hint is False
    assert analyze.annotations.destructive_hint is False
    reproduce = analyze.input_schema["properties"]["reproduce"]
    assert (reproduce["type"], reproduce["default"]) == ("boolean", False)
    assert analyze.description is not None
    assert "runs its eval suite" in analyze.description
    run = listed["run"]
    assert run.input_schema["required"] == ["prompt"]
    assert {"agent", "routingKey"} <= set(run.input_schema["properties"])
    assert run.annotations is not None
    assert run.annotations.destructive_hint is False


BAD_REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    ("self_improve", {"action": "explode"}, "action"),
    ("self_improve", {}, "action"),
    ("self_improve", {"action": "execute"}, "planId is required for action execute"),
    ("self_improve", {"action": "approve"}, "planId is required for action approve"),
    ("self_improve", {"action": "approve", "planId": "plan-nope"}, "no code update plan"),
    ("self_improve", {"action": "execute", "planId": "plan-nope"}, "'plan-nope'"),
    ("self_improve", {"action": "rollback"}, "reason is required"),
    ("self_improve", {"action": "rollback", "reason": "why"}, "no completed plan"),
    (
        "self_improve",
        {"action": "plan", "files": [{"path": "x.py", "operation": "create", "content": ""}]},
        "description is required",
    ),
    ("self_improve", {"action": "plan", "description": "d"}, "files (or diff) is required"),
    (
        "self_improve",
        {"action": "plan", "description": "d", "files": [{"operation": "create"}]},
        "files.0.path",
    ),
    (
        "self_improve",
        {
            "action": "plan",
            "description": "d",
            "files": [{"path": "../evil.py", "operation": "create", "content": "x"}],
        },
        "'../evil.py'",
    ),
    (
        "self_improve",
        {
            "action": "plan",
            "description": "d",
            "files": [{"path": "/etc/evil.txt", "operation": "create", "content": "x"}],
        },
        "'/etc/evil.txt'",
    ),
    (
        "self_improve",
        {
            "action": "plan",
            "description": "d",
            "files": [{"path": "calc/x.exe", "operation": "create", "content": "x"}],
        },
        "'.exe' not in",
    ),
    (
        "self_improve",
        {
            "action": "plan",
            "description": "d",
            "files": [
                {
                    "path": ".agentmend/agents/research-agent.md",
                    "operation": "modify",
                    "content": "x",
                }
            ],
        },
        "agentmend workspace",
    ),
    (
        "self_improve",
        {
            "action": "plan",
            "description": "d",
            "files": [{"path": "README.md", "operation": "modify"}],
        },
        "files[0].content is required",
    ),
    ("self_improve", {"action": "plan", "description": "d", "diff": "nonsense"}, "no file patch"),
    ("analyze", {}, "agent is required"),
    ("analyze", {"agent": "nobody"}, "no agent named 'nobody'"),
    ("analyze", {"agent": "research-agent", "path": "calc/__init__.py"}, "not both"),
    ("analyze", {"path": "../outside.py"}, "'../outside.py'"),
    ("analyze", {"path": "calc/__init__.py"}, "needs a model"),
    ("memory", {"query": "everything"}, "query"),
    ("memory", {"query": "history", "limit": 0}, "limit"),
    ("memory", {"query": "config", "agent": "nobody"}, "no agent named 'nobody'"),
    ("no_such_tool", {}, "Unknown tool"),
]


async def test_every_bad_request_is_an_error_naming_the_problem_and_writes_nothing(
    tools: AgentmendTools, project: Path
) -> None:
    async with _client(tools) as client:
        # status only reads: the workspace is made by a tool that may write
        assert not (await client.call_tool("self_improve", {"action": "status"})).is_error
        before = _state(project)
        for tool, arguments, expected in BAD_REQUESTS:
            result = await client.call_tool(tool, arguments)
            assert result.is_error, (tool, arguments, _text(result))
            assert expected in _text(result), (tool, arguments, _text(result))
            assert _state(project) == before, (tool, arguments)
        assert not (await client.call_tool("status", {})).is_error  # and the server lives on


async def test_executing_before_approval_and_approving_twice_are_errors(
    tools: AgentmendTools, project: Path
) -> None:
    async with _client(tools) as client:
        plan = _data(
            await client.call_tool(
                "self_improve",
                {
                    "action": "plan",
                    "description": "docs",
                    "files": [{"path": "README.md", "operation": "modify", "content": "# c\n"}],
                },
            )
        )
        pid = {"planId": plan["planId"]}
        before = _state(project)
        result = await client.call_tool("self_improve", {"action": "execute", **pid})
        assert result.is_error
        assert "approve it first" in _text(result)
        assert _state(project) == before
        assert not (await client.call_tool("self_improve", {"action": "approve", **pid})).is_error
        again = await client.call_tool("self_improve", {"action": "approve", **pid})
        assert again.is_error
        assert "already approved" in _text(again)


async def test_yolo_mode_executes_without_approval_and_the_audit_says_so(project: Path) -> None:
    settings = Settings(test_command=PYTEST, test_timeout_s=TIMEOUT_S, yolo_mode=True)
    tools = AgentmendTools(project / ".agentmend", project_root=project, settings=settings)
    try:
        async with Client(build_server(tools), read_timeout_seconds=TIMEOUT_S) as client:
            plan = _data(
                await client.call_tool(
                    "self_improve", {"action": "plan", "description": "mul", "diff": DIFF_EXTEND}
                )
            )
            done = _data(
                await client.call_tool(
                    "self_improve", {"action": "execute", "planId": plan["planId"]}
                )
            )
            assert done["success"] is True
            human = next(g for g in done["gates"] if g["gate"] == "human_approval")
            assert human["details"] == {"skipped": "yolo_mode"}
            audit = _data(await client.call_tool("memory", {"query": "audit"}))
            assert "approval_skipped" in [row["edit_type"] for row in audit["items"]]
    finally:
        await tools.aclose()
    assert (project / "calc" / "__init__.py").read_text() == CALC_EXTENDED


async def test_a_workspace_that_cannot_be_opened_makes_every_call_an_error(
    project: Path,
) -> None:
    blocked = project / "blocked"
    blocked.write_text("a file where the workspace folder should be")
    tools = AgentmendTools(blocked, project_root=project, settings=Settings())
    try:
        async with Client(build_server(tools), read_timeout_seconds=TIMEOUT_S) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            calls = [
                ("self_improve", {"action": "status"}),
                ("analyze", {"agent": "research-agent"}),
                ("status", {}),
                ("memory", {"query": "history"}),
            ]
            for tool, arguments in calls:
                result = await client.call_tool(tool, arguments)
                assert result.is_error
                assert f"workspace {blocked} cannot be opened" in _text(result)
                assert "is a file" in _text(result)
            blocked.unlink()  # fixed while the server runs: the next call opens it
            assert not (await client.call_tool("self_improve", {"action": "status"})).is_error
            assert not (await client.call_tool("status", {})).is_error
    finally:
        await tools.aclose()


async def test_analyze_diagnoses_an_agent_from_the_workspace_and_applies_nothing(
    project: Path,
) -> None:
    workspace = project / ".agentmend"
    async with Workspace.open(workspace, settings=Settings()) as ws:  # the session's traffic
        orchestrator = ws.orchestrator(seed=1)
        orchestrator.team.runtime.inject("research-agent", FaultKind.TRUNCATION)  # type: ignore[attr-defined]
        for _ in range(6):
            await orchestrator.execute_task("Explain the Pythagorean theorem")
    definitions = snapshot(workspace / "agents")
    tools = AgentmendTools(workspace, project_root=project, settings=Settings())
    try:
        async with Client(build_server(tools), read_timeout_seconds=TIMEOUT_S) as client:
            data = _data(await client.call_tool("analyze", {"agent": "research-agent"}))
            assert data["applied"] is False
            assert data["analysis"]["responsible_agent"] == "research-agent"
            assert data["analysis"]["cause_category"] == "truncation"
            assert data["questions"]
            assert any("max_tokens" in e for e in data["analysis"]["evidence"])
            history = _data(await client.call_tool("memory", {"query": "history"}))
            assert history["items"] == []
            decisions = _data(await client.call_tool("memory", {"query": "decisions"}))
            assert "mcp.analyze" in [d["kind"] for d in decisions["items"]]
            status = _data(await client.call_tool("status", {}))
            research = next(a for a in status["agents"] if a["name"] == "research-agent")
            assert research["executions"] == 6
            assert research["success_rate"] == 0.0
    finally:
        await tools.aclose()
    assert snapshot(workspace / "agents") == definitions


async def test_analyze_runs_the_eval_suite_only_when_asked_to_reproduce(project: Path) -> None:
    tools = AgentmendTools(project / ".agentmend", project_root=project, settings=Settings())
    try:
        async with _client(tools) as client:
            plain = _data(await client.call_tool("analyze", {"agent": "research-agent"}))
            monitor = tools.workspace().monitor
            assert plain["reproduced"] is False
            assert plain["applied"] is False
            assert monitor.get_agent_metrics("research-agent", source=VERIFICATION) is None
            fresh = _data(
                await client.call_tool("analyze", {"agent": "research-agent", "reproduce": True})
            )
            assert fresh["reproduced"] is True
            assert "its eval cases pass now" in fresh["issue"]["context"]
            runs = monitor.get_agent_metrics("research-agent", source=VERIFICATION)
            assert runs is not None
            assert runs.executions == 9  # 3 cases x 3 repeats, recorded apart from detection
            assert monitor.get_agent_metrics("research-agent") is None  # no production run
            wrong = await client.call_tool(
                "analyze", {"path": "calc/__init__.py", "reproduce": True}
            )
            assert wrong.is_error
            assert "reproduce goes with agent" in _text(wrong)
    finally:
        await tools.aclose()


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return _data(await client.call_tool(tool, arguments))


@pytest.mark.slow
async def test_over_stdio_a_breaking_plan_is_rolled_back_and_a_good_one_kept(
    project: Path, tmp_path: Path
) -> None:
    workspace = project / ".agentmend"
    env = {
        "PYTHONPATH": str(ROOT),
        "AGENTMEND_TESTING": "1",
        "AGENTMEND_TEST_COMMAND": json.dumps(list(PYTEST)),
        "AGENTMEND_TEST_TIMEOUT_S": str(TIMEOUT_S),
    }
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agentmend.mcp_server", "--workspace", str(workspace), "--root", str(project)],
        env=env,
        cwd=str(project),
    )
    errlog = (tmp_path / "server.stderr").open("w")
    before = snapshot(project, skip=(workspace,))
    async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=TIMEOUT_S) as c:
        assert {t.name for t in (await c.list_tools()).tools} == TOOLS
        bad = await c.call_tool("self_improve", {"action": "execute"})
        assert bad.is_error
        assert "planId is required" in _text(bad)

        broken = await _call(c, "self_improve", {
            "action": "plan", "description": "subtract instead of add",
            "files": [{"path": "calc/__init__.py", "operation": "modify", "content": CALC_BROKEN}],
        })  # fmt: skip
        await _call(c, "self_improve", {"action": "approve", "planId": broken["planId"]})
        executed = await c.call_tool(
            "self_improve", {"action": "execute", "planId": broken["planId"]}
        )
        failed = _data(executed)
        assert (failed["success"], failed["testsPassed"]) == (False, False)
        assert failed["rollbackPerformed"] is False  # validated in a copy, never applied
        assert failed["restoredIdentical"] is True
        assert "NOT APPLIED" in _text(executed)
        assert snapshot(project, skip=(workspace,)) == before  # byte for byte

        good = await _call(
            c, "self_improve", {"action": "plan", "description": "add mul", "diff": DIFF_EXTEND}
        )
        await _call(c, "self_improve", {"action": "approve", "planId": good["planId"]})
        kept = await _call(c, "self_improve", {"action": "execute", "planId": good["planId"]})
        assert (kept["success"], kept["testsPassed"], kept["rollbackPerformed"]) == (
            True,
            True,
            False,
        )
        assert (project / "calc" / "__init__.py").read_text() == CALC_EXTENDED

        status = await _call(c, "status", {})
        assert status["lastExecution"]["planId"] == good["planId"]
        assert status["lastExecution"]["status"] == "completed"
        assert status["pendingPlans"] == []
        code_status = await _call(c, "self_improve", {"action": "status"})
        assert code_status["lastExecution"]["planId"] == good["planId"]

        history = await _call(c, "memory", {"query": "history", "agent": "project"})
        outcomes = {(item["rationale"].split(":")[0], item["status"]) for item in history["items"]}
        assert outcomes == {(good["planId"], "kept")}  # the broken plan was never applied
        decisions = await _call(c, "memory", {"query": "decisions"})
        kinds = [d["kind"] for d in decisions["items"]]
        assert kinds.count("code_update.executed") == 2
        audit = await _call(c, "memory", {"query": "audit", "limit": 200})
        edits = [row["edit_type"] for row in audit["items"]]
        assert edits.count("code_plan_approved") == 2
        assert "rollback" not in edits
        assert audit["chain"]["ok"] is True
    errlog.close()
    assert (project / "calc" / "__init__.py").read_text() != CALC
    assert "Traceback" not in (tmp_path / "server.stderr").read_text()


def test_the_entry_point_reads_the_environment_and_logs_only_to_stderr(tmp_path: Path) -> None:
    """With no client input the server ends at once; stdout stayed the protocol's (empty)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AGENTMEND_WORKSPACE": str(tmp_path / "env-ws"),
        "AGENTMEND_PROJECT_ROOT": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "agentmend.mcp_server"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b""
    assert b"workspace_opened" in done.stderr
    assert (tmp_path / "env-ws" / "agentmend.db").exists()


async def test_a_provider_that_cannot_run_refuses_reviews_but_status_still_works(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    settings = Settings(provider="anthropic", test_command=PYTEST, test_timeout_s=TIMEOUT_S)
    tools = AgentmendTools(project / ".agentmend", project_root=project, settings=settings)
    try:
        tools.workspace()  # made here: status only reads an existing workspace
        async with _client(tools) as client:
            assert _data(await client.call_tool("status", {}))["provider"] == "anthropic"
            for arguments in ({"agent": "research-agent"}, {"path": "calc/__init__.py"}):
                result = await client.call_tool("analyze", arguments)
                assert result.is_error
                assert "provider anthropic" in _text(result)
                assert "API key" in _text(result)
            plan = await _call(client, "self_improve", {
                "action": "plan", "description": "mul", "diff": DIFF_EXTEND})  # fmt: skip
            await _call(client, "self_improve", {"action": "approve", "planId": plan["planId"]})
            done = await _call(client, "self_improve", {"action": "execute",
                                                        "planId": plan["planId"]})  # fmt: skip
            assert (done["success"], done["status"]) == (False, "refused")
            assert "supervisor unavailable: provider anthropic" in done["reason"]
    finally:
        await tools.aclose()
    assert (project / "calc" / "__init__.py").read_text() == CALC


async def test_a_provider_that_could_not_run_is_tried_again_by_later_calls(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    settings = Settings(provider="anthropic")
    tools = AgentmendTools(project / ".agentmend", project_root=project, settings=settings)
    try:
        with pytest.raises(BadRequest, match=r"provider anthropic: .*API key"):
            tools.orchestrator()
        # the key is set meanwhile (and a loopback URL, where nothing listens or is sent)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-a-real-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
        orchestrator = tools.orchestrator()  # no restart needed (nothing is sent anywhere)
        assert isinstance(orchestrator.roles_runtime, AnthropicRuntime)
        assert isinstance(orchestrator.team.runtime, AnthropicRuntime)
    finally:
        await tools.aclose()


async def test_the_read_only_tools_never_create_a_workspace(project: Path) -> None:
    fresh = project / "fresh-ws"
    tools = AgentmendTools(fresh, project_root=project, settings=Settings())
    try:
        async with _client(tools) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            for name, arguments in (("status", {}), ("memory", {"query": "config"})):
                annotations = listed[name].annotations
                assert annotations is not None
                assert annotations.read_only_hint is True
                result = await client.call_tool(name, arguments)
                assert result.is_error, _text(result)
                assert f"workspace {fresh} cannot be opened" in _text(result)
                assert "does not exist" in _text(result)
                assert not fresh.exists()
            fresh.mkdir()  # a folder, but no workspace in it: still nothing is written
            result = await client.call_tool("memory", {"query": "history"})
            assert result.is_error
            assert "no store" in _text(result)
            assert list(fresh.iterdir()) == []
            # a tool that is not read-only creates it; then the read-only ones read it
            assert not (await client.call_tool("self_improve", {"action": "status"})).is_error
            assert (fresh / "agentmend.db").is_file()
            assert _data(await client.call_tool("status", {}))["workspace"] == str(fresh)
    finally:
        await tools.aclose()


async def test_the_status_of_a_workspace_whose_store_is_on_a_server(
    project: Path, pg_url: str
) -> None:
    # its folder never holds an agentmend.db: the store is the server's, and status reads it
    folder = project / "pg-ws"
    settings = Settings(store_url=pg_url)
    creator = AgentmendTools(folder, project_root=project, settings=settings)
    try:
        async with _client(creator) as client:
            assert not (await client.call_tool("self_improve", {"action": "status"})).is_error
    finally:
        await creator.aclose()
    assert not (folder / "agentmend.db").exists()
    reader = AgentmendTools(folder, project_root=project, settings=settings)
    try:
        async with _client(reader) as client:
            result = await client.call_tool("status", {})
            assert not result.is_error, _text(result)
            assert _data(result)["workspace"] == str(folder)
    finally:
        await reader.aclose()
