"""OpenLLMetry's anthropic instrumentation on a plain ``anthropic`` app (no framework).

python openllmetry_anthropic_app.py CALLS [parallel]   (CALLS calls: in turn, or at once)
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

from _otel import API_URL, global_provider, run_each
from anthropic import Anthropic
from opentelemetry.instrumentation.anthropic import (  # type: ignore[import-not-found]
    AnthropicInstrumentor,
)


def main(calls: int, parallel: bool) -> None:
    provider = global_provider("llmetry-app")
    AnthropicInstrumentor().instrument(tracer_provider=provider)
    client = Anthropic(api_key="sk-test", base_url=API_URL, max_retries=0)

    def run(_name: str) -> object:
        return client.messages.create(
            model="claude-haiku-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": "go"}],
        )

    if parallel:
        with ThreadPoolExecutor(max_workers=calls) as pool:
            list(pool.map(lambda _: run_each(["call"], run), range(calls)))
    else:
        run_each(["call"] * calls, run)
    provider.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:] == ["parallel"])
