"""Opening a workspace: the folder, the store, the simulated team, and the orchestrator on it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agentmend.faces.workspace import (
    DB_NAME,
    TEAM_DIR_NAME,
    TeamDirError,
    Workspace,
    WorkspaceError,
    build_runtimes,
)
from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import TEAM_AGENT_NAMES


def test_first_open_makes_the_store_and_copies_the_simulated_team(tmp_path: Path) -> None:
    folder = tmp_path / "ws"
    with Workspace.open(folder, settings=Settings()) as ws:
        assert ws.path == folder
        assert ws.settings.workspace == folder
        assert ws.store_path == folder / DB_NAME
        assert ws.team_dir == folder / TEAM_DIR_NAME
        names = sorted(p.stem for p in ws.team_dir.glob("*.md"))
        assert names == sorted(TEAM_AGENT_NAMES)
        ws.manager.audit.append(
            agent_name="x", edit_type="note", old_value=None, new_value="1", user_id="t"
        )
    edited = folder / TEAM_DIR_NAME / "research-agent.md"
    edited.write_text(edited.read_text() + "\nA local edit.\n")
    with Workspace.open(folder, settings=Settings(), create=False) as again:
        assert [e.new_value for e in again.manager.audit.entries()] == ["1"]
        assert edited.read_text().endswith("A local edit.\n")  # never copied over


def test_the_default_folder_comes_from_settings(tmp_path: Path) -> None:
    with Workspace.open(settings=Settings(workspace=tmp_path / "from-settings")) as ws:
        assert ws.path == tmp_path / "from-settings"
        assert ws.store_path.exists()


@pytest.mark.parametrize("problem", ["missing", "file", "not a database", "no definitions"])
def test_a_workspace_that_cannot_be_opened_says_why(tmp_path: Path, problem: str) -> None:
    folder = tmp_path / "ws"
    kwargs: dict[str, object] = {}
    expected = {
        "missing": "does not exist",
        "file": "is a file",
        "not a database": "is not a database",
        "no definitions": "no agent definitions",
    }[problem]
    if problem == "missing":
        kwargs["create"] = False
    elif problem == "file":
        folder.write_text("not a folder")
    elif problem == "not a database":
        folder.mkdir()
        (folder / DB_NAME).write_bytes(b"this is not sqlite" * 100)
    else:  # the workspace's own team folder, emptied
        (folder / TEAM_DIR_NAME).mkdir(parents=True)
        kwargs["create"] = False
    with pytest.raises(WorkspaceError, match=expected) as raised:
        Workspace.open(folder, settings=Settings(), **kwargs)  # type: ignore[arg-type]
    assert str(folder) in str(raised.value)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda team: None, "it does not exist"),
        (lambda team: team.write_text("not a folder"), "it is a file"),
        (lambda team: team.mkdir(), r"it holds no agent definitions \(\*\.md\)"),
    ],
)
def test_a_bad_team_folder_is_named_and_no_workspace_is_left_behind(
    tmp_path: Path, make: Callable[[Path], object], expected: str
) -> None:
    team = tmp_path / "nope"
    make(team)
    folder = tmp_path / ".agentmend"
    with pytest.raises(TeamDirError, match=expected) as raised:
        Workspace.open(folder, settings=Settings(), team_dir=team)
    assert str(raised.value).startswith(f"agent definitions folder {team} cannot be used")
    assert "workspace" not in str(raised.value)  # the workspace is not what is wrong
    assert not folder.exists()


def test_given_definitions_are_used_as_they_are(tmp_path: Path) -> None:
    team = tmp_path / "team"
    team.mkdir()
    (team / "writer.md").write_text("---\nname: writer\ndescription: writes\n---\nWrite.\n")
    with Workspace.open(tmp_path / "ws", settings=Settings(), team_dir=team) as ws:
        assert ws.team_dir == team
        assert not (tmp_path / "ws" / TEAM_DIR_NAME).exists()


async def test_the_offline_orchestrator_runs_on_the_workspace_store(tmp_path: Path) -> None:
    async with Workspace.open(tmp_path / "ws", settings=Settings()) as ws:
        orchestrator = ws.orchestrator(seed=3)
        assert orchestrator.store is ws.store
        assert orchestrator.monitor is ws.monitor
        task = await orchestrator.execute_task("Explain the Pythagorean theorem")
        assert sorted(task.results) == sorted(TEAM_AGENT_NAMES)
        ws.monitor.flush()
        metrics = ws.monitor.get_metrics()
        assert set(metrics) == set(TEAM_AGENT_NAMES)
    with Workspace.open(tmp_path / "ws", settings=Settings()) as reopened:
        assert set(reopened.monitor.get_metrics()) == set(TEAM_AGENT_NAMES)


def test_a_provider_without_a_key_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="API key"):
        build_runtimes("anthropic")
    with pytest.raises(ConfigurationError, match="unknown provider"):
        build_runtimes("nope")  # type: ignore[arg-type]


def test_the_interactive_session_keeps_a_session_budget_and_other_processes_a_rolling_one(
    tmp_path: Path,
) -> None:
    settings = Settings(improvement_window_s=1800, max_improvements_per_window=3)
    with Workspace.open(tmp_path / "ws", settings=settings) as ws:
        assert ws.manager.improvement_window_s == 1800
        assert ws.manager.max_improvements_per_window == 3
        assert ws.manager.improvements_left() == 3
    with Workspace.open(tmp_path / "ws", settings=settings, interactive=True) as ws:
        assert ws.manager.improvement_window_s is None
        assert ws.manager.improvements_left() == settings.max_improvements_per_session
