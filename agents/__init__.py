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
    from agents.ask_agent_tool import AskAgentTool, create_ask_agent_tool
    from infrastructure.audit import verify_audit_chain
    from infrastructure.detection import IssueDetector
    from infrastructure.errors import (
        AgentmendError,
        AgentRunError,
        ErrorKind,
        PathNotAllowed,
        RollbackConflict,
        SpecError,
    )
    from infrastructure.improvement_manager import ImprovementManager
    from infrastructure.llm.base import AgentResult, AgentRuntime, ToolSpec
    from infrastructure.llm.claude_sdk_hooks import claude_sdk_hooks
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
    from infrastructure.performance_monitor import PerformanceMonitor
    from infrastructure.settings import Settings
    from infrastructure.spec import AgentSpec, load_agent_specs
    from infrastructure.store import Store

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
    "load_agent_specs": "infrastructure.spec",
    "PerformanceMonitor": "infrastructure.performance_monitor",
    "IssueDetector": "infrastructure.detection",
    "ImprovementManager": "infrastructure.improvement_manager",
    "verify_audit_chain": "infrastructure.audit",
    "Store": "infrastructure.store",
    "Settings": "infrastructure.settings",
    "AgentResult": "infrastructure.llm.base",
    "AgentRuntime": "infrastructure.llm.base",
    "ToolSpec": "infrastructure.llm.base",
    "claude_sdk_hooks": "infrastructure.llm.claude_sdk_hooks",
    "AgentmendError": "infrastructure.errors",
    "AgentRunError": "infrastructure.errors",
    "ErrorKind": "infrastructure.errors",
    "PathNotAllowed": "infrastructure.errors",
    "RollbackConflict": "infrastructure.errors",
    "SpecError": "infrastructure.errors",
    "AskAgentTool": "agents.ask_agent_tool",
    "create_ask_agent_tool": "agents.ask_agent_tool",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
