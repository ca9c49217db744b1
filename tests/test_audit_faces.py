"""A break in the audit chain as the faces show it: ``agentmend audit verify``, the MCP status,
and ``agentmend audit acknowledge``, which only an administrator may run."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from agents.faces.cli import main
from agents.faces.mcp_tools import AgentmendTools
from agents.faces.workspace import DB_NAME, Workspace
from infrastructure.models import ChangeStatus, ChangeType, ImprovementAction
from infrastructure.settings import Settings

pytestmark = pytest.mark.usefixtures("restore_logging")


def _broken_workspace(folder: Path) -> None:
    """Three logged changes, the newest row cut off in the database alone, then a rollback."""
    action = ImprovementAction(
        target_agent="research-agent",
        action_type=ChangeType.PROMPT_MODIFICATION,
        confidence_score=0.9,
    )
    with Workspace.open(folder, settings=Settings()) as ws:
        for _ in range(3):
            ws.manager.log_change(action, ChangeStatus.APPLIED)
    conn = sqlite3.connect(folder / DB_NAME)
    conn.execute("DELETE FROM audit_log WHERE id = 3")
    conn.commit()
    conn.close()
    with Workspace.open(folder, settings=Settings(), create=False) as ws:
        assert ws.manager.rollback_last(reason="ordinary work") is not None


def _verify(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main(["audit", "verify", "--workspace", str(folder), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_command_reports_a_break_until_an_administrator_acknowledges_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "ws"
    _broken_workspace(folder)
    capsys.readouterr()
    for _ in range(2):
        code, report = _verify(folder, capsys)
        assert code == 1
        assert [p["kind"] for p in report["problems"]] == ["chain_break"]  # type: ignore[attr-defined]
    assert main(["status", "--workspace", str(folder), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["audit"]["ok"] is False
    assert [p["kind"] for p in status["audit"]["problems"]] == ["chain_break"]
    assert main(["audit", "acknowledge", "--workspace", str(folder)]) == 2
    assert "needs the 'admin' permission" in capsys.readouterr().err
    assert _verify(folder, capsys)[0] == 1
    monkeypatch.setenv("AGENTMEND_PRINCIPAL_ADMIN", "true")
    monkeypatch.setenv("AGENTMEND_PRINCIPAL_ID", "ops-1")
    args = ["audit", "acknowledge", "--workspace", str(folder), "--note", "checked", "--json"]
    assert main(args) == 0
    acked = json.loads(capsys.readouterr().out)
    assert acked["acknowledged_rows"] == [4]
    assert acked["by"] == "ops-1"
    code, report = _verify(folder, capsys)
    assert code == 0
    assert any("acknowledged by" in n for n in report["notes"])  # type: ignore[attr-defined]
    assert main(["status", "--workspace", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["audit"]["ok"] is True


async def test_the_mcp_status_reports_the_break(tmp_path: Path) -> None:
    folder = tmp_path / "ws"
    _broken_workspace(folder)
    tools = AgentmendTools(folder, project_root=tmp_path, settings=Settings())
    try:
        status = await tools.status()
    finally:
        await tools.aclose()
    audit = status.data["audit"]
    assert audit["ok"] is False
    assert "chain_break" in audit["problems"][0]
    assert "Audit chain: DOES NOT VERIFY" in status.text
