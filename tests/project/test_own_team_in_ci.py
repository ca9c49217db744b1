"""A team of one's own in CI, end to end on the user's path: agentmend installed from a wheel into
a venv outside the repository; the documented "Your own agents without a key" commands (the
``own-team`` blocks of the README and ``docs/``) run as printed: ``agentmend init``, recorded
once against the fake Messages API, then ``eval`` and ``check`` replayed with no key and the
server stopped, as a CI job runs them; and every documented GitHub Actions step (the
``ci-step`` blocks) runs its ``run`` script on that project."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import yaml
from doc_blocks import Block, of_kind
from fake_messages_api import FakeMessagesAPI
from own_team import answer_scaffolded_team
from user_project import UserVenv, user_venv

__all__ = ["user_venv"]  # the session fixture, used here by name

_SECRET = re.compile(r"^\$\{\{ secrets\.(\w+) \}\}$")


def _documented_commands() -> list[str]:
    """The commands of the own-team blocks: the README and the docs print the same ones."""
    texts = {block.text for block in of_kind("own-team")}
    assert len(texts) == 1, "the own-team blocks differ"
    (text,) = texts
    return [line for line in text.splitlines() if line.strip()]


def _ci_steps() -> list[tuple[Block, dict[str, Any]]]:
    steps = []
    texts: set[str] = set()
    for block in of_kind("ci-step"):
        if block.text in texts:  # the README repeats a page's step: run once
            continue
        texts.add(block.text)
        loaded = yaml.safe_load(block.text)
        assert isinstance(loaded, list), block  # steps, as under a job's `steps:`
        for step in loaded:
            assert set(step) <= {"name", "run", "env"}, block
            assert step["name"], block
            assert step["run"].strip(), block
            steps.append((block, step))
    return steps


def _run_step(
    user_venv: UserVenv, project: Path, block: Block, step: dict[str, Any], secrets: dict[str, str]
) -> None:
    """A step's ``run`` script under ``sh -e`` (as Actions runs bash with -e), its env given;
    a ``${{ secrets.NAME }}`` value is the stand-in this test holds for that secret."""
    env = {}
    for name, value in (step.get("env") or {}).items():
        secret = _SECRET.match(str(value))
        env[name] = secrets[secret.group(1)] if secret else str(value)
    done = user_venv.run(["sh", "-e", "-c", step["run"]], project, env=env)
    assert done.returncode == 0, f"{block} {step['name']}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stdout + done.stderr


def _printed_next_commands(init_output: str) -> list[list[str]]:
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
    init, record, replay, check = _documented_commands()
    assert "--record" in record
    assert "--replay" in replay

    done = user_venv.run(["sh", "-c", init], project)
    assert done.returncode == 0, done.stderr
    printed = _printed_next_commands(done.stdout)

    fake_api.set_responder(answer_scaffolded_team)
    recorded = user_venv.run(
        ["sh", "-c", record], project, env={"ANTHROPIC_BASE_URL": fake_api.base_url}
    )
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    assert "4/4 cases pass" in recorded.stdout
    assert len(fake_api.message_requests()) == 12  # 2 agents x 2 cases x 3 repeats
    cassette = project / ".agentmend" / "cassette.json"
    assert "sk-ant-..." not in cassette.read_text()  # the key of the documented line
    steps = _ci_steps()
    assert len(steps) == 2  # the replayed gate, and the live one on the fleet's store
    secrets = {
        "ANTHROPIC_API_KEY": "test-key",
        "AGENTMEND_STORE_URL": str(project / ".agentmend" / "agentmend.db"),
    }
    live = [(b, s) for b, s in steps if "ANTHROPIC_API_KEY" in (s.get("env") or {})]
    for block, step in live:  # a gate on the live model: the fake API stands in for it
        on_fake = {**step, "env": {**step["env"], "ANTHROPIC_BASE_URL": fake_api.base_url}}
        _run_step(user_venv, project, block, on_fake, secrets)
    fake_api.close()  # the CI job has no network and no key
    for block, step in steps:
        if (block, step) not in live:
            _run_step(user_venv, project, block, step, secrets)

    replayed = user_venv.run(["sh", "-c", replay], project)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "4/4 cases pass" in replayed.stdout
    suites = ElementTree.parse(project / "agentmend-eval.xml").getroot().findall("testsuite")
    assert sorted((s.get("name"), s.get("failures")) for s in suites) == [
        ("summarizer", "0"),
        ("support-agent", "0"),
    ]
    checked = user_venv.run(["sh", "-c", check], project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok: no open issue" in checked.stdout

    # the commands init printed work on the same cassette
    (printed_replay,) = [c for c in printed if c[1] == "eval" and "--replay" in c]
    assert user_venv.run(printed_replay, project).returncode == 0

    # the gate closes: an agent's file changed since the recording is one named error
    agent = project / ".agentmend" / "agents" / "summarizer.md"
    agent.write_text(agent.read_text().replace("one line", "one short line"))
    stale = user_venv.run(["sh", "-c", replay], project)
    assert stale.returncode == 2
    assert "no recorded answer for agent 'summarizer', turn 1" in stale.stderr
    assert "Traceback" not in stale.stdout + stale.stderr
