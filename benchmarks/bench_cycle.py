"""The improvement cycle on the simulated team: how often it detects, diagnoses and repairs.

A seeded set of scenarios (single faults, two faults at once, healthy controls), each on a fresh
copy of the six-agent team with the offline playbooks as roles:

1. warm up: ``--baseline`` tasks (every agent runs each), the detector's baseline;
2. inject the scenario's faults and run tasks until every faulty agent had a cycle (at most
   ``--max-tasks``); a healthy control just runs the same number of tasks;
3. run ``--after`` more tasks and measure each agent's success rate.

Figures: detection rate, right agent, right cause, repair rate (repairable faults), correct
refusals (a tool only an admin may grant) and correct non-changes (rate limits, unknown faults),
changes made on healthy controls (goal 0), regressions kept (must be 0), model calls per cycle,
and the median cycle time with its phases, next to the median ``execute_task`` time measured in
the same process, and the eval runs each verification on a suite made (both sides; with
``--verification fixed``, today's former design, to compare). Run:
``python benchmarks/bench_cycle.py [--scenarios 54] [--seed 2024] [--verification fixed]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentmend.infrastructure.definitions.permissions import SHELL_AND_WRITE_TOOLS
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import (
    SIMULATED_AGENTS,
    TEAM_AGENT_NAMES,
    Fault,
    FaultKind,
    SimulatedRuntime,
)
from agentmend.infrastructure.structured_logger import configure_logging
from agentmend.loop.cycle import CycleEvent, CycleResult
from agentmend.loop.meta_orchestrator import MetaOrchestrator

CATEGORY = {
    FaultKind.TRUNCATION: "truncation",
    FaultKind.TOOL_DENIED: "tool_denied",
    FaultKind.MODEL_RETIRED: "model_unavailable",
    FaultKind.SLOW: "timeout",
    FaultKind.FORMAT_DRIFT: "format_violation",
    FaultKind.RATE_LIMIT_STORM: "rate_limit",
    FaultKind.UNKNOWN: "unknown",
}
SINGLE_KINDS = list(CATEGORY)
REPAIRABLE = {
    FaultKind.TRUNCATION,
    FaultKind.TOOL_DENIED,
    FaultKind.MODEL_RETIRED,
    FaultKind.SLOW,
    FaultKind.FORMAT_DRIFT,
}
PHASES = (
    ("analysis", "cycle_started", "analysis_completed"),
    ("proposal", "analysis_completed", "actions_proposed"),
    ("gates", "actions_proposed", "gate_checked"),
    ("suite before + apply", "gate_checked", "change_applied"),
    ("verification + keep", "change_applied", "cycle_finished"),
)
"""(name, from step, to step); the last event of a step counts (the sixth gate, say)."""
GRANTABLE = [
    a for a in TEAM_AGENT_NAMES if SIMULATED_AGENTS[a].extra_tool not in SHELL_AND_WRITE_TOOLS
]
NEEDS_ADMIN = [a for a in TEAM_AGENT_NAMES if a not in GRANTABLE]


def expected_outcome(agent: str, kind: FaultKind) -> str:
    """What a correct loop does: repair, refuse (needs an admin), or change nothing."""
    if (
        kind is FaultKind.TOOL_DENIED
        and SIMULATED_AGENTS[agent].extra_tool in SHELL_AND_WRITE_TOOLS
    ):
        return "refuse"
    return "repair" if kind in REPAIRABLE else "no_change"


@dataclass
class Scenario:
    number: int
    seed: int
    faults: list[tuple[str, FaultKind]]

    @property
    def label(self) -> str:
        if not self.faults:
            return "healthy"
        return " + ".join(f"{kind.value}@{agent}" for agent, kind in self.faults)


@dataclass
class Outcome:
    scenario: Scenario
    cycles: list[CycleResult] = field(default_factory=list)
    warm_rate: dict[str, float] = field(default_factory=dict)
    after_rate: dict[str, float] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    changes: int = 0
    task_ms: list[float] = field(default_factory=list)
    events: dict[str, list[CycleEvent]] = field(default_factory=dict)
    crashed: str | None = None


def scenarios(count: int, seed: int) -> list[Scenario]:
    """Single faults (kinds in turn), two faults at once, healthy controls: about 5:2:2."""
    rng = random.Random(seed)
    out: list[Scenario] = []
    for number in range(count):
        slot = number % 9
        if slot < 5:
            index = number // 9 * 5 + slot
            kind = SINGLE_KINDS[index % len(SINGLE_KINDS)]
            agents = list(TEAM_AGENT_NAMES)
            if kind is FaultKind.TOOL_DENIED:  # alternate: a tool anyone may grant, or not
                agents = GRANTABLE if index // len(SINGLE_KINDS) % 2 == 0 else NEEDS_ADMIN
            faults = [(rng.choice(agents), kind)]
        elif slot < 7:
            first, second = rng.sample(TEAM_AGENT_NAMES, 2)
            kinds = rng.sample(sorted(REPAIRABLE, key=str), 2)
            faults = [(first, kinds[0]), (second, kinds[1])]
        else:
            faults = []
        out.append(Scenario(number, rng.randrange(1 << 30), faults))
    return out


def fault_for(kind: FaultKind) -> Fault:
    if kind is FaultKind.RATE_LIMIT_STORM:
        return Fault(kind, calls=30)  # long enough to be detected
    return Fault(kind)


async def run_scenario(scenario: Scenario, args: argparse.Namespace, root: Path) -> Outcome:
    outcome = Outcome(scenario)
    settings = Settings(
        baseline_n=args.baseline,
        false_alarm_rate=args.false_alarm_rate,
        detection_mode=args.detection,
        verification_design=args.verification,
    )

    def keep(event: CycleEvent) -> None:
        outcome.events.setdefault(event.cycle_id, []).append(event)

    folder = root / f"s{scenario.number}"
    with MetaOrchestrator.offline_simulated(
        folder / "team", seed=scenario.seed, settings=settings, on_progress=keep
    ) as orchestrator:
        runtime = orchestrator.team.runtime
        assert isinstance(runtime, SimulatedRuntime)

        async def task(prompt: str) -> dict[str, bool]:
            started = time.perf_counter()
            result = await orchestrator.execute_task(prompt)
            outcome.task_ms.append((time.perf_counter() - started) * 1000)
            outcome.cycles.extend(result.cycles)
            return {name: r.success for name, r in result.results.items()}

        warm: Counter[str] = Counter()
        for n in range(args.baseline):
            warm.update(name for name, ok in (await task(f"warm {n}")).items() if ok)
        outcome.warm_rate = {name: warm[name] / args.baseline for name in TEAM_AGENT_NAMES}
        for agent, kind in scenario.faults:
            runtime.inject(agent, fault_for(kind))

        def settled(agent: str, kind: FaultKind) -> bool:
            # a repairable fault is settled once its fix is kept, any other once a cycle ran,
            # so the success rate measured afterwards is the rate after the loop acted
            if expected_outcome(agent, kind) == "repair":
                return kept_on(outcome, agent)
            return first_cycle(outcome, agent) is not None

        for n in range(args.max_tasks):
            await task(f"fault {n}")
            if scenario.faults and all(settled(a, k) for a, k in scenario.faults):
                break
        after: Counter[str] = Counter()
        for n in range(args.after):
            after.update(name for name, ok in (await task(f"after {n}")).items() if ok)
        outcome.after_rate = {name: after[name] / args.after for name in TEAM_AGENT_NAMES}
        history = orchestrator.manager.get_history(limit=1000)
        outcome.changes = len(history)
        outcome.statuses = Counter(record.status.value for record in history)
    return outcome


def first_cycle(outcome: Outcome, agent: str) -> CycleResult | None:
    return next((c for c in outcome.cycles if c.issue.agent_name == agent), None)


def kept_on(outcome: Outcome, agent: str) -> bool:
    return any(
        c.status == "kept" and any(a.target_agent == agent for a in c.applied_actions)
        for c in outcome.cycles
    )


def pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "n/a"


def report(outcomes: list[Outcome], elapsed_s: float) -> None:
    faults = [(o, agent, kind) for o in outcomes for agent, kind in o.scenario.faults]
    detected = [(o, a, k, c) for o, a, k in faults if (c := first_cycle(o, a)) is not None]
    right_agent = [x for x in detected if x[3].analysis and x[3].analysis.agent_name == x[1]]
    right_cause = [
        x for x in detected if x[3].analysis and x[3].analysis.cause_category == CATEGORY[x[2]]
    ]
    repairable = [(o, a, k) for o, a, k in faults if expected_outcome(a, k) == "repair"]
    repaired = [
        (o, a) for o, a, _ in repairable if kept_on(o, a) and o.after_rate[a] >= args_ns.recovered
    ]
    refusals = [(o, a) for o, a, k in faults if expected_outcome(a, k) == "refuse"]
    refused_ok = [
        (o, a)
        for o, a in refusals
        if (c := first_cycle(o, a)) is not None and c.status == "refused" and not kept_on(o, a)
    ]
    no_change = [(o, a) for o, a, k in faults if expected_outcome(a, k) == "no_change"]
    unchanged_ok = [
        (o, a)
        for o, a in no_change
        if first_cycle(o, a) is not None
        and not any(act.target_agent == a for c in o.cycles for act in c.applied_actions)
    ]
    healthy = [o for o in outcomes if not o.scenario.faults]
    healthy_changes = sum(o.changes for o in healthy)
    healthy_cycles = sum(len(o.cycles) for o in healthy)
    regressions = 0
    unneeded = 0
    for o in outcomes:
        faulty = {agent for agent, _ in o.scenario.faults}
        for c in o.cycles:
            if c.status != "kept":
                continue
            verdicts = c.verifications.values()
            for action in c.applied_actions:
                agent = action.target_agent
                if agent not in faulty:
                    unneeded += 1
                worse = o.after_rate[agent] < o.warm_rate[agent] - 0.15
                if worse or any(v.regressions for v in verdicts):
                    regressions += 1
    cycles = [c for o in outcomes for c in o.cycles]
    calls = [c.model_calls for c in cycles]
    # eval runs of each suite verification, both sides (the runs before the change included)
    eval_runs = [
        sum(row.before_runs + row.after_runs for row in v.cases)
        for c in cycles
        for v in c.verifications.values()
        if v.cases
    ]
    times = [c.duration_ms for c in cycles]
    task_ms = [ms for o in outcomes for ms in o.task_ms]
    statuses = Counter(c.status for c in cycles)

    if not cycles:
        print("no cycle ran")
        return
    median_cycle, median_task = statistics.median(times), statistics.median(task_ms)
    by_status = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    faulty_count = len(outcomes) - len(healthy)
    rows = [
        ("scenarios", f"{len(outcomes)} ({faulty_count} faulty, {len(healthy)} healthy)"),
        ("faults injected", str(len(faults))),
        ("detection rate", pct(len(detected), len(faults))),
        ("right agent (of detected)", pct(len(right_agent), len(detected))),
        ("right cause (of detected)", pct(len(right_cause), len(detected))),
        ("repair rate (repairable faults)", pct(len(repaired), len(repairable))),
        ("correct refusals (tool needs admin)", pct(len(refused_ok), len(refusals))),
        ("correct non-changes (rate limit, unknown)", pct(len(unchanged_ok), len(no_change))),
        ("changes made on healthy controls (goal 0)", f"{healthy_changes}"),
        ("cycles on healthy controls", f"{healthy_cycles}"),
        ("kept changes on agents without a fault", str(unneeded)),
        ("regressions kept (must be 0)", str(regressions)),
        ("cycles run", f"{len(cycles)}: {by_status}"),
        ("model calls per cycle (median / mean)", f"{statistics.median(calls):.0f} / "
         f"{statistics.fmean(calls):.1f}"),
        ("eval runs per suite verification (median / mean / n)",
         f"{statistics.median(eval_runs):.0f} / {statistics.fmean(eval_runs):.1f} / "
         f"{len(eval_runs)}" if eval_runs else "none"),
        ("cycle time, median / p90 (ms)", f"{median_cycle:.1f} / {_p90(times):.1f}"),
        ("execute_task time, median (ms)", f"{median_task:.2f}"),
        ("median cycle / median execute_task", f"{median_cycle / median_task:.0f}x"),
        ("wall time (s)", f"{elapsed_s:.1f}"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    print(f"{'figure':<{width}}  value")
    print(f"{'-' * width}  {'-' * 40}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print()
    phase_rows = []
    for name, start, end in PHASES:
        spans = []
        for o in outcomes:
            for events in o.events.values():
                at = {e.step: e.timestamp for e in events}
                if start in at and end in at:
                    spans.append((at[end] - at[start]).total_seconds() * 1000)
        if spans:
            phase_rows.append(f"{name} {statistics.median(spans):.1f}")
    print("median phase times of applied cycles (ms): " + ", ".join(phase_rows))
    for o, a, k, c in detected:
        if c not in [x[3] for x in right_cause]:
            category = c.analysis.cause_category if c.analysis else None
            print(f"wrong cause: {o.scenario.number} {k.value}@{a}: {category}; {c.summary()}")
    for o in outcomes:
        for c in o.cycles:
            if c.status in ("rolled_back", "error", "invalid_proposal", "analysis_failed"):
                print(
                    f"{c.status}: scenario {o.scenario.number} ({o.scenario.label}): {c.summary()}"
                )
    misses = [
        f"{o.scenario.number}:{k.value}@{a}" for o, a, k in repairable if (o, a) not in repaired
    ]
    if misses:
        print("not repaired: " + ", ".join(misses))
        for o, a, k in repairable:
            if (o, a) in repaired:
                continue
            c = first_cycle(o, a)
            print(f"  {o.scenario.number} {k.value}@{a}: {c.summary() if c else 'not detected'}")


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


args_ns = argparse.Namespace(recovered=0.85)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=54)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--baseline", type=int, default=50)
    parser.add_argument("--max-tasks", type=int, default=40)
    parser.add_argument("--after", type=int, default=50)
    parser.add_argument("--false-alarm-rate", type=float, default=1e-4)
    parser.add_argument("--detection", choices=("statistical", "rules"), default="statistical")
    parser.add_argument("--recovered", type=float, default=0.85, help="success rate = repaired")
    parser.add_argument(
        "--verification",
        choices=("sequential", "fixed"),
        default="sequential",
        help="how changes are verified on their eval suites",
    )
    args = parser.parse_args()
    args_ns.recovered = args.recovered
    # the figures are the loop's, not the console's: only errors, and on stderr
    configure_logging(logging.ERROR, stream=sys.stderr)
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    crashes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="agentmend-bench-") as tmp:
        for scenario in scenarios(args.scenarios, args.seed):
            try:
                outcomes.append(await run_scenario(scenario, args, Path(tmp)))
            except Exception as exc:  # reported, and left out of the figures
                crashed = Outcome(scenario, crashed=f"{type(exc).__name__}: {exc}")
                crashes.append(crashed)
    report(outcomes, time.perf_counter() - started)
    for crashed in crashes:
        print(
            f"scenario {crashed.scenario.number} ({crashed.scenario.label}) crashed: "
            f"{crashed.crashed}"
        )


if __name__ == "__main__":
    asyncio.run(main())
