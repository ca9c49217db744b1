"""A raw JSON-RPC client for the MCP server over real stdio, for requests no SDK client sends.

``McpProcess`` starts ``python -m agentmend.mcp_server`` with pipes, writes raw lines (an
oversized or absurdly nested request is just bytes here), reads the answers with a deadline,
and reports the server's peak memory (``VmHWM``). Used by the tests and the bounded-input
benchmark.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mcp_types

ROOT = Path(__file__).resolve().parents[1]


class McpProcess:
    """A real server process; stop it with :meth:`close` (it is killed by pid if need be)."""

    def __init__(self, workspace: Path, project: Path, **env: str) -> None:
        environment = {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": str(ROOT),
            "AGENTMEND_TESTING": "1",
            **env,
        }
        self.stderr_path = workspace.parent / "server.stderr"
        self._stderr = self.stderr_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentmend.mcp_server", "--workspace", str(workspace),
             "--root", str(project)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=str(project),
            env=environment,
        )  # fmt: skip
        self._buffer = b""

    def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line if line.endswith(b"\n") else line + b"\n")
        self.process.stdin.flush()

    def request(self, ident: int, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method}
        if params is not None:
            message["params"] = params
        self.send(json.dumps(message).encode())

    def initialize(self) -> dict[str, Any]:
        self.request(
            0,
            "initialize",
            {
                "protocolVersion": mcp_types.LATEST_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "wire-test", "version": "1"},
            },
        )
        answer = self.receive(30.0)
        self.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        return answer

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """The next message from the server; raises TimeoutError past ``timeout_s``."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no answer within {timeout_s} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("the server closed its stdout")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def peak_memory_kib(self) -> int:
        """The server process's peak resident memory (``VmHWM``), KiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return 0

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()


def deep_request(ident: int, depth: int) -> bytes:
    """A ``tools/call`` whose argument nests ``depth`` arrays deep."""
    head = f'{{"jsonrpc": "2.0", "id": {ident}, "method": "tools/call", "params": '
    body = '{"name": "status", "arguments": {"x": ' + "[" * depth + "]" * depth + "}}}"
    return (head + body).encode()


def large_request(ident: int, size: int) -> bytes:
    """A ``tools/call`` of about ``size`` bytes (one long string argument)."""
    head = f'{{"jsonrpc": "2.0", "id": {ident}, "method": "tools/call", "params": '
    filler = "x" * max(0, size - 120)
    return (head + '{"name": "status", "arguments": {"x": "' + filler + '"}}}').encode()
