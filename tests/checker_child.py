"""``agentmend ARGV`` in a process whose simulated world has a fault in it.

``python checker_child.py AGENT FAULT ARGV...``: the offline provider's simulated runtime gets
``FAULT`` injected into ``AGENT`` before the command runs, so a fleet checker's cycle questions
and verifies the agent in the same world the fleet's workers recorded its failures in (as a
real model API that truncates answers would be the same for both). Everything else is the real
command.
"""

from __future__ import annotations

import sys
from typing import Any

from agentmend.faces import workspace
from agentmend.faces.cli.app import main
from agentmend.infrastructure.llm.base import AgentRuntime
from agentmend.infrastructure.settings import Provider
from agentmend.infrastructure.simulation import SimulatedRuntime

_real_build = workspace.build_runtimes


def _main() -> int:
    agent, fault, *argv = sys.argv[1:]

    def build(provider: Provider, **options: Any) -> tuple[AgentRuntime, AgentRuntime]:
        team, roles = _real_build(provider, **options)
        assert isinstance(team, SimulatedRuntime), provider
        team.inject(agent, fault)
        return team, roles

    workspace.build_runtimes = build
    return main(argv)


if __name__ == "__main__":
    sys.exit(_main())
