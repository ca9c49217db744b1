"""OpenLLMetry's anthropic instrumentation on a plain ``anthropic`` app (no framework).

python openllmetry_anthropic_app.py CALLS [parallel]   (CALLS calls: in turn, or at once)
"""

from __future__ import annotations

import sys

from _otel import global_provider, plain_anthropic_calls
from opentelemetry.instrumentation.anthropic import (  # type: ignore[import-not-found]
    AnthropicInstrumentor,
)

if __name__ == "__main__":
    provider = global_provider("llmetry-app")
    AnthropicInstrumentor().instrument(tracer_provider=provider)
    plain_anthropic_calls(provider, int(sys.argv[1]), parallel=sys.argv[2:] == ["parallel"])
