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
    from agents.faces.mcp_tools import BadRequest
    from agents.faces.release_serving import NoReleases
    from agents.faces.workspace import TeamDirError, Workspace, WorkspaceError
    from agents.loop.code_review import ModelRequired
    from agents.loop.cycle import (
        CycleResult,
        TaskResult,
        WatchOutcome,
        replay_cycle,
    )
    from agents.loop.meta_orchestrator import MetaOrchestrator
    from agents.loop.release_publishing import ReleasePublisher
    from agents.loop.self_edit_tools import SelfEditNotKept
    from agents.roles.ask_agent_tool import (
        AskAgentTool,
        create_ask_agent_tool,
    )
    from agents.roles.prompt_blocks import PromptBlockError
    from agents.roles.report_parsing import ReportParseError
    from agents.roles.role_names import (
        ROLE_AGENT_NAMES,
        RoleNameClash,
        offline_role_runtime,
    )
    from agents.roles.schemas import (
        ImprovementPlan,
        MediatorReport,
        ProposedAction,
        SupervisorReview,
    )
    from agents.roles.self_improver import InvalidProposal, SelfImprover
    from agents.roles.socratic_mediator import SocraticMediator
    from agents.roles.supervisor import Supervisor
    from agents.roles.team import AgentTeam, UnknownAgent
    from infrastructure.changes.audit import AuditChainBroken, verify_audit_chain
    from infrastructure.changes.effectors import InvalidChange
    from infrastructure.changes.gates import ChangeRefused
    from infrastructure.changes.improvement_manager import ImprovementManager
    from infrastructure.changes.leases import LeaseLost
    from infrastructure.changes.safety import GateVerdict, ProposedChange
    from infrastructure.changes.watch import ChangeWatch, ChangeWatcher
    from infrastructure.code_update.code_plans import CodeUpdateError, PlanNotFound, PlanStateError
    from infrastructure.code_update.unified_diff import DiffError
    from infrastructure.errors import (
        AgentmendError,
        AgentRunError,
        AuditChainError,
        ChangeNotFound,
        ChangeStateError,
        ConfigurationError,
        ErrorKind,
        FileOperationError,
        FileTooLarge,
        InputTooLarge,
        InvalidArgument,
        NotFound,
        PathNotAllowed,
        PermissionRequired,
        PostgresExtraMissing,
        RollbackConflict,
        SpecError,
        StoreError,
        WrongArgumentType,
    )
    from infrastructure.evaluation.verification import SuiteMismatch, VerificationVerdict
    from infrastructure.frontmatter import FrontMatterError
    from infrastructure.llm.anthropic_runtime import AnthropicRuntime
    from infrastructure.llm.base import (
        AgentResult,
        AgentRuntime,
        ToolError,
        ToolSpec,
    )
    from infrastructure.llm.claude_agent_runtime import ClaudeAgentRuntime
    from infrastructure.llm.claude_sdk_hooks import claude_sdk_hooks
    from infrastructure.llm.network_guard import NetworkRefusedError
    from infrastructure.llm.offline import OfflineRuntime
    from infrastructure.llm.testing import (
        ConformanceReport,
        FunctionRuntime,
        RuntimeConformanceError,
        Scenario,
        ScriptedRuntime,
        Step,
        TurnInfo,
        UnexpectedModelCall,
        run_runtime_conformance,
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
    from infrastructure.monitoring.performance_monitor import (
        InvalidExecution,
        MonitorClosed,
        PerformanceMonitor,
    )
    from infrastructure.principal import Principal
    from infrastructure.releases.attribution import ReleaseAttribution, linked_release_label
    from infrastructure.releases.follower import ReleaseFollower
    from infrastructure.releases.release_errors import ReleaseRefused, RolloutConflict
    from infrastructure.releases.release_log import ReleaseLog
    from infrastructure.releases.rollout import Rollouts
    from infrastructure.releases.rollout_evidence import RolloutLimits
    from infrastructure.settings import InvalidSetting, Settings
    from infrastructure.simulation import Fault, FaultKind, SimulatedRuntime
    from infrastructure.spec import (
        AgentSpec,
        PermissionProfile,
        load_agent_specs,
    )
    from infrastructure.store import Store
    from infrastructure.telemetry.otlp_decode import OtlpDecodeError
    from infrastructure.telemetry.span import OtelExtraMissing
    from infrastructure.telemetry.span_processor import AgentmendSpanProcessor

__version__ = "0.1.0"

__all__ = [
    "ROLE_AGENT_NAMES",
    "AgentMetrics",
    "AgentResult",
    "AgentRunError",
    "AgentRuntime",
    "AgentSpec",
    "AgentTeam",
    "AgentmendError",
    "AgentmendSpanProcessor",
    "AnthropicRuntime",
    "AskAgentTool",
    "AuditChainBroken",
    "AuditChainError",
    "BadRequest",
    "ChangeNotFound",
    "ChangeRecord",
    "ChangeRefused",
    "ChangeStateError",
    "ChangeStatus",
    "ChangeType",
    "ChangeWatch",
    "ChangeWatcher",
    "ClaudeAgentRuntime",
    "CodeUpdateError",
    "ConfigurationError",
    "ConformanceReport",
    "CycleResult",
    "DiffError",
    "ErrorKind",
    "ExecutionRecord",
    "Fault",
    "FaultKind",
    "FileOperationError",
    "FileTooLarge",
    "FrontMatterError",
    "FunctionRuntime",
    "GateVerdict",
    "ImprovementAction",
    "ImprovementManager",
    "ImprovementPlan",
    "InputTooLarge",
    "InvalidArgument",
    "InvalidChange",
    "InvalidExecution",
    "InvalidProposal",
    "InvalidSetting",
    "IssueDetector",
    "IssueReport",
    "LeaseLost",
    "MediatorReport",
    "MetaOrchestrator",
    "ModelRequired",
    "MonitorClosed",
    "NetworkRefusedError",
    "NoReleases",
    "NotFound",
    "OfflineRuntime",
    "OtelExtraMissing",
    "OtlpDecodeError",
    "PathNotAllowed",
    "PerformanceMonitor",
    "PermissionProfile",
    "PermissionRequired",
    "PlanNotFound",
    "PlanStateError",
    "PostgresExtraMissing",
    "Principal",
    "PromptBlockError",
    "ProposedAction",
    "ProposedChange",
    "ReleaseAttribution",
    "ReleaseFollower",
    "ReleaseLog",
    "ReleasePublisher",
    "ReleaseRefused",
    "ReportParseError",
    "RoleNameClash",
    "RollbackConflict",
    "RolloutConflict",
    "RolloutLimits",
    "Rollouts",
    "RootCauseAnalysis",
    "RuntimeConformanceError",
    "Scenario",
    "ScriptedRuntime",
    "SelfEditNotKept",
    "SelfImprover",
    "Settings",
    "SimulatedRuntime",
    "SocraticMediator",
    "SpecError",
    "Step",
    "Store",
    "StoreError",
    "SuiteMismatch",
    "Supervisor",
    "SupervisorReview",
    "TaskResult",
    "TeamDirError",
    "ToolError",
    "ToolSpec",
    "TurnInfo",
    "UnexpectedModelCall",
    "UnknownAgent",
    "VerificationVerdict",
    "WatchOutcome",
    "Workspace",
    "WorkspaceError",
    "WrongArgumentType",
    "claude_sdk_hooks",
    "create_ask_agent_tool",
    "linked_release_label",
    "load_agent_specs",
    "offline_role_runtime",
    "replay_cycle",
    "run_runtime_conformance",
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
    "AuditChainBroken": "infrastructure.changes.audit",
    "LeaseLost": "infrastructure.changes.leases",
    "ChangeWatch": "infrastructure.changes.watch",
    "ChangeWatcher": "infrastructure.changes.watch",
    "ReleaseAttribution": "infrastructure.releases.attribution",
    "linked_release_label": "infrastructure.releases.attribution",
    "ReleaseFollower": "infrastructure.releases.follower",
    "ReleaseLog": "infrastructure.releases.release_log",
    "ReleasePublisher": "agents.loop.release_publishing",
    "ReleaseRefused": "infrastructure.releases.release_errors",
    "RolloutConflict": "infrastructure.releases.release_errors",
    "RolloutLimits": "infrastructure.releases.rollout_evidence",
    "Rollouts": "infrastructure.releases.rollout",
    "Store": "infrastructure.store",
    "Settings": "infrastructure.settings",
    "InvalidSetting": "infrastructure.settings",
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
    "ConformanceReport": "infrastructure.llm.testing",
    "RuntimeConformanceError": "infrastructure.llm.testing",
    "Scenario": "infrastructure.llm.testing",
    "run_runtime_conformance": "infrastructure.llm.testing",
    "SimulatedRuntime": "infrastructure.simulation",
    "Fault": "infrastructure.simulation",
    "FaultKind": "infrastructure.simulation",
    "AgentRunError": "infrastructure.errors",
    "AgentmendError": "infrastructure.errors",
    "ErrorKind": "infrastructure.errors",
    "FileOperationError": "infrastructure.errors",
    "FileTooLarge": "infrastructure.errors",
    "InputTooLarge": "infrastructure.errors",
    "PathNotAllowed": "infrastructure.errors",
    "RollbackConflict": "infrastructure.errors",
    "SpecError": "infrastructure.errors",
    "PermissionRequired": "infrastructure.errors",
    "AskAgentTool": "agents.roles.ask_agent_tool",
    "create_ask_agent_tool": "agents.roles.ask_agent_tool",
    "AgentTeam": "agents.roles.team",
    "MediatorReport": "agents.roles.schemas",
    "ImprovementPlan": "agents.roles.schemas",
    "ProposedAction": "agents.roles.schemas",
    "SupervisorReview": "agents.roles.schemas",
    "ROLE_AGENT_NAMES": "agents.roles.role_names",
    "RoleNameClash": "agents.roles.role_names",
    "offline_role_runtime": "agents.roles.role_names",
    "SocraticMediator": "agents.roles.socratic_mediator",
    "SelfImprover": "agents.roles.self_improver",
    "Supervisor": "agents.roles.supervisor",
    "MetaOrchestrator": "agents.loop.meta_orchestrator",
    "CycleResult": "agents.loop.cycle",
    "WatchOutcome": "agents.loop.cycle",
    "TaskResult": "agents.loop.cycle",
    "replay_cycle": "agents.loop.cycle",
    "Workspace": "agents.faces.workspace",
    "AgentmendSpanProcessor": "infrastructure.telemetry.span_processor",
    "OtelExtraMissing": "infrastructure.telemetry.span",
    "OtlpDecodeError": "infrastructure.telemetry.otlp_decode",
    "BadRequest": "agents.faces.mcp_tools",
    "NoReleases": "agents.faces.release_serving",
    "TeamDirError": "agents.faces.workspace",
    "WorkspaceError": "agents.faces.workspace",
    "ModelRequired": "agents.loop.code_review",
    "SelfEditNotKept": "agents.loop.self_edit_tools",
    "PromptBlockError": "agents.roles.prompt_blocks",
    "ReportParseError": "agents.roles.report_parsing",
    "InvalidProposal": "agents.roles.self_improver",
    "UnknownAgent": "agents.roles.team",
    "InvalidChange": "infrastructure.changes.effectors",
    "ChangeRefused": "infrastructure.changes.gates",
    "CodeUpdateError": "infrastructure.code_update.code_plans",
    "PlanNotFound": "infrastructure.code_update.code_plans",
    "PlanStateError": "infrastructure.code_update.code_plans",
    "DiffError": "infrastructure.code_update.unified_diff",
    "AuditChainError": "infrastructure.errors",
    "ChangeNotFound": "infrastructure.errors",
    "ChangeStateError": "infrastructure.errors",
    "ConfigurationError": "infrastructure.errors",
    "InvalidArgument": "infrastructure.errors",
    "NotFound": "infrastructure.errors",
    "StoreError": "infrastructure.errors",
    "PostgresExtraMissing": "infrastructure.errors",
    "WrongArgumentType": "infrastructure.errors",
    "SuiteMismatch": "infrastructure.evaluation.verification",
    "FrontMatterError": "infrastructure.frontmatter",
    "NetworkRefusedError": "infrastructure.llm.network_guard",
    "UnexpectedModelCall": "infrastructure.llm.testing",
    "InvalidExecution": "infrastructure.monitoring.performance_monitor",
    "MonitorClosed": "infrastructure.monitoring.performance_monitor",
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
