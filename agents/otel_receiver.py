"""``python -m agentmend.otel_receiver``: starts the OTLP/HTTP receiver face
(``agentmend.faces.otel_receiver``)."""

import sys

from agentmend.faces.otel_receiver import main

if __name__ == "__main__":
    sys.exit(main())
