"""``agentmend init`` and ``--record`` / ``--replay`` on the command line: a team of one's own,
recorded once through the real ``anthropic`` client against the fake Messages API, then
evaluated with no key and the server stopped."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from cli_run import run_cli
from fake_messages_api import FakeMessagesAPI
from own_team import SUPPORT_ANSWER, answer_scaffolded_team

from agentmend.faces.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE

pytestmark = pytest.mark.usefixtures("restore_logging")

SCAFFOLD = [
    "agents/summarizer.evals.yaml",
    "agents/summarizer.md",
    "agents/support-agent.evals.yaml",
    "agents/support-agent.md",
    "settings.env",
]


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_init_scaffolds_a_workspace_and_says_what_comes_next(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "team"
    code, out, err = run_cli(capsys, "init", str(folder))

    assert code == EXIT_OK, err
    assert sorted(_files(folder)) == SCAFFOLD
    for name in SCAFFOLD:
        assert f"created {folder / name}" in out
    assert f"agentmend eval --workspace {folder} --replay {folder / 'cassette.json'}" in out
    assert f"agentmend check --workspace {folder}" in out
    # the files load as the next commands read them: agent files and suites alike
    from agentmend.infrastructure.evaluation.evals import find_eval_suite
    from agentmend.infrastructure.llm.offline import OfflineRuntime
    from agentmend.roles.team import AgentTeam

    team = AgentTeam(folder / "agents", OfflineRuntime({}))
    assert sorted(team.names) == ["summarizer", "support-agent"]
    for name in team.names:
        suite = find_eval_suite(team.spec(name))
        assert suite is not None
        assert len(suite.cases) == 2


def test_init_refuses_a_team_folder_that_holds_files_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "team"
    (folder / "agents").mkdir(parents=True)
    (folder / "agents" / "mine.md").write_text("---\nname: mine\n---\nmine\n")
    before = _files(folder)

    code, _out, err = run_cli(capsys, "init", str(folder))

    assert code == EXIT_USAGE
    assert f"cannot init {folder}: its team folder {folder / 'agents'} already holds files" in err
    assert "nothing was written" in err
    assert _files(folder) == before

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    code, _, err = run_cli(capsys, "init", str(a_file))
    assert (code, a_file.read_text()) == (EXIT_USAGE, "x")
    assert "it is a file, not a folder" in err


def test_eval_records_once_then_replays_with_no_key_and_the_server_stopped(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_api: FakeMessagesAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder, cassette = tmp_path / "team", tmp_path / "cassette.json"
    assert run_cli(capsys, "init", str(folder))[0] == EXIT_OK
    fake_api.set_responder(answer_scaffolded_team)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-recording-key-123")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_api.base_url)

    code, out, err = run_cli(
        capsys, "eval", "--workspace", str(folder), "--record", str(cassette), "--json"
    )
    assert code == EXIT_OK, out + err
    assert json.loads(out)["passed"] is True
    assert len(fake_api.message_requests()) == 12  # 2 agents x 2 cases x 3 repeats

    fake_api.close()
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    code, out, err = run_cli(capsys, "eval", "--workspace", str(folder), "--replay", str(cassette))
    assert code == EXIT_OK, out + err
    assert "4/4 cases pass" in out
    assert "sk-ant-test-recording-key-123" not in cassette.read_text()
    assert SUPPORT_ANSWER in cassette.read_text()

    code, out, err = run_cli(capsys, "check", "--workspace", str(folder))
    assert code == EXIT_OK, out + err

    # a case changed since the recording: one named error, not a failing case
    suite = folder / "agents" / "summarizer.evals.yaml"
    suite.write_text(suite.read_text().replace("5 Elm Street", "7 Oak Road"))
    code, out, err = run_cli(
        capsys, "eval", "summarizer", "--workspace", str(folder), "--replay", str(cassette)
    )
    assert code == EXIT_USAGE
    assert "has no recorded answer for agent 'summarizer', turn 1" in err
    assert "Traceback" not in out + err


@pytest.mark.slow
def test_the_session_records_and_replays_and_improve_names_a_miss(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_api: FakeMessagesAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder, cassette = tmp_path / "team", tmp_path / "cassette.json"
    assert run_cli(capsys, "init", str(folder))[0] == EXIT_OK
    question = "Can I still get a refund for shoes delivered three weeks ago?\n/quit\n"
    fake_api.set_responder(answer_scaffolded_team)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-session-key-0123")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_api.base_url)
    monkeypatch.setattr("sys.stdin", io.StringIO(question))
    recorded = run_cli(capsys, "session", "--workspace", str(folder), "--record", str(cassette))
    assert recorded[0] == EXIT_OK, recorded
    assert len(fake_api.message_requests()) == 2  # the question goes to every agent

    fake_api.close()
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    monkeypatch.setattr("sys.stdin", io.StringIO(question))
    replay = ("--replay", str(cassette))
    code, out, err = run_cli(capsys, "session", "--workspace", str(folder), *replay)
    assert code == EXIT_OK, out + err
    assert f"2 agents from {folder / 'agents'}" in out
    assert "30 days" in out  # the support agent's recorded answer, served again

    # improve's roles ask the model first: nothing of theirs was recorded, and the miss says who
    improve = ("improve", "support-agent", "--workspace", str(folder))
    code, out, err = run_cli(capsys, *improve, *replay)
    assert code == EXIT_USAGE, out + err
    assert "has no recorded answer for agent" in err
    assert "turn 1" in err
    assert "Traceback" not in out + err

    code, out, err = run_cli(capsys, "session", "--workspace", str(folder))
    assert code == EXIT_USAGE
    assert "needs ANTHROPIC_API_KEY" in err  # settings.env: the anthropic provider


def test_settings_env_is_read_and_a_bad_line_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "team"
    assert run_cli(capsys, "init", str(folder))[0] == EXIT_OK
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    code, _, err = run_cli(capsys, "eval", "--workspace", str(folder))
    assert code == EXIT_USAGE
    assert "needs an API key" in err

    monkeypatch.setenv("AGENTMEND_PROVIDER", "offline")  # the environment wins over the file
    code, _out, err = run_cli(capsys, "eval", "--workspace", str(folder))
    assert code == EXIT_PROBLEM, err  # the simulated runtime does not know these agents

    settings = folder / "settings.env"
    settings.write_text(settings.read_text() + "AGENTMEND_BASELINE=5\n")
    code, _, err = run_cli(capsys, "check", "--workspace", str(folder))
    assert code == EXIT_USAGE
    assert f"{settings} line 7: 'AGENTMEND_BASELINE' is not an agentmend setting" in err


@pytest.mark.slow
def test_a_corrupt_cassette_is_one_line_from_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, cassette = tmp_path / "team", tmp_path / "cassette.json"
    assert run_cli(capsys, "init", str(folder))[0] == EXIT_OK
    cassette.write_text('{"format": "agentmend-cassette", "version": 1, "exchanges": [')
    before = cassette.read_bytes()
    monkeypatch.setattr("sys.stdin", io.StringIO("/quit\n"))
    for command in (("eval",), ("improve", "summarizer"), ("session",)):
        code, out, err = run_cli(
            capsys, *command, "--workspace", str(folder), "--replay", str(cassette)
        )
        assert code == EXIT_USAGE, (command, out, err)
        assert f"cassette {cassette} cannot be used: it is not JSON" in err
        assert len(err.strip().splitlines()) == 1, err
    code, out, _ = run_cli(
        capsys, "eval", "--workspace", str(folder), "--record", str(cassette), "--json"
    )
    assert code == EXIT_USAGE
    assert json.loads(out)["exit_code"] == EXIT_USAGE
    assert cassette.read_bytes() == before  # recording into it would have lost it: refused
