"""``make demo``: the whole loop on the simulated team, non-interactive, in a few seconds.

1. healthy traffic fills each agent's baseline;
2. a truncation fault is injected into research-agent: detected, diagnosed by questioning,
   fixed (max_tokens raised), verified on its eval suite, kept; its success recovers;
3. a timeout fault is injected into quality-agent while the improver's playbook is swapped for
   one that proposes the wrong fix (raise max_tokens): verification rejects it and it is rolled
   back, the definition files byte-identical to before;
4. with the real playbook back, the next cycle fixes the timeout.

What is simulated is said so: the team runs on ``SimulatedRuntime``, the roles on the offline
playbooks, baselines are 40 runs instead of 500 so detection starts quickly, and changes are not
put to a human (yolo mode, recorded as such in the audit).
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentmend.faces.session.views import cycle_event_line
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.llm.offline import OfflineCall, OfflineRuntime
from agentmend.infrastructure.models import ChangeType
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.simulation import FaultKind, SimulatedRuntime
from agentmend.loop.cycle import CycleEvent, CycleResult
from agentmend.loop.meta_orchestrator import MetaOrchestrator
from agentmend.roles.prompt_blocks import extract_block
from agentmend.roles.schemas import ImprovementPlan, ProposedAction

__all__ = ["DemoStep", "run_demo"]

BASELINE_RUNS = 40
MAX_TASKS_TO_DETECT = 120


@dataclass
class DemoStep:
    name: str
    expected: str
    tasks_to_detect: int | None = None
    cycle: CycleResult | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.cycle is not None and self.cycle.status == self.expected


async def _wrong_fix(call: OfflineCall) -> BaseModel | str:
    """A deliberately wrong improver: raise max_tokens whatever the cause."""
    config = extract_block(call.prompt, "agent_config")
    current = int(config.get("max_tokens") or 1024)
    return ImprovementPlan(
        summary="(demo) the wrong fix on purpose: raise max_tokens whatever the cause",
        actions=[
            ProposedAction(
                action_type=ChangeType.PARAMETER_ADJUSTMENT,
                target_agent=str(config["name"]),
                target_field="max_tokens",
                new_value=current * 2,
                rationale="(demo) a fix that does not address the cause",
                confidence=0.9,
            )
        ],
    )


def _definitions_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.md")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


async def _until_cycle(orchestrator: MetaOrchestrator, agent: str, step: DemoStep) -> None:
    for n in range(1, MAX_TASKS_TO_DETECT + 1):
        task = await orchestrator.execute_task(f"Explain topic {n} to a new learner")
        if step.tasks_to_detect is None and any(i.agent_name == agent for i in task.issues):
            step.tasks_to_detect = n
        cycles = [c for c in task.cycles if agent in (c.issue.agent_name, _responsible(c))]
        if cycles:
            step.cycle = cycles[-1]
            return
    step.notes.append(f"no cycle for {agent} within {MAX_TASKS_TO_DETECT} tasks")


def _responsible(cycle: CycleResult) -> str | None:
    return cycle.analysis.agent_name if cycle.analysis is not None else None


async def _success_rate(orchestrator: MetaOrchestrator, agent: str, tasks: int) -> float:
    ok = 0
    for n in range(tasks):
        result = await orchestrator.team.run(agent, f"Follow-up question {n}")
        ok += result.success
    return ok / tasks


async def run_demo(
    console: Console,
    *,
    workspace: Path | None = None,
    seed: int = 0,
    store_url: str | None = None,
) -> int:
    """Run the scenario; print each step and a summary. 0 when every step went as designed.

    ``store_url`` puts the store elsewhere than the workspace's file (a PostgreSQL database).
    """
    with tempfile.TemporaryDirectory(prefix="agentmend-demo-") as scratch:
        folder = workspace if workspace is not None else Path(scratch) / "workspace"
        settings = Settings(baseline_n=BASELINE_RUNS, yolo_mode=True, store_url=store_url)

        def show(event: CycleEvent) -> None:
            console.print(cycle_event_line(event))

        async with Workspace.open(folder, settings=settings) as ws:
            orchestrator = ws.orchestrator(seed=seed, auto_improve=True, on_progress=show)
            simulation = orchestrator.team.runtime
            roles = orchestrator.roles_runtime
            if not isinstance(simulation, SimulatedRuntime) or not isinstance(
                roles, OfflineRuntime
            ):
                console.print("the demo runs on the offline provider only")
                return 2
            console.print(Text(__doc__ or "", style="dim"))
            console.print(Text(f"workspace: {ws.path}", style="bold"))

            console.print(Text(f"1. healthy traffic: {BASELINE_RUNS + 5} questions", "bold"))
            for n in range(BASELINE_RUNS + 5):
                await orchestrator.execute_task(f"Warm-up question {n}")

            fixed = DemoStep("truncation in research-agent: fix kept", "kept")
            console.print(Text(f"\n2. {fixed.name}", "bold"))
            simulation.inject("research-agent", FaultKind.TRUNCATION)
            await _until_cycle(orchestrator, "research-agent", fixed)
            rate = await _success_rate(orchestrator, "research-agent", 30)
            fixed.notes.append(f"success rate after the fix: {rate:.0%} over 30 runs")
            console.print(f"   {fixed.notes[-1]}")

            wrong = DemoStep("timeout in quality-agent, wrong fix: rolled back", "rolled_back")
            console.print(Text(f"\n3. {wrong.name}", "bold"))
            console.print("   (demo: the improver's playbook is swapped for a wrong one)")
            real_improver = roles.policies["self-improver"]
            roles.policies["self-improver"] = _wrong_fix
            before = _definitions_digest(ws.team_dir)
            simulation.inject("quality-agent", FaultKind.SLOW)
            try:
                await _until_cycle(orchestrator, "quality-agent", wrong)
            finally:
                roles.policies["self-improver"] = real_improver
            identical = _definitions_digest(ws.team_dir) == before
            wrong.notes.append(
                "definition files byte-identical after rollback"
                if identical
                else "definition files DIFFER after rollback"
            )
            console.print(f"   {wrong.notes[-1]}")

            healed = DemoStep("timeout in quality-agent, real playbook: fix kept", "kept")
            console.print(Text(f"\n4. {healed.name}", "bold"))
            await _until_cycle(orchestrator, "quality-agent", healed)

            chain = orchestrator.manager.verify_audit_chain()
            steps = [fixed, wrong, healed]
            console.print(_summary(steps, bool(chain)))
            ok = all(step.ok for step in steps) and identical and bool(chain)
            console.print(
                Text(
                    "demo finished as designed" if ok else "demo did NOT go as designed",
                    style="bold green" if ok else "bold red",
                )
            )
            return 0 if ok else 1


def _summary(steps: list[DemoStep], chain_ok: bool) -> Table:
    table = Table(title="Summary")
    for column in ("step", "detected after", "cycle", "eval score", "notes"):
        table.add_column(column)
    for step in steps:
        cycle = step.cycle
        verdict = cycle.verification if cycle is not None else None
        score = "-"
        if verdict is not None and verdict.before_score is not None:
            score = f"{verdict.before_score:.2f} -> {verdict.after_score:.2f}"
        table.add_row(
            step.name,
            f"{step.tasks_to_detect} tasks" if step.tasks_to_detect else "-",
            Text(cycle.status if cycle is not None else "none", "green" if step.ok else "red"),
            score,
            "; ".join(step.notes),
        )
    table.caption = f"audit chain: {'verified' if chain_ok else 'DOES NOT VERIFY'}"
    return table
