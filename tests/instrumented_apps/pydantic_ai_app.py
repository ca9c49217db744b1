"""pydantic-ai agents on an Anthropic model, instrumented by pydantic-ai itself or by logfire.

    python pydantic_ai_app.py otel|logfire AGENT...    (one run per AGENT, in order)

Each agent has a ``lookup`` tool, so a run is one model call, or two when the model calls it.
"""

from __future__ import annotations

import sys

from _otel import API_URL, global_provider, run_each
from anthropic import AsyncAnthropic
from pydantic_ai import Agent  # type: ignore[import-not-found]
from pydantic_ai.models.anthropic import AnthropicModel  # type: ignore[import-not-found]
from pydantic_ai.providers.anthropic import AnthropicProvider  # type: ignore[import-not-found]


def main(mode: str, agents: list[str]) -> None:
    if mode == "logfire":
        import logfire  # type: ignore[import-not-found]

        # logfire's own set-up, sending to the OTLP endpoint of the environment only
        logfire.configure(send_to_logfire=False, service_name="pydantic-app", console=False)
        logfire.instrument_pydantic_ai()
    else:
        provider = global_provider("pydantic-app")
        Agent.instrument_all()
    client = AsyncAnthropic(api_key="sk-test", base_url=API_URL, max_retries=0)
    model = AnthropicModel("claude-sonnet-4-5", provider=AnthropicProvider(anthropic_client=client))

    def lookup(topic: str) -> str:
        """Look a topic up."""
        return f"notes on {topic}"

    def run(name: str) -> object:
        agent = Agent(model, name=name, tools=[lookup])
        return agent.run_sync("go")

    run_each(agents, run)
    if mode == "logfire":
        logfire.shutdown()
    else:
        provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
