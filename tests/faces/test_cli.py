"""The ``agentmend`` command as a user runs it: help at every level, each subcommand's output,
``--json``, exit codes (0 ok, 1 problem, 2 usage, 3 unavailable) and bad arguments.

Most tests call ``main()`` in-process (the same parser and handlers the console script runs);
the installed script itself, ``python -m agentmend`` and the session are run as subprocesses.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import demo_workspace as make_demo
from cli_run import fresh_demo_workspace, run_cli

from agentmend.faces.cli.app import build_parser, main
from agentmend.faces.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_UNAVAILABLE, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture(scope="module")
def demo_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo(tmp_path_factory.mktemp("demo") / "ws")


@pytest.fixture
def workspace(demo_workspace: Path, tmp_path: Path) -> Path:
    """A copy of the demo's workspace for tests that read it or touch only its database
    (its changes name the files of the original, so a rollback needs a demo of its own)."""
    copy = tmp_path / "ws"
    shutil.copytree(demo_workspace, copy)
    return copy


def _leaf_paths() -> list[tuple[str, ...]]:
    from agentmend.faces.cli.app import _subcommands

    return [command.path for command in _subcommands()]


def test_top_level_help_lists_every_subcommand_examples_and_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == EXIT_OK
    for name in ("session", "demo", "mcp", "history", "rollback", "audit"):
        assert name in out
    assert "examples:" in out
    assert "exit codes: 0 ok, 1 a problem was found, 2 usage error, 3" in out


@pytest.mark.parametrize("path", _leaf_paths(), ids=lambda p: " ".join(p))
def test_every_subcommand_has_help_with_an_example_and_the_workspace_flag(
    capsys: pytest.CaptureFixture[str], path: tuple[str, ...]
) -> None:
    code, out, _ = run_cli(capsys, *path, "--help")
    assert code == EXIT_OK
    assert "example:\n  agentmend " + " ".join(path) in out
    # init makes the workspace it is given: its folder is its argument, not a flag
    assert "--workspace DIR" in out or path == ("init",)


def test_a_group_without_its_subcommand_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(capsys, "audit")
    assert code == EXIT_USAGE
    assert err.startswith("agentmend: ")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ("bogus",),
        ("history", "--limit", "zero"),
        ("history", "--limit", "0"),
        ("rollback",),
        ("history", "--no-such-flag"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == EXIT_USAGE
    assert out == ""
    assert err.startswith("agentmend: ")
    assert len(err.strip().splitlines()) == 1


def test_history_as_a_table_and_as_json(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    code, out, _ = run_cli(capsys, "history", "--workspace", str(workspace))
    assert code == EXIT_OK
    assert "kept" in out
    code, out, _ = run_cli(capsys, "history", "--workspace", str(workspace), "--json")
    assert code == EXIT_OK
    changes = json.loads(out)["changes"]
    assert changes, "the demo keeps a change"
    assert {"change_id", "status", "action"} <= set(changes[0])
    code, out, _ = run_cli(
        capsys, "history", "--workspace", str(workspace), "--json", "--limit", "1"
    )
    assert len(json.loads(out)["changes"]) == 1


def test_the_workspace_comes_from_the_environment_when_not_given(
    capsys: pytest.CaptureFixture[str], workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTMEND_WORKSPACE", str(workspace))
    code, out, _ = run_cli(capsys, "history", "--json")
    assert code == EXIT_OK
    assert json.loads(out)["changes"]


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_an_unavailable_workspace_exits_3_in_one_line_and_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "ws"
    if kind == "file":
        target.write_text("not a folder")
    for argv in (("history",), ("audit", "verify"), ("rollback", "abc")):
        code, out, err = run_cli(capsys, *argv, "--workspace", str(target))
        assert code == EXIT_UNAVAILABLE, argv
        assert out == ""
        assert err.startswith("agentmend: workspace ")
        assert len(err.strip().splitlines()) == 1
    assert (not target.exists()) if kind == "missing" else target.read_text() == "not a folder"


def test_a_bad_setting_names_the_variable_and_exits_2(
    capsys: pytest.CaptureFixture[str], workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTMEND_BASELINE_N", "lots")
    code, _, err = run_cli(capsys, "history", "--workspace", str(workspace))
    assert code == EXIT_USAGE
    assert "AGENTMEND_BASELINE_N" in err
    assert len(err.strip().splitlines()) == 1


def test_audit_verify_passes_then_fails_with_exit_1_after_a_tamper(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    code, out, _ = run_cli(capsys, "audit", "verify", "--workspace", str(workspace), "--json")
    assert code == EXIT_OK
    report = json.loads(out)
    assert report["verified"] is True
    assert report["rows_checked"] > 0
    with sqlite3.connect(workspace / "agentmend.db") as conn:
        conn.execute("UPDATE audit_log SET new_value = 'forged' WHERE id = 1")
    code, out, _ = run_cli(capsys, "audit", "verify", "--workspace", str(workspace), "--json")
    assert code == EXIT_PROBLEM
    report = json.loads(out)
    assert report["verified"] is False
    assert any(p["row_id"] == 1 for p in report["problems"])
    code, out, _ = run_cli(capsys, "audit", "verify", "--workspace", str(workspace))
    assert code == EXIT_PROBLEM
    assert "does NOT verify" in out


def _kept_change(workspace: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    main(["history", "--workspace", str(workspace), "--json"])
    changes = json.loads(capsys.readouterr().out)["changes"]
    return next(c for c in reversed(changes) if c["status"] == "kept")


def test_rollback_restores_the_files_and_a_second_rollback_is_a_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    workspace = fresh_demo_workspace(tmp_path / "ws")  # rolls back the demo's own change
    team = workspace / "agents"
    before = {p.name: p.read_bytes() for p in team.glob("*.md")}
    change = _kept_change(workspace, capsys)
    code, out, err = run_cli(
        capsys, "rollback", str(change["change_id"]), "--workspace", str(workspace), "--json"
    )
    assert code == EXIT_OK, err
    assert json.loads(out)["change"]["status"] == "rolled_back"
    after = {p.name: p.read_bytes() for p in team.glob("*.md")}
    assert after != before, "the kept change's file went back to its old bytes"
    code, _, err = run_cli(
        capsys, "rollback", str(change["change_id"]), "--workspace", str(workspace)
    )
    assert code == EXIT_PROBLEM
    assert "already rolled_back" in err
    code, _, _ = run_cli(capsys, "audit", "verify", "--workspace", str(workspace))
    assert code == EXIT_OK


def test_rollback_of_an_unknown_change_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    code, out, err = run_cli(capsys, "rollback", "no-such-id", "--workspace", str(workspace))
    assert code == EXIT_USAGE
    assert out == ""
    assert "unknown change id 'no-such-id'" in err


def test_the_installed_script_and_python_m_agents_run(tmp_path: Path) -> None:
    script = shutil.which("agentmend", path=str(Path(sys.executable).parent))
    assert script is not None, "the agentmend console script is installed with the package"
    result = subprocess.run(
        [script, "history", "--workspace", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == EXIT_UNAVAILABLE
    assert result.stderr.startswith("agentmend: workspace ")
    version = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0
    assert version.stdout.startswith("agentmend ")
    session = subprocess.run(
        [sys.executable, "-m", "agentmend", "--workspace", str(tmp_path / "ws")],
        input="/status\n/quit\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert session.returncode == 0, session.stderr
    assert "6 agents from" in session.stdout


def test_agentmend_session_takes_the_session_flags(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentmend.faces.cli",
            "session",
            "--workspace",
            str(tmp_path / "ws"),
            "--seed",
            "3",
        ],
        input="what is a monad?\n/history\n/quit\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "no changes yet" in result.stdout
    assert (tmp_path / "ws" / "agentmend.db").exists()


def test_agentmend_mcp_serves_the_workspace_over_stdio(tmp_path: Path) -> None:
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentmend.faces.cli",
            "mcp",
            "--workspace",
            str(tmp_path / "ws"),
            "--root",
            str(tmp_path),
            "--log-level",
            "WARNING",
        ],
        input=json.dumps(request) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout.splitlines()[0])
    assert reply["id"] == 1
    assert reply["result"]["serverInfo"]["name"] == "agentmend"


def test_agentmend_mcp_takes_every_option_of_agentmend_mcp_and_passes_each_on(
    tmp_path: Path,
) -> None:
    from agentmend.faces.mcp.server import _parse_args

    mcp_leaf = build_parser(argv=["mcp"]).parse_args(
        ["mcp", "--follow-releases", "on", "--release", "3", "--store", "x.db"]
    )
    alone = _parse_args(["--follow-releases", "on", "--release", "3", "--store", "x.db"])
    assert {k: v for k, v in vars(alone).items()} == {
        k: v for k, v in vars(mcp_leaf).items() if k in vars(alone)
    }
    # --store reaches the server: it names the store it cannot open (and keeps serving, as
    # documented, so that each call may try again)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "agentmend.faces.cli", "mcp"),
            *("--workspace", str(tmp_path / "ws"), "--store", "mysql://nobody@127.0.0.1/db"),
        ],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert "unsupported store URL mysql://" in result.stderr


def test_the_parser_nests_paths_and_every_leaf_runs_something() -> None:
    parser = build_parser()
    args = parser.parse_args(["audit", "verify", "--json"])
    assert args.subcommand.path == ("audit", "verify")
    assert args.json is True
    args = parser.parse_args(["rollback", "abc", "--force"])
    assert args.change == "abc"
    assert args.force
    assert not args.cascade


@pytest.mark.parametrize("argv", [["--version"], ["status", "--workspace", "{ws}"], ["--help"]])
def test_a_subcommand_imports_only_what_it_runs(tmp_path: Path, argv: list[str]) -> None:
    # the session's module (most of a second to import) is not loaded to build the parser
    probe = (
        "import sys\nfrom agentmend.faces.cli.app import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print('session imported:', 'agentmend.faces.session.app' in sys.modules,"
        " file=sys.stderr)\n"
    )
    args = [a.replace("{ws}", str(tmp_path / "ws")) for a in argv]
    result = subprocess.run(
        [sys.executable, "-c", probe, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert "session imported: False" in result.stderr, result.stderr
    assert "agentmend" in result.stdout + result.stderr  # it ran: the version, help or error


def test_under_json_a_failure_is_json_on_stdout_with_its_exit_code(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "show", "nope", "--workspace", str(workspace), "--json")
    assert code == EXIT_USAGE
    assert json.loads(out) == {
        "error": "unknown change id 'nope' (see `agentmend history`)",
        "exit_code": EXIT_USAGE,
    }
    assert err == ""
    code, out, err = run_cli(capsys, "show", "nope", "--workspace", str(workspace))
    assert (code, out) == (EXIT_USAGE, "")  # without --json: the one line on stderr
    assert err == "agentmend: unknown change id 'nope' (see `agentmend history`)\n"


@pytest.mark.parametrize(
    ("status", "issue_id", "code"),
    [
        ("kept", "i1", 0),
        ("watching", "i1", 0),
        ("not_reproduced", "i1", 0),
        ("claimed_elsewhere", "i1", 0),
        ("no_action", None, 0),  # a healthy agent asked about: nothing to change, nothing open
        ("no_action", "i1", 1),  # the detector's issue stays open
        ("refused", "i1", 1),
        ("rolled_back", None, 1),
        ("error", None, 1),
    ],
)
def test_improve_exits_1_exactly_when_an_issue_is_left_open(
    status: str, issue_id: str | None, code: int
) -> None:
    from types import SimpleNamespace

    from agentmend.faces.cli.report import improve_exit_code

    result = SimpleNamespace(status=status, issue=SimpleNamespace(issue_id=issue_id))
    assert improve_exit_code(result) == code
