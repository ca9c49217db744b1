"""``python -m agentmend.faces.cli``: the ``agentmend`` command."""

import sys

from agentmend.faces.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
