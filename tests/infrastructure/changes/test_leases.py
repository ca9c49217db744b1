"""Who may settle an unproven change, and when: leases, owners, hosts, records, faces.

The owners here are made by hand in the store (a pid reused by another process, another
host's process, a watch record) so each rule is shown on its own; the tests with real killed
and stopped processes are in ``test_verification_crash.py``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fake_runtimes import Call, HookedSimulation

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.improvement_manager import (
    ChangeStatus,
    ChangeType,
    ImprovementAction,
    ImprovementManager,
    LeaseLost,
    LeaseTerms,
)
from agentmend.infrastructure.changes.protocol.owners import HostIdentity, ProcessOwner, RecordOwner
from agentmend.infrastructure.models import ChangeRecord
from agentmend.infrastructure.settings import Settings
from agentmend.loop.cycle import cycle_events
from agentmend.loop.meta_orchestrator import MetaOrchestrator

OLD = {"a.md": b"old a\n", "b.md": b"old b\n"}
NEW = {"a.md": "new a\n", "b.md": "new b\n"}


def _action(agent: str) -> ImprovementAction:
    return ImprovementAction(
        target_agent=agent, action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "team"
    folder.mkdir()
    for name, data in OLD.items():
        (folder / name).write_bytes(data)
    return folder


def _apply_leased(manager: ImprovementManager, root: Path) -> tuple[str, list[ChangeRecord]]:
    """Apply a two-agent group under a new lease of this process; the keeper stops renewing."""
    with manager.hold_lease() as keeper:
        records = manager.apply_group(
            [(_action(name[0]), name, text) for name, text in NEW.items()],
            root=root,
            lease=keeper.lease_id,
        )
    return keeper.lease_id, records


def _set_owner(manager: ImprovementManager, lease_id: str, **columns: Any) -> None:
    sets = ", ".join(f"{name} = ?" for name in columns)
    with manager.store.transaction() as conn:
        conn.execute(f"UPDATE leases SET {sets} WHERE lease_id = ?", (*columns.values(), lease_id))


def _files(root: Path) -> dict[str, bytes]:
    return {name: (root / name).read_bytes() for name in OLD}


def test_a_live_owners_change_is_left_alone_by_another_open(root: Path, tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with ImprovementManager(db) as owner:
        lease_id, records = _apply_leased(owner, root)
        with ImprovementManager(db) as other:  # this process is alive: its work is its own
            assert other.recover() == []
        assert _files(root) == {name: text.encode() for name, text in NEW.items()}
        kept = owner.mark_kept(records[0].change_id, {"passed": True}, lease=lease_id)
        assert kept.status is ChangeStatus.KEPT
        assert owner.leases.get(lease_id).state == "released"  # type: ignore[union-attr]


def test_a_change_applied_by_hand_is_never_undone_by_recovery(root: Path, tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with ImprovementManager(db) as manager:
        manager.apply(_action("a"), path="a.md", new_content="by hand\n", root=root)
    with ImprovementManager(db) as reopened:
        assert reopened.recover() == []
        [record] = reopened.get_history()
        assert record.status is ChangeStatus.APPLIED
    assert (root / "a.md").read_text() == "by hand\n"


def test_a_reused_pid_is_not_taken_for_the_owner(root: Path, tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with ImprovementManager(db) as manager:
        lease_id, _ = _apply_leased(manager, root)
        start = ProcessOwner.current().start
        assert start is not None
        # same pid, another start time: the process that took the lease is gone
        _set_owner(manager, lease_id, process_start=start + 1)
    with ImprovementManager(db) as reopened:
        settled = {r.change_id: r for r in reopened.get_history()}
        assert all(r.status is ChangeStatus.FAILED for r in settled.values())
        assert {r.rollback_info["reason"] for r in settled.values() if r.rollback_info} == {
            "interrupted"
        }
        assert reopened.leases.get(lease_id).state == "settled"  # type: ignore[union-attr]
        assert reopened.verify_audit_chain()
    assert _files(root) == OLD


def test_files_that_moved_on_are_left_and_named_as_needing_attention(
    root: Path, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    with ImprovementManager(db) as manager:
        lease_id, _ = _apply_leased(manager, root)
        (root / "b.md").write_text("someone's own edit\n")
        _set_owner(manager, lease_id, pid=2**22 + 7)  # a pid that runs nothing
    with ImprovementManager(db) as reopened:
        by_agent = {r.action.target_agent: r for r in reopened.get_history()}
    assert (root / "a.md").read_bytes() == OLD["a.md"]  # restored
    assert (root / "b.md").read_text() == "someone's own edit\n"  # never overwritten
    assert by_agent["a"].status is ChangeStatus.FAILED
    blocked = by_agent["b"].rollback_info
    assert by_agent["b"].status is ChangeStatus.FAILED
    assert blocked is not None
    assert blocked["reason"] == "interrupted"
    assert blocked["needs_attention"] is True
    assert list(blocked["left_unchanged"]) == [str((root / "b.md").resolve())]
    assert str((root / "b.md").resolve()) in blocked["note"]


def test_another_host_only_marks_and_the_owners_host_restores(root: Path, tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    here = HostIdentity.current()
    there = HostIdentity("other-host", "another-boot", "another-machine")
    terms = LeaseTerms(ttl_s=30.0, renew_every_s=5.0, clock_skew_s=5.0)
    with ImprovementManager(db) as manager:
        lease_id, _ = _apply_leased(manager, root)
        _set_owner(manager, lease_id, hostname=there.hostname, boot_id=there.boot_id,
                   machine_id=there.machine_id, expires=time.time() - 2)  # fmt: skip
    # expired by 2 s only: within the clock skew another host allows, so still the owner's
    with ImprovementManager(db, lease_terms=terms) as manager:
        assert manager.leases.get(lease_id).state == "held"  # type: ignore[union-attr]
        _set_owner(manager, lease_id, expires=time.time() - 60)
    with ImprovementManager(db, lease_terms=terms, host=here) as elsewhere:
        assert elsewhere.leases.get(lease_id).state == "lost"  # type: ignore[union-attr]
        assert {r.status for r in elsewhere.get_history()} == {ChangeStatus.APPLIED}
    assert _files(root) != OLD  # the files are not this host's to restore
    with ImprovementManager(db, lease_terms=terms, host=there) as owners_host:
        assert {r.status for r in owners_host.get_history()} == {ChangeStatus.FAILED}
        assert owners_host.leases.get(lease_id).state == "settled"  # type: ignore[union-attr]
    assert _files(root) == OLD


def test_a_change_owned_by_a_watch_record_is_continued_not_rolled_back(
    root: Path, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    with ImprovementManager(db) as manager:
        lease = manager.leases.acquire(RecordOwner("watch", "w-1"), manager.lease_terms)
        assert lease.expires is None
        manager.apply(_action("a"), path="a.md", new_content=NEW["a.md"], root=root,
                      lease=lease.lease_id)  # fmt: skip
    with ImprovementManager(db) as reopened:
        assert reopened.recover() == []
        team = reopened.leases.get(lease.lease_id).team_id  # type: ignore[union-attr]
        assert team is not None  # learnt from the change linked to it
        assert reopened.leases.get(lease.lease_id) == replace(lease, team_id=team)
    assert (root / "a.md").read_text() == NEW["a.md"]


def test_a_settled_owner_cannot_keep_or_roll_back_or_apply(root: Path, tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with ImprovementManager(db) as manager:
        lease_id, records = _apply_leased(manager, root)
        _set_owner(manager, lease_id, expires=time.time() - 1)
        with ImprovementManager(db, recover=False) as other:
            assert len(other.recover()) == 2
        with pytest.raises(LeaseLost):
            manager.mark_kept(records[0].change_id, lease=lease_id)
        with pytest.raises(LeaseLost):
            manager.rollback_unproven(records[0].change_id, reason="x", lease=lease_id)
        with pytest.raises(LeaseLost):
            manager.apply(_action("a"), path="a.md", new_content="x", root=root, lease=lease_id)
        assert {r.status for r in manager.get_history()} == {ChangeStatus.FAILED}
    assert _files(root) == OLD


def test_opening_a_workspace_settles_a_gone_owners_change(tmp_path: Path) -> None:
    folder = tmp_path / "ws"
    with Workspace.open(folder, settings=Settings()) as workspace:
        before = {p.name: p.read_bytes() for p in workspace.team_dir.glob("*.md")}
        target = sorted(before)[0]
        lease_id, _ = _apply_leased_one(workspace.manager, workspace.team_dir, target)
        _set_owner(workspace.manager, lease_id, pid=2**22 + 7)
    with Workspace.open(folder, settings=Settings(), create=False) as workspace:
        after = {p.name: p.read_bytes() for p in workspace.team_dir.glob("*.md")}
        [record] = workspace.manager.get_history()
    assert after == before
    assert record.status is ChangeStatus.FAILED


def _apply_leased_one(manager: ImprovementManager, root: Path, name: str) -> tuple[str, Any]:
    with manager.hold_lease() as keeper:
        record = manager.apply(_action(name), path=name, new_content="changed\n", root=root,
                               lease=keeper.lease_id)  # fmt: skip
    return keeper.lease_id, record


async def test_a_cycle_that_lost_its_lease_stops_without_writing(tmp_path: Path) -> None:
    from loop_scenarios import cooler_research_agent, faulty_issue

    runtime = HookedSimulation(seed=3)
    orchestrator = MetaOrchestrator.offline_simulated(
        tmp_path / "team",
        seed=3,
        runtime=runtime,
        roles_runtime=cooler_research_agent(),
        settings=Settings(baseline_n=20, detection_mode="rules"),
    )
    try:
        original = orchestrator.team.spec("research-agent")
        db = orchestrator.store.path
        taken = False

        def take_the_lease(call: Call) -> None:
            """Once research-agent's definition has changed, another process opens the store
            and finds the verifier's lease expired (it looked stopped)."""
            nonlocal taken
            if call.spec.name == "research-agent" and not taken and call.spec != original:
                taken = True
                with ImprovementManager(db, recover=False) as other:
                    with other.store.transaction() as conn:
                        conn.execute("UPDATE leases SET expires = ? WHERE state = 'held'", (0.0,))
                    assert other.recover()

        runtime.before = take_the_lease
        before = {p.name: p.read_bytes() for p in orchestrator.team.directory.glob("*.md")}
        issue = await faulty_issue(orchestrator)
        cycle = await asyncio.wait_for(orchestrator.run_improvement_cycle(issue), timeout=120)
        assert taken
        assert cycle.status == "error"
        after = {p.name: p.read_bytes() for p in orchestrator.team.directory.glob("*.md")}
        assert after == before  # restored by the other process, not touched since
        [record] = orchestrator.manager.get_history()
        assert record.status is ChangeStatus.FAILED
        assert record.rollback_info is not None
        assert record.rollback_info["reason"] == "interrupted"  # the settlement stands
        steps = [e.step for e in cycle_events(orchestrator.store, cycle.cycle_id)]
        assert "change_lease_lost" in steps
        assert "change_kept" not in steps
        assert "change_rolled_back" not in steps
        assert orchestrator.manager.verify_audit_chain()
    finally:
        orchestrator.close()


@pytest.mark.slow
def test_opening_a_workspace_settles_a_plan_whose_server_died_while_validating(
    tmp_path: Path,
) -> None:
    import contextlib
    import json
    import os
    import signal
    import subprocess
    import sys

    from tiny_project import CALC, CALC_BROKEN, CODE_UPDATE_CHILD, make_project

    from agentmend.infrastructure.code_update.updater import CodeUpdater

    project = make_project(tmp_path / "project")
    folder = tmp_path / "ws"
    Workspace.open(folder, settings=Settings()).close()
    scratch = tmp_path / "scratch"  # the executor's TMPDIR, where its validation copy is made
    scratch.mkdir()
    hang = "import os, time; open('validating.pid', 'w').write(str(os.getpid())); time.sleep(120)"
    args = {"db": str(folder / "agentmend.db"), "root": str(project),
            "command": [sys.executable, "-c", hang], "content": CALC_BROKEN}  # fmt: skip
    repo = Path(__file__).resolve().parents[3]
    child = subprocess.Popen(
        [sys.executable, "-c", CODE_UPDATE_CHILD, json.dumps(args)],
        env={**os.environ, "PYTHONPATH": str(repo), "TMPDIR": str(scratch)},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pid = ""
    try:
        deadline = time.monotonic() + 60
        while not pid:
            assert child.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.05)
            markers = list(scratch.glob("agentmend-validate-*/project/validating.pid"))
            pid = markers[0].read_text() if markers else ""
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the server dies while the tests run
        child.wait(timeout=30)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)
    assert (project / "calc" / "__init__.py").read_text() == CALC  # validated in a copy
    with Workspace.open(folder, settings=Settings(), create=False) as workspace:
        updater = CodeUpdater(project, manager=workspace.manager, reviewer=_Approve())
        [plan] = updater.plans()
        assert updater.status().active_improvement is None
    assert plan.status == "failed"  # settled by the open, before anyone asked
    assert plan.result is not None
    assert plan.result["reason"].startswith("interrupted")
    assert not plan.result["rollback_performed"]  # nothing had reached the real tree
    assert (project / "calc" / "__init__.py").read_text() == CALC


class _Approve:
    async def review(self, change: Any) -> Any:
        from agentmend.infrastructure.changes.proposal import GateVerdict

        return GateVerdict(gate="code-supervisor", passed=True, reason="test")


def test_a_lease_is_keyed_by_the_team_of_its_changes(root: Path, tmp_path: Path) -> None:
    from agentmend.infrastructure.changes.protocol.team_registry import team_id

    with ImprovementManager(tmp_path / "store.db") as manager:
        lease_id, _ = _apply_leased(manager, root)
        team = team_id(root, manager.store)
        lease = manager.leases.get(lease_id)
        assert lease is not None
        assert lease.team_id == team
        assert [x.lease_id for x in manager.leases.open_leases(team)] == [lease_id]
        assert manager.leases.open_leases("team-000000000000") == []


def test_a_store_from_before_team_keyed_leases_is_migrated_on_open(
    root: Path, tmp_path: Path
) -> None:
    """A store whose leases table is at version 1: its open lease gets its changes' team."""
    from agentmend.infrastructure.changes.protocol.leases import Leases
    from agentmend.infrastructure.changes.protocol.team_registry import team_id
    from agentmend.infrastructure.store.api import Store

    db = tmp_path / "store.db"
    with Store(db) as store:
        manager = ImprovementManager(store=store)
        lease_id, _ = _apply_leased(manager, root)
        with store.transaction() as conn:  # the lease as an agentmend without team keys left it
            conn.execute("UPDATE leases SET team_id = NULL WHERE lease_id = ?", (lease_id,))
            conn.execute("UPDATE schema_versions SET version = 1 WHERE component = 'leases'")
            conn.execute("DROP INDEX leases_team")
            conn.execute("ALTER TABLE leases DROP COLUMN team_id")
        team = team_id(root, store)
    with Store(db) as reopened:
        leases = Leases(reopened)
        assert reopened.schema_version("leases") == 2
        lease = leases.get(lease_id)
        assert lease is not None
        assert lease.team_id == team
