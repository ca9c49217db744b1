"""SIGKILL at each step of an apply, on both backends: recovery settles it, nothing half-applied.

A real child (``tests/apply_step_child.py``) applies a group of three files (two replaced, one
created) and kills itself with SIGKILL at one step of the protocol. Reopening the store (which
recovers) must leave the group either undone whole (killed before its APPLIED commit: the files
hold their old bytes, the created one is gone, no temporary file or backup of it remains, its
changes are FAILED as ``interrupted``, or absent when the intent never committed) or applied whole
(killed after it: APPLIED, the new bytes, the audit head repaired, being one commit behind). In
every case nothing is PENDING and the audit chain verifies.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from apply_step_child import NEW, OLD, STEPS
from crash_child import child_env

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.models import ChangeStatus, ChangeType, ImprovementAction
from agentmend.infrastructure.store.api import Store

CHILD = Path(__file__).resolve().parents[1] / "apply_step_child.py"
UNDONE = {"after_intent", "after_backup", "between_writes", "before_applied"}


def _kill_at(step: str, store_url: str, files_dir: Path, root: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(CHILD), step, store_url, str(files_dir), str(root)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
        check=False,
    )
    assert result.returncode == -9, (result.returncode, result.stdout, result.stderr[-2000:])
    assert result.stdout.split() == ["READY"]  # killed inside the apply, never acknowledged


def _team(root: Path) -> None:
    for rel, data in OLD.items():
        if data is not None:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)


def _files(root: Path) -> dict[str, bytes | None]:
    return {rel: (root / rel).read_bytes() if (root / rel).exists() else None for rel in OLD}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_kill_at_any_step_of_an_apply_leaves_it_undone_or_done_whole(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    failures: list[str] = []
    for step in STEPS:
        work = tmp_path / step
        root = work / "team"
        _team(root)
        url = (
            str(work / "agentmend.db")
            if backend == "sqlite"
            else str(request.getfixturevalue("pg_server").create_database())
        )
        _kill_at(step, url, work, root)
        with (
            Store(url, files_dir=work) as store,
            ImprovementManager(store=store, recover=False) as manager,
        ):
            settled = manager.recover()
            history = manager.get_history(limit=100)
            chain = manager.verify_audit_chain()
        statuses = sorted({record.status for record in history})
        files = _files(root)
        leftovers = sorted(
            str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(".tmp")
        )
        backups = sorted(p.name for p in (root / ".agent" / "backups").glob("*.bak"))
        seen = f"{step}: statuses {statuses}, files {files}, backups {backups}, tmp {leftovers}"
        if step == "in_intent":
            ok = history == [] and files == OLD and backups == [] and settled == []
        elif step in UNDONE:
            ok = (
                statuses == [ChangeStatus.FAILED]
                and len(history) == 3
                and all(
                    r.rollback_info and r.rollback_info.get("reason") == "interrupted"
                    for r in history
                )
                and files == OLD
                and backups == []
                and len(settled) == 3
            )
        else:  # before_head: the APPLIED commit is what acknowledges the group
            ok = (
                statuses == [ChangeStatus.APPLIED]
                and len(history) == 3
                and files == NEW
                and chain.repaired
            )
        if not ok or leftovers or not chain:
            failures.append(f"{seen}, chain {chain.problems} {chain.notes}")
    assert failures == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_next_apply_on_the_folder_settles_a_killed_one_first(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Without a reopen's recovery: the next apply's intent finds the killed group, recovery puts
    the old bytes back, and the new change is recorded as replacing those."""
    root = tmp_path / "team"
    _team(root)
    url = (
        str(tmp_path / "agentmend.db")
        if backend == "sqlite"
        else str(request.getfixturevalue("pg_server").create_database())
    )
    _kill_at("between_writes", url, tmp_path, root)
    assert (root / "agents" / "a.md").read_bytes() == NEW["agents/a.md"]  # half of the group
    with (
        Store(url, files_dir=tmp_path) as store,
        ImprovementManager(store=store, recover=False) as manager,
    ):
        action = ImprovementAction(
            target_agent="writer", action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
        )
        record = manager.apply(action, path="agents/a.md", new_content=b"next a\n", root=root)
        history = manager.get_history(limit=100)
        chain = manager.verify_audit_chain()
    assert [r.status for r in history] == [ChangeStatus.FAILED] * 3 + [ChangeStatus.APPLIED]
    assert record.files[0].old_sha256 == hashlib.sha256(OLD["agents/a.md"] or b"").hexdigest()
    assert _files(root) == {**OLD, "agents/a.md": b"next a\n"}
    assert chain, chain.problems
