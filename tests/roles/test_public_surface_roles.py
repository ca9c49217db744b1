"""The public surface: faults, the roles' output models, the offline role runtime, and the
role agent names a user's team may not reuse."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentmend
from agentmend.infrastructure.definitions.spec import load_agent_specs
from agentmend.infrastructure.llm.offline import OfflineRuntime
from agentmend.infrastructure.simulation import SimulatedRuntime, copy_team
from agentmend.roles.playbooks import IMPROVER_NAME, MEDIATOR_NAME, SUPERVISOR_NAME
from agentmend.roles.role_names import ROLE_AGENT_NAMES, RoleNameClash
from agentmend.roles.schemas import MediatorReport


def test_faults_role_outputs_and_the_offline_role_runtime_are_exported() -> None:
    for name in ("Fault", "FaultKind", "MediatorReport", "ImprovementPlan", "ProposedAction",
                 "SupervisorReview", "offline_role_runtime", "ROLE_AGENT_NAMES",
                 "RoleNameClash", "AuditChainBroken", "PermissionRequired"):  # fmt: skip
        assert name in agentmend.__all__
        assert getattr(agentmend, name) is not None
    assert agentmend.MediatorReport is MediatorReport
    assert isinstance(agentmend.offline_role_runtime(), OfflineRuntime)
    assert {"socratic-mediator", "self-improver", "supervisor"} == agentmend.ROLE_AGENT_NAMES
    assert {MEDIATOR_NAME, IMPROVER_NAME, SUPERVISOR_NAME} == ROLE_AGENT_NAMES
    assert agentmend.FaultKind.TRUNCATION in agentmend.FaultKind


def test_the_role_definitions_carry_the_documented_names() -> None:
    folder = Path(agentmend.__file__).parent / "roles" / "definitions"
    assert set(load_agent_specs(folder)) == ROLE_AGENT_NAMES


@pytest.mark.parametrize("reused", sorted(ROLE_AGENT_NAMES))
def test_a_team_that_reuses_a_role_name_gets_a_clear_error(tmp_path: Path, reused: str) -> None:
    team_dir = copy_team(tmp_path / "team")
    source = team_dir / "quality-agent.md"
    source.write_text(source.read_text().replace("name: quality-agent", f"name: {reused}"))
    source.rename(team_dir / f"{reused}.md")
    team = agentmend.AgentTeam(team_dir, SimulatedRuntime(0))
    with pytest.raises(RoleNameClash) as refused:
        agentmend.MetaOrchestrator.for_team(team, roles_runtime=agentmend.offline_role_runtime(),
                                         workspace=tmp_path / "ws")  # fmt: skip
    assert refused.value.names == (reused,)
    assert reused in str(refused.value)
    assert "rename" in str(refused.value)
    assert not (tmp_path / "ws").exists()  # refused before anything was opened
