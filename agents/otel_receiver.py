"""``python -m agentmend.otel_receiver``: starts the OTLP/HTTP receiver face
(``agentmend.faces.cli.otel``, around ``agentmend.infrastructure.telemetry.receiver``)."""

import sys

from agentmend.faces.cli.otel import main

if __name__ == "__main__":
    sys.exit(main())
