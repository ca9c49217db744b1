"""Every code block of the README and of ``docs/``, run as printed or checked as its kind says.

Each fenced block carries a marker naming its kind (``tests/project/doc_blocks.py``): a block
without one fails here. The runnable kinds run in projects outside the repository with agentmend
installed from a wheel of this tree (``user_venv``), offline: model calls go to a fake Messages
API on 127.0.0.1 (``ANTHROPIC_BASE_URL``), the install lines build agentmend from a copy of the
checkout with ``PIP_NO_INDEX`` and the wheelhouse ``make`` fills. The ``own-team`` and
``ci-step`` blocks run in ``test_own_team_in_ci.py``, the ``fleet-setup`` block in
``test_docs_fleet.py``.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from doc_blocks import KINDS, NOT_RUN, WHEELHOUSE, Block, blocks, of_kind
from fake_messages_api import FakeMessagesAPI, Reply
from services import unavailable
from user_project import ROOT, UserVenv, borrow_dependencies, user_venv

__all__ = ["user_venv"]  # the session fixture, used here by name

README_MAX_LINES = 250


def _distinct(found: list[Block]) -> list[Block]:
    """The first of each text: a block the README repeats from a page runs once."""
    seen: set[str] = set()
    kept = []
    for block in found:
        if block.text not in seen:
            seen.add(block.text)
            kept.append(block)
    return kept


def _command_lines(block: Block) -> list[str]:
    """The block's commands without their comments (a comment-only line is dropped)."""
    lines = (line.split("  #")[0].strip() for line in block.text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


# ------------------------------------------------------------------ every block is accounted for


def test_every_block_is_marked_with_a_kind_a_test_runs() -> None:
    found = blocks()
    assert len(found) >= 30
    unmarked = [str(block) for block in found if block.kind not in KINDS]
    assert unmarked == [], "mark each with <!-- example: KIND --> (tests/project/doc_blocks.py)"
    not_run = {(block.page, block.first_line) for block in of_kind("not-run")}
    assert not_run == set(NOT_RUN)  # each listed with its reason, and no stale entry
    assert len(NOT_RUN) <= 2


def test_the_readme_stays_short_and_names_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    (commands,) = [block for block in of_kind("make") if block.page == "README.md"]
    assert [line.split()[:2] for line in _command_lines(commands)] == [
        ["make", "run"],
        ["make", "test"],
    ]


def test_every_link_of_the_readme_names_a_page_that_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert missing == []


def test_every_page_is_in_the_site_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert [page for page in pages if page not in config] == []


# ------------------------------------------------------------------ kinds checked in process


def test_the_make_targets_exist_and_run_what_the_docs_say() -> None:
    expected = {"run": "main.py", "test": "pytest"}
    # not the flags of a `make test` this suite may run under
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    for block in of_kind("make"):
        for line in _command_lines(block):
            make, target = line.split()
            assert make == "make"
            done = subprocess.run(
                ["make", "-n", target],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, f"{block}: {done.stderr}"
            assert expected[target] in done.stdout, block


def test_the_pgbouncer_settings_are_those_the_tests_record_through() -> None:
    import configparser

    from pgbouncer import SESSION_SETTINGS

    (block,) = of_kind("pgbouncer-config")
    config = configparser.ConfigParser(inline_comment_prefixes=(";",))
    config.read_string(block.text)
    documented = dict(config["pgbouncer"])
    assert {name: documented.get(name) for name in SESSION_SETTINGS} == SESSION_SETTINGS
    # a pool below the server's connections, more clients than the pool
    assert int(documented["default_pool_size"]) < int(documented["max_client_conn"])


def test_every_agent_file_loads_whole(tmp_path: Path) -> None:
    from agentmend import load_agent_specs

    agent_files = of_kind("agent-file")
    assert agent_files
    for number, block in enumerate(agent_files):
        folder = tmp_path / str(number)
        folder.mkdir()
        name = re.search(r"^name: (\S+)$", block.text, flags=re.M)
        assert name is not None, block
        (folder / f"{name.group(1)}.md").write_text(block.text)
        specs = load_agent_specs(folder)
        assert list(specs) == [name.group(1)], block
        assert specs[name.group(1)].system_prompt.strip(), block


def _project(tmp_path: Path) -> Path:
    """A user's project whose agents are the documented agent file."""
    project = tmp_path / "my-project"
    agents = project / ".claude" / "agents"
    agents.mkdir(parents=True)
    (first, *_) = of_kind("agent-file")
    (agents / "research-agent.md").write_text(first.text)
    return project


# ------------------------------------------------------------------ kinds run in a user's project


@pytest.mark.slow
def test_every_python_example_runs_as_printed(
    user_venv: UserVenv, tmp_path: Path, fake_api: FakeMessagesAPI
) -> None:
    fake_api.set_fallback(Reply.text("The Pythagorean theorem: a² + b² = c² for a right triangle."))
    project = _project(tmp_path)
    env = {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": fake_api.base_url}
    scripts = _distinct(of_kind("python"))
    assert len(scripts) >= 6
    for number, block in enumerate(scripts, 1):
        script = project / f"example_{number}.py"
        script.write_text(block.text)
        done = user_venv.run(["python", script.name], project, env=env)
        assert done.returncode == 0, f"{block}:\n{block.text}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, block
    assert fake_api.message_requests()  # the whole-loop example ran the agent on the model


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [[], ["-p", "no:asyncio"]],  # asyncio_mode=auto: tests/faces/test_pytest_plugin.py
    ids=["pytest-asyncio strict", "no async plugin"],
)
def test_every_pytest_example_passes_with_only_the_documented_install(
    user_venv: UserVenv, tmp_path: Path, options: list[str]
) -> None:
    examples = _distinct(of_kind("pytest"))
    assert examples
    for number, block in enumerate(examples):
        project = _project(tmp_path / str(number))
        (project / "test_example.py").write_text(block.text)
        done = user_venv.run(
            ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *options], project
        )
        assert done.returncode == 0, f"{block}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        assert "1 passed" in done.stdout


@pytest.mark.slow
def test_every_shell_example_runs_as_printed(user_venv: UserVenv, tmp_path: Path) -> None:
    pages: dict[str, list[Block]] = {}
    for block in _distinct(of_kind("shell")):
        pages.setdefault(block.page, []).append(block)
    assert len(pages) >= 2
    for number, (page, page_blocks) in enumerate(pages.items()):
        project = tmp_path / f"project-{number}"  # one per page: its blocks build on each other
        project.mkdir()
        for block in page_blocks:
            done = user_venv.run(["sh", "-e", "-c", block.text], project, timeout=300)
            assert done.returncode == 0, f"{block}:\n{done.stdout[-3000:]}\n{done.stderr}"
            assert "Traceback" not in done.stdout + done.stderr, block
        assert page


def _wait_for_output(process: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """The first line the process writes (stdout and stderr are one pipe)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    received = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in received:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        received += chunk
    return received


@pytest.mark.slow
def test_every_server_example_starts_answers_and_stops_on_sigterm(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    servers = _distinct(of_kind("server"))
    assert servers
    for number, block in enumerate(servers):
        project = tmp_path / str(number)
        project.mkdir()
        # a workspace with a team, as the page's set-up leaves it
        assert user_venv.run(["agentmend", "init"], project).returncode == 0
        (command,) = _command_lines(block)
        argv = shlex.split(command)
        process = subprocess.Popen(
            [str(user_venv.bin / argv[0]), *argv[1:]],
            cwd=project,
            env=user_venv.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            first = _wait_for_output(process, 60)
            assert process.poll() is None, f"{block} ended: {first.decode(errors='replace')}"
            assert first.strip(), block
            process.send_signal(signal.SIGTERM)
            code = process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            assert process.stdout is not None
            rest = process.stdout.read()
            process.stdout.close()
        assert code == 0, f"{block}: exit {code}\n{(first + rest).decode(errors='replace')}"
        assert b"Traceback" not in first + rest, block


def _mcp_exchange(process: subprocess.Popen[bytes]) -> list[str]:
    """initialize, then tools/list: the tool names the server offers."""
    assert process.stdin is not None
    assert process.stdout is not None
    buffer = b""

    def send(message: dict[str, Any]) -> None:
        assert process.stdin is not None
        process.stdin.write(json.dumps(message).encode() + b"\n")
        process.stdin.flush()

    def receive() -> dict[str, Any]:
        nonlocal buffer
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        while b"\n" not in buffer:
            left = deadline - time.monotonic()
            ready = select.select([process.stdout.fileno()], [], [], max(left, 0))[0]
            if not ready:
                raise TimeoutError("the MCP server did not answer within 60 s")
            chunk = os.read(process.stdout.fileno(), 1 << 16)
            if not chunk:
                raise EOFError("the MCP server closed its stdout")
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    import mcp_types

    send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": mcp_types.LATEST_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "docs-example", "version": "1"},
            },
        }
    )
    assert "result" in receive()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    listed = receive()
    return sorted(tool["name"] for tool in listed["result"]["tools"])


@pytest.mark.slow
def test_every_mcp_client_configuration_starts_the_server_it_names(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    configs = of_kind("mcp-config")
    assert len(configs) >= 3
    for number, block in enumerate(configs):
        project = tmp_path / str(number)
        project.mkdir()
        # the placeholders of the absolute-path examples name this project and its venv
        text = block.text.replace("/path/to/project/.venv", str(user_venv.path))
        text = text.replace("/path/to/project", str(project))
        (server,) = json.loads(text)["mcpServers"].values()
        command = server["command"]
        if "/" not in command:
            command = str(user_venv.bin / command)
        process = subprocess.Popen(
            [command, *server["args"]],
            cwd=project,
            env=user_venv.env(**server.get("env", {})),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            tools = _mcp_exchange(process)
        finally:
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            assert process.stdout is not None
            process.stdout.close()
        assert tools == ["analyze", "issue", "memory", "run", "self_improve", "status"], block
        assert (project / ".agentmend").is_dir(), block  # its --workspace, in the project


# ------------------------------------------------------------------ the install lines


@pytest.mark.slow
def test_the_install_lines_install_from_a_checkout_without_a_registry(tmp_path: Path) -> None:
    needed = ("setuptools-", "wheel-")
    if not all(any(WHEELHOUSE.glob(f"{name}*.whl")) for name in needed):
        unavailable(f"no setuptools and wheel wheels in {WHEELHOUSE} (`make` downloads them)")
    (block,) = _distinct(of_kind("install"))
    checkout = tmp_path / "agentmend"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("agents", "infrastructure"):
        shutil.copytree(ROOT / name, checkout / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, checkout / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    # the dependencies are this test run's (never this checkout's editable install): pip checks
    # the declared ranges against them and installs only agentmend, built from the checkout
    borrow_dependencies(venv / "bin" / "python")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AGENTMEND_", "PYTHON", "VIRTUAL_ENV", "PIP_"))
    }
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
        VIRTUAL_ENV=str(venv),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(WHEELHOUSE),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    done = subprocess.run(
        ["sh", "-e", "-c", block.text],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{block}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = "import agentmend, psycopg, opentelemetry.sdk, pytest; print(agentmend.__file__)"
    installed = subprocess.run(
        [venv / "bin" / "python", "-c", probe],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    assert Path(installed.stdout.strip()).is_relative_to(venv)
    version = subprocess.run(
        [venv / "bin" / "agentmend", "--version"], cwd=elsewhere, env=env, capture_output=True
    )
    assert version.returncode == 0
    assert (venv / "bin" / "agentmend-mcp").exists()


# ------------------------------------------------------------------ settings


def test_every_setting_and_server_variable_is_on_the_settings_page(
    user_venv: UserVenv, tmp_path: Path
) -> None:
    from agentmend.infrastructure.settings import Settings

    named = {f"AGENTMEND_{field.upper()}" for field in Settings.model_fields}
    help_text = user_venv.run(["agentmend-mcp", "--help"], tmp_path).stdout
    named |= set(re.findall(r"AGENTMEND_[A-Z_]+", help_text))
    page = (ROOT / "docs" / "settings.md").read_text()
    settings = page.split("## Settings", 1)[1].split("\n## ", 1)[0]
    missing = sorted(
        name
        for name in named
        if name not in settings and not name.startswith("AGENTMEND_PRINCIPAL_")
    )
    assert missing == []
    assert "AGENTMEND_PRINCIPAL_ID" in settings
