"""agentmend: keep a team of LLM agents healthy.

Record every execution, detect degradation, question the agents to find the root cause, apply a
fix, prove it helped on the same cases, and roll it back when it did not.

Names are loaded on first use, so ``import agents`` imports no model SDK, writes no file and
configures no logging (the pytest plugin loads this package in every user's test run).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.faces.workspace import Workspace
    from agents.loop.cycle import (
        CycleResult,
        TaskResult,
        replay_cycle,
    )
    from agents.loop.meta_orchestrator import MetaOrchestrator
    from agents.roles.ask_agent_tool import (
        AskAgentTool,
        create_ask_agent_tool,
    )
    from agents.roles.self_improver import SelfImprover
    from agents.roles.socratic_mediator import SocraticMediator
    from agents.roles.supervisor import Supervisor
    from agents.roles.team import AgentTeam
    from infrastructure.changes.audit import verify_audit_chain
    from infrastructure.changes.improvement_manager import ImprovementManager
    from infrastructure.changes.safety import GateVerdict, ProposedChange
    from infrastructure.errors import (
        AgentmendError,
        AgentRunError,
        ErrorKind,
        PathNotAllowed,
        RollbackConflict,
        SpecError,
    )
    from infrastructure.evaluation.verification import VerificationVerdict
    from infrastructure.llm.anthropic_runtime import AnthropicRuntime
    from infrastructure.llm.base import (
        AgentResult,
        AgentRuntime,
        ToolError,
        ToolSpec,
    )
    from infrastructure.llm.claude_agent_runtime import ClaudeAgentRuntime
    from infrastructure.llm.claude_sdk_hooks import claude_sdk_hooks
    from infrastructure.llm.offline import OfflineRuntime
    from infrastructure.llm.testing import (
        FunctionRuntime,
        ScriptedRuntime,
        Step,
        TurnInfo,
    )
    from infrastructure.models import (
        AgentMetrics,
        ChangeRecord,
        ChangeStatus,
        ChangeType,
        ExecutionRecord,
        ImprovementAction,
        IssueReport,
        RootCauseAnalysis,
    )
    from infrastructure.monitoring.detection import IssueDetector
    from infrastructure.monitoring.performance_monitor import PerformanceMonitor
    from infrastructure.principal import Principal
    from infrastructure.settings import Settings
    from infrastructure.simulation import SimulatedRuntime
    from infrastructure.spec import (
        AgentSpec,
        PermissionProfile,
        load_agent_specs,
    )
    from infrastructure.store import Store

__version__ = "0.1.0"

__all__ = [
    "AgentMetrics",
    "AgentResult",
    "AgentRunError",
    "AgentRuntime",
    "AgentSpec",
    "AgentTeam",
    "AgentmendError",
    "AnthropicRuntime",
    "AskAgentTool",
    "ChangeRecord",
    "ChangeStatus",
    "ChangeType",
    "ClaudeAgentRuntime",
    "CycleResult",
    "ErrorKind",
    "ExecutionRecord",
    "FunctionRuntime",
    "GateVerdict",
    "ImprovementAction",
    "ImprovementManager",
    "IssueDetector",
    "IssueReport",
    "MetaOrchestrator",
    "OfflineRuntime",
    "PathNotAllowed",
    "PerformanceMonitor",
    "PermissionProfile",
    "Principal",
    "ProposedChange",
    "RollbackConflict",
    "RootCauseAnalysis",
    "ScriptedRuntime",
    "SelfImprover",
    "Settings",
    "SimulatedRuntime",
    "SocraticMediator",
    "SpecError",
    "Step",
    "Store",
    "Supervisor",
    "TaskResult",
    "ToolError",
    "ToolSpec",
    "TurnInfo",
    "VerificationVerdict",
    "Workspace",
    "claude_sdk_hooks",
    "create_ask_agent_tool",
    "load_agent_specs",
    "replay_cycle",
    "verify_audit_chain",
]

_EXPORTS: dict[str, str] = {
    "AgentMetrics": "infrastructure.models",
    "ChangeRecord": "infrastructure.models",
    "ChangeStatus": "infrastructure.models",
    "ChangeType": "infrastructure.models",
    "ExecutionRecord": "infrastructure.models",
    "ImprovementAction": "infrastructure.models",
    "IssueReport": "infrastructure.models",
    "RootCauseAnalysis": "infrastructure.models",
    "AgentSpec": "infrastructure.spec",
    "PermissionProfile": "infrastructure.spec",
    "load_agent_specs": "infrastructure.spec",
    "PerformanceMonitor": "infrastructure.monitoring.performance_monitor",
    "IssueDetector": "infrastructure.monitoring.detection",
    "ImprovementManager": "infrastructure.changes.improvement_manager",
    "verify_audit_chain": "infrastructure.changes.audit",
    "Store": "infrastructure.store",
    "Settings": "infrastructure.settings",
    "GateVerdict": "infrastructure.changes.safety",
    "Principal": "infrastructure.principal",
    "ProposedChange": "infrastructure.changes.safety",
    "VerificationVerdict": "infrastructure.evaluation.verification",
    "AgentResult": "infrastructure.llm.base",
    "AgentRuntime": "infrastructure.llm.base",
    "ToolError": "infrastructure.llm.base",
    "ToolSpec": "infrastructure.llm.base",
    "AnthropicRuntime": "infrastructure.llm.anthropic_runtime",
    "ClaudeAgentRuntime": "infrastructure.llm.claude_agent_runtime",
    "claude_sdk_hooks": "infrastructure.llm.claude_sdk_hooks",
    "OfflineRuntime": "infrastructure.llm.offline",
    "FunctionRuntime": "infrastructure.llm.testing",
    "ScriptedRuntime": "infrastructure.llm.testing",
    "Step": "infrastructure.llm.testing",
    "TurnInfo": "infrastructure.llm.testing",
    "SimulatedRuntime": "infrastructure.simulation",
    "AgentRunError": "infrastructure.errors",
    "AgentmendError": "infrastructure.errors",
    "ErrorKind": "infrastructure.errors",
    "PathNotAllowed": "infrastructure.errors",
    "RollbackConflict": "infrastructure.errors",
    "SpecError": "infrastructure.errors",
    "AskAgentTool": "agents.roles.ask_agent_tool",
    "create_ask_agent_tool": "agents.roles.ask_agent_tool",
    "AgentTeam": "agents.roles.team",
    "SocraticMediator": "agents.roles.socratic_mediator",
    "SelfImprover": "agents.roles.self_improver",
    "Supervisor": "agents.roles.supervisor",
    "MetaOrchestrator": "agents.loop.meta_orchestrator",
    "CycleResult": "agents.loop.cycle",
    "TaskResult": "agents.loop.cycle",
    "replay_cycle": "agents.loop.cycle",
    "Workspace": "agents.faces.workspace",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # the public surface only: not the names this module itself imports to work
    return sorted({*__all__, "__version__"})
