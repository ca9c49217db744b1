"""The pytest plugin: users' failure-cycle tests run on its fixtures, and it imports no SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

USER_TESTS = """
import pytest

from agentmend.infrastructure.simulation import FaultKind


async def test_truncation_is_repaired(agentmend_orchestrator, inject_fault):
    for n in range(50):
        await agentmend_orchestrator.execute_task(f"topic {n}")
    fault = inject_fault("research-agent", "truncation", token_factor=3.0)
    assert fault.kind is FaultKind.TRUNCATION
    cycles = []
    for n in range(40):
        cycles += (await agentmend_orchestrator.execute_task(f"faulty {n}")).cycles
        if cycles:
            break
    assert [c.status for c in cycles] == ["kept"]
    assert agentmend_orchestrator.team.spec("research-agent").max_tokens > 2048


def test_the_team_is_a_private_copy(agentmend_team, agentmend_team_dir, tmp_path):
    assert agentmend_team.directory == agentmend_team_dir
    assert agentmend_team_dir.parent == tmp_path
    assert len(agentmend_team.names) == 6


def test_inject_fault_refuses_parameters_with_a_fault(inject_fault):
    from agentmend.infrastructure.simulation import Fault

    with pytest.raises(TypeError, match="not with a Fault"):
        inject_fault("research-agent", Fault(FaultKind.SLOW), calls=3)
"""


def test_users_can_write_failure_cycle_tests_with_the_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(test_user_team=USER_TESTS)
    # the entry point may or may not be installed here; load the module explicitly either way
    result = pytester.runpytest_inprocess(
        "-p", "no:agentmend", "-p", "agentmend.faces.pytest_plugin", "-q"
    )
    result.assert_outcomes(passed=3)


def test_importing_the_plugin_imports_no_sdk_and_no_team(tmp_path: Path) -> None:
    probe = (
        "import json, sys\n"
        "import agentmend.faces.pytest_plugin\n"
        "heavy = ('anthropic', 'claude_agent_sdk', 'mcp', 'agentmend.loop.meta_orchestrator',"
        " 'agentmend.infrastructure.simulation')\n"
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []
    assert list(tmp_path.iterdir()) == []
