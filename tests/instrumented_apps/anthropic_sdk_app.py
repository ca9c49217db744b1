"""A plain ``anthropic`` app: the SDK's own tracing (on by default) and nothing else.

python anthropic_sdk_app.py CALLS [parallel]   (CALLS calls: in turn, or at once)
"""

from __future__ import annotations

import sys

from _otel import global_provider, plain_anthropic_calls

if __name__ == "__main__":
    plain_anthropic_calls(
        global_provider("plain-app"), int(sys.argv[1]), parallel=sys.argv[2:] == ["parallel"]
    )
