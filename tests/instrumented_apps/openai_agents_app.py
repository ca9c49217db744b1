"""openai-agents on the Responses API, traced by OpenInference's or OpenLLMetry's bridge.

    python openai_agents_app.py openinference|openllmetry AGENT...   (one run per AGENT)

Each agent has a ``lookup`` tool, so a run is one model call, or two when the model calls it.
Both bridges replace the SDK's own trace processor (which would send to OpenAI's servers).
"""

from __future__ import annotations

import sys

from _otel import API_URL, global_provider, run_each
from openai import AsyncOpenAI  # type: ignore[import-not-found]

# openai-agents' package is ``agents``: in the apps' venv it is that, not this repository's
from agents import (
    Agent,
    Runner,
    function_tool,
    set_default_openai_client,
)


def main(bridge: str, agents: list[str]) -> None:
    provider = global_provider("agents-app")
    if bridge == "openinference":
        from openinference.instrumentation.openai_agents import (  # type: ignore[import-not-found]
            OpenAIAgentsInstrumentor,
        )

        OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    else:
        from opentelemetry.instrumentation.openai_agents import (  # type: ignore[import-not-found]
            OpenAIAgentsInstrumentor,
        )

        OpenAIAgentsInstrumentor(replace_existing_processors=True).instrument(
            tracer_provider=provider
        )
    set_default_openai_client(
        AsyncOpenAI(api_key="sk-test", base_url=f"{API_URL}/v1", max_retries=0),
        use_for_tracing=False,
    )

    @function_tool  # type: ignore[untyped-decorator]
    def lookup(topic: str) -> str:
        """Look a topic up."""
        return f"notes on {topic}"

    def run(name: str) -> object:
        agent = Agent(name=name, instructions="Answer briefly.", model="gpt-4.1", tools=[lookup])
        return Runner.run_sync(agent, "go")

    run_each(agents, run)
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
