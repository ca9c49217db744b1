"""The pytest plugin: users' failure-cycle tests run on its fixtures, and it imports no SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_messages_api import FakeMessagesAPI
from own_team import answer_scaffolded_team

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


CASSETTE_TESTS = """
from agentmend import AgentTeam


async def test_refunds(agentmend_cassette_runtime):
    team = AgentTeam({team!r}, agentmend_cassette_runtime)
    result = await team.run("support-agent", "Can I return shoes after three weeks?")
    assert "30 days" in result.text
"""


@pytest.mark.slow
def test_own_agents_record_once_then_replay_with_no_key(
    pytester: pytest.Pytester, fake_api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentmend.faces.cli.ci_gates import SCAFFOLD

    team = pytester.path / "team"
    for relative, text in SCAFFOLD.items():
        if relative.startswith("agents/"):
            (team / relative).parent.mkdir(parents=True, exist_ok=True)
            (team / relative).write_text(text)
    pytester.makepyfile(test_own_team=CASSETTE_TESTS.format(team=str(team / "agents")))
    plugin = ("-p", "no:agentmend", "-p", "agentmend.faces.pytest_plugin", "-q")
    cassette = str(pytester.path / "cassette.json")

    fake_api.set_responder(answer_scaffolded_team)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-plugin-key-0123")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_api.base_url)
    pytester.runpytest_inprocess(*plugin, "--agentmend-record", cassette).assert_outcomes(passed=1)
    assert len(fake_api.message_requests()) == 1

    fake_api.close()
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    pytester.runpytest_inprocess(*plugin, "--agentmend-replay", cassette).assert_outcomes(passed=1)

    unasked = pytester.runpytest_inprocess(*plugin)
    unasked.assert_outcomes(errors=1)
    unasked.stdout.fnmatch_lines(["*agentmend_cassette_runtime needs a cassette*"])
