"""The runtime seam. SDK-backed runtimes import their SDK only when constructed."""

from agentmend.infrastructure.llm.base import (
    AgentResult,
    AgentRuntime,
    ToolCallRecord,
    ToolError,
    ToolHandler,
    ToolSpec,
    Usage,
)

__all__ = [
    "AgentResult",
    "AgentRuntime",
    "ToolCallRecord",
    "ToolError",
    "ToolHandler",
    "ToolSpec",
    "Usage",
]
