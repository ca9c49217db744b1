"""OpenInference's anthropic instrumentation, each agent a function under ``@tracer.agent``.

    python openinference_anthropic_app.py AGENT...    (one run per AGENT, in order)

A run makes two model calls (a plan, then an answer), as a small hand-written agent does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from _otel import API_URL, global_provider, run_each
from anthropic import Anthropic
from anthropic.types import TextBlock
from openinference.instrumentation import OITracer, TraceConfig  # type: ignore[import-not-found]
from openinference.instrumentation.anthropic import (  # type: ignore[import-not-found]
    AnthropicInstrumentor,
)


def main(agents: list[str]) -> None:
    provider = global_provider("oi-app")
    AnthropicInstrumentor().instrument(tracer_provider=provider)
    tracer = OITracer(provider.get_tracer(__name__), config=TraceConfig())
    client = Anthropic(api_key="sk-test", base_url=API_URL, max_retries=0)

    def ask(prompt: str) -> str:
        reply = client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": prompt}],
        )
        return "".join(block.text for block in reply.content if isinstance(block, TextBlock))

    def answer(question: str) -> str:
        return ask(f"answer: {ask(f'plan: {question}')}")

    def agent_named(name: str) -> Callable[[str], str]:
        agent: Callable[[str], str] = tracer.agent(name=name)(answer)
        return agent

    run_each(agents, lambda name: agent_named(name)("go"))
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
