"""agentmend and the bundled Claude Code CLI agree on which agent files are valid, and on what
the valid ones say.

Two of Claude Code's own readings are used, both offline (``HOME`` a temporary folder,
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``):

- ``claude plugin validate`` on a throwaway plugin whose ``agents/`` holds the files: it reports
  front matter that does not parse (after Claude Code's repair) and fields of the wrong type.
- a real session over ``.claude/agents/`` against the fake Messages API: the CLI lists the agents
  it loaded, with description and tools, in its first request. This is the check of the name
  rule, which ``plugin validate`` does not apply.

The files are the project's fixtures and, for every valid one, the file agentmend writes after a
change (description with ``: ``, a tool added, another model), so what agentmend writes is read
by Claude Code as agentmend meant it. Each CLI run takes a few seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import warnings
from pathlib import Path

import claude_agent_sdk
import pytest
from agent_file_fixtures import EXPECTED, VALID, fixture_text
from claude_agent_sdk import ClaudeAgentOptions, query
from fake_messages_api import FakeMessagesAPI, Reply

from agentmend.infrastructure.definitions.spec import AgentSpec, SpecWarning
from agentmend.infrastructure.errors import SpecError

pytestmark = pytest.mark.slow

BUNDLED_CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
CHANGED_DESCRIPTION = "Use this agent when: asked to check. Examples: C# code, a [draft] diff."
_LISTING = "Available agent types for the Agent tool:\n"
_NAME_LINE = re.compile(r"^name:[ \t]*(.*?)[ \t]*\r?$", re.M)
# plugin validate does not apply Claude Code's name rule; the session test covers these
_NAME_RULE_ONLY = frozenset({"name-with-colon.md", "name-with-leading-dash.md"})


def _agentmend(text: str) -> AgentSpec | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        try:
            return AgentSpec.from_markdown(text)
        except SpecError:
            return None


@pytest.fixture(scope="module")
def agent_files() -> dict[str, str]:
    """File name -> text: every fixture, and each valid one as agentmend writes it changed."""
    files = {name: fixture_text(name) for name in EXPECTED}
    for name in VALID:
        spec = _agentmend(files[name])
        assert spec is not None
        assert spec.tools is not None
        changed = spec.with_changes(
            name=f"{spec.name}-changed",
            description=CHANGED_DESCRIPTION,
            tools=(*spec.tools, "WebFetch"),
            model="haiku",
        )
        files[f"changed-{name}"] = changed.to_markdown()
    return files


def _environment(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }


def _write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_bytes(text.encode("utf-8"))


def _validation_errors(output: str) -> dict[str, list[str]]:
    """``plugin validate`` output -> agent file name -> the fields its errors name."""
    errors: dict[str, list[str]] = {}
    current: str | None = None
    in_errors = False
    for line in output.splitlines():
        stripped = line.strip()
        if stripped.startswith("Validating"):
            current = Path(stripped.split(": ", 1)[1]).name if "agent:" in stripped else None
            in_errors = False
        elif stripped.startswith("✘ Found"):
            in_errors = current is not None
        elif stripped.startswith("Plugin directory checks"):
            current, in_errors = None, False  # the catalog's own checks, not the files'
        elif stripped.startswith("⚠ Found"):
            in_errors = False
        elif in_errors and current is not None and stripped.startswith("❯ "):
            errors.setdefault(current, []).append(stripped[2:].split(":", 1)[0])
    return errors


def _listed_agents(system_text: str) -> dict[str, tuple[str, str]]:
    """The CLI's agent listing -> name -> (description, tools as it shows them)."""
    assert _LISTING in system_text, "the CLI's first request lists no agents"
    listing = system_text.split(_LISTING, 1)[1].split("\n\n", 1)[0]
    agents: dict[str, tuple[str, str]] = {}
    for line in listing.splitlines():
        name, rest = line.removeprefix("- ").split(": ", 1)
        description, tools = rest.rsplit(" (Tools: ", 1)
        agents[name] = (description, tools.removesuffix(")"))
    return agents


def _shown_tools(spec: AgentSpec) -> str:
    return ", ".join(spec.tools) if spec.tools else "All tools"


def _name_written(text: str) -> str:
    """The name a file gives on its ``name:`` line (what Claude Code would list it as)."""
    match = _NAME_LINE.search(text)
    assert match is not None
    return match.group(1).strip("\"'")


def test_plugin_validate_and_agentmend_agree(tmp_path: Path, agent_files: dict[str, str]) -> None:
    plugin = tmp_path / "plugin"
    _write(plugin / "agents", agent_files)
    (plugin / ".claude-plugin").mkdir()
    (plugin / ".claude-plugin" / "plugin.json").write_text('{"name": "fixtures"}')
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        [str(BUNDLED_CLI), "plugin", "validate", str(plugin)],
        env=_environment(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert "Validating agent" in output, output
    errors = _validation_errors(output)
    assert set(errors) <= set(agent_files), errors
    for name, text in agent_files.items():
        claude_code_ok = name not in errors
        if name in _NAME_RULE_ONLY:
            assert claude_code_ok
            assert _agentmend(text) is None
        else:
            assert (_agentmend(text) is not None) == claude_code_ok, (name, errors.get(name))
    assert errors["description-list.md"] == ["description"]
    assert errors["crlf-colon.md"] == ["frontmatter"]


async def test_claude_code_loads_exactly_the_files_agentmend_loads(
    tmp_path: Path, fake_api: FakeMessagesAPI, agent_files: dict[str, str]
) -> None:
    project = tmp_path / "project"
    _write(project / ".claude" / "agents", agent_files)
    home = tmp_path / "home"
    home.mkdir()
    fake_api.set_fallback(Reply.text("ok"))
    env = _environment(home) | {
        "ANTHROPIC_BASE_URL": fake_api.base_url,
        "ANTHROPIC_API_KEY": "test-key",
    }
    options = ClaudeAgentOptions(
        cwd=str(project),
        env=env,
        setting_sources=["project"],
        tools=["Agent"],
        max_turns=1,
        cli_path=str(BUNDLED_CLI),
    )

    async def session() -> None:
        async for _ in query(prompt="List nothing; answer ok.", options=options):
            pass

    await asyncio.wait_for(session(), timeout=120)
    first = fake_api.message_requests()[0]
    listed = _listed_agents(_text_of(first.messages))
    for name, text in agent_files.items():
        spec = _agentmend(text)
        if spec is None:
            assert _name_written(text) not in listed, name
            continue
        assert spec.name in listed, name
        assert listed[spec.name] == (spec.description, _shown_tools(spec)), name


def _text_of(messages: list[dict[str, object]]) -> str:
    """All text the CLI sent in its messages (the agent listing is one of its blocks)."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                str(block["text"])
                for block in content
                if isinstance(block, dict) and isinstance(block.get("text"), str)
            )
    return "\n".join(parts)
