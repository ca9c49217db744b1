"""The report page: one self-contained HTML file, readable with JavaScript off.

Charts are inline SVG (hover values are SVG ``<title>`` elements, which browsers show without
script); the only script is a small filter box, inline. No network: no CDN, no web fonts, no
external images, so the file opens on a locked-down machine and travels as an attachment.
"""

from __future__ import annotations

import html
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from agentmend.faces.report.data import AgentStatus, ReportData
from agentmend.infrastructure.detection.detector import CHART_OF_KIND, LOW_SUCCESS, SLOWDOWN
from agentmend.infrastructure.detection.series import StatisticStep
from agentmend.infrastructure.models import ChangeRecord, ChangeStatus
from agentmend.infrastructure.monitoring.run_series import SeriesPoint
from agentmend.loop.cycle import CycleResult
from agentmend.loop.cycle_history import CycleSummary

__all__ = ["render_report"]

_W, _H = 720, 232
_LEFT, _RIGHT = 60, 40
"""The plot's margins: the left one holds the y-axis labels (right-aligned against the plot),
the right one the time axis's "UTC"."""
_RATE, _LATENCY, _STATISTIC = (10, 67), (75, 132), (148, 192)
"""Each band's top and bottom: success rate, p95 latency, the detector's statistic."""
_AXIS_Y = 200
"""The time axis: its line, and its tick labels beneath it."""
_TICKS_S = (
    *(0.001 * m for m in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 300, 500)),
    *(1, 2, 3, 5, 10, 15, 30),
    *(60 * m for m in (1, 2, 3, 5, 10, 15, 30)),
    *(3600 * h for h in (1, 2, 3, 6, 12)),
    *(86_400 * d for d in (1, 2, 4, 7, 14, 30, 61, 91, 183, 365)),
)
"""Tick intervals a time axis may use, finest first: each a round number on a clock, and each
at most 7/3 times the one before, so the first that gives at most ``_MAX_TICKS`` ticks gives at
least 3 (the one before gave 8 or more)."""
_MAX_TICKS = 7
_STAT_COLOURS = {LOW_SUCCESS: "#6a4c93", SLOWDOWN: "#2a9d8f"}

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d232a;
background:#f6f7f9}
header{background:#1d3557;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
main{padding:16px 24px;max-width:1100px}section{background:#fff;border:1px solid #dde1e6;
border-radius:6px;padding:12px 16px;margin:14px 0}h2{font-size:17px;margin:4px 0 10px}
h3{font-size:15px;margin:10px 0 6px}table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #e6e9ed;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f0f2f5}.ok{color:#1a7f37}.bad{color:#c62828}.warn{color:#9a6700}
.num{text-align:right;font-variant-numeric:tabular-nums}pre{background:#f6f8fa;padding:8px;
overflow:auto;font-size:12px;border-radius:4px}.diff-add{color:#1a7f37}.diff-del{color:#c62828}
.muted{color:#5c6670}svg{display:block;max-width:100%;height:auto}.legend span{margin-right:14px}
#filter{padding:4px 8px;font-size:14px;width:260px}
"""

_SCRIPT = """
(function(){var box=document.getElementById('filter');if(!box)return;box.hidden=false;
box.addEventListener('input',function(){var q=box.value.toLowerCase();
document.querySelectorAll('[data-agent]').forEach(function(el){
el.style.display=el.getAttribute('data-agent').toLowerCase().indexOf(q)<0?'none':'';});});})();
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _json(value: object) -> str:
    # inside <script> no entity is decoded: keep "</script>" out by escaping "<"
    return json.dumps(value).replace("<", "\\u003c")


def _when(moment: datetime | float | None) -> str:
    if moment is None:
        return "-"
    if isinstance(moment, (int, float)):
        moment = datetime.fromtimestamp(moment, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _x(ts: float, start: float, end: float) -> float:
    span = end - start if end > start else 1.0
    return _LEFT + (ts - start) / span * (_W - _LEFT - _RIGHT)


Gap = tuple[float, float]
"""A stretch with no run: from the previous point's last run to the next point's first."""


def _gaps(series: Sequence[SeriesPoint], step_s: float) -> list[Gap]:
    """Where a whole step with no run lies between consecutive points, counting steps from
    the first point: as the stored buckets would show it (a point summed from them stands
    for its step; a point drawn from runs ends at its last run)."""
    if not series:
        return []
    origin = series[0].start_ts

    def step(ts: float) -> int:
        return math.floor((ts - origin) / step_s + 1e-9)

    gaps = []
    for before, after in itertools.pairwise(series):
        last = before.start_ts if before.last_ts is None else before.last_ts
        if step(after.start_ts) - step(last) > 1:
            gaps.append((last, after.start_ts))
    return gaps


def _line(
    points: Sequence[tuple[float, float, float]], gaps: Sequence[Gap], colour: str, width: float
) -> str:
    """(ts, x, y) points, in time order, as a path broken across every gap (no line may
    suggest runs where there were none), and a dot for each point alone between gaps (a path
    of one point draws nothing)."""
    runs: list[list[tuple[float, float]]] = []
    previous: float | None = None
    for ts, x, y in points:
        if previous is None or any(previous <= low and high <= ts for low, high in gaps):
            runs.append([])
        runs[-1].append((x, y))
        previous = ts
    d = " ".join(
        f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}"
        for run in runs
        if len(run) > 1
        for i, (x, y) in enumerate(run)
    )
    parts = [f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width}"/>'] if d else []
    parts += [
        f'<circle class="lone" cx="{run[0][0]:.1f}" cy="{run[0][1]:.1f}" r="2.2" fill="{colour}"/>'
        for run in runs
        if len(run) == 1
    ]
    return "".join(parts)


def _duration(ms: float) -> str:
    """A duration as a person reads it: "850 ms", "3.5 s", "35 s", "12 min", "1.5 h"."""
    for unit, size in (("h", 3_600_000.0), ("min", 60_000.0), ("s", 1000.0)):
        if ms >= size:
            value = ms / size
            shown = f"{value:.1f}".removesuffix(".0") if value < 10 else f"{value:.0f}"
            return f"{shown} {unit}"
    return f"{ms:.0f} ms"


def _ticks(start: float, end: float) -> list[tuple[float, str]]:
    """A few round times inside ``start``..``end`` (UTC), labelled HH:MM (with seconds or
    their fractions when the ticks are that close), or by date when the span passes a day."""
    span = end - start
    for interval in _TICKS_S:  # the finest whose ticks inside the span are few enough
        first = math.ceil(start / interval - 1e-9)
        last = math.floor(end / interval + 1e-9)
        if last - first + 1 <= _MAX_TICKS:
            break
    if span > 86_400:
        fmt = "%m-%d" if interval >= 86_400 else "%m-%d %H:%M"
    elif interval >= 60:
        fmt = "%H:%M"
    else:
        fmt = "%H:%M:%S"
    decimals = 0 if interval >= 1 else len(f"{interval:.3f}".rstrip("0").split(".")[1])
    ticks = []
    for i in range(first, last + 1):
        moment = datetime.fromtimestamp(i * interval, UTC)
        label = moment.strftime(fmt)
        if decimals:
            label += f"{moment.microsecond / 1e6:.{decimals}f}"[1:]
        ticks.append((i * interval, label))
    return ticks


def _label(y: float, text: str, colour: str = "#5c6670") -> str:
    # right-aligned against the plot: however long, a label never reaches the lines
    return (
        f'<text class="y-label" x="{_LEFT - 6}" y="{y}" font-size="10" fill="{colour}" '
        f'text-anchor="end">{_e(text)}</text>'
    )


def _axis(start: float, end: float) -> str:
    parts = [
        f'<g class="time-axis"><line x1="{_LEFT}" y1="{_AXIS_Y}" x2="{_W - _RIGHT}" '
        f'y2="{_AXIS_Y}" stroke="#adb5bd"/>'
    ]
    for ts, label in _ticks(start, end):
        x = _x(ts, start, end)
        parts.append(
            f'<line x1="{x:.1f}" y1="{_AXIS_Y}" x2="{x:.1f}" y2="{_AXIS_Y + 4}" stroke="#adb5bd"/>'
            f'<text class="tick" x="{x:.1f}" y="{_AXIS_Y + 15}" font-size="10" fill="#5c6670" '
            f'text-anchor="middle" data-ts="{ts:.3f}">{_e(label)}</text>'
        )
    parts.append(
        f'<text x="{_W - _RIGHT + 6}" y="{_AXIS_Y + 15}" font-size="10" fill="#5c6670">UTC</text>'
        "</g>"
    )
    return "".join(parts)


def _chart(
    agent: str,
    series: Sequence[SeriesPoint],
    statistics: Mapping[str, Sequence[StatisticStep]],
    changes: Iterable[ChangeRecord],
    issues: Iterable[tuple[datetime, str]],
    span: tuple[float, float],
    step_s: float,
) -> str:
    """Success rate, p95 latency and, beneath them, each detector chart's statistic as a
    share of its threshold (the dashed line: an alarm; a point where it was reached), with
    issue and change markers, over a time axis in UTC. Lines break where no run happened for
    more than one step of the series (``step_s``)."""
    start, end = span
    (rate_top, rate_bottom), (lat_top, lat_bottom) = _RATE, _LATENCY
    stat_top, stat_bottom = _STATISTIC
    max_ms = max((p.p95_ms for p in series), default=1.0) or 1.0
    rate_points = [
        (
            p.start_ts,
            _x(p.start_ts, start, end),
            rate_top + (1 - p.success_rate) * (rate_bottom - rate_top),
        )
        for p in series
    ]
    lat_points = [
        (
            p.start_ts,
            _x(p.start_ts, start, end),
            lat_bottom - p.p95_ms / max_ms * (lat_bottom - lat_top),
        )
        for p in series
    ]
    parts = [
        f'<svg viewBox="0 0 {_W} {_H}" role="img" aria-label="{_e(agent)}: success, latency'
        f' and detector statistic" class="chart" data-points="{len(series)}" '
        f'data-plot="{_LEFT} {_W - _RIGHT}">',
        f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="#fff"/>',
        f'<line x1="{_LEFT}" y1="{rate_bottom + 4}" x2="{_W - _RIGHT}" y2="{rate_bottom + 4}" '
        'stroke="#e6e9ed"/>',
        f'<line x1="{_LEFT}" y1="{lat_bottom + 8}" x2="{_W - _RIGHT}" y2="{lat_bottom + 8}" '
        'stroke="#e6e9ed"/>',
        _label(rate_top + 8, "100%"),
        _label(rate_bottom, "0%"),
        _label(lat_top + 8, _duration(max_ms)),
        _label(lat_bottom, "0 s"),
        _label(stat_top + 4, "alarm", "#c62828"),
        f'<line x1="{_LEFT}" y1="{stat_top}" x2="{_W - _RIGHT}" y2="{stat_top}" stroke="#c62828" '
        'stroke-dasharray="4,3" class="threshold"/>',
        _label(stat_bottom, "0"),
        _axis(start, end),
    ]
    for ts, label in issues:
        x = _x(ts.timestamp(), start, end)
        parts.append(
            f'<g class="issue-marker"><line x1="{x:.1f}" y1="{rate_top}" x2="{x:.1f}" '
            f'y2="{stat_bottom}" stroke="#9a6700" stroke-dasharray="3,3"/><title>issue raised '
            f"{_e(_when(ts))}: {_e(label)}</title></g>"
        )
    for change in changes:
        colour = {
            ChangeStatus.KEPT: "#1a7f37",
            ChangeStatus.ROLLED_BACK: "#c62828",
        }.get(change.status, "#5c6670")
        x = _x(change.timestamp.timestamp(), start, end)
        parts.append(
            f'<g class="change-marker" data-status="{_e(change.status.value)}">'
            f'<line x1="{x:.1f}" y1="{rate_top}" x2="{x:.1f}" y2="{stat_bottom}" '
            f'stroke="{colour}" stroke-width="2"/><title>change {_e(change.change_id)} '
            f"({_e(change.status.value)}) at {_e(_when(change.timestamp))}</title></g>"
        )
    gaps = _gaps(series, step_s)
    if rate_points:
        parts.append(f'<g class="rate">{_line(rate_points, gaps, "#1d3557", 1.5)}</g>')
        parts.append(f'<g class="latency">{_line(lat_points, gaps, "#e76f51", 1.5)}</g>')
    for point, (_ts, x, y) in zip(series, rate_points, strict=True):
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="#1d3557"><title>'
            f"{_e(_when(point.start_ts))}: {point.runs} runs, {point.success_rate:.1%} success, "
            f"p95 {_e(_duration(point.p95_ms))}</title></circle>"
        )
    for kind, steps in sorted(statistics.items()):
        colour = _STAT_COLOURS.get(kind, "#5c6670")
        chart = CHART_OF_KIND.get(kind, kind)
        points = [
            (
                p.start_ts,
                _x(p.start_ts, start, end),
                stat_bottom - min(p.peak, 1.0) * (stat_bottom - stat_top),
            )
            for p in steps
        ]
        highest = max(steps, key=lambda p: p.peak)
        last = steps[-1]
        # one line per chart, a hover title for the whole of it, and a point only where the
        # statistic reached its threshold: a point per step of a hundred agents' charts would
        # be most of the page's weight
        parts.append(
            f'<g class="statistic" data-kind="{_e(kind)}" data-steps="{len(steps)}" '
            f'data-peak="{highest.peak:.4f}"><title>{_e(chart)}: highest {highest.peak:.0%} of '
            f"its threshold at {_e(_when(highest.start_ts))}; now {last.statistic:.2f} / "
            f"{last.threshold:.2f}</title>" + _line(points, gaps, colour, 1.2)
        )
        for step, (_ts, x, y) in zip(steps, points, strict=True):
            if step.peak < 1.0:
                continue
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.2" fill="{colour}"><title>'
                f"{_e(_when(step.start_ts))}: {_e(chart)} reached its threshold;"
                f" statistic {step.statistic:.2f} / threshold {step.threshold:.2f}</title></circle>"
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _agent_table(agents: Sequence[AgentStatus]) -> str:
    rows = []
    for a in agents:
        detector = "-"
        if a.detector:
            detector = (
                "; ".join(
                    f"{name} {v['statistic']:.2f} / {v['threshold']:.2f}"
                    for name, v in a.detector.items()
                    if isinstance(v, dict) and "statistic" in v
                )
                or "-"
            )
        state = (
            f'<span class="warn">warming up ({a.baseline_runs}/{a.baseline_n})</span>'
            if a.warming_up
            else "watched"
        )
        rate_class = "ok" if a.recent_success_rate >= 0.9 else "bad"
        rows.append(
            f'<tr data-agent="{_e(a.name)}"><td>{_e(a.name)}</td>'
            f'<td class="num">{a.runs}</td><td class="num">{a.success_rate:.1%}</td>'
            f'<td class="num {rate_class}">{a.recent_success_rate:.1%}</td>'
            f'<td class="num">{a.p95_ms:.0f}</td><td>{_e(detector)}</td><td>{state}</td>'
            f'<td class="num">{len(a.open_issues)}</td></tr>'
        )
    return (
        # a numeric column's header is right-aligned as its figures are: else, in a wide
        # column, the figures sit under the next column's header
        '<table id="agents"><tr><th>agent</th><th class="num">runs</th>'
        '<th class="num">success (all)</th><th class="num">success (recent)</th>'
        '<th class="num">p95 ms (recent)</th><th>detector (statistic / threshold)</th>'
        '<th>state</th><th class="num">open issues</th></tr>' + "".join(rows) + "</table>"
    )


def _diff(text: str) -> str:
    lines = []
    for line in text.splitlines():
        css = (
            "diff-add"
            if line.startswith("+") and not line.startswith("+++")
            else "diff-del"
            if line.startswith("-") and not line.startswith("---")
            else ""
        )
        lines.append(f'<span class="{css}">{_e(line)}</span>' if css else _e(line))
    return "<pre>" + "\n".join(lines) + "</pre>"


def _cycle(cycle: CycleResult) -> str:
    issue = cycle.issue
    outcome_class = "ok" if cycle.status == "kept" else "bad" if cycle.rolled_back else "warn"
    parts = [
        f'<section class="cycle" id="cycle-{_e(cycle.cycle_id)}" data-agent="'
        f'{_e(issue.agent_name)}"><h3>Cycle {_e(cycle.cycle_id)}: {_e(issue.agent_name)} '
        f'<span class="{outcome_class}">{_e(cycle.status)}</span></h3>',
        f'<p class="muted">{_e(_when(cycle.started_at))} · {cycle.model_calls} model calls · '
        f"{cycle.duration_ms:.0f} ms</p>",
        f"<p><b>Issue</b> ({_e(issue.detector)}): {_e(issue.error_type)} — {_e(issue.context)}",
    ]
    if issue.statistic is not None and issue.threshold is not None:
        parts.append(f" (statistic {issue.statistic:.2f} &gt; threshold {issue.threshold:.2f})")
    parts.append("</p>")
    if cycle.questions:
        parts.append("<h4>Questions</h4><ol>")
        for qa in cycle.questions:
            answer = _e(qa.answer) if qa.answer else f'<span class="bad">{_e(qa.error)}</span>'
            parts.append(
                f"<li><b>to {_e(qa.agent_name)}:</b> {_e(qa.question)}<br>"
                f"<i>answer:</i> {answer}</li>"
            )
        parts.append("</ol>")
    if cycle.analysis is not None:
        analysis = cycle.analysis
        parts.append(
            f"<h4>Analysis</h4><p>{_e(analysis.identified_cause)} "
            f"(confidence {analysis.confidence_score:.2f}, responsible: "
            f"{_e(analysis.agent_name)})</p>"
        )
        if analysis.evidence:
            parts.append(
                "<ul>" + "".join(f"<li>{_e(item)}</li>" for item in analysis.evidence) + "</ul>"
            )
    for outcome in cycle.outcomes:
        action = outcome.action
        parts.append(
            f"<h4>Action {outcome.index + 1}: {_e(action.action_type.value)} on "
            f"{_e(action.target_agent)}</h4><p>{_e(action.rationale)}</p>"
        )
        if outcome.verdicts:
            parts.append(
                "<table class='gates'><tr><th>gate</th><th>verdict</th><th>reason</th></tr>"
            )
            for verdict in outcome.verdicts:
                css = "ok" if verdict.passed else "bad"
                parts.append(
                    f"<tr><td>{_e(verdict.gate)}</td><td class='{css}'>"
                    f"{'passed' if verdict.passed else 'refused'}</td>"
                    f"<td>{_e(verdict.reason)}</td></tr>"
                )
            parts.append("</table>")
        if outcome.diff:
            parts.append(_diff(outcome.diff))
    for agent, check in cycle.verifications.items():
        before = "-" if check.before_score is None else f"{check.before_score:.2f}"
        parts.append(
            f"<h4>Verification of {_e(agent)}: "
            f"<span class='{'ok' if check.accepted else 'bad'}'>"
            f"{'accepted' if check.accepted else 'rejected'}</span> "
            f"(score {before} → {check.after_score:.2f})</h4><p>{_e(check.reason)}</p>"
        )
        if check.cases:
            parts.append(
                "<table class='cases'><tr><th>case</th><th class='num'>before</th>"
                "<th class='num'>after</th><th>change</th></tr>"
            )
            for case in check.cases:
                parts.append(
                    f"<tr><td>{_e(case.case_id)}</td>"
                    f"<td class='num'>{case.before_passes}/{case.before_runs}</td>"
                    f"<td class='num'>{case.after_passes}/{case.after_runs}</td>"
                    f"<td>{_e(case.change)}</td></tr>"
                )
            parts.append("</table>")
    if cycle.rollback_reason:
        parts.append(f"<p><b>Rolled back:</b> {_e(cycle.rollback_reason)}</p>")
    if cycle.error:
        parts.append(f"<p class='bad'><b>Error:</b> {_e(cycle.error)}</p>")
    parts.append("</section>")
    return "".join(parts)


def _older_cycles(cycles: Sequence[CycleSummary]) -> str:
    if not cycles:
        return ""
    rows = "".join(
        f"<tr data-agent='{_e(c.issue.agent_name)}'><td>{_e(c.cycle_id)}</td>"
        f"<td>{_e(_when(c.started_at))}</td><td>{_e(c.issue.agent_name)}</td>"
        f"<td>{_e(c.issue.error_type)}</td><td>{_e(c.status)}</td></tr>"
        for c in cycles
    )
    return (
        f"<h3>Older cycles ({len(cycles)})</h3><table id='older-cycles'><tr><th>cycle</th>"
        f"<th>started</th><th>agent</th><th>issue</th><th>outcome</th></tr>{rows}</table>"
    )


def _audit(data: ReportData) -> str:
    chain = data.chain
    verdict = (
        f'<p class="ok" id="chain">audit chain verified: every hash and link of its '
        f"{chain.rows_checked} rows and its head checked in {data.chain_ms:.0f} ms</p>"
        if chain.ok
        else '<p class="bad" id="chain">audit chain does NOT verify: '
        + _e("; ".join(f"{p.kind}: {p.detail}" for p in chain.problems))
        + "</p>"
    )
    verdict += "".join(f"<p class='muted'>{_e(note)}</p>" for note in chain.notes)
    rows = "".join(
        f"<tr data-agent='{_e(entry.agent_name)}'><td class='num'>{entry.id}</td>"
        f"<td>{_e(_when(entry.timestamp))}</td><td>{_e(entry.agent_name)}</td>"
        f"<td>{_e(entry.edit_type)}</td><td>{_e(entry.user_name or entry.user_id)}</td>"
        f"<td>{_e(entry.change_id or '-')}</td></tr>"
        for entry in reversed(data.audit)
    )
    return (
        verdict + "<table id='audit'><tr><th class='num'>#</th><th>when (UTC)</th><th>agent</th>"
        f"<th>edit</th><th>by</th><th>change</th></tr>{rows}</table>"
    )


def _span(
    data: ReportData,
    names: Sequence[str],
    issues: Mapping[str, Sequence[tuple[datetime, str]]],
    changes: Mapping[str, Sequence[ChangeRecord]],
) -> tuple[float, float]:
    """The time axis all charts share: every point drawn and every marker of a charted agent,
    all on the one clock they are recorded by (UTC seconds), with a small margin each side so
    that the first and last are not on the edge."""
    moments = [
        moment
        for name in names
        for p in data.series.get(name, ())
        for moment in (p.start_ts, p.last_ts if p.last_ts is not None else p.start_ts)
    ]
    moments += [p.start_ts for (agent, _), steps in data.statistics.items() for p in steps]
    moments += [ts.timestamp() for name in names for ts, _ in issues.get(name, ())]
    moments += [c.timestamp.timestamp() for name in names for c in changes.get(name, ())]
    if not moments:
        return (0.0, 1.0)
    low, high = min(moments), max(moments)
    margin = (high - low) * 0.02 if high > low else 0.5
    return (low - margin, high + margin)


def render_report(data: ReportData, *, title: str = "agentmend report") -> str:
    """The whole page as one HTML string."""
    issues_by_agent: dict[str, list[tuple[datetime, str]]] = {}
    for issue in [c.issue for c in data.cycles] + [c.issue for c in data.older_cycles]:
        issues_by_agent.setdefault(issue.agent_name, []).append((issue.timestamp, issue.error_type))
    changes_by_agent: dict[str, list[ChangeRecord]] = {}
    for change in data.changes:
        changes_by_agent.setdefault(change.action.target_agent, []).append(change)
    names = sorted(set(data.series) | {a.name for a in data.agents})
    span = _span(data, names, issues_by_agent, changes_by_agent)
    charts = []
    for name in names:
        charts.append(
            f'<div class="agent-chart" data-agent="{_e(name)}"><h3>{_e(name)}</h3>'
            + _chart(
                name,
                data.series.get(name, []),
                {kind: steps for (agent, kind), steps in data.statistics.items() if agent == name},
                changes_by_agent.get(name, []),
                issues_by_agent.get(name, []),
                span,
                data.step_s,
            )
            + "</div>"
        )
    summary = {
        "agents": len(data.agents),
        "changes": len(data.changes),
        "cycles": len(data.cycles) + len(data.older_cycles),
        "audit_verified": data.chain.ok,
        "audit_rows_checked": data.chain.rows_checked,
        "audit_verify_ms": round(data.chain_ms, 1),
    }
    notes = "".join(f"<p class='muted'>{_e(note)}</p>" for note in data.notes)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<link rel='icon' href='data:,'>"  # no favicon request: nothing to fetch
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
        f"<header><h1>{_e(title)}</h1><div>generated {_e(_when(data.generated_at))} UTC"
        "</div></header><main>"
        f"<script type='application/json' id='summary'>{_json(summary)}</script>"
        "<input id='filter' type='search' placeholder='filter agents…' hidden>"
        f"{notes}<section id='status'><h2>Agents</h2>{_agent_table(data.agents)}</section>"
        "<section id='charts'><h2>Over time</h2><p class='legend muted'>"
        "<span style='color:#1d3557'>━ success rate</span>"
        "<span style='color:#e76f51'>━ p95 latency</span>"
        "<span style='color:#9a6700'>┆ issue raised</span>"
        "<span style='color:#1a7f37'>┃ change kept</span>"
        "<span style='color:#c62828'>┃ change rolled back</span>"
        "<br>beneath: the detector's statistic as a share of its threshold, its peak per step "
        "(<span style='color:#6a4c93'>━ failures</span>"
        "<span style='color:#2a9d8f'>━ latency</span>"
        "<span style='color:#c62828'>┅ threshold: an alarm</span>)"
        "<br>across: when the runs were recorded, in UTC; a line breaks where a whole step of "
        f"the series ({_e(_duration(data.step_s * 1000))}) had no run</p>"
        f"{''.join(charts) or '<p>no runs recorded yet</p>'}</section>"
        f"<section id='cycles'><h2>Improvement cycles</h2>"
        f"{''.join(_cycle(c) for c in data.cycles) or '<p>no cycles yet</p>'}"
        f"{_older_cycles(data.older_cycles)}</section>"
        f"<section id='audit-trail'><h2>Audit trail</h2>{_audit(data)}</section>"
        f"</main><script>{_SCRIPT}</script></body></html>"
    )
