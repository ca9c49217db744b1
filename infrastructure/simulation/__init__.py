"""A simulated team with injectable faults: what the demo, ``main.py`` offline and pytest run on.

The team's six agents ship as definition files (``copy_team`` puts them in a workspace, where the
loop may edit them). ``SimulatedRuntime`` runs them as a deterministic function of the seed, each
agent's configuration and the faults injected at run time; ``faults.py`` documents, for each
fault, the configuration condition under which a run fails and the edit that fixes it. Agents
answer ``ask_agent`` questions from their own recent runs (``runtime.agent_registry``).

Example::

    team_dir = copy_team(tmp_path / "team")
    specs = load_agent_specs(team_dir)
    runtime = SimulatedRuntime(seed=7)
    runtime.inject("research-agent", FaultKind.TRUNCATION)
    result = await runtime.run(specs["research-agent"], "Pythagorean theorem")
    assert result.error is not None and result.error.kind is ErrorKind.TRUNCATED
"""

from agentmend.infrastructure.simulation.faults import Fault, FaultKind
from agentmend.infrastructure.simulation.run_record import RunRecord
from agentmend.infrastructure.simulation.runtime import AgentAnswerer, SimulatedRuntime
from agentmend.infrastructure.simulation.team import (
    AVAILABLE_MODELS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MODEL,
    DEFAULT_TIMEOUT_S,
    FORMAT_HEADING,
    FORMAT_INSTRUCTION,
    MODEL_ALIASES,
    RETIRED_MODELS,
    SIMULATED_AGENTS,
    TEAM_AGENT_NAMES,
    TOKEN_SPREAD,
    AgentProfile,
    ModelProfile,
    copy_team,
    format_instruction_line,
    has_format_instruction,
    profile_for,
    resolve_model,
    team_files,
)

__all__ = [
    "AVAILABLE_MODELS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODEL",
    "DEFAULT_TIMEOUT_S",
    "FORMAT_HEADING",
    "FORMAT_INSTRUCTION",
    "MODEL_ALIASES",
    "RETIRED_MODELS",
    "SIMULATED_AGENTS",
    "TEAM_AGENT_NAMES",
    "TOKEN_SPREAD",
    "AgentAnswerer",
    "AgentProfile",
    "Fault",
    "FaultKind",
    "ModelProfile",
    "RunRecord",
    "SimulatedRuntime",
    "copy_team",
    "format_instruction_line",
    "has_format_instruction",
    "profile_for",
    "resolve_model",
    "team_files",
]
