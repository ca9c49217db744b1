"""``agentmend status``, ``show``, ``improve``, ``report`` and ``serve``: seeing the loop.

``status``, ``show``, ``report`` and ``serve`` only read: they open the workspace's store (not a
whole ``Workspace``, whose monitor would replay the history) and never create anything.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmend.faces.cli.commands import _settings, cassette_arguments, console, open_workspace
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
from agentmend.infrastructure.errors import AgentmendError
from agentmend.infrastructure.files.atomic import atomic_write

if TYPE_CHECKING:
    from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
    from agentmend.infrastructure.store.api import Store

__all__ = ["SUBCOMMANDS", "open_store"]


class _OpenStore:
    """The workspace's store and change manager, for reading; closed on exit."""

    def __init__(self, args: argparse.Namespace) -> None:
        from agentmend.faces.store_record import is_server_url, sqlite_path, store_for
        from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
        from agentmend.infrastructure.code_update.plan_recovery import settle_interrupted_plans
        from agentmend.infrastructure.detection.team_baseline import read_team_baseline
        from agentmend.infrastructure.errors import AgentmendError
        from agentmend.infrastructure.store.api import Store
        from agentmend.infrastructure.store.timeouts import StoreTimeouts

        folder = workspace_path(args)
        self.settings = _settings(args)
        if not folder.is_dir():
            raise CommandError(
                f"workspace {folder} cannot be opened: "
                + (
                    "it is a file, not a folder" if folder.exists() else "the folder does not exist"
                ),
                EXIT_UNAVAILABLE,
            )
        try:
            location = store_for(folder, self.settings.store_url)
            missing = not is_server_url(location) and not sqlite_path(location).is_file()
        except AgentmendError as exc:
            raise CommandError(
                f"workspace {folder} cannot be opened: {exc}", EXIT_UNAVAILABLE
            ) from exc
        if missing:
            # read-only: a store that is not there is named, never made empty
            where = "in it" if isinstance(location, Path) else f"at {location}"
            raise CommandError(
                f"workspace {folder} cannot be opened: no store ({Path(location).name}) {where}",
                EXIT_UNAVAILABLE,
            )
        try:
            self.store: Store = Store(
                location, files_dir=folder, timeouts=StoreTimeouts.from_settings(self.settings)
            )
        except AgentmendError as exc:
            raise CommandError(
                f"workspace {folder} cannot be opened: {exc}", EXIT_UNAVAILABLE
            ) from exc
        try:
            key = self.settings.audit_hmac_key
            self.manager: ImprovementManager = ImprovementManager(
                store=self.store,
                audit_hmac_key=key.get_secret_value() if key is not None else None,
            )
            # like every face's start: settle the code plans of executors that are gone
            settle_interrupted_plans(self.manager)
            team_baseline = read_team_baseline(self.store)
            if team_baseline is not None and "baseline_n" not in self.settings.model_fields_set:
                self.settings = self.settings.model_copy(update={"baseline_n": team_baseline})
        except AgentmendError as exc:
            self.store.close()  # a store behind the role's schema, a plan that failed to settle
            raise CommandError(
                f"workspace {folder} cannot be opened: {exc}", EXIT_UNAVAILABLE
            ) from exc
        self.folder = folder

    def __enter__(self) -> _OpenStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.manager.close()
        self.store.close()


def open_store(args: argparse.Namespace) -> _OpenStore:
    """The store of ``args``'s workspace; a missing one ends the command with exit code 3."""
    return _OpenStore(args)


# -- status -------------------------------------------------------------------------------------

_HEAD_WAIT_S = 1.0  # status waits this long for the audit head a writer appends under


def _status_json(statuses: list[Any], pending: int) -> dict[str, Any]:
    from agentmend.faces.report.data import RECENT_RUNS, STATUS_SCHEMA

    return {
        "schema": STATUS_SCHEMA,
        "recent_runs": RECENT_RUNS,
        "agents": [s.as_json() for s in statuses],
        "warming_up": [s.name for s in statuses if s.warming_up],
        "changes_awaiting_verification": pending,
    }


def _run_status(args: argparse.Namespace) -> int:
    from rich.table import Table

    from agentmend.faces.release_serving import check_worker_folders
    from agentmend.faces.report.data import agent_statuses
    from agentmend.infrastructure.changes.cycle_requests import read_requests
    from agentmend.infrastructure.detection.checker_seat import read_checkers
    from agentmend.infrastructure.models import ChangeStatus
    from agentmend.infrastructure.store.quarantine import quarantined_counts
    from agentmend.infrastructure.telemetry.receiver_counts import read_receiver_counts

    with open_store(args) as opened:
        statuses = agent_statuses(opened.store, baseline_n=opened.settings.baseline_n)
        # the statuses alone: the records (files, verdicts) are not needed to count them
        pending = sum(
            1 for s in opened.manager.changes.recent_statuses(200) if s is ChangeStatus.APPLIED
        )
        # a writer stopped while it appends holds the head: the rows are checked without it
        chain = opened.manager.verify_audit_chain(repair=False, head_wait_s=_HEAD_WAIT_S)
        receivers = read_receiver_counts(opened.store)
        checkers = read_checkers(opened.store)
        questions = read_requests(opened.store, states=("asked",))
        quarantined = quarantined_counts(opened.store)
        workers = check_worker_folders(opened.folder, opened.store)
    problems = [{"row_id": p.row_id, "kind": p.kind, "detail": p.detail} for p in chain.problems]
    if args.json:
        print_json(
            {
                **_status_json(statuses, pending),
                "audit": {
                    "ok": chain.ok,
                    "rows_checked": chain.rows_checked,
                    "problems": problems,
                    "head_unchecked": chain.head_unchecked,
                },
                "telemetry_receivers": [r.as_json() for r in receivers],
                "checkers": [c.as_json() for c in checkers],
                "checker_questions": [q.as_json() for q in questions],
                "quarantined_rows": quarantined,
                "workers": [
                    {"worker": w.worker, "release": w.version, "problem": w.problem}
                    for w in workers
                ],
            }
        )
        return EXIT_OK
    for component, count in quarantined.items():
        console().print(
            f"{count:,} {component} rows the store refused are set apart, with the reason, in"
            " table quarantined_rows",
            style="red",
            highlight=False,
        )
    for p in problems:  # a break stays on screen until an administrator acknowledges it
        where = f"row {p['row_id']}: " if p["row_id"] is not None else ""
        console().print(f"audit chain: {where}{p['kind']}: {p['detail']}", style="red")
    if chain.head_unchecked is not None:
        console().print(f"audit chain: {chain.head_unchecked}", style="yellow")
    for w in workers:  # a served release not as published: its worker replaces it
        if w.problem is not None:
            console().print(
                f"worker {w.worker}: release {w.version} on disk is not what was published: "
                f"{w.problem}",
                style="red",
                markup=False,
                highlight=False,
            )
    for r in receivers:
        c = r.counts
        console().print(
            f"OpenTelemetry receiver {r.receiver}: {c.spans_received:,} spans received, "
            f"{c.executions_recorded:,} runs recorded from them, {r.dropped:,} dropped "
            f"({c.unmappable:,} naming no agent, {c.orphans:,} orphaned "
            f"[{c.orphans_over_bound:,} over the buffer's bound], {c.rejected:,} "
            f"malformed, {c.dropped_queue_full:,} over the queue); as of "
            f"{r.updated_at:%Y-%m-%d %H:%M:%S} UTC",
            style="red" if r.dropped else None,
            highlight=False,
        )
        logs = r.logs
        if logs.log_records_received or logs.metric_points_received:
            lost = logs.log_unmappable + logs.log_rejected
            console().print(
                f"OpenTelemetry receiver {r.receiver}: {logs.log_records_received:,} log events "
                f"received, {logs.log_runs_recorded:,} runs recorded from them "
                f"({logs.log_runs_cut_short:,} before their session was quiet, "
                f"{logs.log_unmappable:,} naming no agent, {logs.log_rejected:,} malformed, "
                f"{logs.log_records_late:,} events late), {logs.open_log_runs:,} runs open; "
                f"{logs.metric_points_received:,} metric points received",
                style="red" if lost else None,
                highlight=False,
            )
    now = time.time()
    for ch in checkers:
        last = "no check yet"
        if ch.last_check is not None:
            last = f"checked {now - ch.last_check:.0f} s ago"
        console().print(
            f"fleet checker of team {ch.team_id}: {ch.principal} on {ch.host} pid {ch.pid}, "
            f"since {datetime.fromtimestamp(ch.since, UTC):%Y-%m-%d %H:%M:%S} UTC, {last}, "
            f"{ch.issues_opened} issues opened"
            + ("; silent past its term: a standby takes over" if ch.lapsed(now) else ""),
            style="red" if ch.lapsed(now) else None,
            highlight=False,
        )
    for q in questions:
        console().print(
            f"the fleet checker asks: a cycle for issue {q.issue_id} of {q.agent} ({q.kind})? "
            f"agentmend issue approve {q.issue_id} (or decline)",
            style="yellow",
            highlight=False,
        )
    if not statuses:
        console().print("no runs recorded yet")
        return EXIT_OK
    table = Table(title="Agents")
    for column in ("agent", "runs", "success", "recent", "p95 ms", "detector", "state", "issues"):
        table.add_column(column, justify="right" if column in ("runs", "p95 ms") else "left")
    for s in statuses:
        detector = "-"
        if s.detector:
            detector = ", ".join(
                f"{name} {v['statistic']:.2f}/{v['threshold']:.2f}"
                for name, v in s.detector.items()
                if isinstance(v, dict) and "statistic" in v
            )
        table.add_row(
            s.name,
            str(s.runs),
            f"{s.success_rate:.1%}",
            f"{s.recent_success_rate:.1%}",
            f"{s.p95_ms:.0f}",
            detector,
            f"warming up {s.baseline_runs}/{s.baseline_n}" if s.warming_up else "watched",
            str(len(s.open_issues)),
        )
    console().print(table)
    return EXIT_OK


# -- show ---------------------------------------------------------------------------------------


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("change", metavar="CHANGE", help="the change id (see `agentmend history`)")


def _run_show(args: argparse.Namespace) -> int:
    from agentmend.loop.cycle_history import cycle_of_change

    with open_store(args) as opened:
        record = opened.manager.get_change(args.change)
        if record is None:
            raise CommandError(f"unknown change id {args.change!r} (see `agentmend history`)")
        audit = opened.manager.audit.entries(change_id=args.change, limit=100)
        cycle = cycle_of_change(opened.store, args.change)
    outcome = None
    if cycle is not None:
        outcome = next(
            (
                o
                for o in cycle.outcomes
                if o.accepted and o.action.target_agent == record.action.target_agent
            ),
            None,
        )
    verdict = cycle.verifications.get(record.action.target_agent) if cycle else None
    if args.json:
        print_json(
            {
                "change": record.model_dump(mode="json"),
                "cycle_id": cycle.cycle_id if cycle else None,
                "diff": outcome.diff if outcome else None,
                "gates": [v.model_dump(mode="json") for v in outcome.verdicts] if outcome else [],
                "verification": verdict.model_dump(mode="json") if verdict else None,
                "audit": [
                    {
                        "id": e.id,
                        "timestamp": e.timestamp.isoformat(),
                        "edit_type": e.edit_type,
                        "user": e.user_name or e.user_id,
                        "db_role": e.db_role,
                        "old_value": e.old_value,
                        "new_value": e.new_value,
                    }
                    for e in audit
                ],
            }
        )
        return EXIT_OK
    out = console()
    action = record.action
    out.print(
        f"change {record.change_id}: {action.action_type.value}"
        + (f" {action.target_field}" if action.target_field else "")
        + f" on {action.target_agent}, {record.status.value}"
    )
    out.print(f"rationale: {action.rationale}")
    if outcome is not None:
        for v in outcome.verdicts:
            out.print(f"gate {v.gate}: {'passed' if v.passed else 'refused'}: {v.reason}")
        if outcome.diff:
            out.print(outcome.diff.rstrip(), markup=False, highlight=False)
    if verdict is not None:
        before = "-" if verdict.before_score is None else f"{verdict.before_score:.2f}"
        out.print(f"verification: score {before} -> {verdict.after_score:.2f}: {verdict.reason}")
        for case in verdict.cases:
            out.print(
                f"  {case.case_id}: {case.before_passes}/{case.before_runs} -> "
                f"{case.after_passes}/{case.after_runs} ({case.change})"
            )
    for e in audit:
        out.print(
            f"audit #{e.id} {e.timestamp:%Y-%m-%d %H:%M:%S} {e.edit_type} by "
            f"{e.user_name or e.user_id}" + (f" (store role {e.db_role})" if e.db_role else ""),
            markup=False,
        )
    return EXIT_OK


# -- improve ------------------------------------------------------------------------------------


def _improve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "agent", metavar="AGENT", nargs="?", help="the agent (default: the most urgent issue)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated team")
    cassette_arguments(parser)


def _run_improve(args: argparse.Namespace) -> int:
    from agentmend.faces.cli.improve_progress import ImproveProgress
    from agentmend.faces.session.views import cycle_summary_line
    from agentmend.infrastructure.errors import AgentmendError
    from agentmend.infrastructure.llm.cassette import CassetteError, CassetteMiss
    from agentmend.roles.team import UnknownAgent

    out = console()
    progress = ImproveProgress(out, live=sys.stdout.isatty())
    with open_workspace(args) as workspace:
        try:
            orchestrator = workspace.orchestrator(seed=args.seed, on_progress=progress.on_event)
        except AgentmendError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from exc
        orchestrator.verifier.on_eval_run = progress.on_eval_run

        async def one_cycle() -> Any:
            try:
                if args.agent:
                    orchestrator.team.spec(args.agent)  # UnknownAgent names the agents there are
                    issue = await orchestrator.issue_for(
                        args.agent, requested_by="agentmend improve"
                    )
                    return await orchestrator.run_improvement_cycle(issue)
                urgent = orchestrator.next_issue()
                if urgent is None:
                    return None
                return await orchestrator.run_improvement_cycle(urgent)
            finally:  # on this loop: a runtime's HTTP client is closed before the loop ends
                await workspace.aclose()

        with progress:
            try:
                result = asyncio.run(one_cycle())
            except (UnknownAgent, CassetteMiss, CassetteError) as exc:
                raise CommandError(str(exc), EXIT_USAGE) from exc
    if result is None:
        out.print("no open issue; name an agent: agentmend improve AGENT")
        return EXIT_OK
    out.print(cycle_summary_line(result))
    return improve_exit_code(result)


_NOTHING_LEFT_OPEN = frozenset(
    {
        "kept",  # a change was kept (as stable, or published as a canary)
        "watching",  # applied and being judged on live runs: nothing is wrong yet
        "not_reproduced",  # the agent passes its suite: nothing needed
        "watch_open",  # a change to this agent is already being judged
        "claimed_elsewhere",  # another process runs the cycle for this issue
    }
)


def improve_exit_code(result: Any) -> int:
    """``agentmend improve``'s one rule: 0 when nothing is left open, 1 when an issue is.

    A requested analysis (no detector issue behind it) that found nothing to change leaves
    nothing open either: a healthy agent is not a failure.
    """
    if result.status in _NOTHING_LEFT_OPEN:
        return EXIT_OK
    if result.status == "no_action" and result.issue.issue_id is None:
        return EXIT_OK
    return EXIT_PROBLEM


# -- report and serve ---------------------------------------------------------------------------


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("agentmend-report.html"),
        metavar="FILE",
        help="where to write the page (default agentmend-report.html)",
    )
    parser.add_argument("--open", action="store_true", help="open it in the default browser")
    parser.add_argument(
        "--cycles", type=int, default=50, metavar="N", help="latest cycles shown in full"
    )


def render_workspace_report(opened: _OpenStore, *, full_cycles: int = 50) -> str:
    """The report page of an open workspace, as HTML."""
    from agentmend.faces.report.data import collect_report
    from agentmend.faces.report.page import render_report
    from agentmend.infrastructure.monitoring.run_series import RAW_RUNS

    data = collect_report(
        opened.store,
        opened.manager,
        baseline_n=opened.settings.baseline_n,
        full_cycles=full_cycles,
    )
    if sum(a.runs for a in data.agents) > RAW_RUNS:
        data.notes.append(
            "Latency over time is read from per-minute histograms (within 19 % of the exact p95)."
        )
    return render_report(data, title=f"agentmend: {opened.folder}")


def _run_report(args: argparse.Namespace) -> int:
    if args.cycles < 0:
        raise CommandError("--cycles must be 0 or more")
    if args.output.is_dir():
        raise CommandError(f"{args.output} is a folder: give a file name with -o")
    with open_store(args) as opened:
        page = render_workspace_report(opened, full_cycles=args.cycles)
    try:
        atomic_write(args.output, page)
    except AgentmendError as exc:  # FileOperationError names the file and the cause
        raise CommandError(str(exc)) from exc
    out = console()
    out.print(f"wrote {args.output} ({len(page.encode()) / 1024:.0f} KiB)")
    if args.open:
        import webbrowser

        uri = args.output.resolve().as_uri()
        try:
            shown = webbrowser.open(uri)
        except webbrowser.Error:
            shown = False
        if not shown:  # no browser here (a server, a container): say so, and where it is
            out.print(f"no browser could be opened here; open {uri} yourself", soft_wrap=True)
    return EXIT_OK


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0 picks one)"
    )


def _store_version(opened: _OpenStore) -> tuple[object, ...]:
    """What the page depends on: commits to the database by any other connection (SQLite's
    ``data_version``), and the audit head file, which the chain check reads."""
    from agentmend.infrastructure.store.sql import data_version

    data = data_version(opened.store.connection())
    try:
        head = opened.manager.audit.head_path.stat()
    except OSError:
        return (data, None)
    return (data, head.st_mtime_ns, head.st_size, head.st_ino)


def _run_serve(args: argparse.Namespace) -> int:
    from agentmend.faces.report.server import serve

    if not 0 <= args.port <= 65_535:
        raise CommandError(f"--port {args.port}: a port is 0 to 65535 (0 picks a free one)")

    with open_store(args) as opened:
        try:
            return serve(
                opened,
                port=args.port,
                render=render_workspace_report,
                version=lambda: _store_version(opened),
            )
        except OSError as exc:
            raise CommandError(
                f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror} "
                "(choose another with --port)"
            ) from exc


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        path=("status",),
        help="per agent: runs, success rate, p95 latency, detector, issues, warming up",
        example="agentmend status --workspace ./ws --json",
        run=_run_status,
        json_output=True,
    ),
    Subcommand(
        path=("show",),
        help="one change: its diff, gate verdicts, before/after scores and audit rows",
        example="agentmend show 3f2a9c1e --workspace ./ws",
        add_arguments=_show_arguments,
        run=_run_show,
        json_output=True,
    ),
    Subcommand(
        path=("improve",),
        help="run one improvement cycle, showing each step (exit 1 if no fix was kept)",
        example="agentmend improve research-agent --workspace ./ws",
        add_arguments=_improve_arguments,
        run=_run_improve,
    ),
    Subcommand(
        path=("report",),
        help="write the report page: one self-contained HTML file",
        example="agentmend report -o report.html --workspace ./ws",
        add_arguments=_report_arguments,
        run=_run_report,
    ),
    Subcommand(
        path=("serve",),
        help="show the report page live on 127.0.0.1 (read-only)",
        example="agentmend serve --port 8765 --workspace ./ws",
        add_arguments=_serve_arguments,
        run=_run_serve,
    ),
)
