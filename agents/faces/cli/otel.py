"""``agentmend otel receive``: the OTLP/HTTP receiver as a program.

The server itself (``agentmend.infrastructure.telemetry.receiver``) reads no flag and no
environment: this face chooses the store (``--store``, else ``AGENTMEND_STORE_URL``, else the
workspace's file), the token (``--token``, else ``AGENTMEND_OTLP_TOKEN``) and the team whose
releases labelled runs are attributed to, then serves until interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agentmend.faces.cli.common import Subcommand
from agentmend.infrastructure.errors import AgentmendError, ConfigurationError
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.otlp_decode import require_proto
from agentmend.infrastructure.telemetry.receiver import TRACES_PATH, OtlpReceiver

__all__ = ["SUBCOMMANDS", "add_arguments", "main", "run"]

log = get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The receiver's flags (``--workspace`` is the command's own)."""
    parser.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=4318, help="port (default 4318)")
    parser.add_argument(
        "--store", metavar="URL", help="the store to record into (instead of the workspace's)"
    )
    parser.add_argument(
        "--token", help="require this bearer token (default: $AGENTMEND_OTLP_TOKEN, else none)"
    )
    parser.add_argument(
        "--team",
        metavar="TEAM_ID",
        help="attribute runs labelled agentmend.release to this team's releases (default: the "
        "workspace's team, when it has an id)",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=16 * 1024 * 1024, help="largest body accepted"
    )
    parser.add_argument(
        "--orphan-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="flush a trace whose agent span has not come after this long (default 60)",
    )


def _store_location(args: argparse.Namespace) -> tuple[str | Path, Path]:
    """(the store: ``--store``, else ``AGENTMEND_STORE_URL``, else the workspace's file; the
    workspace folder, where a PostgreSQL store's per-host files go)."""
    from agentmend.faces.workspace import DB_NAME

    folder = Path(args.workspace or os.environ.get("AGENTMEND_WORKSPACE") or ".agentmend")
    given = args.store or os.environ.get("AGENTMEND_STORE_URL")
    if given:
        text = str(given)
        if "://" in text and not text.startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ConfigurationError(
                f"--store {text!r}: use a SQLite path, sqlite://PATH or postgresql://..."
            )
        return text, folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder / DB_NAME, folder


def _release_attribution(
    args: argparse.Namespace, store: Any, folder: Path
) -> Callable[[object, object], Any] | None:
    """Resolves release labels for ``--team``, else the workspace's team (None: no team)."""
    from agentmend.faces.release_serving import existing_team_id
    from agentmend.faces.workspace import TEAM_DIR_NAME
    from agentmend.infrastructure.releases.attribution import ReleaseAttribution
    from agentmend.infrastructure.releases.log import ReleaseLog

    team = getattr(args, "team", None) or existing_team_id(folder / TEAM_DIR_NAME)
    if team is None:
        return None
    return ReleaseAttribution(ReleaseLog(store, team)).tags


def run(args: argparse.Namespace, *, ready: Callable[[OtlpReceiver], None] | None = None) -> int:
    """Serve until interrupted; the exit code (2 bad arguments, 3 store unavailable)."""
    from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
    from agentmend.infrastructure.store.api import Store
    from agentmend.infrastructure.structured_logger import configure_logging

    configure_logging("INFO")
    try:
        require_proto()
        location, folder = _store_location(args)
    except ConfigurationError as exc:
        sys.stderr.write(f"agentmend: {exc}\n")
        return 2
    except OSError as exc:  # the workspace path is a file, or cannot be made
        sys.stderr.write(f"agentmend: cannot use the workspace: {exc}\n")
        return 3
    try:
        store = Store(location, files_dir=folder)
    except AgentmendError as exc:
        sys.stderr.write(f"agentmend: {exc}\n")
        return 3
    monitor = PerformanceMonitor(store)
    token = args.token or os.environ.get("AGENTMEND_OTLP_TOKEN") or None
    try:
        attribute = _release_attribution(args, store, folder)
    except AgentmendError as exc:
        sys.stderr.write(f"agentmend: {exc}\n")
        monitor.close()
        store.close()
        return 2
    try:
        receiver = OtlpReceiver(
            TraceAssembler(
                monitor.record, orphan_timeout_s=args.orphan_timeout, attribute=attribute
            ),
            host=args.host,
            port=args.port,
            token=token,
            max_body_bytes=args.max_body_bytes,
        )
    except OSError as exc:
        sys.stderr.write(f"agentmend: cannot listen on {args.host}:{args.port}: {exc}\n")
        monitor.close()
        store.close()
        return 3
    from agentmend.infrastructure.telemetry.receiver_counts import (
        receiver_name,
        write_receiver_counts,
    )

    name, started = receiver_name(*receiver.address), time.time()
    receiver.publish = lambda counts: write_receiver_counts(store, name, started, counts)
    receiver.publish_counts()  # the row from the start: status shows a receiver at zero
    sys.stderr.write(f"agentmend: receiving OTLP traces at {receiver.endpoint}{TRACES_PATH}\n")
    sys.stderr.flush()
    if ready is not None:
        ready(receiver)
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.close()
        counts = receiver.assembler.counts()
        monitor.close()
        store.close()
        log.info("otlp_receiver_stopped", **asdict(counts))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m agentmend.otel_receiver``: the receiver without the rest of the command."""
    parser = argparse.ArgumentParser(
        prog="python -m agentmend.otel_receiver", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workspace", metavar="DIR", help="workspace folder")
    add_arguments(parser)
    args = parser.parse_args(argv)
    import signal

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    return run(args)


SUBCOMMANDS = (
    Subcommand(
        path=("otel", "receive"),
        help="take agent runs from OpenTelemetry traces (OTLP/HTTP on /v1/traces)",
        run=run,
        example="agentmend otel receive --port 4318 --workspace .agentmend",
        add_arguments=add_arguments,
    ),
)
