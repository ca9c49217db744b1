"""The public surface: faults, the roles' output models, the offline role runtime, and the
role agent names a user's team may not reuse."""

from __future__ import annotations

from pathlib import Path

import pytest

import agents
from agents.roles.playbooks import IMPROVER_NAME, MEDIATOR_NAME, SUPERVISOR_NAME
from agents.roles.role_names import ROLE_AGENT_NAMES, RoleNameClash
from agents.roles.schemas import MediatorReport
from infrastructure.llm.offline import OfflineRuntime
from infrastructure.simulation import SimulatedRuntime, copy_team
from infrastructure.spec import load_agent_specs


def test_faults_role_outputs_and_the_offline_role_runtime_are_exported() -> None:
    for name in ("Fault", "FaultKind", "MediatorReport", "ImprovementPlan", "ProposedAction",
                 "SupervisorReview", "offline_role_runtime", "ROLE_AGENT_NAMES",
                 "RoleNameClash", "AuditChainBroken", "PermissionRequired"):  # fmt: skip
        assert name in agents.__all__
        assert getattr(agents, name) is not None
    assert agents.MediatorReport is MediatorReport
    assert isinstance(agents.offline_role_runtime(), OfflineRuntime)
    assert {"socratic-mediator", "self-improver", "supervisor"} == agents.ROLE_AGENT_NAMES
    assert {MEDIATOR_NAME, IMPROVER_NAME, SUPERVISOR_NAME} == ROLE_AGENT_NAMES
    assert agents.FaultKind.TRUNCATION in agents.FaultKind


def test_the_role_definitions_carry_the_documented_names() -> None:
    folder = Path(agents.__file__).parent / "roles" / "definitions"
    assert set(load_agent_specs(folder)) == ROLE_AGENT_NAMES


@pytest.mark.parametrize("reused", sorted(ROLE_AGENT_NAMES))
def test_a_team_that_reuses_a_role_name_gets_a_clear_error(tmp_path: Path, reused: str) -> None:
    team_dir = copy_team(tmp_path / "team")
    source = team_dir / "quality-agent.md"
    source.write_text(source.read_text().replace("name: quality-agent", f"name: {reused}"))
    source.rename(team_dir / f"{reused}.md")
    team = agents.AgentTeam(team_dir, SimulatedRuntime(0))
    with pytest.raises(RoleNameClash) as refused:
        agents.MetaOrchestrator(team, roles_runtime=agents.offline_role_runtime(),
                                workspace=tmp_path / "ws")  # fmt: skip
    assert refused.value.names == (reused,)
    assert reused in str(refused.value)
    assert "rename" in str(refused.value)
    assert not (tmp_path / "ws").exists()  # refused before anything was opened
