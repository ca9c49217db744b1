"""``agentmend`` subcommands that only a person at a terminal runs: acknowledging a break in
the audit chain. The MCP server offers no tool for this, so an MCP client cannot drive it."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator

from agents.faces.cli import EXIT_OK, EXIT_USAGE, CommandError, Subcommand, print_json
from agents.faces.cli_commands import console, open_workspace

__all__ = ["SUBCOMMANDS"]


def _acknowledge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--note", help="why the break is acceptable (kept in the audit row)")


@contextlib.contextmanager
def _logs_to_stderr() -> Iterator[None]:
    """Warnings to stderr while the command runs (stdout carries the answer), then as before."""
    import logging
    import sys

    import structlog

    from infrastructure.structured_logger import configure_logging

    saved = structlog.get_config()
    configure_logging(logging.WARNING, stream=sys.stderr)
    try:
        yield
    finally:
        structlog.configure(**saved)


def _run_audit_acknowledge(args: argparse.Namespace) -> int:
    with _logs_to_stderr():
        return _acknowledge(args)


def _acknowledge(args: argparse.Namespace) -> int:
    from infrastructure.errors import PermissionRequired

    with open_workspace(args) as workspace:
        principal = workspace.settings.default_principal
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
            out.print("no unacknowledged break in the audit chain")
        else:
            rows = ", ".join(map(str, acknowledged))
            who = principal.user_id
            out.print(f"acknowledged the break(s) at row(s) {rows} as {who} (row {entry.id})")
        for p in check.problems:
            where = f"row {p.row_id}: " if p.row_id is not None else ""
            out.print(f"still reported: {where}{p.kind}: {p.detail}", style="red")
    return EXIT_OK


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        path=("audit", "acknowledge"),
        help="as an administrator, acknowledge the audit chain's breaks so applies resume",
        example="AGENTMEND_PRINCIPAL_ADMIN=true agentmend audit acknowledge --note 'restored db'",
        add_arguments=_acknowledge_arguments,
        run=_run_audit_acknowledge,
        json_output=True,
    ),
)
