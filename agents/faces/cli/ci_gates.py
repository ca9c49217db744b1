"""``agentmend init``, ``agentmend eval`` and ``agentmend check``: a team of one's own in CI.

``init`` scaffolds a workspace for a team of one's own: two agents in Claude Code's format, an
eval suite for each and a ``settings.env``, refusing to write into a team folder that holds
anything.

``eval`` runs agents' eval suites on their own, outside any cycle, and exits 1 when a case fails
by its suite's rule (a majority of its repeats must pass), with ``--json`` and ``--junit FILE``
for a CI system to read. ``check`` exits 1 when the store holds an open or held issue or its
audit chain does not verify. Neither changes a file or records a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

from agentmend.faces.cli.commands import cassette_arguments, console, open_workspace
from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    Subcommand,
    print_json,
)
from agentmend.faces.cli.report import open_store

if TYPE_CHECKING:
    from agentmend.infrastructure.evaluation.verification import SuiteRun

__all__ = ["SCAFFOLD", "SUBCOMMANDS"]


# -- init ---------------------------------------------------------------------------------------

SCAFFOLD: dict[str, str] = {
    "agents/support-agent.md": """\
---
name: support-agent
description: Answers customers' questions about their orders (shipping, returns, refunds) in a
  few friendly sentences. Use for any question a customer writes in.
model: haiku
agentmend:
  max_tokens: 1024
  timeout_s: 60
  permission_profile: standard
---
You answer customers of an online shop. Be brief: three sentences at most, in plain words.

## Rules
- Refunds: within 30 days of delivery, to the original payment method.
- Returns: free, with the label from the order page.
- Never promise a date you do not know; say where the customer can check it.
""",
    "agents/support-agent.evals.yaml": """\
description: support-agent states the shop's policies and stays brief.
repeats: 3            # runs per case; a case passes when most of its runs pass
cases:
  - id: refund-window
    prompt: "Can I still get a refund for shoes delivered three weeks ago?"
    check: {regex: "(?i)30 days"}
  - id: return-label
    prompt: "How do I send back a jacket that does not fit?"
    check: {regex: "(?i)label"}
""",
    "agents/summarizer.md": """\
---
name: summarizer
description: Summarizes a customer conversation in one line for the ticket's title. Use when a
  ticket is closed.
model: haiku
agentmend:
  max_tokens: 256
  timeout_s: 30
  permission_profile: standard
---
You summarize a customer conversation for a ticket title. Reply with one line that starts with
"Summary:" and names the customer's request; no other text.
""",
    "agents/summarizer.evals.yaml": """\
description: summarizer gives one line that starts with "Summary:".
repeats: 3
cases:
  - id: refund-ticket
    prompt: "Customer: my parcel arrived broken, I want my money back. Agent: refund issued."
    check: {regex: "^Summary:"}
  - id: address-ticket
    prompt: "Customer: please change my delivery address to 5 Elm Street. Agent: done."
    check: {regex: "^Summary:"}
""",
    "settings.env": """\
# agentmend settings for this workspace, read by every agentmend command run on it
# (--workspace DIR, or AGENTMEND_WORKSPACE); a variable set in the environment wins.
# The agents run on the Messages API (ANTHROPIC_API_KEY); --replay CASSETTE needs no key.
AGENTMEND_PROVIDER=anthropic
# An agent is judged against its first 30 runs (the default, 500, suits a busy team).
AGENTMEND_BASELINE_N=30
""",
}
"""What ``agentmend init`` writes, by path inside the workspace."""


def _init_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "folder",
        metavar="DIR",
        nargs="?",
        type=Path,
        help="the workspace to make (default: $AGENTMEND_WORKSPACE, else ./.agentmend)",
    )


def _run_init(args: argparse.Namespace) -> int:
    from agentmend.faces.cli.common import workspace_path
    from agentmend.infrastructure.errors import AgentmendError
    from agentmend.infrastructure.files.atomic import atomic_write

    folder: Path = args.folder if args.folder is not None else workspace_path(args)
    team = folder / "agents"
    if folder.exists() and not folder.is_dir():
        raise CommandError(f"cannot init {folder}: it is a file, not a folder")
    if team.exists() and (not team.is_dir() or any(team.iterdir())):
        raise CommandError(
            f"cannot init {folder}: its team folder {team} already holds files; nothing was "
            "written (give another folder: agentmend init DIR)"
        )
    if (folder / "settings.env").exists():
        raise CommandError(
            f"cannot init {folder}: {folder / 'settings.env'} exists; nothing was written "
            "(give another folder: agentmend init DIR)"
        )
    created = []
    try:
        for relative, text in SCAFFOLD.items():
            atomic_write(folder / relative, text)
            created.append(folder / relative)
    except (OSError, AgentmendError) as exc:
        raise CommandError(f"cannot init {folder}: {exc}", EXIT_UNAVAILABLE) from exc
    cassette = folder / "cassette.json"
    if args.json:
        print_json({"workspace": str(folder), "created": [str(p) for p in created]})
        return EXIT_OK
    out = console()
    for path in created:
        out.print(f"created {path}", soft_wrap=True)
    out.print(
        "\nnext (edit the agents and their suites first, then):\n"
        f"  agentmend eval --workspace {folder} --record {cassette}   "
        "# once, with ANTHROPIC_API_KEY\n"
        f"  agentmend eval --workspace {folder} --replay {cassette}   # no key, no network: CI\n"
        f"  agentmend check --workspace {folder}\n"
        f"  agentmend improve --workspace {folder} support-agent --record {cassette}\n"
        f"  agentmend session --workspace {folder} --replay {cassette}",
        soft_wrap=True,  # commands to copy: never broken across lines
    )
    return EXIT_OK


# -- eval ---------------------------------------------------------------------------------------


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "agent", nargs="?", help="the agent whose suite to run (default: every agent with one)"
    )
    parser.add_argument(
        "--junit", type=Path, metavar="FILE", help="also write the results as JUnit XML"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="the simulated team's seed (offline provider)"
    )
    cassette_arguments(parser)


def _run_eval(args: argparse.Namespace) -> int:
    from agentmend.infrastructure.errors import AgentmendError
    from agentmend.infrastructure.evaluation.evals import find_eval_suite
    from agentmend.infrastructure.evaluation.verification import run_suite
    from agentmend.infrastructure.llm.cassette import CassetteError, CassetteMiss
    from agentmend.roles.team import AgentTeam, UnknownAgent

    with open_workspace(args) as workspace:
        try:
            runtime, _ = workspace.runtimes(seed=args.seed)
            team = AgentTeam(workspace.team_dir, runtime)
            specs = [team.spec(args.agent)] if args.agent else [team.spec(n) for n in team.names]
        except UnknownAgent as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        except AgentmendError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        suites = [(spec, find_eval_suite(spec)) for spec in specs]
        if args.agent and suites[0][1] is None:
            raise CommandError(
                f"{args.agent} has no eval suite ({args.agent}.evals.yaml beside its file)",
                EXIT_USAGE,
            )
        runnable = [(spec, suite) for spec, suite in suites if suite is not None]
        if not runnable:
            raise CommandError("no agent of the team has an eval suite", EXIT_USAGE)

        async def run_all() -> list[SuiteRun]:
            try:
                return [await run_suite(runtime, spec, suite) for spec, suite in runnable]
            finally:  # on this loop: a runtime's HTTP client is closed before the loop ends
                await workspace.aclose()

        try:
            runs = asyncio.run(run_all())
        except (CassetteMiss, CassetteError) as exc:  # a request to record, or a cassette to fix
            raise CommandError(str(exc), EXIT_USAGE) from exc
    report = [_suite_json(run) for run in runs]
    passed = all(case["passed"] for agent in report for case in agent["cases"])
    if args.junit is not None:
        _write_junit(args.junit, report)
    if args.json:
        print_json({"passed": passed, "agents": report})
    else:
        out = console()
        for agent in report:
            for case in agent["cases"]:
                ok = sum(r["passed"] for r in case["runs"])
                out.print(
                    f"{'pass' if case['passed'] else 'FAIL'}  {agent['agent']}  {case['id']}  "
                    f"{ok}/{len(case['runs'])}"
                    + ("" if case["passed"] else f"  {_first_failure(case)}"),
                    style=None if case["passed"] else "red",
                )
        failing = sum(not c["passed"] for a in report for c in a["cases"])
        total = sum(len(a["cases"]) for a in report)
        out.print(f"{total - failing}/{total} cases pass" + ("" if passed else ": FAILED"))
    return EXIT_OK if passed else EXIT_PROBLEM


def _suite_json(run: SuiteRun) -> dict[str, Any]:
    return {
        "agent": run.agent_name,
        "score": run.score,
        "cases": [
            {
                "id": case.case_id,
                "passed": case.majority_pass,
                "runs": [
                    {
                        "passed": r.passed,
                        "detail": r.detail,
                        "error": r.error,
                        "duration_ms": r.duration_ms,
                    }
                    for r in case.runs
                ],
            }
            for case in run.cases
        ],
    }


def _first_failure(case: dict[str, Any]) -> str:
    failed = next((r for r in case["runs"] if not r["passed"]), None)
    if failed is None:
        return ""
    return str(failed["error"] or failed["detail"] or "")[:200]


def _write_junit(path: Path, report: list[dict[str, Any]]) -> None:
    from agentmend.infrastructure.files.atomic import atomic_write

    root = ElementTree.Element("testsuites", name="agentmend eval")
    for agent in report:
        failures = sum(not c["passed"] for c in agent["cases"])
        suite = ElementTree.SubElement(
            root,
            "testsuite",
            name=agent["agent"],
            tests=str(len(agent["cases"])),
            failures=str(failures),
        )
        for case in agent["cases"]:
            seconds = sum(r["duration_ms"] or 0.0 for r in case["runs"]) / 1000
            element = ElementTree.SubElement(
                suite, "testcase", classname=agent["agent"], name=case["id"], time=f"{seconds:.3f}"
            )
            if not case["passed"]:
                failure = ElementTree.SubElement(element, "failure", message=_first_failure(case))
                failure.text = json.dumps(case["runs"], indent=2)
    try:
        atomic_write(path, ElementTree.tostring(root, encoding="utf-8", xml_declaration=True))
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc}", EXIT_USAGE) from exc


# -- check --------------------------------------------------------------------------------------


def _run_check(args: argparse.Namespace) -> int:
    from agentmend.infrastructure.detection.issue_ledger import read_active_issues
    from agentmend.infrastructure.store.snapshot import read_snapshot
    from agentmend.infrastructure.store.sql import has_table

    with open_store(args) as opened:
        with read_snapshot(opened.store) as conn:
            issues = read_active_issues(conn) if has_table(conn, "monitoring_issues") else []
        chain = opened.manager.verify_audit_chain(repair=False)
    ok = not issues and chain.ok
    if args.json:
        print_json(
            {
                "ok": ok,
                "open_issues": [
                    {"issue_id": i.issue_id, "agent": i.agent, "kind": i.kind, "status": i.status}
                    for i in issues
                ],
                "audit": {"ok": chain.ok, "rows_checked": chain.rows_checked},
            }
        )
        return EXIT_OK if ok else EXIT_PROBLEM
    out = console()
    for issue in issues:
        out.print(f"{issue.status} issue {issue.issue_id}: {issue.agent} {issue.kind}", style="red")
    if not chain.ok:
        out.print("audit chain does NOT verify (agentmend audit verify)", style="red")
    if ok:
        out.print(f"ok: no open issue; audit chain verified ({chain.rows_checked} rows)")
    return EXIT_OK if ok else EXIT_PROBLEM


SUBCOMMANDS = (
    Subcommand(
        path=("init",),
        help="scaffold a workspace for your own agents: agent files, eval suites, settings",
        run=_run_init,
        example="agentmend init my-team",
        add_arguments=_init_arguments,
        json_output=True,
        workspace=False,
    ),
    Subcommand(
        path=("eval",),
        help="run eval suites on their own (exit 1 if a case fails): a CI gate",
        run=_run_eval,
        example="agentmend eval research-agent --junit eval.xml",
        add_arguments=_eval_arguments,
        json_output=True,
    ),
    Subcommand(
        path=("check",),
        help="exit 1 if an issue is open or the audit chain does not verify: a CI gate",
        run=_run_check,
        example="agentmend check --json",
        json_output=True,
    ),
)
