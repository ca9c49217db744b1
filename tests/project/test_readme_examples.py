"""The README's examples, run exactly as printed in a fresh project with agentmend installed.

Every ``python`` block runs as a script (in README order, in one project folder, as a reader
trying them one after another would), the pytest example runs under pytest with only the
documented install, the agent file example is the project's agent, and every ``json`` block
parses. Model calls go to a fake Messages API on 127.0.0.1 (``ANTHROPIC_BASE_URL``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fake_messages_api import FakeMessagesAPI, Reply
from user_project import ROOT, UserVenv, user_venv

__all__ = ["user_venv"]  # the session fixture, used here by name

README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", README, flags=re.M | re.S)


def _blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCKS if lang == language]


def test_the_readme_has_the_examples_this_test_runs() -> None:
    python = _blocks("python")
    assert len(python) >= 5
    assert sum("def test_" in block for block in python) == 1
    assert len(_blocks("markdown")) == 1


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "my-project"
    agents = project / ".claude" / "agents"
    agents.mkdir(parents=True)
    (markdown,) = _blocks("markdown")
    (agents / "research-agent.md").write_text(markdown)
    return project


@pytest.mark.slow
def test_every_python_example_runs_as_printed(
    user_venv: UserVenv, tmp_path: Path, fake_api: FakeMessagesAPI
) -> None:
    fake_api.set_fallback(Reply.text("The Pythagorean theorem: a² + b² = c² for a right triangle."))
    project = _project(tmp_path)
    env = {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": fake_api.base_url}
    scripts = [block for block in _blocks("python") if "def test_" not in block]
    for number, block in enumerate(scripts, 1):
        script = project / f"readme_example_{number}.py"
        script.write_text(block)
        done = user_venv.run(["python", script.name], project, env=env)
        assert done.returncode == 0, f"example {number}:\n{block}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr
    assert fake_api.message_requests()  # the whole-loop example ran the agent on the model


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [[], ["-p", "no:asyncio"]],  # asyncio_mode=auto: tests/faces/test_pytest_plugin.py
    ids=["pytest-asyncio strict", "no async plugin"],
)
def test_the_pytest_example_passes_with_only_the_documented_install(
    user_venv: UserVenv, tmp_path: Path, options: list[str]
) -> None:
    project = _project(tmp_path)
    (block,) = [block for block in _blocks("python") if "def test_" in block]
    (project / "test_readme_example.py").write_text(block)
    done = user_venv.run(
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *options], project
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout


def test_every_json_example_parses() -> None:
    blocks = _blocks("json")
    assert blocks
    for block in blocks:
        assert isinstance(json.loads(block), dict)


def test_every_setting_and_server_variable_is_in_the_readme(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    from agentmend.infrastructure.settings import Settings

    named = {f"AGENTMEND_{field.upper()}" for field in Settings.model_fields}
    help_text = user_venv.run(["agentmend-mcp", "--help"], tmp_path).stdout
    named |= set(re.findall(r"AGENTMEND_[A-Z_]+", help_text))
    settings = README.split("## Settings", 1)[1].split("\n## ", 1)[0]
    missing = sorted(
        name
        for name in named
        if name not in settings and not name.startswith("AGENTMEND_PRINCIPAL_")
    )
    assert missing == []
    assert "AGENTMEND_PRINCIPAL_ID" in settings
