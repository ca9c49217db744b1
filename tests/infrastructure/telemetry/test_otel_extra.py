"""Without the ``[otel]`` extra: nothing changes for users who do not use it, and those who do
get one line naming the extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BLOCK = (
    "import sys\n"
    "for name in ('opentelemetry.sdk', 'opentelemetry.sdk.trace', 'opentelemetry.proto',\n"
    "             'opentelemetry.proto.collector.trace.v1.trace_service_pb2'):\n"
    "    sys.modules[name] = None  # as if the extra were not installed\n"
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120
    )


def test_the_span_processor_names_the_extra() -> None:
    result = run(
        "import agentmend\n"
        "try:\n"
        "    agentmend.AgentmendSpanProcessor\n"
        "except agentmend.AgentmendError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OtelExtraMissing opentelemetry-sdk is not installed")
    assert "agentmend[otel]" in result.stdout


def test_the_receiver_command_says_so_in_one_line(tmp_path: Path) -> None:
    result = run(
        "from agentmend.faces.cli.otel import main\n"
        f"sys.exit(main(['--port', '0', '--workspace', {str(tmp_path)!r}]))\n"
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("agentmend: opentelemetry-proto is not installed")
    assert "agentmend[otel]" in lines[0]


def test_the_rest_of_agentmend_works_without_it() -> None:
    result = run(
        "from agentmend.infrastructure.tracing import agentmend_tracer, role_span\n"
        "with role_span(agentmend_tracer(), 'supervisor'):\n"
        "    pass\n"
        "from agentmend import MetaOrchestrator, PerformanceMonitor\n"
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
