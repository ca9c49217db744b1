"""Importing agentmend must be free: no SDK import, no file written, no logging configured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json, os, sys
before = set(os.listdir('.'))
import structlog
config_before = structlog.get_config()
import agentmend
from agentmend import (AgentSpec, ExecutionRecord, AgentMetrics, IssueReport, RootCauseAnalysis,
    ImprovementAction, ChangeType, ChangeStatus, ChangeRecord, PerformanceMonitor, IssueDetector,
    ImprovementManager, AskAgentTool)
print(json.dumps({
    "sdks": sorted(m for m in ("anthropic", "claude_agent_sdk", "mcp") if m in sys.modules),
    "new_files": sorted(set(os.listdir('.')) - before),
    "logging_changed": structlog.get_config() != config_before,
}))
"""


def test_import_agents_imports_no_sdk_writes_nothing_configures_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"sdks": [], "new_files": [], "logging_changed": False}
    assert list(tmp_path.iterdir()) == []


def test_every_advertised_name_resolves() -> None:
    import agentmend

    missing = [name for name in agentmend.__all__ if not hasattr(agentmend, name)]
    assert missing == []
