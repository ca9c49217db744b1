"""Oversized and absurdly nested requests against a real MCP server over stdio.

Starts ``python -m agentmend.mcp_server`` with the default bounds and sends, one after another:
the 88 MB plan (100 files of 878 KB), a 50 MB description, a request nested 200,000 levels
deep, and a 9 MB request (under the request bound, with one argument over the tool-argument
bound). For each it prints the request's size, how it was answered, the seconds to the answer
and the server's peak resident memory (VmHWM) after it, against the peak after ``initialize``
in the same process; then checks the server still answers.

    python benchmarks/bench_bounded_input.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mcp_wire import McpProcess, deep_request
from tiny_project import make_project


def _plan_request(ident: int, files: int, file_bytes: int, description_bytes: int = 20) -> bytes:
    content = "#" * file_bytes
    arguments = {
        "action": "plan",
        "description": "d" * description_bytes,
        "files": [
            {"path": f"m{i}.py", "operation": "create", "content": content} for i in range(files)
        ],
    }
    message = {
        "jsonrpc": "2.0",
        "id": ident,
        "method": "tools/call",
        "params": {"name": "self_improve", "arguments": arguments},
    }
    return json.dumps(message).encode()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        project = make_project(Path(tmp) / "proj")
        server = McpProcess(project / ".agentmend", project)
        try:
            server.initialize()
            baseline = server.peak_memory_kib()
            cases = [
                ("88 MB plan (100 x 878 KB)", _plan_request(1, 100, 878_000)),
                ("50 MB description", _plan_request(2, 1, 10, 50_000_000)),
                ("nested 200,000 deep", deep_request(3, 200_000)),
                ("9 MB request, 9 MB argument", _plan_request(4, 1, 10, 9_000_000)),
            ]
            print(f"server peak memory after initialize: {baseline / 1024:.1f} MiB")
            print(f"{'request':<30} {'bytes':>12} {'answer':<44} {'seconds':>8} {'peak MiB':>9}")
            worst = 0.0
            for name, line in cases:
                started = time.perf_counter()
                server.send(line)
                answer = server.receive(120.0)
                elapsed = time.perf_counter() - started
                worst = max(worst, elapsed)
                if "error" in answer:
                    text = f"JSON-RPC error {answer['error']['code']}"
                elif answer.get("result", {}).get("isError"):
                    message = answer["result"]["content"][0]["text"].split(": ", 1)[-1]
                    text = "tool error: " + message[:32]
                else:
                    text = "accepted"
                peak = server.peak_memory_kib() / 1024
                print(f"{name:<30} {len(line):>12,} {text:<44} {elapsed:>8.3f} {peak:>9.1f}")
            server.request(9, "tools/list")
            alive = "tools" in server.receive(30.0).get("result", {})
            print(f"server still answers: {alive}")
            print(f"slowest refusal: {worst:.3f} s; peak memory growth over initialize: "
                  f"{(server.peak_memory_kib() - baseline) / 1024:.1f} MiB")  # fmt: skip
        finally:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
