"""Releases: publication, refusal, reading, diff, materialization, the link, following, routing.

The tests that touch the store run on both backends (``store_url``: a SQLite file, then a
PostgreSQL database on the test server); a volume detached under a worker is SQLite's case.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.errors import (
    InvalidArgument,
    NotFound,
    PathNotAllowed,
    WrongArgumentType,
)
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.links import swap_link
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.releases.content import read_team_files
from agentmend.infrastructure.releases.errors import ReleaseRefused
from agentmend.infrastructure.releases.follower import ReleaseFollower
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.materialize import ReleaseDirectories
from agentmend.infrastructure.releases.routing import check_share, choose_arm
from agentmend.infrastructure.releases.signals import ReleaseWakeup, announce
from agentmend.infrastructure.simulation import copy_team
from agentmend.infrastructure.store.api import Store

CYCLE = Principal("cycle", "improvement cycle")
ADMIN_USER = Principal("ops", "Operator", frozenset({ADMIN}))


@pytest.fixture
def team(tmp_path: Path) -> Path:
    return copy_team(tmp_path / "team")


@pytest.fixture
def store(store_url: str, tmp_path: Path) -> Iterator[Store]:
    if "://" in store_url:
        opened = Store(store_url, files_dir=tmp_path / "files")
    else:
        opened = Store(tmp_path / "store" / "agentmend.db")
    with opened:
        yield opened


@pytest.fixture
def log(store: Store) -> ReleaseLog:
    return ReleaseLog(store, "team-1", audit=AuditLog(store))


def _edit(team: Path, name: str, old: str, new: str) -> None:
    path = team / name
    path.write_text(path.read_text().replace(old, new, 1))


def test_first_release_is_stable_and_carries_every_file_hash(team: Path, log: ReleaseLog) -> None:
    release = log.publish_directory(team, by=CYCLE, change_ids=("chg-1",))
    assert release.version == 1
    assert release.parent is None
    assert release.change_ids == ("chg-1",)
    assert dict(release.files).keys() == read_team_files(team).keys()
    assert len(release.files) == 12  # six definitions, six eval suites
    assert log.heads().stable == 1
    assert log.heads().canary is None
    assert log.files(1) == read_team_files(team)
    entries = log.audit.entries() if log.audit else []
    assert [e.edit_type for e in entries] == ["release_published"]


def test_later_release_has_parent_and_a_diff(team: Path, log: ReleaseLog) -> None:
    log.publish_directory(team, by=CYCLE)
    _edit(team, "research-agent.md", "max_tokens: 2048", "max_tokens: 4096")
    second = log.publish_directory(team, by=CYCLE, change_ids=("chg-2",))
    assert second.version == 2
    assert second.parent == 1
    assert log.heads().stable == 1  # served only once a rollout starts it
    diff = log.diff(1, 2)
    assert diff.changed == ("research-agent.md",)
    assert not diff.added
    assert not diff.removed
    assert "-  max_tokens: 2048" in diff.text
    assert "+  max_tokens: 4096" in diff.text
    assert [r.version for r in log.list()] == [2, 1]


def test_same_content_has_the_same_address(team: Path, log: ReleaseLog) -> None:
    a = log.publish_directory(team, by=CYCLE)
    b = log.publish_directory(team, by=CYCLE)
    assert a.content_hash == b.content_hash
    assert a.version != b.version


def test_a_release_that_fails_to_parse_is_refused_naming_the_file(
    team: Path, log: ReleaseLog, store: Store
) -> None:
    log.publish_directory(team, by=CYCLE)
    (team / "quality-agent.md").write_text("---\nname: [unclosed\n---\nbody\n")
    with pytest.raises(ReleaseRefused) as caught:
        log.publish_directory(team, by=CYCLE)
    assert caught.value.path == "quality-agent.md"
    assert [r.version for r in log.list()] == [1]  # nothing written
    (team / "quality-agent.md").unlink()
    (team / "quality-agent.evals.yaml").write_text("cases: [1, 2\n")
    with pytest.raises(ReleaseRefused, match=r"quality-agent\.evals\.yaml"):
        log.publish_directory(team, by=CYCLE)
    assert [r.version for r in log.list()] == [1]
    rows = store.connection().execute("SELECT COUNT(*) FROM release_files").fetchone()[0]
    assert rows == 12


def test_a_release_without_definitions_or_with_binary_docs_is_refused(log: ReleaseLog) -> None:
    with pytest.raises(ReleaseRefused, match="no agent definition"):
        log.publish({"notes.txt": b"hello"}, by=CYCLE)
    with pytest.raises(ReleaseRefused) as caught:
        log.publish({"a/docs/x.md": b"\xff\xfe"}, by=CYCLE)
    assert caught.value.path == "a/docs/x.md"


def test_unknown_release_is_not_found(log: ReleaseLog) -> None:
    with pytest.raises(NotFound, match="release"):
        log.get(7)


def test_rollback_publishes_the_parents_content_as_a_new_stable_release(
    team: Path, log: ReleaseLog
) -> None:
    log.publish_directory(team, by=CYCLE)
    _edit(team, "research-agent.md", "max_tokens: 2048", "max_tokens: 4096")
    log.publish_directory(team, by=CYCLE, stable=True)
    back = log.publish_rollback(2, by=CYCLE)
    assert back.version == 3
    assert back.parent == 2
    assert back.content_hash == log.get(1).content_hash
    assert log.heads().stable == 3
    assert [r.version for r in log.list()] == [3, 2, 1]  # history kept


# -- materialization and the link --------------------------------------------------------------


def test_materialize_and_switch_the_link(team: Path, log: ReleaseLog, tmp_path: Path) -> None:
    log.publish_directory(team, by=CYCLE)
    dirs = ReleaseDirectories(tmp_path / "worker")
    served = dirs.materialize(log, 1)
    dirs.switch(served)
    assert os.readlink(dirs.team_dir) == f".releases/{served.directory.name}"
    assert (dirs.team_dir / "research-agent.md").read_bytes() == (
        team / "research-agent.md"
    ).read_bytes()
    assert dirs.linked() == served
    assert dirs.materialize(log, 1) == served  # reused, not rewritten


def test_the_link_is_the_only_symlink_the_layer_replaces(tmp_path: Path) -> None:
    root = tmp_path / "w"
    (root / ".releases" / "v1").mkdir(parents=True)
    (root / "agents").mkdir()
    with pytest.raises(PathNotAllowed, match="real entry"):
        swap_link(str(root), "agents", ".releases/v1")
    (root / "agents").rmdir()
    (root / "agents").symlink_to(tmp_path)  # someone else's link, absolute
    with pytest.raises(PathNotAllowed, match="did not make"):
        swap_link(str(root), "agents", ".releases/v1")
    (root / "agents").unlink()
    with pytest.raises(PathNotAllowed):
        swap_link(str(root), "agents", "../elsewhere")
    swap_link(str(root), "agents", ".releases/v1")
    # writes through the link are still refused: the rest of the layer follows no symlink
    with pytest.raises(PathNotAllowed):
        confined.write(str(root), "agents/x.md", b"x")


def test_follower_follows_publication_and_keeps_its_release_when_cut_off(
    team: Path, tmp_path: Path
) -> None:
    store = Store(tmp_path / "store" / "agentmend.db")
    log = ReleaseLog(store, "team-1", audit=AuditLog(store))
    log.publish_directory(team, by=CYCLE)
    follower = ReleaseFollower(log, tmp_path / "worker")
    status = follower.poll()
    assert status.connected
    assert status.stable == 1
    _edit(team, "research-agent.md", "max_tokens: 2048", "max_tokens: 4096")
    log.publish_directory(team, by=CYCLE, stable=True)
    assert follower.poll().stable == 2
    assert "max_tokens: 4096" in (follower.team_dir / "research-agent.md").read_text()
    volume = store.path.parent
    away = volume.with_name("detached")
    volume.rename(away)  # the store's volume is gone (database, WAL and all)
    try:
        status = follower.poll()
        assert not status.connected
        assert status.stable == 2
        assert status.problem is not None
        assert "unreachable" in status.problem
        assert follower.choose("user-1").version == 2  # still serving
    finally:
        away.rename(volume)
    assert follower.poll().connected


def test_a_pinned_worker_asked_for_a_missing_release_is_refused(
    team: Path, log: ReleaseLog, tmp_path: Path
) -> None:
    log.publish_directory(team, by=CYCLE)
    with pytest.raises(NotFound, match="release"):
        ReleaseFollower(log, tmp_path / "worker", pin=9)
    pinned = ReleaseFollower(log, tmp_path / "worker", pin=1)
    assert pinned.poll().stable == 1


# -- routing -----------------------------------------------------------------------------------


def test_routing_is_stable_and_close_to_the_share() -> None:
    keys = [f"user-{i}" for i in range(20_000)]
    arms = [choose_arm(k, 0.1, "rollout-a") for k in keys]
    assert arms == [choose_arm(k, 0.1, "rollout-a") for k in keys]
    share = arms.count("canary") / len(arms)
    assert 0.09 < share < 0.11
    other = [choose_arm(k, 0.1, "rollout-b") for k in keys]
    assert other != arms  # another rollout draws other users


@pytest.mark.parametrize("share", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_a_share_outside_the_open_interval_is_refused(share: float) -> None:
    with pytest.raises(InvalidArgument, match="canary share"):
        check_share(share)


def test_a_routing_key_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(WrongArgumentType, match="routing key"):
        choose_arm(12345, 0.1, "r")


def test_unchanged_files_are_copies_never_shared_with_the_linked_release(
    team: Path, log: ReleaseLog, tmp_path: Path
) -> None:
    log.publish_directory(team, by=CYCLE)
    dirs = ReleaseDirectories(tmp_path / "worker")
    first = dirs.materialize(log, 1)
    dirs.switch(first)
    _edit(team, "research-agent.md", "max_tokens: 2048", "max_tokens: 4096")
    log.publish_directory(team, by=CYCLE, stable=True)
    second = dirs.materialize(log, 2)
    # a file shared between two releases would carry an edit of one into the other
    same = (first.directory / "quality-agent.md").stat().st_ino
    assert (second.directory / "quality-agent.md").stat().st_ino != same
    changed = second.directory / "research-agent.md"
    assert changed.stat().st_ino != (first.directory / "research-agent.md").stat().st_ino
    assert "max_tokens: 4096" in changed.read_text()
    assert log.files(2) == read_team_files(second.directory)


# -- waking followers (PostgreSQL LISTEN/NOTIFY) ----------------------------------------------


def test_a_listener_wakes_on_its_teams_commits_only(pg_url: str, tmp_path: Path) -> None:
    with Store(pg_url, files_dir=tmp_path / "files") as store:
        log = ReleaseLog(store, "team-1")
        wakeup = ReleaseWakeup(store, "team-1", reconnect_every_s=0.0)
        stop = threading.Event()
        try:
            assert not wakeup.wait(0.01, stop)  # connects and listens; nothing announced yet
            assert wakeup.connected
            with store.transaction() as conn:
                announce(conn, "team-2")  # another team's release
            assert not wakeup.wait(0.3, stop)
            with pytest.raises(RuntimeError):
                _announce_then_fail(store, "team-1")  # rolled back: never heard
            assert not wakeup.wait(0.3, stop)
            log.publish_directory(copy_team(tmp_path / "team"), by=CYCLE)
            assert wakeup.wait(30.0, stop)  # the publication's commit
            assert wakeup.wakeups == 1
            # the listening session is killed (a failover, say): the wait falls back, then the
            # next one listens on a new connection
            pid = wakeup.backend_pid
            store.connection().execute("SELECT pg_terminate_backend(?)", (pid,))
            assert not wakeup.wait(0.3, stop)
            assert not wakeup.connected
            assert not wakeup.wait(0.01, stop)
            assert wakeup.connected
            assert wakeup.backend_pid != pid
            with store.transaction() as conn:
                announce(conn, "team-1")
            assert wakeup.wait(30.0, stop)
        finally:
            wakeup.close()


def _announce_then_fail(store: Store, team_id: str) -> None:
    with store.transaction() as conn:
        announce(conn, team_id)
        raise RuntimeError("the publication failed")


def test_on_sqlite_a_follower_only_polls(tmp_path: Path) -> None:
    with Store(tmp_path / "agentmend.db") as store:
        wakeup = ReleaseWakeup(store, "team-1")
        with store.transaction() as conn:
            announce(conn, "team-1")  # nothing to announce through: workers poll
        assert not wakeup.wait(0.05, threading.Event())
        assert not wakeup.listening
        assert not wakeup.connected
