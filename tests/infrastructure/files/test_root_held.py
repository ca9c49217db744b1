"""One root opened for every walk of a block (what an apply's steps share): the same answers as
opening it per call, symlinks still refused below it, the folders walked to kept open until the
block ends (and forgotten when one is renamed or removed), and every descriptor closed after."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentmend.infrastructure.errors import PathNotAllowed
from agentmend.infrastructure.files import confined, links


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_walks_inside_the_block_start_from_the_directory_opened_at_its_start(
    tmp_path: Path,
) -> None:
    root = tmp_path / "team"
    (root / "agents").mkdir(parents=True)
    (root / "agents" / "a.md").write_bytes(b"old")
    before = _open_fds()
    with confined.root_held(root):
        assert _open_fds() == before + 1
        with confined.root_held(root):  # nested: the outer block's descriptor
            assert _open_fds() == before + 1
            assert confined.read(root, "agents/a.md") == b"old"
        confined.write(root, "agents/a.md", b"new")
        confined.write(root, "agents/deep/b.md", b"made")
        confined.link_or_copy(root, "agents/a.md", ".agent/backups/a.bak", b"new")
        # the folders walked to stay open for the next walk (agents, agents/deep, the backups);
        # the folders on the way to them (.agent) do not
        assert _open_fds() == before + 4
        confined.write(root, "agents/deep/c.md", b"made")
        assert confined.read(root, "agents/a.md") == b"new"
        assert _open_fds() == before + 4  # walked from the kept ones: nothing more opened
        # the folder moved away: the walks follow the directory opened, not the name
        root.rename(tmp_path / "moved")
        confined.write(root, "agents/c.md", b"after the move")
    assert _open_fds() == before
    moved = tmp_path / "moved"
    assert (moved / "agents" / "a.md").read_bytes() == b"new"
    assert (moved / "agents" / "deep" / "b.md").read_bytes() == b"made"
    assert (moved / ".agent" / "backups" / "a.bak").read_bytes() == b"new"
    assert (moved / "agents" / "c.md").read_bytes() == b"after the move"
    with pytest.raises(PathNotAllowed, match="cannot be opened"):  # the name again, after
        confined.read(root, "agents/a.md")


def test_a_symlink_below_a_held_root_is_refused_as_without_it(tmp_path: Path) -> None:
    root = tmp_path / "team"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (root / "agents").symlink_to(tmp_path / "outside")
    with confined.root_held(root):
        with pytest.raises(PathNotAllowed, match="symlink"):
            confined.write(root, "agents/a.md", b"x")
        with pytest.raises(PathNotAllowed, match="symlink"):
            confined.read(root, "agents/a.md")
    assert list((tmp_path / "outside").iterdir()) == []


def test_a_root_that_cannot_be_opened_is_refused_before_the_block(tmp_path: Path) -> None:
    before = _open_fds()
    with (
        pytest.raises(PathNotAllowed, match="cannot be opened"),
        confined.root_held(tmp_path / "missing"),
    ):
        pass
    assert _open_fds() == before


def test_a_folder_renamed_or_removed_in_the_block_is_walked_to_by_name_again(
    tmp_path: Path,
) -> None:
    root = tmp_path / "team"
    (root / "v1").mkdir(parents=True)
    (root / "v1" / "a.md").write_bytes(b"first")
    before = _open_fds()
    with confined.root_held(root):
        assert confined.read(root, "v1/a.md") == b"first"  # v1 kept open
        links.rename_directory(str(root), "v1", "old")
        (root / "v1").mkdir()
        (root / "v1" / "a.md").write_bytes(b"second")
        assert confined.read(root, "v1/a.md") == b"second"  # the new v1, not the one kept
        confined.write(root, "gone/a.md", b"x")
        links.remove_tree(str(root), "gone")
        confined.write(root, "gone/a.md", b"again")  # made anew, not in the removed one
    assert _open_fds() == before
    assert (root / "old" / "a.md").read_bytes() == b"first"
    assert (root / "gone" / "a.md").read_bytes() == b"again"
