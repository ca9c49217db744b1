"""``agentmend store copy FROM TO``: move a workspace's whole history between stores."""

from __future__ import annotations

import argparse

from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNAVAILABLE,
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


SUBCOMMANDS = (
    Subcommand(
        path=("store", "copy"),
        help="copy a store's whole history into an empty store (SQLite <-> PostgreSQL)",
        run=_run,
        example="agentmend store copy .agentmend/agentmend.db postgresql://agentmend@db/agentmend",
        add_arguments=_arguments,
        json_output=True,
    ),
)
