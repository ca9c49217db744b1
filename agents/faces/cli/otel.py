"""``agentmend otel receive``: the OTLP/HTTP receiver as a program.

The server itself (``agentmend.infrastructure.telemetry.receiver``) reads no flag and no
environment: this face chooses the store (``--store``, else ``AGENTMEND_STORE_URL``, else the
store the workspace records, else its file), the token (``--token``, else
``AGENTMEND_OTLP_TOKEN``, else the workspace's ``otlp-token``, generated on first use: readable
by its owner only, printed once), the ``Host`` names it answers besides its own
(``--allow-host``, ``AGENTMEND_OTLP_ALLOWED_HOSTS``) and the team whose releases labelled runs
are attributed to, then serves until interrupted or terminated: SIGTERM, like Ctrl-C, stops
taking requests and stores every run already answered.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmend.faces.cli.common import Subcommand
from agentmend.faces.cli.watch import add_policy_argument
from agentmend.infrastructure.errors import AgentmendError, ConfigurationError
from agentmend.infrastructure.local_http import is_loopback
from agentmend.infrastructure.redaction import redact, redact_url
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from agentmend.infrastructure.telemetry.receiver import OtlpReceiver

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
        "--token",
        help="the bearer token exporters send (default: $AGENTMEND_OTLP_TOKEN, else the "
        "workspace's otlp-token, generated on first use); required off loopback",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="answer this Host name too (a load balancer's; repeatable; default "
        "$AGENTMEND_OTLP_ALLOWED_HOSTS, comma-separated); loopback names and the bound address "
        "are always answered",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, how long to finish the requests being answered (default 10)",
    )
    parser.add_argument(
        "--team",
        metavar="TEAM_ID",
        help="attribute runs labelled agentmend.release to this team's releases (default: the "
        "workspace's team, when it has an id)",
    )
    parser.add_argument(
        "--name",
        metavar="NAME",
        help="this receiver's name, written into every run it attributes to a release "
        "(default $AGENTMEND_RECEIVER_NAME, else otel@<host name>); its runs count in a "
        "rollout only where NAME is in $AGENTMEND_TRUSTED_RECEIVERS",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="also judge the store's runs as the team's fleet checker (see agentmend watch); "
        "the team is --team, else the workspace's team folder",
    )
    add_policy_argument(parser)
    parser.add_argument(
        "--check-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --check, seconds between checks (default 5)",
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
    parser.add_argument(
        "--session-quiet",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="record a Claude Code session's runs (from /v1/logs events) once it has sent "
        "nothing for this long (default 120)",
    )


def _store_location(args: argparse.Namespace) -> tuple[str | Path, Path]:
    """(the store: ``--store``, else ``AGENTMEND_STORE_URL``, else the one the workspace
    records, else its file; the workspace folder, where a PostgreSQL store's per-host files go).

    Raises:
        ConfigurationError: an unsupported URL, or one that is not the workspace's recorded
            store (``StoreMismatch``).
    """
    from agentmend.faces.store_record import store_for

    folder = Path(args.workspace or os.environ.get("AGENTMEND_WORKSPACE") or ".agentmend")
    given = args.store or os.environ.get("AGENTMEND_STORE_URL")
    if given:
        text = str(given)
        if "://" in text and not text.startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ConfigurationError(
                f"--store {redact_url(text)!r}: use a SQLite path, sqlite://PATH or "
                "postgresql://..."
            )
    try:
        location = store_for(folder, given or None)
    except ConfigurationError as exc:
        raise ConfigurationError(f"workspace {folder} cannot be opened: {exc}") from exc
    if isinstance(location, Path):
        folder.mkdir(parents=True, exist_ok=True)
    return location, folder


def _record_first_store(folder: Path, location: str | Path) -> None:
    """Record ``location`` in ``folder`` when it was given and the workspace records none."""
    from agentmend.faces.store_record import needs_record, record_store

    given = str(location) if not isinstance(location, Path) else None
    if needs_record(folder, given):
        folder.mkdir(parents=True, exist_ok=True)
        record_store(folder, location)


TOKEN_FILE = "otlp-token"


def _given_token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``AGENTMEND_OTLP_TOKEN`` (empty is none); None: the workspace's.

    Raises:
        ConfigurationError: no token given for an address other than loopback.
    """
    given = (args.token or os.environ.get("AGENTMEND_OTLP_TOKEN") or "").strip()
    if not given and not is_loopback(args.host):
        raise ConfigurationError(
            f"--host {args.host} is not a loopback address: give the token exporters must "
            "send (--token or AGENTMEND_OTLP_TOKEN)"
        )
    return given or None


def _workspace_token(folder: Path) -> tuple[str, str]:
    """The workspace's token, made on first use readable by its owner only; and what to say
    (the token itself only when it was just made).

    Raises:
        ConfigurationError: the token file can be read by others, or is empty.
        OSError: the token file cannot be made or read.
    """
    path = folder / TOKEN_FILE
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            raise ConfigurationError(
                f"{path} can be read by others: chmod 600 it, or remove it for a new token"
            ) from None
        token = path.read_text(encoding="utf-8").strip()
        if not token:
            raise ConfigurationError(f"{path} is empty: remove it for a new token") from None
        return token, f"exporters send the token in {path}"
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    return token, (
        f"a token was made for this receiver and kept in {path} (readable by you only); "
        f"exporters send it: OTEL_EXPORTER_OTLP_HEADERS='Authorization=Bearer {token}'"
    )


def _allowed_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    given = list(args.allow_host) or os.environ.get("AGENTMEND_OTLP_ALLOWED_HOSTS", "").split(",")
    return tuple(name.strip() for name in given if name.strip())


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
    return ReleaseAttribution(ReleaseLog(store, team), source=_receiver_name(args)).tags


def _receiver_name(args: argparse.Namespace) -> str:
    """The name this receiver writes into the runs it attributes (never one a client sends)."""
    import socket

    given = getattr(args, "name", None) or os.environ.get("AGENTMEND_RECEIVER_NAME", "")
    return given.strip() or f"otel@{socket.gethostname()}"


def run(args: argparse.Namespace, *, ready: Callable[[OtlpReceiver], None] | None = None) -> int:
    """Serve until interrupted; the exit code (2 bad arguments, 3 store unavailable)."""
    # imported here, not with the command table: every other command starts without them
    from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
    from agentmend.infrastructure.store.api import Store
    from agentmend.infrastructure.structured_logger import configure_logging
    from agentmend.infrastructure.telemetry.assembly import TraceAssembler
    from agentmend.infrastructure.telemetry.claude_code_events import LogAssembler
    from agentmend.infrastructure.telemetry.otlp_decode import require_proto
    from agentmend.infrastructure.telemetry.receiver import (
        LOGS_PATH,
        METRICS_PATH,
        TRACES_PATH,
        OtlpReceiver,
    )

    configure_logging("INFO")
    try:
        require_proto()
        given_token = _given_token(args)  # refused before anything is made
        location, folder = _store_location(args)
    except ConfigurationError as exc:
        sys.stderr.write(f"agentmend: {redact(str(exc))}\n")
        return 2
    except OSError as exc:  # the workspace path is a file, or cannot be made
        sys.stderr.write(f"agentmend: cannot use the workspace: {exc}\n")
        return 3
    try:
        store = Store(location, files_dir=folder)
    except AgentmendError as exc:
        sys.stderr.write(f"agentmend: {redact(str(exc))}\n")
        return 3
    try:  # the first open given a store records it, as the workspace's other faces do
        _record_first_store(folder, location)
    except (AgentmendError, OSError) as exc:
        sys.stderr.write(f"agentmend: cannot record the store in {folder}: {redact(str(exc))}\n")
        store.close()
        return 3
    monitor = PerformanceMonitor(store)
    try:
        attribute = _release_attribution(args, store, folder)
        token, note = (given_token, "") if given_token else _workspace_token(folder)
    except OSError as exc:  # the token file cannot be made or read
        sys.stderr.write(f"agentmend: cannot keep the receiver's token: {exc}\n")
        monitor.close()
        store.close()
        return 3
    except AgentmendError as exc:
        sys.stderr.write(f"agentmend: {redact(str(exc))}\n")
        monitor.close()
        store.close()
        return 2
    try:
        receiver = OtlpReceiver(
            TraceAssembler(monitor, orphan_timeout_s=args.orphan_timeout, attribute=attribute),
            host=args.host,
            port=args.port,
            token=token,
            allowed_hosts=_allowed_hosts(args),
            drain_timeout_s=args.drain_timeout,
            max_body_bytes=args.max_body_bytes,
            logs=LogAssembler(monitor.record, attribute=attribute, quiet_s=args.session_quiet),
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

    try:
        checking = _fleet_checker(args, store, location, folder, monitor)
    except AgentmendError as exc:
        sys.stderr.write(f"agentmend: {redact(str(exc))}\n")
        receiver.close()
        monitor.close()
        store.close()
        return 2
    name, started = receiver_name(*receiver.address), time.time()
    receiver.publish = lambda counts: write_receiver_counts(
        store, name, started, counts, receiver.logs.counts()
    )
    try:
        with _terminate_as_interrupt():  # from before the address is told: a signal may follow
            receiver.publish_counts()  # the row from the start: status shows a receiver at zero
            sys.stderr.write(
                f"agentmend: receiving OTLP traces at {receiver.endpoint}{TRACES_PATH} "
                f"(logs at {LOGS_PATH}, metrics at {METRICS_PATH})\n"
            )
            if note:
                sys.stderr.write(f"agentmend: {note}\n")
            sys.stderr.flush()
            if ready is not None:
                ready(receiver)
            receiver.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.close()  # stops taking requests, waits for those being answered
        if checking is not None:
            checking.stop()
        counts = receiver.assembler.counts()
        log_counts = receiver.logs.counts()
        monitor.close()
        store.close()
        log.info("otlp_receiver_stopped", **asdict(counts), **asdict(log_counts))
    return 0


class _CheckerThread:
    """The fleet checker beside the receiver, on the receiver's monitor, in a thread; what it
    opened (its policy, the workspace its cycles run on) is closed when it stops."""

    def __init__(self, checker: Any, opened: contextlib.ExitStack) -> None:
        self._stop = threading.Event()
        self._opened = opened
        self._thread = threading.Thread(
            target=checker.run,
            args=(self._stop,),
            kwargs={"on_step": _say_notes},
            name="agentmend-fleet-checker",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._opened.close()


def _say_notes(step: Any) -> None:
    from agentmend.infrastructure.terminal_text import terminal_text

    for note in step.notes:
        sys.stderr.write(f"agentmend: {terminal_text(note.text)}\n")
    if step.notes:
        sys.stderr.flush()


def _fleet_checker(
    args: argparse.Namespace, store: Any, location: str | Path, folder: Path, monitor: Any
) -> _CheckerThread | None:
    """With ``--check``: the team's fleet checker, started (None without it).

    Raises:
        ConfigurationError: no team to check for, a bad interval, or a policy that cannot run
            (``ask`` and ``improve`` run cycles on the workspace's team, which must be the
            team checked; ``improve`` needs yolo mode and a published release).
    """
    if not args.check:
        if args.on_issue != "report":
            raise ConfigurationError(f"--on-issue {args.on_issue} needs --check")
        return None
    from agentmend.faces.cli.watch import checker_policy, issue_line
    from agentmend.faces.workspace import TEAM_DIR_NAME, Workspace
    from agentmend.infrastructure.changes.protocol.team_registry import team_id
    from agentmend.infrastructure.detection.checker_seat import CheckerSeat
    from agentmend.infrastructure.detection.team_baseline import settle_team_baseline
    from agentmend.infrastructure.principal import Principal
    from agentmend.infrastructure.settings import load_settings
    from agentmend.infrastructure.terminal_text import terminal_text
    from agentmend.loop.checker_policies import ReportPolicy
    from agentmend.loop.collaborators import default_detector
    from agentmend.loop.fleet_checker import FleetChecker

    team_dir = folder / TEAM_DIR_NAME
    team = args.team or (team_id(team_dir, store) if team_dir.is_dir() else None)
    if team is None:
        raise ConfigurationError(
            "--check needs the team whose runs it judges: --team TEAM_ID, or a workspace "
            "with a team"
        )
    if args.check_interval <= 0:
        raise ConfigurationError(f"--check-interval must be positive, not {args.check_interval}")
    settings = settle_team_baseline(store, load_settings())
    opened = contextlib.ExitStack()
    policy: Any = ReportPolicy()
    try:
        if args.on_issue != "report":
            workspace = opened.enter_context(
                Workspace.open(
                    folder,
                    settings=load_settings(store_url=str(location)),
                    create=False,
                )
            )
            mine = team_id(workspace.team_dir, workspace.store)
            if mine != team:
                raise ConfigurationError(
                    f"--on-issue {args.on_issue} runs cycles on the workspace's team "
                    f"({mine}), not on --team {team}"
                )
            policy = opened.enter_context(checker_policy(workspace, team, args.on_issue))
    except BaseException:
        opened.close()
        raise
    principal = Principal.fleet_checker(team)
    seat = CheckerSeat(
        store,
        team,
        principal=principal.user_id,
        term_s=max(15.0, 3 * args.check_interval),
    )

    def report(issue: Any) -> None:
        sys.stderr.write(f"agentmend: {terminal_text(issue_line(issue))}\n")
        sys.stderr.flush()

    checker = FleetChecker(
        seat,
        monitor,
        lambda bound: default_detector(settings, store, bound),
        on_issue=report,
        policy=policy,
        interval_s=args.check_interval,
    )
    sys.stderr.write(
        f"agentmend: checking team {team}'s runs every {args.check_interval:g} s "
        f"(on an issue: {args.on_issue})\n"
    )
    return _CheckerThread(checker, opened)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM stops serving as Ctrl-C does (then the runs answered are stored): the default
    ends the process at once, losing every run still in the monitor's buffer."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: whoever runs us there decides
        return

    def interrupt(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the stopping has a deadline
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """``python -m agentmend.otel_receiver``: the receiver without the rest of the command."""
    parser = argparse.ArgumentParser(
        prog="python -m agentmend.otel_receiver", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workspace", metavar="DIR", help="workspace folder")
    add_arguments(parser)
    return run(parser.parse_args(argv))


SUBCOMMANDS = (
    Subcommand(
        path=("otel", "receive"),
        help="take agent runs from OpenTelemetry traces (OTLP/HTTP on /v1/traces)",
        run=run,
        example="agentmend otel receive --port 4318 --workspace .agentmend",
        add_arguments=add_arguments,
    ),
)
