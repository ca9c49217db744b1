"""``agentmend store``: the store's size by kind of record, and pruning by the retention policy.

The policy is the ``AGENTMEND_RETENTION_*`` settings, which the flags override for one run;
pruning never removes what the loop still needs (see
:mod:`agentmend.infrastructure.store.retention`).
"""

from __future__ import annotations

import argparse
from typing import Any

from agentmend.faces.cli.commands import console, open_workspace
from agentmend.faces.cli.common import EXIT_OK, EXIT_USAGE, CommandError, Subcommand, print_json

__all__ = ["SUBCOMMANDS"]


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prune",
        action="store_true",
        help="delete what the retention policy lets go, then show the sizes",
    )
    parser.add_argument(
        "--run-days", type=float, help="prune runs older than this (AGENTMEND_RETENTION_RUN_DAYS)"
    )
    parser.add_argument(
        "--runs-per-agent",
        type=int,
        help="prune runs beyond the newest this many per agent"
        " (AGENTMEND_RETENTION_RUNS_PER_AGENT)",
    )
    parser.add_argument(
        "--decision-days",
        type=float,
        help="prune decisions older than this (AGENTMEND_RETENTION_DECISION_DAYS)",
    )


def _policy(args: argparse.Namespace, settings: Any) -> Any:
    from agentmend.infrastructure.errors import ConfigurationError
    from agentmend.infrastructure.store.retention import RetentionPolicy

    base = RetentionPolicy.of(settings)
    try:
        return RetentionPolicy(
            run_days=base.run_days if args.run_days is None else args.run_days,
            runs_per_agent=(
                base.runs_per_agent if args.runs_per_agent is None else args.runs_per_agent
            ),
            decision_days=base.decision_days if args.decision_days is None else args.decision_days,
            baseline_n=base.baseline_n,
        )
    except ConfigurationError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc


def _run_store(args: argparse.Namespace) -> int:
    from agentmend.infrastructure.store.retention import prune
    from agentmend.infrastructure.store.usage import store_usage

    with open_workspace(args) as workspace:
        policy = _policy(args, workspace.settings)
        if args.prune and not policy.enabled:
            raise CommandError(
                "no retention policy: set AGENTMEND_RETENTION_RUN_DAYS, "
                "AGENTMEND_RETENTION_RUNS_PER_AGENT or AGENTMEND_RETENTION_DECISION_DAYS "
                "(or pass --run-days, --runs-per-agent, --decision-days)",
                EXIT_USAGE,
            )
        workspace.monitor.flush()  # what is recorded is in the store before it is measured
        result = prune(workspace.store, policy) if args.prune else None
        usage = store_usage(workspace.store)
    if args.json:
        data: dict[str, Any] = {
            "path": workspace.store.display,  # the file, or the server and database
            "file_bytes": usage.file_bytes,
            "wal_bytes": usage.wal_bytes,
            "kinds": {k.kind: {"rows": k.rows, "bytes": k.bytes} for k in usage.kinds},
        }
        if result is not None:
            data["pruned"] = {"runs": result.runs_deleted, "decisions": result.decisions_deleted}
        print_json(data)
        return EXIT_OK
    out = console()
    if result is not None:
        out.print(f"pruned {result.runs_deleted} runs and {result.decisions_deleted} decisions")
    wal = "" if usage.wal_bytes is None else f" (+ {_size(usage.wal_bytes)} WAL)"
    out.print(f"{workspace.store.display}: {_size(usage.file_bytes)}{wal}")
    for kind in usage.kinds:
        size = "size unknown" if kind.bytes is None else _size(kind.bytes)
        out.print(f"  {kind.kind:<10} {kind.rows:>12,} rows  {size:>10}")
    return EXIT_OK


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        path=("store",),
        help="show the store's size by kind of record; --prune applies the retention policy",
        example="agentmend store --prune --run-days 30 --workspace ./ws",
        add_arguments=_store_arguments,
        run=_run_store,
        json_output=True,
    ),
)
