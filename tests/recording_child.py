"""A recorder for the crash test of cassettes: records until it is killed.

As a script (``python recording_child.py BASE_URL CASSETTE``) it runs one agent on the Messages
API at ``BASE_URL`` (the fake one) with a ``RecordingRuntime``, question after question, and
prints ``ACK <n>`` (flushed) once the run of question ``n`` returned, so its exchange was stored.
The parent kills it with SIGKILL at a random moment and checks the cassette.
"""

from __future__ import annotations

import asyncio
import sys

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.llm.cassette import RecordingRuntime

SPEC = AgentSpec(
    name="recorder",
    description="answers questions",
    system_prompt="You answer questions.",
    model="claude-haiku-4-5",
    max_tokens=256,
)


def question(n: int) -> str:
    return f"question {n}"


async def record_forever(base_url: str, cassette: str) -> None:
    runtime = RecordingRuntime(cassette, api_key="sk-ant-child-key-0123456789", base_url=base_url)
    n = 0
    while True:
        result = await runtime.run(SPEC, question(n))
        if result.error is not None:
            raise SystemExit(f"run {n} failed: {result.error}")
        print(f"ACK {n}", flush=True)
        n += 1


if __name__ == "__main__":
    asyncio.run(record_forever(sys.argv[1], sys.argv[2]))
