"""``agentmend watch``, the fleet checker as a program, and ``agentmend issue``, its questions.

Runs reach the store from every worker, receiver and host; ``watch`` judges them all for the
workspace's team, one checker at a time (the others stand by and take over when it dies), and
deals with each issue it opens by the policy picked with ``--on-issue``
(:mod:`agentmend.loop.checker_policies`): ``report``, ``ask`` or ``improve``. Under ``ask`` a
person answers with ``agentmend issue approve ID`` or ``agentmend issue decline ID`` (or from the
session or the MCP server); ``agentmend issue list`` shows the questions and their answers. The
checker itself lives in the loop (:class:`agentmend.loop.fleet_checker.FleetChecker`); this face
opens the workspace, builds the policy and prints what happens.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agentmend.faces.cli.commands import console, open_workspace
from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    CommandError,
    Subcommand,
    print_json,
)

if TYPE_CHECKING:
    from agentmend.faces.workspace import Workspace
    from agentmend.infrastructure.models import IssueReport
    from agentmend.loop.checker_policies import IssuePolicy
    from agentmend.loop.fleet_checker import CheckerStep

__all__ = ["SUBCOMMANDS", "add_policy_argument", "checker_policy", "issue_line"]

POLICIES = ("report", "ask", "improve")


def add_policy_argument(parser: argparse.ArgumentParser) -> None:
    """``--on-issue``, shared with ``agentmend otel receive --check``."""
    parser.add_argument(
        "--on-issue",
        choices=POLICIES,
        default="report",
        help="what to do with an issue: report opens it and says so (default); ask asks a "
        "person (agentmend issue approve ID) and runs the cycle once approved; improve runs "
        "the cycle unattended (needs AGENTMEND_YOLO_MODE=true and a published release: what "
        "it keeps goes out as a canary)",
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    add_policy_argument(parser)
    parser.add_argument(
        "--interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between checks (default 5)",
    )
    parser.add_argument(
        "--term",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="a checker silent this long is replaced by a standby (default 15)",
    )
    parser.add_argument(
        "--max-checks", type=int, metavar="N", help="stop after N steps (default: until stopped)"
    )


@contextlib.contextmanager
def checker_policy(workspace: Workspace, team: str, name: str) -> Iterator[IssuePolicy]:
    """The policy ``name`` for ``team``'s checker on ``workspace``, closed on the way out.

    ``ask`` and ``improve`` run cycles on the workspace's team folder as the checker's own
    principal; what a cycle keeps is published as a canary when the team publishes releases.

    Raises:
        ConfigurationError: ``improve`` without yolo mode or without a published release.
    """
    from agentmend.infrastructure.changes.cycle_requests import CycleRequests
    from agentmend.infrastructure.principal import Principal
    from agentmend.infrastructure.releases.log import ReleaseLog
    from agentmend.infrastructure.releases.rollout import Rollouts
    from agentmend.loop.checker_policies import CyclePolicy, ReportPolicy, check_unattended
    from agentmend.loop.release_publishing import ReleasePublisher

    if name == "report":
        yield ReportPolicy()
        return
    assert name in ("ask", "improve")
    log = ReleaseLog(workspace.store, team, audit=workspace.manager.audit)
    has_release = log.heads().stable is not None
    if name == "improve":
        check_unattended(workspace.settings.yolo_mode, has_release, team)
    principal = Principal.fleet_checker(team)
    orchestrator = workspace.orchestrator(
        principal=principal,
        publisher=ReleasePublisher(log) if has_release else None,
        # under ask the cycle runs only once a person approved it (agentmend issue approve):
        # that answer, audited with its author, is the approval of the cycle's change
        approval_callback=(lambda _change: True) if name == "ask" else None,
    )
    policy = CyclePolicy(
        "ask" if name == "ask" else "improve",
        CycleRequests(workspace.store),
        team,
        principal,
        orchestrator,
        advance_rollouts=Rollouts(log).advance if has_release else None,
        stale_after_s=workspace.settings.issue_claim_stale_s,
    )
    try:
        yield policy
    finally:
        policy.close()


def _run_watch(args: argparse.Namespace) -> int:
    from agentmend.infrastructure.changes.protocol.team_registry import team_id
    from agentmend.infrastructure.detection.checker_seat import CheckerSeat
    from agentmend.infrastructure.errors import ConfigurationError
    from agentmend.infrastructure.principal import Principal
    from agentmend.loop.collaborators import default_detector
    from agentmend.loop.fleet_checker import FleetChecker

    if args.interval <= 0 or args.term <= args.interval:
        raise CommandError(
            f"--interval must be positive and shorter than --term "
            f"(got {args.interval} and {args.term})",
            EXIT_USAGE,
        )
    if args.max_checks is not None and args.max_checks < 1:
        raise CommandError(f"--max-checks must be at least 1, not {args.max_checks}", EXIT_USAGE)
    out = console()
    with open_workspace(args) as workspace, contextlib.ExitStack() as stack:
        settings, store = workspace.settings, workspace.store
        team = team_id(workspace.team_dir, store)
        try:
            policy = stack.enter_context(checker_policy(workspace, team, args.on_issue))
        except ConfigurationError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        principal = Principal.fleet_checker(team)
        seat = CheckerSeat(store, team, principal=principal.user_id, term_s=args.term)

        def report(issue: IssueReport) -> None:
            out.print(issue_line(issue))

        checker = FleetChecker(
            seat,
            workspace.monitor,
            lambda monitor: default_detector(settings, store, monitor),
            on_issue=report,
            policy=policy,
            interval_s=args.interval,
        )
        shown: list[bool] = []  # whether the last step judged, once there was one

        def say(step: CheckerStep) -> None:
            for note in step.notes:
                out.print(note.text)
            if not shown or shown[-1] != step.judging:
                shown.append(step.judging)
                h = step.holder
                out.print(
                    f"checking team {team}'s runs every {args.interval:g} s (on an issue: "
                    f"{args.on_issue})"
                    if step.judging
                    else f"standing by: {h.host} pid {h.pid} checks team {team}"
                )
            sys.stdout.flush()

        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            checker.run(stop, max_steps=args.max_checks, on_step=say)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


def issue_line(issue: IssueReport) -> str:
    """One line for an issue the checker opened (escaped by the console that prints it)."""
    return (
        f"issue {issue.issue_id}: {issue.agent_name} {issue.error_type} "
        f"({issue.detector} {issue.statistic or 0:.2f}/{issue.threshold or 0:.2f}); "
        "see agentmend status"
    )


# -- agentmend issue: the checker's questions, answered ------------------------------------------


def _answerer() -> Any:
    """The person at the terminal, with the rights the settings give."""
    from agentmend.infrastructure.principal import Principal
    from agentmend.infrastructure.settings import load_settings

    user = getpass.getuser()
    return Principal(
        user_id=user,
        name=f"{user} (agentmend issue)",
        permissions=load_settings().default_principal.permissions,
    )


def _run_issue_list(args: argparse.Namespace) -> int:
    from agentmend.infrastructure.changes.cycle_requests import read_requests

    with open_workspace(args) as workspace:
        requests = read_requests(workspace.store)
    if args.json:
        print_json({"requests": [r.as_json() for r in requests]})
        return EXIT_OK
    out = console()
    if not requests:
        out.print("no questions from a fleet checker")
    now = time.time()
    for r in requests:
        answer = (f"{r.state} by {r.answered_by}" if r.answered_by else r.state) + (
            f", cycle {r.outcome}" if r.outcome else ""
        )
        out.print(
            f"issue {r.issue_id}: {r.agent} {r.kind}, asked by {r.asked_by} "
            f"{now - r.asked_at:.0f} s ago: {answer}"
        )
    return EXIT_OK


def _answer(args: argparse.Namespace, *, approve: bool) -> int:
    from agentmend.infrastructure.changes.cycle_requests import AlreadyAnswered, CycleRequests
    from agentmend.infrastructure.errors import AuditChainError, NotFound

    who = _answerer()
    with open_workspace(args) as workspace:
        try:
            request = CycleRequests(workspace.store).answer(
                args.issue_id, approve=approve, by=who, audit=workspace.manager.audit
            )
        except NotFound as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        except (AlreadyAnswered, AuditChainError) as exc:
            raise CommandError(str(exc), EXIT_PROBLEM) from exc
    if args.json:
        print_json({"request": request.as_json()})
        return EXIT_OK
    console().print(
        f"issue {request.issue_id}: a cycle for {request.agent} "
        + (
            "approved: the fleet checker runs it at its next check"
            if approve
            else "declined: the checker holds the issue"
        )
        + f" (audited as {who.user_id})"
    )
    return EXIT_OK


def _issue_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("issue_id", metavar="ID", help="the issue's id (agentmend issue list)")


SUBCOMMANDS = (
    Subcommand(
        path=("issue", "list"),
        help="the fleet checker's questions (--on-issue ask) and their answers",
        run=_run_issue_list,
        example="agentmend issue list --json",
        json_output=True,
    ),
    Subcommand(
        path=("issue", "approve"),
        help="let the fleet checker run a cycle for an issue it asked about (audited)",
        run=lambda args: _answer(args, approve=True),
        example="agentmend issue approve 3f2a9c1b7d0e",
        add_arguments=_issue_id,
        json_output=True,
    ),
    Subcommand(
        path=("issue", "decline"),
        help="tell the fleet checker to run no cycle for an issue (held; audited)",
        run=lambda args: _answer(args, approve=False),
        example="agentmend issue decline 3f2a9c1b7d0e",
        add_arguments=_issue_id,
        json_output=True,
    ),
    Subcommand(
        path=("watch",),
        help="the fleet checker: judge every run the team's fleet records, one checker at a time",
        run=_run_watch,
        example="agentmend watch --workspace .agentmend --store postgresql://agentmend@db/fleet",
        add_arguments=_arguments,
    ),
)
