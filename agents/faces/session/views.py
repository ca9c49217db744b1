"""How the interactive session and the demo show things: rich renderables, no I/O of their own.

Kept apart from ``main.py`` so the session only reads commands and wires objects, and so the
same views serve the demo.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from agentmend.infrastructure.errors import AgentmendError
from agentmend.infrastructure.models import AgentMetrics, ChangeRecord, IssueReport
from agentmend.infrastructure.redaction import redact
from agentmend.loop.cycle import CycleEvent, CycleResult, TaskResult

__all__ = [
    "cycle_event_line",
    "cycle_summary_line",
    "diff_text",
    "history_table",
    "issue_line",
    "one_line_error",
    "sparkline",
    "status_table",
    "task_table",
]

_STEP_MARKS: Mapping[str, tuple[str, str]] = {
    "cycle_started": ("▶", "bold"),
    "question_asked": ("?", "cyan"),
    "analysis_completed": ("●", "magenta"),
    "actions_proposed": ("●", "magenta"),
    "proposal_invalid": ("✗", "red"),
    "change_applied": ("●", "yellow"),
    "verification_completed": ("●", "blue"),
    "change_kept": ("✓", "green"),
    "change_rolled_back": ("↺", "red"),
    "change_rollback_blocked": ("⚠", "bold red"),
    "change_lease_lost": ("⚠", "bold red"),
    "cycle_finished": ("■", "bold"),
}


def sparkline(outcomes: Sequence[bool]) -> str:
    """Recent successes as a strip, oldest first: ``▇`` a success, ``▁`` a failure."""
    return "".join("▇" if ok else "▁" for ok in outcomes)


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


SIMULATED_NOTE = "simulated: latencies are the simulation's, not measured"


def task_table(task: TaskResult, *, simulated: bool = False) -> Table:
    """Each agent's answer and outcome for one question (``simulated``: latencies say so)."""
    table = Table(
        title=f"Q: {_clip(task.query, 70)}",
        expand=False,
        caption=SIMULATED_NOTE if simulated else None,
    )
    table.add_column("agent")
    table.add_column("outcome")
    table.add_column("sim. ms" if simulated else "ms", justify="right")
    table.add_column("answer")
    for name, result in sorted(task.results.items()):
        if result.error is None:
            outcome = Text("ok", style="green")
            answer = _clip(result.text, 70)
        else:
            outcome = Text(result.error.kind.value, style="red")
            answer = _clip(result.error.message, 70)
        table.add_row(name, outcome, f"{result.duration_ms:.0f}", answer)
    return table


def _detector_cell(stats: Mapping[str, Any] | None, baseline_n: int) -> str:
    if not stats:
        return "-"
    baseline = stats.get("baseline", {})
    if stats.get("state") == "warming_up" or (
        not baseline.get("frozen", False) and "consecutive_failures" not in stats
    ):
        return f"warming up {baseline.get('n', 0)}/{baseline_n}"
    parts = []
    for key, label in (("cusum_failure_rate", "fail"), ("cusum_log_duration", "time")):
        chart = stats.get(key)
        if chart:
            parts.append(f"{label} {chart['statistic']:.1f}/{chart['threshold']:.1f}")
    if "consecutive_failures" in stats:
        parts.append(f"streak {stats['consecutive_failures']}")
    if stats.get("state") == "outside_guarantee":
        parts.append("(rules, no guarantee)")
    return "  ".join(parts) or "-"


def backlog_line(unwritten: int, write_error: str | None) -> Text | None:
    """The runs between ``record()`` and the store, worded as what they are.

    Runs waiting for the background writer are the normal lag after a burst of traffic, not a
    fault: only a failed write (``write_error``) is worded as one.
    """
    if not unwritten:
        return None
    if write_error is None:
        return Text(f"{unwritten} runs on their way to the store (the writer is catching up)")
    return Text(
        f"{unwritten} runs not yet written to the store (kept, retried): {write_error}",
        style="yellow",
    )


def status_table(
    metrics: Mapping[str, AgentMetrics],
    detector_stats: Mapping[str, Mapping[str, Any] | None],
    *,
    baseline_n: int,
    simulated: bool = False,
) -> Table:
    """Per agent: executions, success rate, p95 latency, detector statistic, recent success."""
    table = Table(title="Agents", caption=SIMULATED_NOTE if simulated else None)
    table.add_column("agent")
    table.add_column("runs", justify="right")
    table.add_column("success", justify="right")
    table.add_column("p95 sim. ms" if simulated else "p95 ms", justify="right")
    table.add_column("detector (statistic/threshold)")
    table.add_column("recent")
    for name in sorted(metrics):
        m = metrics[name]
        rate = Text(f"{m.success_rate:.0%}", style="green" if m.success_rate >= 0.9 else "red")
        table.add_row(
            name,
            str(m.executions),
            rate,
            f"{m.p95_duration_ms:.0f}",
            _detector_cell(detector_stats.get(name), baseline_n),
            sparkline(m.recent_outcomes[-24:]),
        )
    return table


def history_table(records: Iterable[ChangeRecord], *, title: str = "Changes") -> Table:
    table = Table(title=title)
    for column in ("id", "when (UTC)", "agent", "change", "status", "old -> new"):
        table.add_column(column)
    for record in records:
        action = record.action
        what = action.action_type.value + (f" {action.target_field}" if action.target_field else "")
        values = f"{_clip(str(action.old_value), 30)} -> {_clip(str(action.new_value), 30)}"
        table.add_row(
            record.change_id,
            record.timestamp.strftime("%Y-%m-%d %H:%M:%S"),
            action.target_agent,
            what,
            record.status.value,
            values,
        )
    return table


def issue_line(issue: IssueReport) -> Text:
    stat = ""
    if issue.statistic is not None and issue.threshold is not None:
        stat = f" [{issue.detector}: {issue.statistic:.2f} > {issue.threshold:.2f}]"
    return Text(
        f"⚠ Performance issue in {issue.agent_name}: {issue.context}{stat}", style="bold yellow"
    )


def _whole(text: str) -> str:
    """All of ``text`` on one logical line: the console wraps it, nothing is cut off."""
    return " ".join(text.split())


def cycle_event_line(event: CycleEvent) -> Text:
    """A step of a cycle as it happens, whole: verdicts, questions and answers are not cut."""
    if event.step == "gate_checked":
        verdict = event.data.get("verdict") or {}
        mark, style = ("✓", "green") if verdict.get("passed") else ("✗", "red")
        return Text(f"   {mark} gate {_whole(event.message)}", style=style)
    if event.step == "question_asked":
        answer = event.data.get("answer") or event.data.get("error") or ""
        return Text(
            f"   ? ask {event.agent_name}: {_whole(event.message)}\n     → {_whole(str(answer))}",
            style="cyan",
        )
    mark, style = _STEP_MARKS.get(event.step, ("·", ""))
    indent = "" if event.step in ("cycle_started", "cycle_finished") else "   "
    return Text(f"{indent}{mark} {event.step.replace('_', ' ')}: {_whole(event.message)}", style)


def diff_text(diff: str | None) -> Text:
    """A unified diff, one line per line with no padding: ``+`` green, ``-`` red."""
    if not diff:
        return Text("(no diff)")
    out = Text()
    for line in diff.rstrip("\n").splitlines():
        line = line.rstrip()
        style = (
            "bold"
            if line.startswith(("+++", "---"))
            else "green"
            if line.startswith("+")
            else "red"
            if line.startswith("-")
            else "cyan"
            if line.startswith("@@")
            else ""
        )
        out.append(line + "\n", style=style)
    out.rstrip()
    return out


def one_line_error(exc: BaseException) -> str:
    """What went wrong, in one line a user can act on (never a traceback).

    A file-system error names the file and says what the system said (``Permission denied``,
    ``No space left on device``); notes added on the way (a blocked rollback) follow it.
    """
    if isinstance(exc, OSError) and exc.filename is not None:
        where = Path(str(exc.filename))
        text = f"{exc.strerror or type(exc).__name__}: {where} (in the folder {where.parent})"
    elif isinstance(exc, AgentmendError):
        text = str(exc) or type(exc).__name__
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    notes = getattr(exc, "__notes__", None) or []
    return _whole(redact(" ".join([text, *notes])))


def cycle_summary_line(result: CycleResult) -> Text:
    style = (
        "green"
        if result
        else ("red" if result.rolled_back or result.rollback_blocked else "yellow")
    )
    return Text(result.summary(), style=style)
