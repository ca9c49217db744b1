"""agentmend: keep a team of LLM agents healthy.

Record every execution, detect degradation, question the agents to find the root cause, apply a
fix, prove it helped on the same cases, and roll it back when it did not.

Names are loaded on first use, so ``import agentmend`` imports no model SDK, writes no file and
configures no logging (the pytest plugin loads this package in every user's test run).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentmend.faces.mcp.tools import BadRequest
    from agentmend.faces.release_serving import NoReleases
    from agentmend.faces.store_record import StoreMismatch, UnrecordedServerStore
    from agentmend.faces.workspace import TeamDirError, Workspace, WorkspaceError
    from agentmend.infrastructure.changes.audit.log import AuditChainBroken, verify_audit_chain
    from agentmend.infrastructure.changes.cycle_requests import AlreadyAnswered, CycleRequests
    from agentmend.infrastructure.changes.effectors import InvalidChange
    from agentmend.infrastructure.changes.gates import ChangeRefused
    from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
    from agentmend.infrastructure.changes.proposal import GateVerdict, ProposedChange
    from agentmend.infrastructure.changes.protocol.apply import UnfinishedWork
    from agentmend.infrastructure.changes.protocol.leases import LeaseLost
    from agentmend.infrastructure.changes.watch import ChangeWatch, ChangeWatcher
    from agentmend.infrastructure.code_update.plans import (
        CodeUpdateError,
        PlanNotFound,
        PlanStateError,
    )
    from agentmend.infrastructure.code_update.unified_diff import DiffError
    from agentmend.infrastructure.definitions.frontmatter import FrontMatterError
    from agentmend.infrastructure.definitions.spec import (
        AgentSpec,
        PermissionProfile,
        load_agent_specs,
    )
    from agentmend.infrastructure.detection.checker_seat import CheckerSeat
    from agentmend.infrastructure.detection.detector import IssueDetector
    from agentmend.infrastructure.detection.issue_ledger import IssueLedger
    from agentmend.infrastructure.errors import (
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
        LockTimeout,
        NotFound,
        PathNotAllowed,
        PermissionRequired,
        PostgresExtraMissing,
        RollbackConflict,
        SchemaBehind,
        SpecError,
        StoreError,
        WrongArgumentType,
    )
    from agentmend.infrastructure.evaluation.verification import SuiteMismatch, VerificationVerdict
    from agentmend.infrastructure.llm.anthropic_runtime import AnthropicRuntime
    from agentmend.infrastructure.llm.base import (
        AgentResult,
        AgentRuntime,
        ToolError,
        ToolSpec,
    )
    from agentmend.infrastructure.llm.cassette import (
        CassetteError,
        CassetteMiss,
        RecordingRuntime,
        ReplayRuntime,
    )
    from agentmend.infrastructure.llm.claude.hooks import claude_sdk_hooks
    from agentmend.infrastructure.llm.claude.runtime import ClaudeAgentRuntime
    from agentmend.infrastructure.llm.network_guard import NetworkRefusedError
    from agentmend.infrastructure.llm.offline import OfflineRuntime
    from agentmend.infrastructure.llm.testing import (
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
    from agentmend.infrastructure.models import (
        AgentMetrics,
        ChangeRecord,
        ChangeStatus,
        ChangeType,
        ExecutionRecord,
        ImprovementAction,
        IssueReport,
        RootCauseAnalysis,
    )
    from agentmend.infrastructure.monitoring.performance_monitor import (
        InvalidExecution,
        MonitorClosed,
        PerformanceMonitor,
    )
    from agentmend.infrastructure.principal import ChangeAuthor, Principal
    from agentmend.infrastructure.releases.attribution import (
        ReleaseAttribution,
        linked_release_label,
    )
    from agentmend.infrastructure.releases.errors import ReleaseRefused, RolloutConflict
    from agentmend.infrastructure.releases.follower import ReleaseFollower
    from agentmend.infrastructure.releases.log import ReleaseLog
    from agentmend.infrastructure.releases.rollout import Rollouts
    from agentmend.infrastructure.releases.rollout_evidence import RolloutLimits
    from agentmend.infrastructure.settings import InvalidSetting, Settings
    from agentmend.infrastructure.simulation import Fault, FaultKind, SimulatedRuntime
    from agentmend.infrastructure.store.api import Store
    from agentmend.infrastructure.telemetry.otlp_decode import OtlpDecodeError
    from agentmend.infrastructure.telemetry.span import OtelExtraMissing
    from agentmend.infrastructure.telemetry.span_processor import AgentmendSpanProcessor
    from agentmend.loop.checker_policies import CyclePolicy, ReportPolicy
    from agentmend.loop.collaborators import LoopCollaborators
    from agentmend.loop.cycle import (
        CycleResult,
        TaskResult,
        WatchOutcome,
        replay_cycle,
    )
    from agentmend.loop.fleet_checker import FleetChecker
    from agentmend.loop.meta_orchestrator import MetaOrchestrator
    from agentmend.loop.release_publishing import ReleasePublisher
    from agentmend.loop.self_edit_tools import SelfEditNotKept
    from agentmend.roles.ask_agent_tool import (
        AskAgentTool,
        create_ask_agent_tool,
    )
    from agentmend.roles.code_review import ModelRequired
    from agentmend.roles.prompt_blocks import PromptBlockError
    from agentmend.roles.report_parsing import ReportParseError
    from agentmend.roles.role_names import (
        ROLE_AGENT_NAMES,
        RoleNameClash,
        offline_role_runtime,
    )
    from agentmend.roles.schemas import (
        ImprovementPlan,
        MediatorReport,
        ProposedAction,
        SupervisorReview,
    )
    from agentmend.roles.self_improver import InvalidProposal, SelfImprover
    from agentmend.roles.socratic_mediator import SocraticMediator
    from agentmend.roles.supervisor import Supervisor
    from agentmend.roles.team import AgentTeam, UnknownAgent

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
    "AlreadyAnswered",
    "AnthropicRuntime",
    "AskAgentTool",
    "AuditChainBroken",
    "AuditChainError",
    "BadRequest",
    "CassetteError",
    "CassetteMiss",
    "ChangeAuthor",
    "ChangeNotFound",
    "ChangeRecord",
    "ChangeRefused",
    "ChangeStateError",
    "ChangeStatus",
    "ChangeType",
    "ChangeWatch",
    "ChangeWatcher",
    "CheckerSeat",
    "ClaudeAgentRuntime",
    "CodeUpdateError",
    "ConfigurationError",
    "ConformanceReport",
    "CyclePolicy",
    "CycleRequests",
    "CycleResult",
    "DiffError",
    "ErrorKind",
    "ExecutionRecord",
    "Fault",
    "FaultKind",
    "FileOperationError",
    "FileTooLarge",
    "FleetChecker",
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
    "IssueLedger",
    "IssueReport",
    "LeaseLost",
    "LockTimeout",
    "LoopCollaborators",
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
    "RecordingRuntime",
    "ReleaseAttribution",
    "ReleaseFollower",
    "ReleaseLog",
    "ReleasePublisher",
    "ReleaseRefused",
    "ReplayRuntime",
    "ReportParseError",
    "ReportPolicy",
    "RoleNameClash",
    "RollbackConflict",
    "RolloutConflict",
    "RolloutLimits",
    "Rollouts",
    "RootCauseAnalysis",
    "RuntimeConformanceError",
    "Scenario",
    "SchemaBehind",
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
    "StoreMismatch",
    "SuiteMismatch",
    "Supervisor",
    "SupervisorReview",
    "TaskResult",
    "TeamDirError",
    "ToolError",
    "ToolSpec",
    "TurnInfo",
    "UnexpectedModelCall",
    "UnfinishedWork",
    "UnknownAgent",
    "UnrecordedServerStore",
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
    "AgentMetrics": "agentmend.infrastructure.models",
    "ChangeRecord": "agentmend.infrastructure.models",
    "ChangeStatus": "agentmend.infrastructure.models",
    "ChangeType": "agentmend.infrastructure.models",
    "ExecutionRecord": "agentmend.infrastructure.models",
    "ImprovementAction": "agentmend.infrastructure.models",
    "IssueReport": "agentmend.infrastructure.models",
    "RootCauseAnalysis": "agentmend.infrastructure.models",
    "AgentSpec": "agentmend.infrastructure.definitions.spec",
    "PermissionProfile": "agentmend.infrastructure.definitions.spec",
    "load_agent_specs": "agentmend.infrastructure.definitions.spec",
    "PerformanceMonitor": "agentmend.infrastructure.monitoring.performance_monitor",
    "IssueDetector": "agentmend.infrastructure.detection.detector",
    "IssueLedger": "agentmend.infrastructure.detection.issue_ledger",
    "CheckerSeat": "agentmend.infrastructure.detection.checker_seat",
    "FleetChecker": "agentmend.loop.fleet_checker",
    "CyclePolicy": "agentmend.loop.checker_policies",
    "ReportPolicy": "agentmend.loop.checker_policies",
    "CycleRequests": "agentmend.infrastructure.changes.cycle_requests",
    "AlreadyAnswered": "agentmend.infrastructure.changes.cycle_requests",
    "StoreMismatch": "agentmend.faces.store_record",
    "UnrecordedServerStore": "agentmend.faces.store_record",
    "ImprovementManager": "agentmend.infrastructure.changes.improvement_manager",
    "verify_audit_chain": "agentmend.infrastructure.changes.audit.log",
    "AuditChainBroken": "agentmend.infrastructure.changes.audit.log",
    "LeaseLost": "agentmend.infrastructure.changes.protocol.leases",
    "ChangeWatch": "agentmend.infrastructure.changes.watch",
    "ChangeWatcher": "agentmend.infrastructure.changes.watch",
    "ReleaseAttribution": "agentmend.infrastructure.releases.attribution",
    "linked_release_label": "agentmend.infrastructure.releases.attribution",
    "ReleaseFollower": "agentmend.infrastructure.releases.follower",
    "ReleaseLog": "agentmend.infrastructure.releases.log",
    "ReleasePublisher": "agentmend.loop.release_publishing",
    "ReleaseRefused": "agentmend.infrastructure.releases.errors",
    "RolloutConflict": "agentmend.infrastructure.releases.errors",
    "RolloutLimits": "agentmend.infrastructure.releases.rollout_evidence",
    "Rollouts": "agentmend.infrastructure.releases.rollout",
    "Store": "agentmend.infrastructure.store.api",
    "Settings": "agentmend.infrastructure.settings",
    "InvalidSetting": "agentmend.infrastructure.settings",
    "GateVerdict": "agentmend.infrastructure.changes.proposal",
    "Principal": "agentmend.infrastructure.principal",
    "ChangeAuthor": "agentmend.infrastructure.principal",
    "ProposedChange": "agentmend.infrastructure.changes.proposal",
    "VerificationVerdict": "agentmend.infrastructure.evaluation.verification",
    "AgentResult": "agentmend.infrastructure.llm.base",
    "AgentRuntime": "agentmend.infrastructure.llm.base",
    "ToolError": "agentmend.infrastructure.llm.base",
    "ToolSpec": "agentmend.infrastructure.llm.base",
    "AnthropicRuntime": "agentmend.infrastructure.llm.anthropic_runtime",
    "CassetteError": "agentmend.infrastructure.llm.cassette",
    "CassetteMiss": "agentmend.infrastructure.llm.cassette",
    "RecordingRuntime": "agentmend.infrastructure.llm.cassette",
    "ReplayRuntime": "agentmend.infrastructure.llm.cassette",
    "ClaudeAgentRuntime": "agentmend.infrastructure.llm.claude.runtime",
    "claude_sdk_hooks": "agentmend.infrastructure.llm.claude.hooks",
    "OfflineRuntime": "agentmend.infrastructure.llm.offline",
    "FunctionRuntime": "agentmend.infrastructure.llm.testing",
    "ScriptedRuntime": "agentmend.infrastructure.llm.testing",
    "Step": "agentmend.infrastructure.llm.testing",
    "TurnInfo": "agentmend.infrastructure.llm.testing",
    "ConformanceReport": "agentmend.infrastructure.llm.testing",
    "RuntimeConformanceError": "agentmend.infrastructure.llm.testing",
    "Scenario": "agentmend.infrastructure.llm.testing",
    "run_runtime_conformance": "agentmend.infrastructure.llm.testing",
    "SimulatedRuntime": "agentmend.infrastructure.simulation",
    "Fault": "agentmend.infrastructure.simulation",
    "FaultKind": "agentmend.infrastructure.simulation",
    "AgentRunError": "agentmend.infrastructure.errors",
    "AgentmendError": "agentmend.infrastructure.errors",
    "ErrorKind": "agentmend.infrastructure.errors",
    "FileOperationError": "agentmend.infrastructure.errors",
    "FileTooLarge": "agentmend.infrastructure.errors",
    "InputTooLarge": "agentmend.infrastructure.errors",
    "PathNotAllowed": "agentmend.infrastructure.errors",
    "RollbackConflict": "agentmend.infrastructure.errors",
    "SpecError": "agentmend.infrastructure.errors",
    "PermissionRequired": "agentmend.infrastructure.errors",
    "AskAgentTool": "agentmend.roles.ask_agent_tool",
    "create_ask_agent_tool": "agentmend.roles.ask_agent_tool",
    "AgentTeam": "agentmend.roles.team",
    "MediatorReport": "agentmend.roles.schemas",
    "ImprovementPlan": "agentmend.roles.schemas",
    "ProposedAction": "agentmend.roles.schemas",
    "SupervisorReview": "agentmend.roles.schemas",
    "ROLE_AGENT_NAMES": "agentmend.roles.role_names",
    "RoleNameClash": "agentmend.roles.role_names",
    "offline_role_runtime": "agentmend.roles.role_names",
    "SocraticMediator": "agentmend.roles.socratic_mediator",
    "SelfImprover": "agentmend.roles.self_improver",
    "Supervisor": "agentmend.roles.supervisor",
    "MetaOrchestrator": "agentmend.loop.meta_orchestrator",
    "LoopCollaborators": "agentmend.loop.collaborators",
    "CycleResult": "agentmend.loop.cycle",
    "WatchOutcome": "agentmend.loop.cycle",
    "TaskResult": "agentmend.loop.cycle",
    "replay_cycle": "agentmend.loop.cycle",
    "Workspace": "agentmend.faces.workspace",
    "AgentmendSpanProcessor": "agentmend.infrastructure.telemetry.span_processor",
    "OtelExtraMissing": "agentmend.infrastructure.telemetry.span",
    "OtlpDecodeError": "agentmend.infrastructure.telemetry.otlp_decode",
    "BadRequest": "agentmend.faces.mcp.tools",
    "NoReleases": "agentmend.faces.release_serving",
    "TeamDirError": "agentmend.faces.workspace",
    "WorkspaceError": "agentmend.faces.workspace",
    "ModelRequired": "agentmend.roles.code_review",
    "SelfEditNotKept": "agentmend.loop.self_edit_tools",
    "PromptBlockError": "agentmend.roles.prompt_blocks",
    "ReportParseError": "agentmend.roles.report_parsing",
    "InvalidProposal": "agentmend.roles.self_improver",
    "UnknownAgent": "agentmend.roles.team",
    "InvalidChange": "agentmend.infrastructure.changes.effectors",
    "ChangeRefused": "agentmend.infrastructure.changes.gates",
    "CodeUpdateError": "agentmend.infrastructure.code_update.plans",
    "PlanNotFound": "agentmend.infrastructure.code_update.plans",
    "PlanStateError": "agentmend.infrastructure.code_update.plans",
    "DiffError": "agentmend.infrastructure.code_update.unified_diff",
    "AuditChainError": "agentmend.infrastructure.errors",
    "ChangeNotFound": "agentmend.infrastructure.errors",
    "ChangeStateError": "agentmend.infrastructure.errors",
    "ConfigurationError": "agentmend.infrastructure.errors",
    "InvalidArgument": "agentmend.infrastructure.errors",
    "LockTimeout": "agentmend.infrastructure.errors",
    "NotFound": "agentmend.infrastructure.errors",
    "StoreError": "agentmend.infrastructure.errors",
    "SchemaBehind": "agentmend.infrastructure.errors",
    "UnfinishedWork": "agentmend.infrastructure.changes.protocol.apply",
    "PostgresExtraMissing": "agentmend.infrastructure.errors",
    "WrongArgumentType": "agentmend.infrastructure.errors",
    "SuiteMismatch": "agentmend.infrastructure.evaluation.verification",
    "FrontMatterError": "agentmend.infrastructure.definitions.frontmatter",
    "NetworkRefusedError": "agentmend.infrastructure.llm.network_guard",
    "UnexpectedModelCall": "agentmend.infrastructure.llm.testing",
    "InvalidExecution": "agentmend.infrastructure.monitoring.performance_monitor",
    "MonitorClosed": "agentmend.infrastructure.monitoring.performance_monitor",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentmend' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # the public surface only: not the names this module itself imports to work
    return sorted({*__all__, "__version__"})
