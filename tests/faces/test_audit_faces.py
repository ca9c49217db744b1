"""A break in the audit chain as the faces show it: ``agentmend audit verify``, the MCP status,
and ``agentmend audit acknowledge``, which only an administrator may run.

On SQLite and on a real PostgreSQL server, each in its documented configuration (a PostgreSQL
store is keyed through ``AGENTMEND_AUDIT_HMAC_KEY``, its head file kept in the workspace); the
row is cut off through a plain database connection (:mod:`raw_sql`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from raw_sql import raw_execute

from agentmend.faces.cli.app import main
from agentmend.faces.mcp.tools import AgentmendTools
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.models import ChangeStatus, ChangeType, ImprovementAction
from agentmend.infrastructure.settings import Settings

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture
def settings(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The workspace's store on each backend; a PostgreSQL one keyed, as documented."""
    monkeypatch.setenv("AGENTMEND_STORE_URL", store_url)
    if store_url.startswith("postgres"):
        monkeypatch.setenv("AGENTMEND_AUDIT_HMAC_KEY", "kept-off-the-database-server")
    else:  # SQLite's default: the store is the workspace's own file
        monkeypatch.delenv("AGENTMEND_STORE_URL")
    return Settings()


def _broken_workspace(folder: Path, settings: Settings) -> None:
    """Three logged changes, the newest row cut off in the database alone, then a rollback."""
    action = ImprovementAction(
        target_agent="research-agent",
        action_type=ChangeType.PROMPT_MODIFICATION,
        confidence_score=0.9,
    )
    with Workspace.open(folder, settings=settings) as ws:
        for _ in range(3):
            ws.manager.log_change(action, ChangeStatus.APPLIED)
        url = ws.store.url
    raw_execute(url, "DELETE FROM audit_log WHERE id = 3")
    with Workspace.open(folder, settings=settings, create=False) as ws:
        assert ws.manager.rollback_last(reason="ordinary work") is not None


def _verify(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main(["audit", "verify", "--workspace", str(folder), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_command_reports_a_break_until_an_administrator_acknowledges_it(
    settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = tmp_path / "ws"
    _broken_workspace(folder, settings)
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


def test_an_edited_row_is_reported_until_an_administrator_acknowledges_it(
    settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The documented way back from a row altered in the database to a chain that verifies."""
    folder = tmp_path / "ws"
    action = ImprovementAction(
        target_agent="research-agent",
        action_type=ChangeType.PROMPT_MODIFICATION,
        confidence_score=0.9,
    )
    with Workspace.open(folder, settings=settings) as ws:
        for _ in range(3):
            ws.manager.log_change(action, ChangeStatus.APPLIED)
        url = ws.store.url
    raw_execute(url, "UPDATE audit_log SET new_value = 'rewritten' WHERE id = 2")
    capsys.readouterr()
    code, report = _verify(folder, capsys)
    assert code == 1
    assert [(p["row_id"], p["kind"]) for p in report["problems"]] == [(2, "edited")]  # type: ignore[attr-defined]
    assert main(["audit", "acknowledge", "--workspace", str(folder)]) == 2  # not an admin
    capsys.readouterr()
    monkeypatch.setenv("AGENTMEND_PRINCIPAL_ADMIN", "true")
    monkeypatch.setenv("AGENTMEND_PRINCIPAL_ID", "ops-1")
    assert main(["audit", "acknowledge", "--workspace", str(folder), "--note", "checked"]) == 0
    said = capsys.readouterr().out
    assert "acknowledged the problem(s) at row(s) 2 as ops-1" in said
    assert "still reported" not in said
    code, report = _verify(folder, capsys)
    assert code == 0
    assert any(
        "row 2 edited" in n and "acknowledged by" in n
        for n in report["notes"]  # type: ignore[attr-defined]
    )
    # an acknowledgement covers what it names: an edit made after it is reported again
    raw_execute(url, "UPDATE audit_log SET new_value = 'again' WHERE id = 1")
    code, report = _verify(folder, capsys)
    assert code == 1
    assert [(p["row_id"], p["kind"]) for p in report["problems"]] == [(1, "edited")]  # type: ignore[attr-defined]
    assert main(["audit", "acknowledge", "--workspace", str(folder)]) == 0
    assert "nothing to acknowledge" not in capsys.readouterr().out
    assert _verify(folder, capsys)[0] == 0


async def test_the_mcp_status_reports_the_break(tmp_path: Path, settings: Settings) -> None:
    folder = tmp_path / "ws"
    _broken_workspace(folder, settings)
    tools = AgentmendTools(folder, project_root=tmp_path, settings=settings)
    try:
        status = await tools.status()
    finally:
        await tools.aclose()
    audit = status.data["audit"]
    assert audit["ok"] is False
    assert "chain_break" in audit["problems"][0]
    assert "Audit chain: DOES NOT VERIFY" in status.text
