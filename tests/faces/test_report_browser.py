"""The report page as a person sees it: opened in headless Chromium (Debian's), through
Playwright, from the file and from `agentmend serve`.

Each test asserts no console error and no failed resource load, that every agent's chart and
the cycle sections are there with the right numbers, and saves a screenshot as an artifact
(``AGENTMEND_ARTIFACTS``, default ``test-artifacts/`` in the checkout). Without Chromium or
Playwright the tests skip with the reason; CI (``AGENTMEND_REQUIRE_SERVICES=1``) fails instead.
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_run import demo_workspace
from services import chromium_path, unavailable
from test_report import start_server, stop_server

from agentmend.faces.cli.app import main

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("AGENTMEND_ARTIFACTS", ROOT / "test-artifacts"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("Playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            args=[
                "--no-sandbox",  # the tests may run as root
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_workspace(tmp_path_factory.mktemp("browser") / "ws")


def _agents(workspace: Path) -> dict[str, int]:
    with sqlite3.connect(workspace / "agentmend.db") as conn:
        rows = conn.execute(
            "SELECT agent, COUNT(*) FROM executions WHERE source = 'run' GROUP BY agent"
        ).fetchall()
    return {agent: int(n) for agent, n in rows}


def _look(browser: Any, url: str, shot: str, *, script: bool = True) -> dict[str, Any]:
    """Open ``url``; what the page shows, with every console error and failed load."""
    context = browser.new_context(
        java_script_enabled=script, viewport={"width": 1200, "height": 900}
    )
    page = context.new_page()
    errors: list[str] = []
    failed: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    page.goto(url, wait_until="load")
    seen = {
        "charts": page.locator("div.agent-chart").count(),
        "chart_names": page.locator("div.agent-chart h3").all_inner_texts(),
        "cycles": page.locator("section.cycle").count(),
        "kept_markers": page.locator('g.change-marker[data-status="kept"]').count(),
        "rolled_back_markers": page.locator('g.change-marker[data-status="rolled_back"]').count(),
        "statistics": page.locator("div.agent-chart g.statistic").count(),
        "alarms_drawn": page.locator('g.statistic[data-peak="1.0000"]').count(),
        "agent_rows": {
            row.locator("td").nth(0).inner_text(): int(row.locator("td").nth(1).inner_text())
            for row in page.locator("#agents tr[data-agent]").all()
        },
        "chain": page.locator("#chain").inner_text(),
        "summary": json.loads(page.locator("#summary").text_content() or "{}"),
        "filter_visible": page.locator("#filter").is_visible(),
    }
    if script:
        page.fill("#filter", "research")
        seen["visible_after_filter"] = [
            el.get_attribute("data-agent")
            for el in page.locator("div.agent-chart").all()
            if el.is_visible()
        ]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    context.close()
    seen["errors"] = errors
    seen["failed"] = failed
    return seen


def _check(seen: dict[str, Any], agents: dict[str, int]) -> None:
    assert seen["errors"] == []
    assert seen["failed"] == []
    assert seen["charts"] == len(agents)
    assert sorted(seen["chart_names"]) == sorted(agents)
    assert seen["agent_rows"] == agents
    assert seen["cycles"] >= 3
    assert seen["kept_markers"] >= 2
    assert seen["rolled_back_markers"] >= 1
    assert seen["statistics"] == 2 * len(agents)  # failures and latency, beneath each chart
    assert seen["alarms_drawn"] >= 1
    assert seen["chain"].startswith("audit chain verified")
    assert seen["summary"]["agents"] == len(agents)


@pytest.mark.slow
def test_the_report_file_in_chromium(browser: Any, workspace: Path, tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    assert main(["report", "--workspace", str(workspace), "-o", str(target)]) == 0
    agents = _agents(workspace)
    seen = _look(browser, target.as_uri(), "report-file.png")
    _check(seen, agents)
    assert seen["filter_visible"] is True
    assert seen["visible_after_filter"] == ["research-agent"]
    plain = _look(browser, target.as_uri(), "report-file-no-js.png", script=False)
    _check(plain, agents)  # readable with JavaScript off: the charts are SVG, not script
    assert plain["filter_visible"] is False


@pytest.mark.slow
def test_the_served_page_in_chromium(browser: Any, workspace: Path) -> None:
    process, url = start_server(workspace)
    try:
        seen = _look(browser, url, "report-served.png")
    finally:
        stop_server(process)
    _check(seen, _agents(workspace))


_LAYOUT = """() => {
  const box = (el) => el.getBoundingClientRect();
  const textBox = (cell) => {
    const range = document.createRange();
    range.selectNodeContents(cell);
    return range.getBoundingClientRect();
  };
  const charts = [...document.querySelectorAll('svg.chart')].map((svg) => {
    const plot = box(svg.querySelector('line.threshold'));
    // the y labels: a time tick centred near the plot's left edge reaches into the margin too,
  // below the bands, and is checked with the other ticks
  const inMargin = [...svg.querySelectorAll('text:not(.tick)')].filter(
    (t) => box(t).left < plot.left);
    return {
      plotLeft: plot.left,
      marginLabels: inMargin.map((t) => ({text: t.textContent, right: box(t).right})),
      ticks: [...svg.querySelectorAll('text.tick')].map((t) => {
        const b = box(t);
        return {text: t.textContent, left: b.left, right: b.right};
      }),
    };
  });
  const tables = [...document.querySelectorAll('table')].map((table) => {
    const rows = [...table.rows];
    const header = [...rows[0].cells].map(textBox);
    return rows.slice(1).map((row) => [...row.cells].map((cell, i) => {
      const b = textBox(cell);
      const h = header[i];
      const under = b.width === 0 || (b.left < h.right && h.left < b.right);
      return {text: cell.textContent, under};
    }));
  });
  return {charts, tables};
}"""


@pytest.mark.slow
def test_labels_keep_off_the_plot_and_figures_sit_under_their_headers(
    browser: Any, workspace: Path, tmp_path: Path
) -> None:
    """As laid out by Chromium: every y-axis label ends left of the plot, the time axis's
    labels do not overlap, and each table cell's text is under its own header's text."""
    target = tmp_path / "report.html"
    assert main(["report", "--workspace", str(workspace), "-o", str(target)]) == 0
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        page = context.new_page()
        page.goto(target.as_uri(), wait_until="load")
        layout = page.evaluate(_LAYOUT)
    finally:
        context.close()
    assert layout["charts"]
    for chart in layout["charts"]:
        assert {label["text"] for label in chart["marginLabels"]} >= {"100%", "0%", "alarm"}
        for label in chart["marginLabels"]:
            assert label["right"] <= chart["plotLeft"], label
        ticks = chart["ticks"]
        assert len(ticks) >= 3
        for left, right in itertools.pairwise(ticks):
            assert left["right"] < right["left"], (left, right)
    misplaced = [
        cell["text"]
        for table in layout["tables"]
        for row in table
        for cell in row
        if not cell["under"]
    ]
    assert misplaced == []
