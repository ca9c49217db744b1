"""A team of one's own in CI, end to end on the user's path: agentmend installed from a wheel into
a venv outside the repository; ``agentmend init``, then the commands it prints: recorded once
against the fake Messages API, then replayed with no key and the server stopped, as a CI job
runs ``eval`` and ``check``."""

from __future__ import annotations

import shlex
from pathlib import Path
from xml.etree import ElementTree

import pytest
from fake_messages_api import FakeMessagesAPI
from own_team import answer_scaffolded_team
from user_project import UserVenv, user_venv

__all__ = ["user_venv"]  # the session fixture, used here by name


def _next_commands(init_output: str) -> list[list[str]]:
    """The commands ``agentmend init`` printed to run next, as argument lists."""
    _, _, after = init_output.partition("next")
    lines = [line.split("#")[0].strip() for line in after.splitlines()[1:]]
    return [shlex.split(line) for line in lines if line.startswith("agentmend ")]


@pytest.mark.slow
def test_init_record_once_then_eval_and_check_offline(
    user_venv: UserVenv, tmp_path: Path, fake_api: FakeMessagesAPI
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    done = user_venv.run(["agentmend", "init"], project)
    assert done.returncode == 0, done.stderr
    record, replay, check, *_ = _next_commands(done.stdout)
    assert "--record" in record
    assert "--replay" in replay
    assert check[:2] == ["agentmend", "check"]

    fake_api.set_responder(answer_scaffolded_team)
    key = {
        "ANTHROPIC_API_KEY": "sk-ant-user-key-0123456789",
        "ANTHROPIC_BASE_URL": fake_api.base_url,
    }
    recorded = user_venv.run(record, project, env=key)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert "4/4 cases pass" in recorded.stdout
    cassette = project / record[record.index("--record") + 1]
    assert "sk-ant-user-key-0123456789" not in cassette.read_text()
    fake_api.close()  # the CI job has no network and no key

    replayed = user_venv.run([*replay, "--junit", "eval.xml"], project)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "4/4 cases pass" in replayed.stdout
    suites = ElementTree.parse(project / "eval.xml").getroot().findall("testsuite")
    assert sorted((s.get("name"), s.get("failures")) for s in suites) == [
        ("summarizer", "0"),
        ("support-agent", "0"),
    ]
    checked = user_venv.run(check, project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok: no open issue" in checked.stdout

    # the gate closes: an agent's file changed since the recording is one named error
    agent = project / ".agentmend" / "agents" / "summarizer.md"
    agent.write_text(agent.read_text().replace("one line", "one short line"))
    stale = user_venv.run(replay, project)
    assert stale.returncode == 2
    assert "no recorded answer for agent 'summarizer', turn 1" in stale.stderr
    assert "Traceback" not in stale.stdout + stale.stderr
