"""Team ids: one id per team folder, kept in its ``.agent/`` and registered in the store."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.team_registry import (
    TEAM_ID_FILE,
    team_id,
    team_roots,
)
from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.store.api import Store


def test_a_team_keeps_its_id_and_the_store_knows_where_each_host_has_it(
    store_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "team"
    root.mkdir()
    with Store(store_url, files_dir=tmp_path) as store:
        first = team_id(root, store)
        assert (root / TEAM_ID_FILE).read_text().strip() == first
        assert team_id(root, store) == first
        assert team_roots(store, first) == {socket.gethostname(): str(root.absolute())}
        (root / TEAM_ID_FILE).write_text("not an id!\n")
        with pytest.raises(ConfigurationError):  # a damaged file is named, never replaced
            team_id(root, store)


def test_changes_record_their_team(store_url: str, tmp_path: Path) -> None:
    root = tmp_path / "team"
    (root / "agents").mkdir(parents=True)
    (root / "agents" / "writer.md").write_text("---\nname: writer\n---\nBe thorough.\n")
    with Store(store_url, files_dir=tmp_path) as store:
        manager = ImprovementManager(store=store)
        try:
            action = ImprovementAction(
                target_agent="writer",
                action_type=ChangeType.PROMPT_MODIFICATION,
                old_value="Be thorough.",
                new_value="Be brief.",
                rationale="shorter answers",
                confidence_score=0.9,
            )
            record = manager.apply(
                action,
                path="agents/writer.md",
                new_content="---\nname: writer\n---\nBe brief.\n",
                root=root,
            )
            row = (
                store.connection()
                .execute("SELECT team_id FROM changes WHERE change_id = ?", (record.change_id,))
                .fetchone()
            )
            assert row[0] == team_id(root, store)
        finally:
            manager.close()


def test_the_remembered_id_follows_the_file(store_url: str, tmp_path: Path) -> None:
    """The id is remembered per root, and read again once its file is replaced or removed."""
    root = tmp_path / "team"
    root.mkdir()
    with Store(store_url, files_dir=tmp_path) as store:
        first = team_id(root, store)
        old = (root / TEAM_ID_FILE).stat().st_mtime_ns - 5_000_000_000
        os.utime(root / TEAM_ID_FILE, ns=(old, old))  # settled: the next read is remembered
        assert team_id(root, store) == first
        assert team_id(root, store) == first
        replacement = root / ".agent" / "new-id"
        replacement.write_text("team-aaaaaaaaaaaa\n")
        os.replace(replacement, root / TEAM_ID_FILE)  # a team folder copied over this one
        assert team_id(root, store) == "team-aaaaaaaaaaaa"
        assert team_roots(store, "team-aaaaaaaaaaaa") == {
            socket.gethostname(): str(root.absolute())
        }
        (root / TEAM_ID_FILE).write_text("team-bbbbbbbbbbbb\n")  # same size, rewritten in place
        assert team_id(root, store) == "team-bbbbbbbbbbbb"
        (root / TEAM_ID_FILE).unlink()
        made = team_id(root, store)
        assert made not in (first, "team-aaaaaaaaaaaa", "team-bbbbbbbbbbbb")
        assert (root / TEAM_ID_FILE).read_text().strip() == made
