"""The MCP server ends soon after its client closes stdin, even with replies nobody reads.

Over real stdio, as a client that gives up would leave it: many calls in flight, stdout full
(the client never reads it), then stdin closed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CALLS_IN_FLIGHT = 20
LISTINGS = 200  # each tools/list reply is a few KB: together far more than a pipe holds
REPLIES = LISTINGS + CALLS_IN_FLIGHT
EXIT_TIMEOUT_S = 10.0  # a hang is what is tested; the time measured is reported, not asserted


def _message(method: str, params: dict[str, Any], msg_id: int | None = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if msg_id is not None:
        body["id"] = msg_id
    return (json.dumps(body) + "\n").encode()


_INITIALIZE = _message(
    "initialize",
    {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
    1,
)


def _requests() -> bytes:
    out = [_message("notifications/initialized", {})]
    out += [_message("tools/list", {}, 100 + i) for i in range(LISTINGS)]
    out += [
        _message("tools/call", {"name": "memory", "arguments": {"query": "config"}}, 1000 + i)
        for i in range(CALLS_IN_FLIGHT)
    ]
    return b"".join(out)


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(3))
def test_closing_stdin_with_calls_in_flight_and_stdout_full_ends_the_server(
    tmp_path: Path, attempt: int
) -> None:
    stderr = (tmp_path / "server.stderr").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentmend.faces.mcp.server",
            "--workspace",
            str(tmp_path / "ws"),
            "--root",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        cwd=ROOT,
    )
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(_INITIALIZE)
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1  # serving (startup takes seconds)
        proc.stdin.write(_requests())
        proc.stdin.flush()
        time.sleep(0.5 + 0.2 * attempt)  # the server works through them and fills stdout
        closed_at = time.monotonic()
        proc.stdin.close()
        code = proc.wait(timeout=EXIT_TIMEOUT_S)
        took = time.monotonic() - closed_at
        unread = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, stderr):
            if stream is not None:
                stream.close()
    log = (tmp_path / "server.stderr").read_text()
    print(f"exited {took:.2f} s after stdin closed, {len(unread)} bytes unread")
    assert code == 0, log
    # stdout really was full when the client left: the server had more replies to write
    assert unread.count(b"\n") < REPLIES
    assert "Traceback" not in log
    assert (tmp_path / "ws" / "agentmend.db").exists()
