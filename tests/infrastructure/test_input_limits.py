"""Bounded input: over a bound is an InputTooLarge naming the input and the setting; nothing is
stored. Also: odd paths and odd files are PathNotAllowed with the path and the reason, and an
MCP client sees that message."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from mcp import Client
from tiny_project import make_project

from agentmend.faces.mcp.server import build_server
from agentmend.faces.mcp.tools import AgentmendTools
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.code_update.updater import CodeUpdater, FileOperation
from agentmend.infrastructure.definitions.spec import AgentSpec, load_agent_specs
from agentmend.infrastructure.errors import (
    FileOperationError,
    FileTooLarge,
    InputTooLarge,
    PathNotAllowed,
    SpecError,
    StoreError,
)
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.atomic import resolve_inside
from agentmend.infrastructure.limits import InputLimits
from agentmend.infrastructure.llm.testing import ScriptedRuntime
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.settings import Settings
from agentmend.roles.code_review import CodeReviewer
from agentmend.roles.team import AgentTeam

KIB = 1024
MIB = 1024 * KIB


def _action(**fields: object) -> ImprovementAction:
    return ImprovementAction(
        target_agent="writer",
        action_type=ChangeType.PROMPT_MODIFICATION,
        confidence_score=0.9,
        **fields,
    )


def _rows(manager: ImprovementManager) -> int:
    with sqlite3.connect(manager.store.path) as conn:
        return int(conn.execute("SELECT count(*) FROM changes").fetchone()[0])


# -- bounds ----------------------------------------------------------------------------------


def test_the_documented_defaults() -> None:
    settings = Settings.model_construct()
    assert (settings.max_text_bytes, settings.max_plan_files) == (64 * KIB, 100)
    assert (settings.max_file_bytes, settings.max_tool_argument_bytes) == (MIB, MIB)
    assert (settings.max_request_bytes, settings.max_plan_bytes) == (10 * MIB, 10 * MIB)
    assert settings.max_request_depth == 64


def test_an_error_names_the_input_the_bound_and_the_setting() -> None:
    with pytest.raises(InputTooLarge) as caught:
        InputLimits().text("description", "é" * (32 * KIB + 1))  # two bytes each in UTF-8
    error = caught.value
    assert (error.what, error.size, error.limit, error.setting) == (
        "description", 64 * KIB + 2, 64 * KIB, "max_text_bytes",
    )  # fmt: skip
    assert "AGENTMEND_MAX_TEXT_BYTES" in str(error)
    assert pickle.loads(pickle.dumps(error)).setting == "max_text_bytes"
    InputLimits().text("description", "x" * 64 * KIB)  # at the bound: fine


def test_apply_refuses_oversized_input_and_records_nothing(
    manager: ImprovementManager, tmp_path: Path
) -> None:
    root = tmp_path / "team"
    root.mkdir()
    (root / "writer.md").write_text("old\n")
    with pytest.raises(InputTooLarge, match="max_file_bytes"):
        manager.apply(_action(), path="writer.md", new_content="x" * (MIB + 1), root=root)
    with pytest.raises(InputTooLarge, match="max_text_bytes"):
        manager.apply(_action(rationale="r" * (64 * KIB + 1)), path="writer.md",
                      new_content="new\n", root=root)  # fmt: skip
    many = [(_action(), f"f{i}.md", "x") for i in range(101)]
    with pytest.raises(InputTooLarge, match="max_plan_files"):
        manager.apply_group(many, root=root)
    with pytest.raises(InputTooLarge, match="max_text_bytes"):
        manager.log_change(_action(rationale="r" * (64 * KIB + 1)))
    assert _rows(manager) == 0
    assert (root / "writer.md").read_text() == "old\n"
    assert not (root / "f0.md").exists()


def test_a_plan_over_a_bound_is_refused_and_not_stored(
    manager: ImprovementManager, tmp_path: Path
) -> None:
    project = make_project(tmp_path / "proj")
    updater = CodeUpdater(project, manager=manager, reviewer=CodeReviewer(None))
    with pytest.raises(InputTooLarge, match="description"):
        updater.create_plan("d" * (64 * KIB + 1), [FileOperation(path="a.py", operation="create",
                                                                 content="X = 1\n")])  # fmt: skip
    files = [
        FileOperation(path=f"m{i}.py", operation="create", content="X=1\n") for i in range(101)
    ]
    with pytest.raises(InputTooLarge, match="101 files"):
        updater.create_plan("many", files)
    big = [FileOperation(path=f"m{i}.py", operation="create", content="#" * 878_000 + "\n")
           for i in range(100)]  # fmt: skip
    with pytest.raises(InputTooLarge, match="max_plan_bytes"):
        updater.create_plan("the 88 MB plan", big)
    with sqlite3.connect(manager.store.path) as conn:
        assert conn.execute("SELECT count(*) FROM plans").fetchone()[0] == 0


async def test_an_mcp_client_sees_the_bound_and_the_refused_path(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj")
    (project / "loop").symlink_to(project / "loop")
    tools = AgentmendTools(project / ".agentmend", project_root=project, settings=Settings())
    try:
        async with Client(build_server(tools), read_timeout_seconds=60) as client:
            big = await client.call_tool(
                "self_improve", {"action": "plan", "description": "x" * (MIB + 1),
                                 "files": [{"path": "a.py", "operation": "create",
                                            "content": "X = 1\n"}]},
            )  # fmt: skip
            assert big.is_error
            text = "".join(getattr(block, "text", "") for block in big.content)
            assert "argument 'description'" in text
            assert "max_tool_argument_bytes" in text
            looped = await client.call_tool(
                "self_improve", {"action": "plan", "description": "loop",
                                 "files": [{"path": "loop/a.py", "operation": "create",
                                            "content": "X = 1\n"}]},
            )  # fmt: skip
            assert looped.is_error
            text = "".join(getattr(block, "text", "") for block in looped.content)
            assert "loop/a.py" in text
            assert "symlink loop" in text
    finally:
        await tools.aclose()


# -- odd paths and odd files -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("a\x00b.md", "NUL byte"),
        ("n" * 256 + ".md", "over 255 bytes"),
        ("/".join(["d" * 200] * 21), "over 4096 bytes"),
        (os.fsdecode(b"bad\xff.md"), "not UTF-8"),
        (b"bad\xff.md", "not UTF-8"),
        ("../outside.md", "'..'"),
        ("/etc/passwd", "outside the root"),
    ],
)
def test_odd_path_text_is_refused_with_the_path_and_the_reason(
    tmp_path: Path, path: str | bytes, reason: str
) -> None:
    with pytest.raises(PathNotAllowed, match=reason) as caught:
        confined.write(tmp_path, path, b"x")
    assert caught.value.problem
    assert str(tmp_path) in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_odd_files_are_refused_by_kind(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    os.mkfifo(tmp_path / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "out").symlink_to("/etc")
    try:
        cases = {
            ("read", "loop"): "symlink",
            ("read", "fifo"): "FIFO",
            ("read", "sock"): "socket",
            ("read", "dir"): "directory",
            ("write", "dir"): "directory",
            ("write", "file/x.md"): "not a directory",
            ("write", "loop/x.md"): "symlink",
            ("write", "out/x.md"): "symlink",
            ("delete", "dir"): "directory",
        }
        operations: dict[str, Callable[[str], object]] = {
            "read": lambda rel: confined.read(tmp_path, rel),
            "write": lambda rel: confined.write(tmp_path, rel, b"x"),
            "delete": lambda rel: confined.delete(tmp_path, rel),
        }
        for (operation, rel), reason in cases.items():
            with pytest.raises(PathNotAllowed, match=reason):
                operations[operation](rel)
        with pytest.raises(PathNotAllowed, match="device"):
            confined.read("/dev", "null")
        with pytest.raises(PathNotAllowed, match="symlink loop"):
            resolve_inside(tmp_path, "loop/x.md")
    finally:
        server.close()
    with pytest.raises(FileTooLarge, match="over the limit of 0 bytes"):
        confined.read(tmp_path, "file", max_bytes=0)
    assert pickle.loads(pickle.dumps(FileOperationError("/x", "write", OSError(28, "full")))).cause
    assert pickle.loads(pickle.dumps(StoreError("m", path="/p", cause="SQLITE_FULL"))).cause


WRITER = "---\nname: writer\ndescription: writes\n---\nYou write.\n"
READER = "---\nname: reader\ndescription: reads\n---\nYou read.\n"


def test_a_team_loads_past_bad_docs_and_fails_only_the_broken_agent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    team = tmp_path / "team"
    docs = team / "writer" / "docs"
    docs.mkdir(parents=True)
    (team / "writer.md").write_text(WRITER)
    (team / "reader.md").write_text(READER)
    (team / "broken.md").write_text("no front matter")
    os.mkfifo(team / "fifo.md")  # a FIFO where a definition should be: never opened for long
    (docs / "good.md").write_text("Short sentences.")
    (docs / "loop.md").symlink_to(docs / "loop.md")
    os.mkfifo(docs / "pipe.md")
    (docs / "binary.md").write_bytes(b"\x00\x01\x02")
    (docs / "huge.md").write_bytes(b"x" * (MIB + 1))
    broken: dict[str, SpecError] = {}
    with caplog.at_level(logging.WARNING, logger="agentmend"):
        specs = load_agent_specs(team, broken=broken)
    logs = [vars(record) for record in caplog.records]
    assert sorted(specs) == ["reader", "writer"]
    assert specs["writer"].docs == (("docs/good.md", "Short sentences."),)
    assert sorted(broken) == ["broken", "fifo"]
    assert "FIFO" in broken["fifo"].problem
    skipped = {e["doc"]: e["reason"] for e in logs if e["event"] == "ignored_agent_doc"}
    assert set(skipped) == {"loop.md", "pipe.md", "binary.md", "huge.md"}
    assert "loop" in skipped["loop.md"]
    assert "FIFO" in skipped["pipe.md"]
    assert skipped["binary.md"] == "binary"
    assert "over the limit" in skipped["huge.md"]
    with pytest.raises(SpecError, match="FIFO"):
        AgentSpec.from_file(team / "fifo.md")


def test_a_team_with_one_broken_definition_serves_the_others(tmp_path: Path) -> None:
    team_dir = tmp_path / "team"
    team_dir.mkdir()
    (team_dir / "writer.md").write_text(WRITER)
    (team_dir / "broken.md").write_text("---\nname: [unclosed\n---\n")
    team = AgentTeam(team_dir, ScriptedRuntime())
    assert team.names == ["writer"]
    assert list(team.broken) == ["broken"]
    with pytest.raises(SpecError, match=r"broken\.md"):
        team.spec("broken")
    assert team.spec("writer").name == "writer"
