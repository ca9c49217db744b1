"""``python -m agents.otel_receiver``: starts the OTLP/HTTP receiver face
(``agents.faces.otel_receiver``)."""

import sys

from agents.faces.otel_receiver import main

if __name__ == "__main__":
    sys.exit(main())
