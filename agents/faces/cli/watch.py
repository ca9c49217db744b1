"""``agentmend watch``: the fleet checker as a program.

Runs reach the store from every worker, receiver and host; this command judges them all for the
workspace's team, one checker at a time (the others stand by and take over when it dies), and
reports each issue it opens. The checker itself lives in the loop
(:class:`agentmend.loop.fleet_checker.FleetChecker`); this face opens the workspace, picks the
policy and prints what happens.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING

from agentmend.faces.cli.commands import console, open_workspace
from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Subcommand,
)

if TYPE_CHECKING:
    from agentmend.infrastructure.models import IssueReport
    from agentmend.loop.fleet_checker import CheckerStep

__all__ = ["SUBCOMMANDS", "issue_line"]

POLICIES = ("report",)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--on-issue",
        choices=POLICIES,
        default="report",
        help="what to do with an issue: report opens it and says so (default)",
    )
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


def _run_watch(args: argparse.Namespace) -> int:
    from agentmend.infrastructure.changes.protocol.team_registry import team_id
    from agentmend.infrastructure.detection.checker_seat import CheckerSeat
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
    with open_workspace(args) as workspace:
        settings, store = workspace.settings, workspace.store
        team = team_id(workspace.team_dir, store)
        principal = settings.default_principal
        seat = CheckerSeat(store, team, principal=principal.user_id, term_s=args.term)

        def report(issue: IssueReport) -> None:
            out.print(issue_line(issue))

        checker = FleetChecker(
            seat,
            workspace.monitor,
            lambda monitor: default_detector(settings, store, monitor),
            on_issue=report,
            interval_s=args.interval,
        )
        shown: list[bool] = []  # whether the last step judged, once there was one

        def say(step: CheckerStep) -> None:
            if shown and shown[-1] == step.judging:
                return
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


SUBCOMMANDS = (
    Subcommand(
        path=("watch",),
        help="the fleet checker: judge every run the team's fleet records, one checker at a time",
        run=_run_watch,
        example="agentmend watch --workspace .agentmend --store postgresql://agentmend@db/fleet",
        add_arguments=_arguments,
    ),
)
