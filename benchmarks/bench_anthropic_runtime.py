"""Per-turn overhead of ``AnthropicRuntime`` over a bare ``anthropic`` client call.

Both talk to the fake Messages API on 127.0.0.1 (``tests/fake_messages_api.py``) through the
same client and connection pool, measured alternately in one process so drift hits both alike:

- single turn: ``runtime.run(spec, prompt)`` against ``client.messages.create`` with the very
  request body the runtime sent;
- tool loop: a 4-turn run (3 tool calls, then text) against the 4 recorded request bodies
  replayed with the bare client; reported per turn.

Goal: runtime median within 1.1x of the bare median. Run:
``.venv/bin/python benchmarks/bench_anthropic_runtime.py [-n 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import anthropic
from fake_messages_api import FakeMessagesAPI, Reply

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.llm.anthropic_runtime import AnthropicRuntime
from agentmend.infrastructure.llm.base import ToolSpec
from agentmend.infrastructure.llm.retry import RetryPolicy

MODEL = "claude-sonnet-4-6"
LOOP_TURNS = 4


async def echo(arguments: dict[str, Any]) -> str:
    return f"looked up {arguments.get('key')}"


TOOL = ToolSpec(
    "lookup",
    "Look a key up.",
    echo,
    input_schema={"type": "object", "properties": {"key": {"type": "string"}}},
)


def loop_script() -> list[Reply]:
    calls = [Reply.tool_use("lookup", {"key": f"k{i}"}) for i in range(LOOP_TURNS - 1)]
    return [*calls, Reply.text("done")]


async def bare_call(client: anthropic.AsyncAnthropic, body: dict[str, Any]) -> None:
    await client.messages.create(**body)


async def time_ns(fn: Callable[[], Awaitable[object]]) -> int:
    started = time.perf_counter_ns()
    await fn()
    return time.perf_counter_ns() - started


def summary(name: str, runtime_ns: list[int], bare_ns: list[int], per: int) -> str:
    rt = statistics.median(runtime_ns) / per / 1000
    bare = statistics.median(bare_ns) / per / 1000
    return (
        f"{name:<12} runtime {rt:8.1f} us/turn   bare {bare:8.1f} us/turn   "
        f"overhead {rt - bare:7.1f} us   ratio {rt / bare:5.3f}x"
    )


async def main(n: int) -> None:
    api = FakeMessagesAPI()
    client = anthropic.AsyncAnthropic(api_key="bench", base_url=api.base_url, max_retries=0)
    runtime = AnthropicRuntime(client=client, retry_policy=RetryPolicy())
    spec = AgentSpec(
        name="bench", description="d", system_prompt="You answer.", model=MODEL, max_tokens=256
    )
    try:
        # Record the exact bodies the runtime sends, to replay them with the bare client.
        api.enqueue(Reply.text("ok"))
        await runtime.run(spec, "hello")
        api.enqueue(*loop_script())
        await runtime.run(spec, "look things up", tools=[TOOL])
        bodies = [r.json for r in api.message_requests()]
        single_body, loop_bodies = bodies[0], bodies[1:]
        api.requests.clear()

        async def run_single() -> None:
            api.enqueue(Reply.text("ok"))
            result = await runtime.run(spec, "hello")
            assert result.success, result.error

        async def bare_single() -> None:
            api.enqueue(Reply.text("ok"))
            await bare_call(client, single_body)

        async def run_loop() -> None:
            api.enqueue(*loop_script())
            result = await runtime.run(spec, "look things up", tools=[TOOL])
            assert result.turns == LOOP_TURNS, result.error

        async def bare_loop() -> None:
            api.enqueue(*loop_script())
            for body in loop_bodies:
                await bare_call(client, body)

        results: dict[str, tuple[list[int], list[int]]] = {"single": ([], []), "loop": ([], [])}
        cases = {"single": (run_single, bare_single), "loop": (run_loop, bare_loop)}
        for name, (with_runtime, bare) in cases.items():
            for _ in range(max(10, n // 10)):  # warm up connections and code paths
                await with_runtime()
                await bare()
            for i in range(n):
                # Alternate which goes first so neither always gets the warmer connection.
                first, second = (with_runtime, bare) if i % 2 == 0 else (bare, with_runtime)
                t1, t2 = await time_ns(first), await time_ns(second)
                rt, bt = (t1, t2) if i % 2 == 0 else (t2, t1)
                results[name][0].append(rt)
                results[name][1].append(bt)
            api.requests.clear()  # keep the log from growing across the run

        print(f"AnthropicRuntime vs bare anthropic client, fake API on 127.0.0.1, n={n}")
        print(summary("single turn", *results["single"], per=1))
        print(summary(f"{LOOP_TURNS}-turn loop", *results["loop"], per=LOOP_TURNS))
    finally:
        await client.close()
        api.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=300, help="measured iterations per case")
    asyncio.run(main(parser.parse_args().n))
