"""How fast `agentmend status` and the report page are on a big store.

Builds a store of AGENTS x RUNS_PER_AGENT runs (default 100 x 100,000: ten million) through the
monitor's own write path in large batches (the executions rows, the per-minute series and its
rollups in the same transactions, as the monitor writes them), over 30 days, the detector's
statistic series as a check every 10 minutes would leave it (random peaks), plus CHANGES changes
(applied and kept or rolled back through the ImprovementManager, so each has its audit rows),
each with the recorded events of a real cycle (the demo's kept cycle, run once by the real
command, re-recorded under a new cycle id naming the change), so the report folds CHANGES cycles.
Then measures, in this process: the status read (`agent_statuses`), the whole `agentmend status
--json` command (chain check included), the audit chain's full verification on its own,
`agentmend show` of the oldest change, the report's data read (which includes that
verification) and its rendering, and the page's size; and, as whole processes,
`agentmend status --json` and `agentmend --version` (the command's start-up cost on its own).

    python benchmarks/bench_report.py                 # 100 agents x 100,000 runs, 500 changes
    python benchmarks/bench_report.py 20 10000 50     # a quick run
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from agentmend.faces.cli.app import main as agentmend
from agentmend.faces.report.data import agent_statuses, collect_report
from agentmend.faces.report.page import render_report
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.decisions import record_decision
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.detection.series import StatisticPoint, add_points
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.monitoring.execution_store import ExecutionStore
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.structured_logger import configure_logging
from agentmend.loop.cycle import DECISION_PREFIX, CycleEvent, cycle_events, list_cycle_ids

T = TypeVar("T")

AGENTS, RUNS_PER_AGENT, CHANGES = 100, 100_000, 500
DAYS = 30
BATCH = 50_000
CHECK_EVERY_S = 600


def _demo_cycle(folder: Path) -> list[CycleEvent]:
    """The events of the demo's last kept cycle, from a demo run by the real command."""
    demo = folder / "demo"
    subprocess.run(
        [sys.executable, "-m", "agentmend.faces.cli", "demo", "--workspace", str(demo)],
        check=True,
        capture_output=True,
    )
    with Store(demo / "agentmend.db") as store:
        for cycle_id in reversed(list_cycle_ids(store)):
            events = cycle_events(store, cycle_id)
            if events[-1].data.get("status") == "kept":
                return events
    raise RuntimeError("the demo kept no change")


def _record_cycle(store: Store, template: list[CycleEvent], n: int, change_id: str) -> None:
    for event in template:
        data = dict(event.data)
        if event.step == "change_applied":
            data["change_ids"] = [change_id]
        payload = event.model_copy(update={"cycle_id": f"bench-{n:05d}", "data": data})
        record_decision(
            store,
            DECISION_PREFIX + event.step,
            agent_name=event.agent_name,
            payload=payload.model_dump(mode="json", exclude={"timestamp"}),
        )


def _add_statistics(store: Store, agents: int, start: float, rng: random.Random) -> None:
    """The detector's statistic series as a detector checking every 10 minutes leaves it: one
    point per agent and chart per check, through the detector's own write path."""
    IssueLedger(store)  # migrates the series
    checks = DAYS * 86_400 // CHECK_EVERY_S
    for first in range(0, checks, 144):  # a day of checks per transaction
        points = [
            StatisticPoint(
                f"agent-{a:03d}", kind, start + (c + 1) * CHECK_EVERY_S, rng.random(), 1.0, 5.0
            )
            for c in range(first, min(checks, first + 144))
            for a in range(agents)
            for kind in ("low_success_rate", "performance_regression")
        ]
        with store.transaction() as conn:
            add_points(conn, points)


def _build(folder: Path, agents: int, runs: int, changes: int) -> tuple[Store, float]:
    store = Store(folder / "agentmend.db")
    executions = ExecutionStore(store, "bench")
    rng = random.Random(7)
    start = time.time() - DAYS * 86_400
    step = DAYS * 86_400 / runs
    t0 = time.perf_counter()
    batch: list[tuple[object, ...]] = []
    for i in range(runs):
        ts = start + i * step
        for a in range(agents):
            ok = rng.random() > 0.05
            batch.append(
                (
                    f"agent-{a:03d}",
                    "run",
                    ok,
                    rng.lognormvariate(6.0, 0.5),
                    None,
                    10,
                    20,
                    0.0,
                    ts,
                    None,
                )
            )
        if len(batch) >= BATCH:
            executions.insert(batch)  # type: ignore[arg-type]
            batch = []
    if batch:
        executions.insert(batch)  # type: ignore[arg-type]
    build_s = time.perf_counter() - t0
    _add_statistics(store, agents, start, rng)
    team = folder / "team"
    team.mkdir()
    template = _demo_cycle(folder)
    manager = ImprovementManager(store=store)
    for n in range(changes):
        agent = f"agent-{n % agents:03d}"
        record = manager.apply(
            ImprovementAction(
                target_agent=agent,
                action_type=ChangeType.PROMPT_MODIFICATION,
                old_value=None,
                new_value=f"v{n}",
                rationale="benchmark",
                confidence_score=0.9,
            ),
            path=f"{agent}.md",
            new_content=f"prompt {n}\n",
            root=team,
        )
        _record_cycle(store, template, n, record.change_id)
        if n % 3:
            manager.mark_kept(record.change_id)
        else:
            manager.rollback_by_id(record.change_id, reason="benchmark")
    manager.close()
    return store, build_s


def _status_command(folder: Path) -> None:
    """``agentmend status --json`` in this process: the command's whole work, audit chain
    verification included, without the interpreter's start-up."""
    with contextlib.redirect_stdout(io.StringIO()):
        code = agentmend(["status", "--json", "--workspace", str(folder)])
    if code != 0:
        raise RuntimeError(f"agentmend status exited {code}")


def _show(folder: Path, change_id: str) -> dict[str, object]:
    """``agentmend show CHANGE --json`` in this process, its output parsed."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = agentmend(["show", change_id, "--json", "--workspace", str(folder)])
    if code != 0:
        raise RuntimeError(f"agentmend show exited {code}")
    shown: dict[str, object] = json.loads(out.getvalue())
    return shown


def _median_ms(fn: Callable[[], T], repeat: int = 5) -> tuple[float, T]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), result


def main() -> None:
    configure_logging("WARNING")
    agents = int(sys.argv[1]) if len(sys.argv) > 1 else AGENTS
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else RUNS_PER_AGENT
    changes = int(sys.argv[3]) if len(sys.argv) > 3 else CHANGES
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store, build_s = _build(folder, agents, runs, changes)
        total = agents * runs
        print(
            f"store: {agents} agents x {runs:,} runs = {total:,} runs, {changes} changes "
            f"(built in {build_s:.0f} s, {total / build_s:,.0f} runs/s through the writer)"
        )
        status_ms, statuses = _median_ms(lambda: agent_statuses(store, baseline_n=500))
        command_ms, _ = _median_ms(lambda: _status_command(folder))
        manager = ImprovementManager(store=store, recover=False)
        chain_ms, chain = _median_ms(lambda: manager.verify_audit_chain(repair=False))
        oldest = manager.get_history(limit=changes)[0].change_id
        show_ms, shown = _median_ms(lambda: _show(folder, oldest), repeat=3)
        data_ms, data = _median_ms(lambda: collect_report(store, manager, baseline_n=500), repeat=3)
        render_ms, page = _median_ms(lambda: render_report(data), repeat=3)
        size = len(page.encode())
        print(
            f"status in-process (agent_statuses): {status_ms:.1f} ms for "
            f"{len(statuses):,} agents (goal < 100 ms)"
        )
        print(
            f"`agentmend status --json` in-process (the whole command, chain check included): "
            f"{command_ms:.1f} ms"
        )
        print(
            f"audit chain, full verification: {chain_ms:.1f} ms for {chain.rows_checked:,} rows "
            f"({'verified' if chain.ok else 'DOES NOT VERIFY'})"
        )
        print(
            f"`agentmend show` of the oldest change, in-process: {show_ms:.0f} ms "
            f"(its cycle {'found' if shown['cycle_id'] else 'NOT FOUND'})"
        )
        print(
            f"report: read {data_ms:.0f} ms + render {render_ms:.0f} ms = "
            f"{data_ms + render_ms:.0f} ms (goal < 5,000 ms); page {size / 1e6:.2f} MB "
            f"(goal < 5 MB); {len(data.cycles) + len(data.older_cycles)} cycles, "
            f"{len(data.changes)} changes"
        )
        manager.close()
        store.close()
        cmd = [sys.executable, "-m", "agentmend.faces.cli"]
        whole = []
        startup = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([*cmd, "--version"], check=True, capture_output=True)
            startup.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            subprocess.run(
                [*cmd, "status", "--json", "--workspace", str(folder)],
                check=True,
                capture_output=True,
            )
            whole.append((time.perf_counter() - t0) * 1000)
        print(
            f"`agentmend status --json` as a process: {statistics.median(whole):.0f} ms, of "
            f"which the command's start-up (`agentmend --version`) is "
            f"{statistics.median(startup):.0f} ms"
        )


if __name__ == "__main__":
    main()
