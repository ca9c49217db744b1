"""``python -m agentmend``: the interactive session, as ``agentmend session`` starts it."""

import sys

from agentmend.faces.session.app import main

if __name__ == "__main__":
    sys.exit(main())
