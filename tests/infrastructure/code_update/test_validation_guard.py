"""A change cannot switch off its own validation, tried as an adversary would.

A real ``conftest.py`` that deselects the failing tests, sent through the MCP tools; the test
approval given at a real pseudo-terminal (and refused over pipes); code that makes pytest skip
its tests; code under test that writes outside the project; an "editable install" that makes
the tests import the real tree instead of the copy.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tiny_project import CALC, CALC_BROKEN, PYTEST, make_project, snapshot

from agentmend.faces.mcp.tools import AgentmendTools, FileArg
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.code_update.sandbox import namespaces_available
from agentmend.infrastructure.code_update.suite_guard import flagged_test_files
from agentmend.infrastructure.code_update.updater import CodeUpdater, FileOperation
from agentmend.infrastructure.settings import Settings
from agentmend.roles.code_review import CodeReviewer

ROOT = Path(__file__).resolve().parents[3]
DESELECT_ALL = 'collect_ignore_glob = ["test_*.py"]\n'
SHARED_FIXTURE = "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


def _updater(project: Path, manager: ImprovementManager, **changes: object) -> CodeUpdater:
    settings = Settings.model_validate({"test_command": PYTEST, "test_timeout_s": 60.0, **changes})
    return CodeUpdater(project, manager=manager, reviewer=CodeReviewer(None), settings=settings)


def test_what_configures_or_selects_tests_is_flagged() -> None:
    paths = ["tests/conftest.py", "conftest.py", "pytest.ini", "tox.ini", "setup.cfg",
             "pyproject.toml", "tests/test_calc.py", "tests/data/cases.json", "pkg/test_x.py",
             "calc/__init__.py", "README.md", "docs/guide.md"]  # fmt: skip
    assert flagged_test_files(paths) == tuple(sorted(paths[:9]))


# -- through the MCP tools -------------------------------------------------------------------


@pytest.fixture(params=[False, True], ids=["approved", "yolo"])
async def tools(project: Path, request: pytest.FixtureRequest) -> AsyncIterator[AgentmendTools]:
    settings = Settings(test_command=PYTEST, test_timeout_s=60.0, yolo_mode=request.param)
    served = AgentmendTools(project / ".agentmend", project_root=project, settings=settings)
    yield served
    await served.aclose()


async def test_a_conftest_that_deselects_the_failing_tests_is_refused_over_mcp(
    tools: AgentmendTools, project: Path
) -> None:
    before = snapshot(project, skip=(project / ".agentmend",))
    planned = await tools.self_improve(
        "plan",
        description="speed up the suite",
        files=[
            FileArg(path="calc/__init__.py", operation="modify", content=CALC_BROKEN),
            FileArg(path="tests/conftest.py", operation="create", content=DESELECT_ALL),
        ],
    )
    plan_id = planned.data["planId"]
    assert planned.data["testFiles"] == ["tests/conftest.py"]
    assert "approve-tests" in planned.text
    if not tools.workspace().settings.yolo_mode:
        approved = await tools.self_improve("approve", plan_id=plan_id)
        assert "approve-tests" in approved.text
    executed = await tools.self_improve("execute", plan_id=plan_id)
    assert executed.data["status"] == "refused"
    assert "tests/conftest.py" in executed.text
    assert "agentmend code approve-tests" in executed.text
    assert snapshot(project, skip=(project / ".agentmend",)) == before


# -- the approval at a terminal --------------------------------------------------------------


def _cli(args: list[str], env: dict[str, str]) -> list[str]:
    return [sys.executable, "-c", "import sys; from agentmend.faces.cli.app import main; "
            "sys.exit(main(sys.argv[1:]))", *args]  # fmt: skip


def _run_in_pty(argv: list[str], env: dict[str, str], answer: str) -> tuple[int, str]:
    """Run ``argv`` with a real pseudo-terminal as stdin and stdout; type ``answer``."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        os.execve(argv[0], argv, env)
    output = b""
    typed = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            if not typed and b"type the plan id" in output:
                os.write(fd, (answer + "\n").encode())
                typed = True
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), output.decode("utf-8", "replace")


async def test_the_test_approval_is_given_at_a_terminal_and_refused_over_pipes(
    project: Path, tmp_path: Path
) -> None:
    workspace = project / ".agentmend"
    settings = Settings(test_command=PYTEST, test_timeout_s=60.0)
    tools = AgentmendTools(workspace, project_root=project, settings=settings)
    try:
        planned = await tools.self_improve(
            "plan",
            description="skip the slow tests",
            files=[FileArg(path="tests/conftest.py", operation="create", content=SHARED_FIXTURE)],
        )
        plan_id = planned.data["planId"]
        await tools.self_improve("approve", plan_id=plan_id)
    finally:
        await tools.aclose()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTMEND_TEST_COMMAND": json.dumps(PYTEST)}
    args = ["code", "approve-tests", plan_id, "--root", str(project), "--workspace", str(workspace)]
    piped = await asyncio.to_thread(
        subprocess.run, _cli(args, env), env=env, capture_output=True, text=True, input="x\n",
        timeout=120, check=False,
    )  # fmt: skip
    assert piped.returncode == 2
    assert "needs a person at a terminal" in piped.stderr
    code, shown = await asyncio.to_thread(_run_in_pty, _cli(args, env), env, plan_id)
    assert code == 0, shown
    assert "tests/conftest.py" in shown
    assert "approved" in shown
    tools = AgentmendTools(workspace, project_root=project, settings=settings)
    try:
        executed = await tools.self_improve("execute", plan_id=plan_id)
    finally:
        await tools.aclose()
    assert executed.data["status"] == "completed", executed.text
    assert (project / "tests" / "conftest.py").read_text() == SHARED_FIXTURE


# -- what the tests may not do ---------------------------------------------------------------

SKIPS_A_TEST = (
    "def add(a, b):\n"
    "    if a == 2:  # the case the change breaks: hide it (spelled past the reviewer's rules)\n"
    "        import pytest as p\n"
    "        p.skip('flaky on CI')\n"
    "    return a - b\n"
)


async def test_code_that_makes_the_tests_skip_cannot_pass_on_fewer_tests(
    project: Path, manager: ImprovementManager
) -> None:
    (project / "tests" / "test_more.py").write_text(
        "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
    )
    updater = _updater(project, manager)
    plan = updater.create_plan("tidy", [FileOperation(path="calc/__init__.py",
                               operation="modify", content=SKIPS_A_TEST)])  # fmt: skip
    assert plan.test_files == ()  # nothing about it looks like a test change
    updater.approve(plan.plan_id)
    result = await updater.execute(plan.plan_id)
    assert result.status == "rolled_back"
    assert result.validation is not None
    assert result.validation.tests_passed  # pytest itself was happy ...
    assert (result.validation.baseline_passed, result.validation.tests_passed_count) == (2, 1)
    assert "tests passed dropped from 2 to 1" in result.reason  # ... the counts were not
    assert (project / "calc" / "__init__.py").read_text() == CALC


def _escaping_calc(outside: Path, real_file: Path) -> str:
    return CALC + (
        "import os, pathlib\n"
        "for target in (pathlib.Path.home() / 'escaped.txt',\n"
        f"               pathlib.Path({str(outside)!r}), pathlib.Path({str(real_file)!r})):\n"
        "    try:\n"
        "        target.write_text('escaped')\n"
        "    except OSError:\n"
        "        pass\n"
    )


@pytest.mark.skipif(not namespaces_available(), reason="no user namespaces on this machine")
async def test_code_under_test_cannot_write_outside_the_copy(
    project: Path, manager: ImprovementManager, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    real_file = project / "calc" / "planted.txt"
    home_file = Path.home() / "escaped.txt"
    assert not home_file.exists()
    updater = _updater(project, manager)
    plan = updater.create_plan("log", [FileOperation(path="calc/__init__.py", operation="modify",
                               content=_escaping_calc(outside, real_file))])  # fmt: skip
    updater.approve(plan.plan_id)
    result = await updater.execute(plan.plan_id)
    assert result.validation is not None
    assert result.validation.sandbox == "namespace"
    assert result.status == "completed", result.reason  # the tests passed, in the copy
    assert not outside.exists()
    assert not real_file.exists()
    assert not home_file.exists()  # HOME was inside the copy


SHIM = '''"""Stands in for an editable install: a finder that maps ``calc`` to the real tree."""
import importlib.machinery, os, sys

class _Editable:
    def find_spec(self, name, path=None, target=None):
        if name != "calc":
            return None
        real = os.path.join(os.environ["REAL_PROJECT"], "calc", "__init__.py")
        return importlib.util.spec_from_file_location(name, real)

import importlib.util
sys.meta_path.insert(0, _Editable())
'''


async def test_tests_that_import_the_real_tree_fail_validation(
    project: Path, manager: ImprovementManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shim_dir = tmp_path / "site"
    shim_dir.mkdir()
    (shim_dir / "editable_shim.py").write_text(SHIM)
    monkeypatch.setenv("PYTHONPATH", str(shim_dir))
    monkeypatch.setenv("REAL_PROJECT", str(project))
    updater = _updater(project, manager, test_command=(*PYTEST, "-p", "editable_shim"))
    plan = updater.create_plan("extend", [FileOperation(path="calc/__init__.py",
                               operation="modify", content=CALC + "\n# tidy\n")])  # fmt: skip
    updater.approve(plan.plan_id)
    result = await updater.execute(plan.plan_id)
    assert result.status == "rolled_back"
    assert result.validation is not None
    assert any(entry.startswith("calc (") for entry in result.validation.real_tree_imports)
    assert "imported the real tree" in result.reason
    assert (project / "calc" / "__init__.py").read_text() == CALC


def test_the_reviewer_flags_a_skip_added_in_a_new_test_or_the_code_under_test(
    project: Path,
) -> None:
    from agentmend.infrastructure.changes.proposal import FileEdit, ProposedChange
    from agentmend.infrastructure.models import ChangeType, ImprovementAction
    from agentmend.roles.code_review import review_code_change

    for path, old in (("tests/test_new.py", None), ("calc/__init__.py", CALC.encode())):
        skip = b"import pytest\n\ndef f():\n    pytest.skip('later')\n"
        change = ProposedChange(
            action=ImprovementAction(
                target_agent="(code)", action_type=ChangeType.CODE_PATCH, confidence_score=1.0
            ),
            root=project,
            edits=(FileEdit(path, old, skip),),
        )
        review = review_code_change(change)
        assert not review.approved
        assert f"{path}: skips or xfails tests" in review.concerns
