"""The store administrator's steps: ``agentmend store copy FROM TO`` moves a workspace's whole
history between stores; ``store grant URL`` gives a PostgreSQL store its roles and login roles
their membership; ``store migrate URL`` brings the schema up to this agentmend (see
:mod:`agentmend.infrastructure.store.roles`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    Subcommand,
)

__all__ = ["SUBCOMMANDS"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="FROM_URL", help="the store to copy (a path or URL)")
    parser.add_argument("target", metavar="TO_URL", help="an empty store to copy it into")


def _run(args: argparse.Namespace) -> int:
    from agentmend.faces.cli.commands import _settings, console
    from agentmend.faces.cli.common import print_json, workspace_path
    from agentmend.infrastructure.errors import AgentmendError
    from agentmend.infrastructure.store.api import Store
    from agentmend.infrastructure.store.copying import copy_store
    from agentmend.infrastructure.store.timeouts import StoreTimeouts

    settings = _settings()
    key = settings.audit_hmac_key
    folder = workspace_path(args)  # where a PostgreSQL store's per-host files (audit head) go
    # a whole-store copy runs long statements and transactions by design: only lock waits
    # stay bounded
    timeouts = StoreTimeouts.from_settings(settings).for_bulk_work()
    try:
        with (
            Store(args.source, files_dir=folder, timeouts=timeouts) as source,
            Store(args.target, files_dir=folder, timeouts=timeouts) as target,
        ):
            report = copy_store(
                source, target, hmac_key=key.get_secret_value() if key is not None else None
            )
    except AgentmendError as exc:
        raise CommandError(f"cannot copy the store: {exc}", EXIT_UNAVAILABLE) from exc
    chains = {"source": report.source_chain, "target": report.target_chain}
    if args.json:
        print_json(
            {
                "rows": report.rows,
                "verified": {side: bool(chain) for side, chain in chains.items()},
            }
        )
    else:
        out = console()
        out.print(f"copied {sum(report.rows.values())} rows ({len(report.rows)} tables)")
        for side, chain in chains.items():
            out.print(f"audit chain on the {side}: {'verified' if chain else 'DOES NOT VERIFY'}")
    return EXIT_OK if report.ok else EXIT_PROBLEM


def _grant_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the PostgreSQL store, as its owner")
    for kind, who in (
        ("worker", "records runs, reads releases"),
        ("controller", "also judges, applies, publishes canaries, settles on evidence"),
        ("admin", "also steers rollouts by hand, acknowledges, migrates"),
    ):
        parser.add_argument(
            f"--{kind}",
            action="append",
            default=[],
            metavar="LOGIN",
            help=f"make this existing login role a {kind} ({who}); repeatable",
        )


def _run_grant(args: argparse.Namespace) -> int:
    from agentmend.faces.cli.commands import console
    from agentmend.faces.cli.common import print_json
    from agentmend.infrastructure.errors import InvalidArgument
    from agentmend.infrastructure.store.roles import ROLES, grant_roles, members_of

    with _admin_store(args, "grant the store's roles") as store:
        try:
            report = grant_roles(
                store, workers=args.worker, controllers=args.controller, admins=args.admin
            )
        except InvalidArgument as exc:
            raise CommandError(f"cannot grant the store's roles: {exc}", EXIT_USAGE) from exc
        members = members_of(store)
    if args.json:
        print_json({"created": list(report.created), "tables": report.tables, "members": members})
        return EXIT_OK
    out = console()
    made = ", ".join(report.created) if report.created else "none (they existed)"
    out.print(f"roles made: {made}; {report.tables} tables granted", markup=False)
    for kind, role in ROLES.items():
        names = ", ".join(members[kind]) or "-"
        out.print(f"{role}: {names}", markup=False)
    return EXIT_OK


def _migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the store, as an administrator role")


def _run_migrate(args: argparse.Namespace) -> int:
    from agentmend.faces.cli.commands import console
    from agentmend.faces.cli.common import print_json
    from agentmend.infrastructure.store.roles import migrate_store

    with _admin_store(args, "migrate the store") as store:
        moved = migrate_store(store)
    if args.json:
        print_json({"migrated": [{"component": c, "from": a, "to": b} for c, a, b in moved]})
        return EXIT_OK
    out = console()
    if not moved:
        out.print("the store's schema is up to date")
    for component, before, after in moved:
        out.print(f"{component}: schema version {before} -> {after}", markup=False)
    return EXIT_OK


@contextmanager
def _admin_store(args: argparse.Namespace, what: str) -> Iterator[Any]:
    """The store at ``args.url``, an error in one line (password never in it) naming ``what``."""
    from agentmend.faces.cli.commands import _settings
    from agentmend.faces.cli.common import workspace_path
    from agentmend.infrastructure.errors import AgentmendError
    from agentmend.infrastructure.store.api import Store
    from agentmend.infrastructure.store.timeouts import StoreTimeouts

    timeouts = StoreTimeouts.from_settings(_settings()).for_bulk_work()
    try:
        with Store(args.url, files_dir=workspace_path(args), timeouts=timeouts) as store:
            yield store
    except CommandError:
        raise
    except AgentmendError as exc:
        raise CommandError(f"cannot {what}: {exc}", EXIT_UNAVAILABLE) from exc


SUBCOMMANDS = (
    Subcommand(
        path=("store", "copy"),
        help="copy a store's whole history into an empty store (SQLite <-> PostgreSQL)",
        run=_run,
        example="agentmend store copy .agentmend/agentmend.db postgresql://agentmend@db/agentmend",
        add_arguments=_arguments,
        json_output=True,
    ),
    Subcommand(
        path=("store", "grant"),
        help="give a PostgreSQL store its worker, controller and admin roles, and add logins",
        run=_run_grant,
        example="agentmend store grant postgresql://owner@db/agentmend --worker app"
        " --controller checker --admin ops",
        add_arguments=_grant_arguments,
        json_output=True,
    ),
    Subcommand(
        path=("store", "migrate"),
        help="bring the store's schema up to this agentmend (an administrator's step)",
        run=_run_migrate,
        example="agentmend store migrate postgresql://ops@db/agentmend",
        add_arguments=_migrate_arguments,
        json_output=True,
    ),
)
