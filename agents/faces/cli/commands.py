"""The ``agentmend`` subcommands whose logic lives in the other faces: session, demo, mcp,
history, rollback and audit verify. Each opens what it needs only when it runs."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    Subcommand,
    print_json,
    workspace_path,
)

if TYPE_CHECKING:
    from rich.console import Console

    from agentmend.faces.workspace import Workspace

__all__ = ["SUBCOMMANDS", "cassette_arguments", "console", "open_workspace"]


def console() -> Console:
    """A console for human output: colour only on a terminal (and never with ``NO_COLOR``)."""
    import sys

    from agentmend.faces.terminal import safe_console

    # stored names and texts are shown escaped, never obeyed (a name may hold "\x1b[2J")
    return safe_console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 120)


@contextlib.contextmanager
def open_workspace(args: argparse.Namespace) -> Iterator[Workspace]:
    """The existing workspace of ``args``; a missing or broken one ends the command with 3."""
    from agentmend.faces.workspace import Workspace
    from agentmend.infrastructure.errors import ConfigurationError

    settings = _settings(args)
    try:
        workspace = Workspace.open(workspace_path(args), settings=settings, create=False)
    except ConfigurationError as exc:
        raise CommandError(str(exc), EXIT_UNAVAILABLE) from exc
    with workspace:
        yield workspace


def _settings(args: argparse.Namespace | None = None) -> Any:
    """The settings: the workspace's ``settings.env`` under ``AGENTMEND_*``, with ``--store``,
    ``--record`` and ``--replay`` (when given) over both."""
    from agentmend.infrastructure.settings import (
        InvalidSetting,
        load_settings,
        workspace_settings,
    )

    try:
        overrides = workspace_settings(workspace_path(args)) if args is not None else {}
        store = getattr(args, "store", None)
        if store:
            overrides["store_url"] = store
        for name in ("record", "replay"):
            if getattr(args, name, None) is not None:
                overrides[name] = getattr(args, name)
        return load_settings(**overrides)
    except InvalidSetting as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc


def cassette_arguments(parser: argparse.ArgumentParser) -> None:
    """``--record`` and ``--replay``: run on the Messages API and keep a cassette, or replay one."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--record",
        type=Path,
        metavar="CASSETTE",
        help="run on the Messages API (needs ANTHROPIC_API_KEY) and store every exchange in "
        "this file (default: $AGENTMEND_RECORD)",
    )
    group.add_argument(
        "--replay",
        type=Path,
        metavar="CASSETTE",
        help="serve the exchanges recorded in this file: no key, no network "
        "(default: $AGENTMEND_REPLAY)",
    )


# -- session and demo ---------------------------------------------------------------------------


def _session_arguments(parser: argparse.ArgumentParser) -> None:
    from agentmend.faces.session.app import add_arguments

    add_arguments(parser, workspace=False)


def _run_session(args: argparse.Namespace) -> int:
    from agentmend.faces.session.app import run

    return run(args)


def _run_demo(args: argparse.Namespace) -> int:
    args.demo = True
    args.provider = None
    args.agents = None
    args.verbose = getattr(args, "verbose", False)
    return _run_session(args)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated team")


# -- mcp ----------------------------------------------------------------------------------------


def _mcp_arguments(parser: argparse.ArgumentParser) -> None:
    from agentmend.faces.mcp.options import add_server_arguments

    add_server_arguments(parser, workspace=False)


def _run_mcp(args: argparse.Namespace) -> int:
    from agentmend.faces.mcp.server import run

    return run(args)


# -- history ------------------------------------------------------------------------------------


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=_positive, default=30, help="at most this many changes (default 30)"
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def _run_history(args: argparse.Namespace) -> int:
    from agentmend.faces.session.views import history_table

    with open_workspace(args) as workspace:
        records = workspace.manager.get_history(limit=args.limit)
        if args.json:
            print_json({"changes": [r.model_dump(mode="json") for r in records]})
        elif records:
            console().print(history_table(records))
        else:
            console().print("no changes yet")
    return EXIT_OK


# -- rollback -----------------------------------------------------------------------------------


def _rollback_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("change", metavar="CHANGE", help="the change id (see `agentmend history`)")
    parser.add_argument(
        "--force", action="store_true", help="restore even if the files changed since"
    )
    parser.add_argument(
        "--cascade", action="store_true", help="also roll back later changes built on this one"
    )


def _run_rollback(args: argparse.Namespace) -> int:
    from agentmend.faces.workspace import build_runtimes
    from agentmend.infrastructure.errors import ChangeNotFound, RollbackConflict
    from agentmend.infrastructure.models import ChangeStatus

    with open_workspace(args) as workspace:
        if workspace.settings.default_principal.is_admin:
            # changes carry no team here: an administrator's claim is checked on every rollback
            from agentmend.infrastructure.principal import admin_uid_refusal

            refusal = admin_uid_refusal("rolling back as an administrator", workspace.path)
            if refusal is not None:
                raise CommandError(refusal, EXIT_USAGE)
        current = workspace.manager.get_change(args.change)
        if current is None:
            raise CommandError(f"unknown change id {args.change!r} (see `agentmend history`)")
        if current.status in (ChangeStatus.ROLLED_BACK, ChangeStatus.FAILED):
            raise CommandError(
                f"change {args.change} is already {current.status.value}: nothing to roll back",
                EXIT_PROBLEM,
            )
        # a rollback calls no model: the offline runtimes serve whatever the provider is
        team_runtime, roles_runtime = build_runtimes("offline")
        orchestrator = workspace.orchestrator(
            team_runtime=team_runtime, roles_runtime=roles_runtime
        )
        try:
            record = orchestrator.rollback(
                args.change,
                reason="rolled back with `agentmend rollback`",
                force=args.force,
                cascade=args.cascade,
            )
        except ChangeNotFound as exc:
            raise CommandError(f"unknown change id {args.change!r}") from exc
        except RollbackConflict as exc:
            raise CommandError(f"rollback refused: {exc}", EXIT_PROBLEM) from exc
    if record is None:  # pragma: no cover - guarded above; kept for a clear message
        raise CommandError(f"change {args.change} has nothing to roll back", EXIT_PROBLEM)
    if args.json:
        print_json({"change": record.model_dump(mode="json")})
    else:
        console().print(f"rolled back {record.change_id}: files restored byte for byte")
    return EXIT_OK if record.status is ChangeStatus.ROLLED_BACK else EXIT_PROBLEM


# -- audit verify -------------------------------------------------------------------------------


def _run_audit_verify(args: argparse.Namespace) -> int:
    with open_workspace(args) as workspace:
        check = workspace.manager.verify_audit_chain()
    problems = [{"row_id": p.row_id, "kind": p.kind, "detail": p.detail} for p in check.problems]
    if args.json:
        print_json(
            {
                "verified": check.ok,
                "rows_checked": check.rows_checked,
                "problems": problems,
                "notes": list(check.notes),
                "repaired": check.repaired,
            }
        )
    else:
        out = console()
        for note in check.notes:
            out.print(f"note: {note}")
        if check.ok:
            out.print(f"audit chain verified ({check.rows_checked} rows)", style="green")
        else:
            for p in problems:
                where = f"row {p['row_id']}: " if p["row_id"] is not None else ""
                out.print(f"{where}{p['kind']}: {p['detail']}", style="red")
            out.print("audit chain does NOT verify", style="bold red")
    return EXIT_OK if check.ok else EXIT_PROBLEM


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        path=("session",),
        help="the interactive session: ask the team, watch it degrade, heal and prove it",
        example="agentmend session --workspace ./ws --provider offline",
        add_arguments=_session_arguments,
        run=_run_session,
    ),
    Subcommand(
        path=("demo",),
        help="a scripted scenario on the simulated team: a fault, a cycle, a kept fix",
        example="agentmend demo --workspace /tmp/demo",
        add_arguments=_demo_arguments,
        run=_run_demo,
    ),
    Subcommand(
        path=("mcp",),
        help="the MCP server over stdio (as agentmend-mcp)",
        example="agentmend mcp --workspace ./ws --root .",
        add_arguments=_mcp_arguments,
        run=_run_mcp,
    ),
    Subcommand(
        path=("history",),
        help="the changes made to the agents, newest last",
        example="agentmend history --workspace ./ws --json",
        add_arguments=_history_arguments,
        run=_run_history,
        json_output=True,
    ),
    Subcommand(
        path=("rollback",),
        help="undo a change and its group, restoring the files byte for byte",
        example="agentmend rollback 3f2a9c1e --workspace ./ws",
        add_arguments=_rollback_arguments,
        run=_run_rollback,
        json_output=True,
    ),
    Subcommand(
        path=("audit", "verify"),
        help="check the audit trail's hash chain (exit 1 if it does not verify)",
        example="agentmend audit verify --workspace ./ws --json",
        run=_run_audit_verify,
        json_output=True,
    ),
)
