"""The report page's charts and cycle tables, read back from the HTML: the time axis, the span
the charts share, lines broken at gaps, markers at their own times, the y-axis labels, and
every table cell under its header. The demo's page, and pages of series made for the case."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import UTC, datetime
from html.parser import HTMLParser

import pytest
from cli_run import demo_workspace

from agentmend.faces.report.data import ReportData, collect_report
from agentmend.faces.report.page import _ticks as axis_ticks
from agentmend.faces.report.page import render_report
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.detection.series import StatisticStep
from agentmend.infrastructure.models import ChangeRecord
from agentmend.infrastructure.monitoring.run_series import BUCKET_S, SeriesPoint
from agentmend.infrastructure.store.api import Store
from agentmend.loop.cycle import CycleResult

pytestmark = pytest.mark.usefixtures("restore_logging")

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC).timestamp()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> ReportData:
    workspace = demo_workspace(tmp_path_factory.mktemp("charts") / "ws")
    store = Store(workspace / "agentmend.db", files_dir=workspace)
    manager = ImprovementManager(store=store)
    try:
        return collect_report(store, manager, baseline_n=40)
    finally:
        manager.close()
        store.close()


def _charts(page: str) -> dict[str, ET.Element]:
    """Each agent's chart, parsed as the SVG it is."""
    charts = {}
    for match in re.finditer(r'<div class="agent-chart" data-agent="([^"]+)">', page):
        start = page.index("<svg", match.end())
        end = page.index("</svg>", start) + len("</svg>")
        svg = page[start:end].replace("<svg ", f'<svg xmlns="{SVG[1:-1]}" ', 1)
        charts[match.group(1)] = ET.fromstring(svg)
    return charts


def _plot(svg: ET.Element) -> tuple[float, float]:
    """The x of the plot's left and right edges: where the alarm threshold line runs."""
    line = next(el for el in svg.iter(f"{SVG}line") if el.get("class") == "threshold")
    return float(line.get("x1", "nan")), float(line.get("x2", "nan"))


def _ticks(svg: ET.Element) -> list[tuple[float, float, str]]:
    """The time axis's ticks: (x, UTC seconds, label)."""
    return [
        (float(el.get("x", "nan")), float(el.get("data-ts", "nan")), el.text or "")
        for el in svg.iter(f"{SVG}text")
        if el.get("class") == "tick"
    ]


def _x_of(svg: ET.Element, ts: float) -> float:
    """Where the axis puts ``ts``: interpolated between its first and last ticks."""
    ticks = _ticks(svg)
    (x0, t0, _), (x1, t1, _) = ticks[0], ticks[-1]
    return x0 + (ts - t0) / (t1 - t0) * (x1 - x0)


def _subpaths(d: str) -> list[list[tuple[float, float]]]:
    paths: list[list[tuple[float, float]]] = []
    for command, x, y in re.findall(r"([ML])(-?[\d.]+),(-?[\d.]+)", d):
        if command == "M":
            paths.append([])
        paths[-1].append((float(x), float(y)))
    return paths


def _group(svg: ET.Element, name: str) -> ET.Element:
    return next(el for el in svg.iter(f"{SVG}g") if el.get("class") == name)


def _made(
    demo: ReportData,
    series: list[SeriesPoint],
    step_s: float,
    *,
    statistics: dict[tuple[str, str], list[StatisticStep]] | None = None,
    changes: list[ChangeRecord] | None = None,
    cycles: list[CycleResult] | None = None,
) -> str:
    """The page of one agent (the one the demo's first change is to) with ``series``."""
    agent = demo.changes[0].action.target_agent
    made = replace(
        demo,
        agents=[],
        series={agent: series},
        statistics=statistics or {},
        changes=changes or [],
        cycles=cycles or [],
        older_cycles=[],
        step_s=step_s,
    )
    return render_report(made)


def _point(ts: float, failures: int = 0, last_ts: float | None = None) -> SeriesPoint:
    return SeriesPoint(ts, 10, failures, 900.0, 1200.0, last_ts)


# -- the time axis ------------------------------------------------------------------------------


def test_each_chart_has_a_time_axis_in_utc(demo: ReportData) -> None:
    charts = _charts(render_report(demo))
    assert charts
    for svg in charts.values():
        ticks = _ticks(svg)
        left, right = _plot(svg)
        assert 3 <= len(ticks) <= 7
        assert all(left <= x <= right for x, _, _ in ticks)
        assert [ts for _, ts, _ in ticks] == sorted(ts for _, ts, _ in ticks)
        for _x, ts, label in ticks:  # each label is its tick's own time, in UTC
            moment = datetime.fromtimestamp(ts, UTC)
            assert label.startswith(moment.strftime("%H:%M"))
        assert "UTC" in [el.text for el in svg.iter(f"{SVG}text")]


@pytest.mark.parametrize("scale", [0.01, 1.0, 60.0, 3600.0, 86_400.0])
def test_an_axis_of_any_span_has_three_to_seven_ticks(scale: float) -> None:
    """Spans from a few scale units to a few hundred, at starts that put the ticks anywhere:
    never fewer than 3 ticks (a span of 1.3 s once got 2, half a second apart), never more
    than 7."""
    for step in range(1, 400):
        span = scale * (3 + step * 0.37)
        start = T0 + (step * 7919 % 1000) / 1000 * span
        ticks = axis_ticks(start, start + span)
        assert 3 <= len(ticks) <= 7, (span, len(ticks))
        assert all(start <= ts <= start + span for ts, _ in ticks)


def test_ticks_are_hours_over_a_day_and_dates_beyond(demo: ReportData) -> None:
    hours = [_point(T0 + i * 300) for i in range(12 * 6)]  # six hours, a point each 5 min
    svg = next(iter(_charts(_made(demo, hours, 300)).values()))
    labels = [label for _, _, label in _ticks(svg)]
    assert labels
    assert all(re.fullmatch(r"\d\d:\d\d", label) for label in labels), labels
    assert "12:00" in labels
    days = [_point(T0 + i * 3600) for i in range(24 * 9)]  # nine days, a point each hour
    svg = next(iter(_charts(_made(demo, days, 3600)).values()))
    labels = [label for _, _, label in _ticks(svg)]
    assert labels
    assert all(re.fullmatch(r"\d\d-\d\d", label) for label in labels), labels
    assert "03-04" in labels


# -- the span -----------------------------------------------------------------------------------


def test_the_data_and_markers_fill_the_shared_span(demo: ReportData) -> None:
    """No empty half: the earliest thing drawn is near the left edge, the latest near the
    right, over all the charts (which share one axis)."""
    xs: list[float] = []
    charts = _charts(render_report(demo))
    for svg in charts.values():
        xs += [float(c.get("cx", "nan")) for c in svg.iter(f"{SVG}circle")]
        for g in svg.iter(f"{SVG}g"):
            if g.get("class") in ("change-marker", "issue-marker"):
                xs.append(float(next(g.iter(f"{SVG}line")).get("x1", "nan")))
    left, right = _plot(next(iter(charts.values())))
    margin = 0.05 * (right - left)
    assert left <= min(xs) <= left + margin
    assert right - margin <= max(xs) <= right


def test_a_far_off_marker_stays_inside_the_plot_at_its_own_time(demo: ReportData) -> None:
    """An issue raised after the last run and a change made before the first: each drawn
    at its own time on the axis, inside the plot."""
    series = [_point(T0 + i * 60) for i in range(30)]
    cycle = demo.cycles[0]
    agent = demo.changes[0].action.target_agent
    late = datetime.fromtimestamp(T0 + 45 * 60, UTC)
    early = datetime.fromtimestamp(T0 - 10 * 60, UTC)
    issue = cycle.issue.model_copy(update={"agent_name": agent, "timestamp": late})
    change = demo.changes[0].model_copy(update={"timestamp": early})
    page = _made(
        demo,
        series,
        60,
        cycles=[cycle.model_copy(update={"issue": issue})],
        changes=[change],
    )
    svg = _charts(page)[agent]
    left, right = _plot(svg)
    for name, moment in (("issue-marker", late), ("change-marker", early)):
        x = float(next(_group(svg, name).iter(f"{SVG}line")).get("x1", "nan"))
        assert left <= x <= right, name
        assert x == pytest.approx(_x_of(svg, moment.timestamp()), abs=0.2), name


# -- gaps ---------------------------------------------------------------------------------------


def test_a_gap_breaks_the_line_and_a_point_alone_is_a_dot(demo: ReportData) -> None:
    """Steps of 5 minutes: healthy, one failed step, an hour with no runs, healthy again,
    then one step alone. The failure must not slope down across the hour."""
    step = 300
    series = [_point(T0 + i * step) for i in range(5)]
    series.append(_point(T0 + 5 * step, failures=10))
    series += [_point(T0 + i * step) for i in range(17, 22)]
    series.append(_point(T0 + 30 * step))
    svg = next(iter(_charts(_made(demo, series, step)).values()))
    width = _x_of(svg, T0 + step) - _x_of(svg, T0)
    for name in ("rate", "latency"):
        group = _group(svg, name)
        paths = _subpaths(next(group.iter(f"{SVG}path")).get("d", ""))
        assert [len(p) for p in paths] == [6, 5], name
        for path in paths:  # no segment longer than one step
            assert all(b[0] - a[0] <= width + 0.2 for a, b in itertools.pairwise(path))
        dots = [float(c.get("cx", "nan")) for c in group.iter(f"{SVG}circle")]
        assert dots == [pytest.approx(_x_of(svg, T0 + 30 * step), abs=0.2)], name


def test_points_drawn_from_runs_break_where_no_run_happened_for_a_step(
    demo: ReportData,
) -> None:
    """Points of runs themselves (each from its first to its last run): a line where the
    runs went on, a break across a whole minute without one, the statistic too."""
    series = [
        _point(T0, last_ts=T0 + 50),
        _point(T0 + 70, last_ts=T0 + 100),  # 20 s on from the last run: one line
        # the minute after that of the last run had none: a break
        _point(T0 + 3 * BUCKET_S + 5, failures=10, last_ts=T0 + 300),
    ]
    steps = [StatisticStep(T0 + s, 0.2, 1.0, 5.0) for s in (0, 90, 250)]
    agent = demo.changes[0].action.target_agent
    page = _made(demo, series, BUCKET_S, statistics={(agent, "low_success_rate"): steps})
    svg = _charts(page)[agent]
    rate = _group(svg, "rate")
    assert [len(p) for p in _subpaths(next(rate.iter(f"{SVG}path")).get("d", ""))] == [2]
    assert len([c for c in rate.iter(f"{SVG}circle") if c.get("class") == "lone"]) == 1
    statistic = _group(svg, "statistic")
    assert [len(p) for p in _subpaths(next(statistic.iter(f"{SVG}path")).get("d", ""))] == [2]
    assert len([c for c in statistic.iter(f"{SVG}circle") if c.get("class") == "lone"]) == 1


# -- the y-axis ---------------------------------------------------------------------------------


def test_y_labels_are_right_aligned_left_of_the_plot_and_durations_readable(
    demo: ReportData,
) -> None:
    for svg in _charts(render_report(demo)).values():
        left, _right = _plot(svg)
        labels = [
            el
            for el in svg.iter(f"{SVG}text")
            if el.get("class") != "tick" and float(el.get("x", "nan")) < left
        ]
        assert {el.text for el in labels} >= {"100%", "0%", "alarm", "0", "0 s"}
        for el in labels:
            assert el.get("text-anchor") == "end", el.text
        durations = [el.text or "" for el in labels if el.text not in ("100%", "0%", "alarm")]
        assert all(re.fullmatch(r"\d+(\.\d)? (ms|s|min|h)|0", t) for t in durations), durations
    slow = [SeriesPoint(T0 + i * 60, 10, 0, 900.0, 35_018.0) for i in range(5)]
    page = _made(demo, slow, 60)
    texts = [el.text for el in next(iter(_charts(page).values())).iter(f"{SVG}text")]
    assert "35 s" in texts
    assert not any("35018" in (t or "") for t in texts)


# -- the cycle tables ---------------------------------------------------------------------------


def _aligned_right(css: str) -> bool:
    return "num" in css.split()


class _Tables(HTMLParser):
    """Every table's rows as lists of (tag, right-aligned, text) cells; a row opened before
    the one before it was closed is an error, as is a cell outside a row."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[list[tuple[str, bool, str]]]]] = []
        self.row: list[tuple[str, bool, str]] | None = None
        self.cell: list[str] | None = None
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        css = dict(attrs).get("class") or ""
        if tag == "table":
            self.tables.append((css or dict(attrs).get("id") or "", []))
        elif tag == "tr":
            if self.row is not None:
                self.errors.append(f"a row opened inside another in table {len(self.tables)}")
            self.row = []
            self.tables[-1][1].append(self.row)
        elif tag in ("td", "th"):
            if self.row is None:
                self.errors.append("a cell outside a row")
                return
            self.cell = []
            self.row.append((tag, _aligned_right(css), ""))

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None and self.row:
            tag_, right, _ = self.row[-1]
            self.row[-1] = (tag_, right, "".join(self.cell))
            self.cell = None
        elif tag == "tr":
            self.row = None


def test_every_cell_of_a_table_is_under_its_header(demo: ReportData) -> None:
    """Each row closed, as many cells as headers, each header aligned as its figures are (a
    left-aligned header over right-aligned figures in a wide column puts them under the next
    header), and each case's figures under their own names."""
    parser = _Tables()
    parser.feed(render_report(demo))
    assert parser.errors == []
    cases = [rows for name, rows in parser.tables if name == "cases"]
    gates = [rows for name, rows in parser.tables if name == "gates"]
    assert cases
    assert gates
    for name, rows in parser.tables:
        header = rows[0]
        assert {tag for tag, _, _ in header} == {"th"}, name
        for row in rows[1:]:
            assert [tag for tag, _, _ in row] == ["td"] * len(header), name
            assert [right for _, right, _ in row] == [right for _, right, _ in header], name
    verdicts = [v for c in demo.cycles for v in c.verifications.values() if v.cases]
    assert len(verdicts) == len(cases)
    for verdict, rows in zip(verdicts, cases, strict=True):
        names = [text for _, _, text in rows[0]]
        for case, row in zip(verdict.cases, rows[1:], strict=True):
            cells = dict(zip(names, (text for _, _, text in row), strict=True))
            assert cells == {
                "case": case.case_id,
                "before": f"{case.before_passes}/{case.before_runs}",
                "after": f"{case.after_passes}/{case.after_runs}",
                "change": case.change,
            }
