"""``agentmend eval`` and ``agentmend check`` as a CI job runs them: the exit code is the gate,
``--json`` and ``--junit`` what the CI system reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest
from cli_run import demo_workspace as make_demo
from cli_run import run_cli

from agentmend.faces.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE
from agentmend.faces.workspace import Workspace

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo(tmp_path_factory.mktemp("demo") / "ws")


@pytest.fixture
def workspace(demo: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ws"
    shutil.copytree(demo, copy)
    return copy


def test_eval_passes_every_case_and_writes_junit(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "eval.xml"
    args = ("eval", "research-agent", "--workspace", str(workspace), "--junit", str(junit))
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == EXIT_OK, err
    report = json.loads(out)
    assert report["passed"] is True
    (agent,) = report["agents"]
    assert agent["agent"] == "research-agent"
    assert [c["id"] for c in agent["cases"]] == ["pythagoras", "euler-identity", "group-theory"]
    assert all(len(c["runs"]) == 3 for c in agent["cases"])  # the suite's repeats
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("name"), suite.get("tests"), suite.get("failures")) == (
        "research-agent",
        "3",
        "0",
    )


def test_a_failing_case_is_exit_1_with_the_failure_in_junit(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite_file = workspace / "agents" / "research-agent.evals.yaml"
    suite_file.write_text(
        suite_file.read_text().replace(
            'check: {contains: ["## Answer", "Euler\'s identity"]}',
            'check: {contains: ["## Answer", "a phrase no answer holds"]}',
        )
    )
    junit = tmp_path / "eval.xml"
    args = ("eval", "research-agent", "--workspace", str(workspace), "--junit", str(junit))
    code, out, _ = run_cli(capsys, *args)
    assert code == EXIT_PROBLEM
    assert "FAIL  research-agent  euler-identity  0/3" in out
    assert "2/3 cases pass: FAILED" in out
    failures = ElementTree.parse(junit).getroot().findall("./testsuite/testcase/failure")
    assert len(failures) == 1
    assert "a phrase no answer holds" in (failures[0].get("message") or "")


def test_eval_of_an_agent_without_a_suite_or_unknown_is_a_usage_error(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "eval", "nobody", "--workspace", str(workspace))
    assert code == EXIT_USAGE
    assert "no agent named 'nobody'" in err
    (workspace / "agents" / "quality-agent.evals.yaml").unlink()
    code, _, err = run_cli(capsys, "eval", "quality-agent", "--workspace", str(workspace))
    assert code == EXIT_USAGE
    assert "quality-agent has no eval suite" in err


def test_check_is_the_gate_on_open_issues_and_the_audit_chain(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = tmp_path / "fresh"
    Workspace.open(fresh, create=True).close()
    code, out, _ = run_cli(capsys, "check", "--workspace", str(fresh))
    assert code == EXIT_OK
    assert out.startswith("ok: no open issue; audit chain verified")

    # the demo leaves an issue held (a cycle ended with no change kept)
    code, out, _ = run_cli(capsys, "check", "--workspace", str(workspace), "--json")
    assert code == EXIT_PROBLEM
    result = json.loads(out)
    assert result["ok"] is False
    assert result["open_issues"]
    assert result["audit"]["ok"] is True

    head = next(fresh.glob("*.audit-head"), None) or next(fresh.rglob("*audit*head*"))
    head.write_text("garbled\n")
    code, out, _ = run_cli(capsys, "check", "--workspace", str(fresh))
    assert code == EXIT_PROBLEM
    assert "audit chain does NOT verify" in out
