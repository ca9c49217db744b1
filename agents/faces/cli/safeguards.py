"""``agentmend`` subcommands for what only a person may do: acknowledge a break in the audit
chain (an administrator) and approve a code plan's changes to its own tests (at a terminal).
The MCP server offers neither, so an MCP client cannot drive them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentmend.faces.cli.commands import console, open_workspace
from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    CommandError,
    Subcommand,
    print_json,
)

__all__ = ["SUBCOMMANDS"]


def _require_admin_uid(action: str, workspace: Any) -> None:
    """Refuse in one line unless this process's real uid is one of the team's administrators."""
    from agentmend.infrastructure.principal import admin_uid_refusal

    refusal = admin_uid_refusal(action, workspace.path)
    if refusal is not None:
        raise CommandError(refusal, EXIT_USAGE)


def _acknowledge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--note", help="why the break or altered rows are acceptable (kept in the audit row)"
    )


def _run_audit_acknowledge(args: argparse.Namespace) -> int:
    from agentmend.infrastructure.errors import PermissionRequired

    with open_workspace(args) as workspace:
        principal = workspace.settings.default_principal
        if principal.is_admin:
            _require_admin_uid("acknowledging audit breaks", workspace)
        try:
            entry = workspace.manager.acknowledge_audit_breaks(principal, note=args.note)
        except PermissionRequired as exc:
            raise CommandError(
                f"{exc} (set AGENTMEND_PRINCIPAL_ADMIN=true for an administrator)", EXIT_USAGE
            ) from exc
        check = workspace.manager.verify_audit_chain()
    acknowledged: list[int] = [] if entry is None else json.loads(entry.new_value or "[]")
    if args.json:
        print_json(
            {
                "acknowledged_rows": acknowledged,
                "row_id": entry.id if entry else None,
                "by": principal.user_id,
                "verified": check.ok,
                "problems": [
                    {"row_id": p.row_id, "kind": p.kind, "detail": p.detail} for p in check.problems
                ],
            }
        )
    else:
        out = console()
        if entry is None:
            out.print("nothing to acknowledge: no unacknowledged break or altered row")
        else:
            rows = ", ".join(map(str, acknowledged))
            who = principal.user_id
            out.print(f"acknowledged the problem(s) at row(s) {rows} as {who} (row {entry.id})")
        for p in check.problems:
            where = f"row {p.row_id}: " if p.row_id is not None else ""
            out.print(f"still reported: {where}{p.kind}: {p.detail}", style="red")
    return EXIT_OK


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        path=("audit", "acknowledge"),
        help="as an administrator, acknowledge the audit chain's breaks so applies resume",
        example="agentmend audit acknowledge --note 'restored from a backup' --workspace ./ws",
        add_arguments=_acknowledge_arguments,
        run=_run_audit_acknowledge,
        json_output=True,
    ),
)


# -- code approve-tests -------------------------------------------------------------------------


def _approve_tests_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="the plan id (plan-...)")
    parser.add_argument("--root", default=".", help="the project root of the plan (default: .)")


def _run_code_approve_tests(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from agentmend.infrastructure.code_update.plans import CodeUpdateError
    from agentmend.infrastructure.code_update.updater import CodeUpdater
    from agentmend.roles.code_review import CodeReviewer

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # An MCP client (or an agent with a shell) drives pipes, not a person's terminal.
        raise CommandError(
            "approving a plan's test changes needs a person at a terminal (stdin and stdout "
            "must be a terminal)",
            EXIT_USAGE,
        )
    with open_workspace(args) as workspace:
        _require_admin_uid("approving test changes", workspace)
        updater = CodeUpdater(
            Path(args.root),
            manager=workspace.manager,
            reviewer=CodeReviewer(None),
            settings=workspace.settings,
            protected=(workspace.path, workspace.team_dir),
        )
        try:
            plan = updater.get(args.plan)
        except CodeUpdateError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        out = console()
        out.print(f"plan {plan.plan_id}: {plan.description}")
        out.print(f"test files it changes: {', '.join(plan.test_files) or '(none)'}")
        out.print(plan.diff)
        answer = input(f"type the plan id to approve its test changes ({plan.plan_id}): ")
        if answer.strip() != plan.plan_id:
            raise CommandError("not approved (the plan id was not typed)", EXIT_PROBLEM)
        who = workspace.settings.default_principal
        try:
            updater.approve_test_changes(plan.plan_id, approved_by=f"terminal:{who.user_id}")
        except CodeUpdateError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
    out.print(f"test changes of {plan.plan_id} approved", style="green")
    return EXIT_OK


SUBCOMMANDS += (
    Subcommand(
        path=("code", "approve-tests"),
        help="approve, at a terminal, a code plan's changes to what configures or selects its "
        "tests (the MCP server cannot)",
        example="agentmend code approve-tests plan-1a2b3c4d5e6f --root . --workspace ./ws",
        add_arguments=_approve_tests_arguments,
        run=_run_code_approve_tests,
    ),
)
