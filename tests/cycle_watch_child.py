"""A process whose improvement cycle leaves a change watched on live runs, then is killed.

As a script it is the child: it opens a workspace (the simulated team; research-agent has no
eval suite), records 40 production runs of research-agent, runs a cycle whose improver cuts the
agent's ``max_tokens`` (a change that hurts), prints ``CYCLE <id>`` and ``WATCH <id>``, records
5 more runs (all fail; too few for the test to decide, so the watch stays open), prints
``RAN``, flushed, and sleeps until the parent kills it with SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from crash_child import quiet_logs  # noqa: E402
from fake_runtimes import RoutedRuntime, scripted_improver  # noqa: E402

from agentmend.infrastructure.models import ChangeType, IssueReport  # noqa: E402
from agentmend.infrastructure.settings import Settings  # noqa: E402
from agentmend.roles.schemas import ProposedAction  # noqa: E402

AGENT = "research-agent"


def improver_setting(field: str, value: object) -> RoutedRuntime:
    """The offline roles, except an improver that proposes exactly one change of ``field`` on
    research-agent."""
    action = ProposedAction(
        action_type=ChangeType.PARAMETER_ADJUSTMENT,
        target_agent=AGENT,
        target_field=field,
        new_value=value,
        rationale="proposed for the test",
        confidence=0.9,
    )
    return scripted_improver([action])


async def main(folder: Path) -> None:
    from agentmend.faces.workspace import Workspace

    quiet_logs()
    workspace = Workspace.open(folder, settings=Settings(yolo_mode=True))
    (workspace.team_dir / f"{AGENT}.evals.yaml").unlink()
    orchestrator = workspace.orchestrator(roles_runtime=improver_setting("max_tokens", 40))
    for n in range(40):
        await orchestrator.team.run(AGENT, f"question {n}")
    metrics = orchestrator.monitor.get_agent_metrics(AGENT)
    assert metrics is not None
    issue = IssueReport(
        agent_name=AGENT,
        error_type="low_success_rate",
        metrics=metrics.model_dump(),
        context="raised for the test",
        available_agents=orchestrator.team.names,
    )
    cycle = await orchestrator.run_improvement_cycle(issue)
    assert cycle.status == "watching", cycle.summary()
    assert cycle.watch is not None
    print(f"CYCLE {cycle.cycle_id}", flush=True)
    print(f"WATCH {cycle.watch.watch_id}", flush=True)
    for n in range(5):
        assert not (await orchestrator.team.run(AGENT, f"after {n}")).success
    orchestrator.monitor.flush()
    print("RAN", flush=True)
    await asyncio.sleep(600)  # the parent kills this process


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
