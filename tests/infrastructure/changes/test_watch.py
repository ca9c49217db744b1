"""A change watched on live runs: rolled back when it hurts, kept when it helps, and continued
(not undone) by whoever opens the store after the watching process was killed."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from crash_child import kill_at_marker
from watch_child import BEFORE, NEW, OLD, action

from agentmend.infrastructure.changes.improvement_manager import (
    ChangeStatus,
    ChangeType,
    ImprovementAction,
    ImprovementManager,
)
from agentmend.infrastructure.changes.protocol.owners import RecordOwner
from agentmend.infrastructure.changes.watch import ChangeWatcher
from agentmend.infrastructure.errors import InvalidArgument
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "a.md").write_bytes(OLD)
    return folder


def _watch_runs(
    manager: ImprovementManager,
    watcher: ChangeWatcher,
    watch_id: str,
    rng: random.Random,
    p_success: float,
    most: int,
) -> int:
    """Record runs one at a time, advancing after each, until the watch ends; runs used."""
    with PerformanceMonitor(manager.store, baseline_n=30) as monitor:
        for i in range(1, most + 1):
            monitor.record("a", success=rng.random() < p_success, duration_ms=100.0)
            monitor.flush()
            if watcher.advance(watch_id).state != "watching":
                return i
    return most


def _status(manager: ImprovementManager) -> ChangeStatus:
    (record,) = manager.get_history()
    return record.status


def test_a_change_that_hurts_is_rolled_back_as_soon_as_the_test_says_so(
    root: Path, tmp_path: Path
) -> None:
    with ImprovementManager(tmp_path / "s.db") as manager:
        watcher = ChangeWatcher(manager)
        watch = watcher.start(action(), path="a.md", new_content=NEW, root=root, before=BEFORE)
        assert (root / "a.md").read_text() == NEW
        used = _watch_runs(manager, watcher, watch.watch_id, random.Random(1), 0.3, 200)
        ended = watcher.get(watch.watch_id)
        assert ended is not None
        assert (ended.state, ended.decision) == ("rolled_back", "hurts")
        assert used < 40  # long before the budget of 200
        assert ended.pairs == used
        assert (root / "a.md").read_bytes() == OLD
        assert _status(manager) is ChangeStatus.ROLLED_BACK
        lease = manager.leases.of_record(RecordOwner("watch", watch.watch_id))
        assert lease is not None
        assert lease.state == "released"


def test_a_fix_that_helps_is_kept(root: Path, tmp_path: Path) -> None:
    rng = random.Random(2)
    before = [rng.random() < 0.5 for _ in range(300)]
    with ImprovementManager(tmp_path / "s.db") as manager:
        watcher = ChangeWatcher(manager)
        watch = watcher.start(action(), path="a.md", new_content=NEW, root=root, before=before)
        _watch_runs(manager, watcher, watch.watch_id, rng, 0.97, 300)
        ended = watcher.get(watch.watch_id)
        assert ended is not None
        assert (ended.state, ended.decision) == ("kept", "better")
        assert (root / "a.md").read_text() == NEW
        assert _status(manager) is ChangeStatus.KEPT


def test_a_change_that_does_not_help_is_rolled_back_when_the_budget_is_spent(
    root: Path, tmp_path: Path
) -> None:
    rng = random.Random(3)
    before = [rng.random() < 0.9 for _ in range(120)]
    with ImprovementManager(tmp_path / "s.db") as manager:
        watcher = ChangeWatcher(manager)
        watch = watcher.start(action(), path="a.md", new_content=NEW, root=root, before=before)
        used = _watch_runs(manager, watcher, watch.watch_id, rng, 0.9, 200)
        ended = watcher.get(watch.watch_id)
        assert ended is not None
        assert ended.state == "rolled_back"
        assert ended.decision in ("no_worse", "budget_spent")
        assert used == ended.pairs == 120
        assert (root / "a.md").read_bytes() == OLD


def test_runs_of_other_agents_and_from_before_the_change_do_not_count(
    root: Path, tmp_path: Path
) -> None:
    with ImprovementManager(tmp_path / "s.db") as manager:
        with PerformanceMonitor(manager.store, baseline_n=30) as monitor:
            for _ in range(50):
                monitor.record("a", success=False, duration_ms=100.0)  # before the change
            monitor.flush()
        watcher = ChangeWatcher(manager)
        watch = watcher.start(action(), path="a.md", new_content=NEW, root=root, before=BEFORE)
        with PerformanceMonitor(manager.store, baseline_n=30) as monitor:
            for _ in range(50):
                monitor.record("b", success=False, duration_ms=100.0)
            monitor.flush()
        assert watcher.advance(watch.watch_id).pairs == 0
        assert (root / "a.md").read_text() == NEW


@pytest.mark.parametrize(("before", "budget"), [((), None), ((True,) * 10, 11), ((True,) * 10, 0)])
def test_a_watch_that_cannot_judge_is_refused_before_anything_is_applied(
    root: Path, tmp_path: Path, before: tuple[bool, ...], budget: int | None
) -> None:
    with ImprovementManager(tmp_path / "s.db") as manager:
        with pytest.raises(InvalidArgument):
            ChangeWatcher(manager).start(
                action(), path="a.md", new_content=NEW, root=root, before=before, budget=budget
            )
        assert manager.get_history() == []
    assert (root / "a.md").read_bytes() == OLD


def test_a_watch_on_another_host_is_left_to_that_host(root: Path, tmp_path: Path) -> None:
    from agentmend.infrastructure.changes.protocol.owners import HostIdentity

    with ImprovementManager(tmp_path / "s.db") as manager:
        watch = ChangeWatcher(manager).start(
            action(), path="a.md", new_content=NEW, root=root, before=BEFORE
        )
        with PerformanceMonitor(manager.store, baseline_n=30) as monitor:
            for _ in range(100):
                monitor.record("a", success=False, duration_ms=100.0)
            monitor.flush()
        elsewhere = ChangeWatcher(manager, host=HostIdentity("other-host", "b", "m"))
        assert elsewhere.advance(watch.watch_id).state == "watching"
        assert (root / "a.md").read_text() == NEW
        assert ChangeWatcher(manager).advance(watch.watch_id).state == "rolled_back"


def test_a_killed_watcher_is_continued_by_the_next_open_not_undone(
    root: Path, tmp_path: Path
) -> None:
    db = tmp_path / "s.db"
    child = Path(__file__).parents[2].joinpath("watch_child.py")
    lines = kill_at_marker(
        [sys.executable, str(child), str(db), str(root), "3"], "RAN", timeout_s=60
    )
    watch_id = next(line.split()[1] for line in lines if line.startswith("STARTED"))
    with ImprovementManager(db) as manager:  # recovery ran: a watch's change is not undone
        assert manager.recover() == []
        assert (root / "a.md").read_text() == NEW
        assert _status(manager) is ChangeStatus.APPLIED
        watcher = ChangeWatcher(manager)
        (resumed,) = watcher.continue_all()
        assert resumed.watch_id == watch_id
        assert (resumed.state, resumed.pairs) == ("watching", 3)  # the child's runs count
        used = _watch_runs(manager, watcher, watch_id, random.Random(4), 0.0, 100)
        ended = watcher.get(watch_id)
        assert ended is not None
        assert (ended.state, ended.decision) == ("rolled_back", "hurts")
        assert ended.pairs == 3 + used
        assert (root / "a.md").read_bytes() == OLD
        assert _status(manager) is ChangeStatus.ROLLED_BACK


def test_opening_a_workspace_continues_a_watch_and_settles_what_it_decided(
    tmp_path: Path,
) -> None:
    from agentmend.faces.workspace import Workspace
    from agentmend.infrastructure.settings import Settings

    folder = tmp_path / "ws"
    with Workspace.open(folder, settings=Settings()) as workspace:
        target = sorted(p.name for p in workspace.team_dir.glob("*.md"))[0]
        old = (workspace.team_dir / target).read_bytes()
        agent = target.removesuffix(".md")
        hurts = ImprovementAction(
            target_agent=agent, action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
        )
        watch = ChangeWatcher(workspace.manager).start(
            hurts, path=target, new_content="changed\n", root=workspace.team_dir, before=BEFORE
        )
        for _ in range(30):
            workspace.monitor.record(agent, success=False, duration_ms=100.0)
        workspace.monitor.flush()
    with Workspace.open(folder, settings=Settings(), create=False) as workspace:
        ended = ChangeWatcher(workspace.manager).get(watch.watch_id)
        assert ended is not None
        assert (ended.state, ended.decision) == ("rolled_back", "hurts")
        assert (workspace.team_dir / target).read_bytes() == old
