"""What a ClaudeAgentRuntime run costs: CLI start-up, per turn, and stopping a run.

Every figure runs the real bundled Claude Code CLI against the fake Messages API on 127.0.0.1
(tests/fake_messages_api.py), so it measures the CLI, the SDK and the runtime, not a model.

- start-up: from ``run()`` to the CLI's first ``POST /v1/messages``: the CLI's own start, which
  is not ours to remove;
- 1-turn and 3-turn runs (text; tool, tool, text); the per-turn cost is their difference / 2,
  and, less noisy, the time from one request of a run to the next (tool call, tool result and
  the CLI's turn around it);
- the baseline, measured in the same process: a bare ``claude_agent_sdk.query`` 1-turn run with
  the same isolation options, so ``runtime / bare`` is the runtime's own overhead;
- abort: from a run's timeout to its return with the CLI gone (the runtime signals its process),
  against the SDK's own close of a cancelled bare query (stdin EOF, then a 5 s grace).

Usage: ``python benchmarks/bench_claude_runtime.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fake_messages_api import FakeMessagesAPI, RecordedRequest, Reply  # noqa: E402

from agentmend.infrastructure.definitions.spec import AgentSpec  # noqa: E402
from agentmend.infrastructure.errors import ErrorKind  # noqa: E402
from agentmend.infrastructure.llm.base import AgentResult, ToolSpec  # noqa: E402
from agentmend.infrastructure.llm.claude.runtime import ClaudeAgentRuntime  # noqa: E402

SPEC = AgentSpec(
    name="bench",
    description="benchmark agent",
    system_prompt="You answer briefly.",
    model="claude-sonnet-4-5",
    tools=("lookup",),
)


async def _lookup(arguments: dict[str, Any]) -> str:
    return "found"


LOOKUP = ToolSpec("lookup", "Look up.", _lookup, input_schema={"type": "object", "properties": {}})


class ArrivalClock:
    """Notes when each request of a run arrived (then lets the scripted queue answer)."""

    def __init__(self, api: FakeMessagesAPI) -> None:
        self.arrivals: list[float] = []
        api.set_responder(self._note)

    def _note(self, request: RecordedRequest) -> None:
        self.arrivals.append(time.perf_counter())

    def reset(self) -> None:
        self.arrivals = []


async def _timed(fn: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await fn()
    return time.perf_counter() - started


async def _bare_query(api: FakeMessagesAPI, home: str) -> None:
    from claude_agent_sdk import ClaudeAgentOptions, query

    options = ClaudeAgentOptions(
        env={
            "ANTHROPIC_BASE_URL": api.base_url,
            "ANTHROPIC_API_KEY": "bench",
            "HOME": home,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
        },
        cwd=home,
        model=SPEC.model,
        system_prompt=SPEC.system_prompt,
        tools=[],
        setting_sources=[],
        skills=[],
        thinking={"type": "disabled"},
    )
    async for _ in query(prompt="hello", options=options):
        pass


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.0f} ms"


async def main(repeats: int) -> None:
    api = FakeMessagesAPI()
    clock = ArrivalClock(api)
    runtime = ClaudeAgentRuntime(base_url=api.base_url, api_key="bench", max_retries=0)
    home = tempfile.mkdtemp(prefix="agentmend-bench-")
    try:
        # warm the page cache: the first start of a 370 MB binary is not what we measure
        api.enqueue(Reply.text("warm"))
        await runtime.run(SPEC, "warm up")

        bare: list[float] = []
        startup: list[float] = []
        one: list[float] = []
        three: list[float] = []
        gaps: list[float] = []
        for _ in range(repeats):
            api.enqueue(Reply.text("hi"))
            bare.append(await _timed(lambda: _bare_query(api, home)))

            api.enqueue(Reply.text("hi"))
            clock.reset()
            started = time.perf_counter()
            result: AgentResult[Any] = await runtime.run(SPEC, "hello", tools=[LOOKUP])
            one.append(time.perf_counter() - started)
            if not result.success or not clock.arrivals:
                raise SystemExit(f"1-turn run failed: {result.error}")
            startup.append(clock.arrivals[0] - started)

            api.enqueue(
                Reply.tool_use("mcp__agentmend__lookup", {}),
                Reply.tool_use("mcp__agentmend__lookup", {}),
                Reply.text("done"),
            )
            clock.reset()
            started = time.perf_counter()
            result = await runtime.run(SPEC, "hello", tools=[LOOKUP])
            three.append(time.perf_counter() - started)
            if not result.success or len(result.tool_calls) != 2 or len(clock.arrivals) != 3:
                raise SystemExit(f"3-turn run failed: {result.error}")
            gaps.extend(b - a for a, b in itertools.pairwise(clock.arrivals))

        per_turn = (statistics.median(three) - statistics.median(one)) / 2
        print(f"Claude Code CLI runs, medians of {repeats} (fake Messages API on 127.0.0.1)")
        print(f"  CLI start-up (run() -> first request) {_ms(startup)}")
        print(f"  bare SDK query, 1 turn (baseline)      {_ms(bare)}")
        print(f"  ClaudeAgentRuntime, 1 turn            {_ms(one)}")
        print(f"  ClaudeAgentRuntime, 3 turns (2 tools) {_ms(three)}")
        print(f"  per extra turn, (3-turn - 1-turn) / 2 {per_turn * 1000:8.0f} ms")
        print(f"  per turn, request to next request     {_ms(gaps)}")
        ratio = statistics.median(one) / statistics.median(bare)
        print(f"  runtime / bare SDK, 1 turn            {ratio:8.2f} x")

        aborts: list[float] = []
        bare_aborts: list[float] = []
        for _ in range(max(2, repeats // 3)):
            api.enqueue(Reply.hang(30))
            timed_out = SPEC.with_changes(timeout_s=0.5)
            started = time.perf_counter()
            result = await runtime.run(timed_out, "hang")
            if result.error is None or result.error.kind is not ErrorKind.TIMEOUT:
                raise SystemExit(f"the hung run did not time out: {result.error}")
            aborts.append(time.perf_counter() - started - 0.5)
        for _ in range(2):
            api.enqueue(Reply.hang(30))
            task = asyncio.create_task(_bare_query(api, home))
            await asyncio.sleep(1.0)
            started = time.perf_counter()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            bare_aborts.append(time.perf_counter() - started)
        print(f"  abort, runtime (timeout -> return)    {_ms(aborts)}")
        print(f"  abort, bare SDK (cancel -> return)    {_ms(bare_aborts)}")
    finally:
        await runtime.aclose()
        api.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    asyncio.run(main(parser.parse_args().repeats))
