"""agentmend's interactive session: ask the team questions, watch it degrade, heal and prove it.

    python main.py                         the simulated six-agent team, offline (no key)
    python main.py --provider anthropic --agents .claude/agents
    python main.py --demo                  a scripted scenario, non-interactive, exits 0
    python main.py --routing-key me        a team with releases: your questions on one arm

The same session is ``agentmend session`` once the package is installed (the session itself
lives in ``agentmend.faces.session.app``).
"""

import sys

from agentmend.faces.session.app import main

if __name__ == "__main__":
    sys.exit(main())
