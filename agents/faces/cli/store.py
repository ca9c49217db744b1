"""``agentmend store``: the store's size by kind of record, and pruning by the retention policy;
``agentmend store init URL``: the store every face of the workspace opens.

The policy is the ``AGENTMEND_RETENTION_*`` settings, which the flags override for one run;
pruning never removes what the loop still needs (see
:mod:`agentmend.infrastructure.store.retention`).

``store init`` records the URL without its password (:mod:`agentmend.faces.store_record`) after
opening the store exactly as the other faces will, without the password: a store they could not
open is refused there, naming where libpq looks for it. ``--new-audit-key`` makes the fleet's
audit HMAC key and prints it once; it is kept nowhere, since a key the workspace held could be
read by whoever can write the workspace, which is what the key guards against.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agentmend.faces.cli.commands import _settings, console, open_workspace
from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    Subcommand,
    print_json,
    workspace_path,
)

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


# -- store init ---------------------------------------------------------------------------------

_PASSWORD_SOURCES = (
    "PGPASSWORD, the password file (PGPASSFILE, default ~/.pgpass: a line "
    "host:port:database:user:password, chmod 600) or a service file (PGSERVICEFILE)"
)


def _init_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url",
        metavar="URL",
        help="the store: postgresql://user@host/db (its password is not kept: libpq finds it "
        "in PGPASSWORD, ~/.pgpass or a service file) or a SQLite file",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="record URL although the workspace records another store or keeps a history in "
        "its own agentmend.db (that history stays where it is: agentmend store copy moves it)",
    )
    parser.add_argument(
        "--new-audit-key",
        action="store_true",
        help="make the fleet's audit HMAC key and print it once (refused when "
        "AGENTMEND_AUDIT_HMAC_KEY is set or the store already holds audit rows)",
    )


def _run_init(args: argparse.Namespace) -> int:
    import secrets

    from agentmend.faces.store_record import (
        DB_NAME,
        recorded_store,
        same_store,
        without_password,
    )
    from agentmend.infrastructure.errors import AgentmendError
    from agentmend.infrastructure.redaction import redact_url

    folder = workspace_path(args)
    given = redact_url(args.url)
    if args.store and not same_store(args.store, args.url):
        raise CommandError(
            f"--store {redact_url(args.store)} and URL {given} name two stores: give one"
        )
    if folder.exists() and not folder.is_dir():
        raise CommandError(f"workspace {folder} cannot be used: it is a file, not a folder")
    try:
        url = without_password(args.url)
    except AgentmendError as exc:
        raise CommandError(f"cannot record {given}: {exc}") from exc
    try:
        previous = recorded_store(folder) if folder.is_dir() else None
    except AgentmendError as exc:
        if not args.force:
            raise CommandError(f"workspace {folder}: {exc}") from exc
        previous = None  # a record that cannot be read is replaced on purpose
    if not args.force:
        _refuse_another_store(folder, previous, args.url, DB_NAME)
    settings = _settings()
    key = settings.audit_hmac_key
    if args.new_audit_key and key is not None:
        raise CommandError(
            "AGENTMEND_AUDIT_HMAC_KEY is already set: that is the fleet's key, set it on every "
            "host (a new one would fail every audit row written under it)"
        )
    rows, keyed, display, backend = _open_as_every_face(url, folder, settings, args.url != url)
    if args.new_audit_key and rows:
        raise CommandError(
            f"the store {display} already holds {rows} audit rows written "
            + ("under a key: set that key" if keyed else "without a key: set none")
            + " as AGENTMEND_AUDIT_HMAC_KEY on every host (a new key would fail them all)"
        )
    new_key = secrets.token_hex(32) if args.new_audit_key else None
    _make_workspace(folder, url, settings)
    return _said_init(args, folder, url, display, backend, rows, keyed, key, new_key)


def _make_workspace(folder: Path, url: str, settings: Any) -> None:
    """Record ``url`` as ``folder``'s store and open the workspace once, as any face's first
    open does (the simulated team copied when it has none); a failure leaves the record, and a
    folder this made, as they were.

    Raises:
        CommandError: the record cannot be written or the workspace cannot be opened.
    """
    import shutil

    from agentmend.faces.store_record import RECORD_FILE, record_store
    from agentmend.faces.workspace import Workspace
    from agentmend.infrastructure.errors import AgentmendError
    from agentmend.infrastructure.files.atomic import atomic_write_or_delete

    made = not folder.exists()
    record = folder / RECORD_FILE
    previous = record.read_bytes() if record.is_file() else None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        record_store(folder, url)
        # opened from the record, as every later face will (an AGENTMEND_STORE_URL set here
        # for another store is not the workspace's)
        Workspace.open(folder, settings=settings.model_copy(update={"store_url": None})).close()
    except (AgentmendError, OSError) as exc:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        else:  # the record as it was, or none
            atomic_write_or_delete(record, previous)
        raise CommandError(f"cannot make workspace {folder}: {exc}", EXIT_UNAVAILABLE) from exc


def _refuse_another_store(folder: Any, previous: str | None, url: str, db_name: str) -> None:
    from agentmend.faces.store_record import same_store
    from agentmend.infrastructure.redaction import redact_url

    if previous is not None and not same_store(previous, url):
        raise CommandError(
            f"workspace {folder} records the store {redact_url(previous)}, not "
            f"{redact_url(url)}: pass --force to record the new one (the history stays in the "
            "old store: agentmend store copy moves it)"
        )
    own = folder / db_name
    if previous is None and own.is_file() and not same_store(own, url):
        raise CommandError(
            f"workspace {folder} keeps its history in {own}: copy it first (agentmend store "
            f"copy {own} URL), then run store init URL --force"
        )


def _open_as_every_face(
    url: str, folder: Any, settings: Any, password_given: bool
) -> tuple[int, bool, str, str]:
    """Open the store from ``url`` (no password in it) as every face will; (audit rows, whether
    they are keyed, the store as shown, its backend).

    Raises:
        CommandError: it cannot be opened (with where libpq looks for the password).
    """
    from agentmend.infrastructure.errors import AgentmendError
    from agentmend.infrastructure.redaction import redact
    from agentmend.infrastructure.store.api import Store
    from agentmend.infrastructure.store.sql import has_table
    from agentmend.infrastructure.store.timeouts import StoreTimeouts

    try:
        with Store(url, files_dir=folder, timeouts=StoreTimeouts.from_settings(settings)) as store:
            conn = store.connection()
            rows, keyed = 0, False
            if has_table(conn, "audit_log"):
                found = conn.execute("SELECT COUNT(*), MAX(keyed) FROM audit_log").fetchone()
                rows, keyed = int(found[0]), bool(found[1])
            return rows, keyed, store.display, store.backend
    except (AgentmendError, OSError) as exc:  # OSError: a SQLite file's folder cannot be made
        hint = ""
        if url.startswith(("postgresql://", "postgres://")) and "password" in str(exc).lower():
            hint = (
                "; the workspace keeps the URL without a password"
                + (" (the one given is not kept)" if password_given else "")
                + f", so libpq must find it in {_PASSWORD_SOURCES}"
            )
        raise CommandError(f"{redact(str(exc))}{hint}", EXIT_UNAVAILABLE) from exc


def _said_init(
    args: argparse.Namespace,
    folder: Any,
    url: str,
    display: str,
    backend: str,
    rows: int,
    keyed: bool,
    key: Any,
    new_key: str | None,
) -> int:
    from agentmend.faces.store_record import RECORD_FILE

    fleet_without_key = backend == "postgresql" and key is None and new_key is None
    if args.json:
        print_json(
            {
                "workspace": str(folder),
                "store": url,
                "record": str(folder / RECORD_FILE),
                "backend": backend,
                "audit_rows": rows,
                "audit_hmac_key": new_key,
            }
        )
        return EXIT_OK
    out = console()
    out.print(f"workspace {folder} uses the store {display} (recorded in {folder / RECORD_FILE})")
    if backend == "postgresql":
        out.print(
            "every face of the workspace opens it with no --store; the password is not "
            f"recorded: libpq finds it in {_PASSWORD_SOURCES}"
        )
    if new_key is not None:
        out.print(f"AGENTMEND_AUDIT_HMAC_KEY={new_key}")
        out.print(
            "the fleet's audit key, printed this once and kept nowhere: set it in the "
            "environment of every agentmend process on every host of this store (a secrets "
            "manager, the service's environment; not the workspace, not the database server) "
            "before the first change"
        )
    elif rows and keyed and key is None:
        out.print(
            "note: the store's audit rows are keyed: set the fleet's AGENTMEND_AUDIT_HMAC_KEY "
            "on this host too"
        )
    elif fleet_without_key:
        out.print(
            "note: no AGENTMEND_AUDIT_HMAC_KEY: only one host can append to the audit of a "
            "PostgreSQL store; for a fleet run this again with --new-audit-key before the "
            "first change"
        )
    return EXIT_OK


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        path=("store",),
        help="show the store's size by kind of record; --prune applies the retention policy",
        example="agentmend store --prune --run-days 30 --workspace ./ws",
        add_arguments=_store_arguments,
        run=_run_store,
        json_output=True,
    ),
    Subcommand(
        path=("store", "init"),
        help="record the store every face of the workspace opens (its URL without the "
        "password); --new-audit-key makes the fleet's audit key",
        example="agentmend store init postgresql://agentmend@db/agentmend --new-audit-key",
        add_arguments=_init_arguments,
        run=_run_init,
        json_output=True,
    ),
)
