"""The errors of releases and rollouts (under the package's one root)."""

from __future__ import annotations

from agentmend.infrastructure.errors import AgentmendError

__all__ = ["ReleaseRefused", "RolloutConflict"]


class ReleaseRefused(AgentmendError):
    """A release that cannot be published: one of its files fails to parse; names the file.

    Nothing is written to the store when a release is refused.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"release refused: {path}: {problem}")


class RolloutConflict(AgentmendError):
    """A rollout step asked of a release that is not in the state the step needs.

    For example promoting a release that is not the current canary, or starting a canary
    while another one is in progress.
    """

    def __init__(self, version: int, problem: str) -> None:
        self.version = version
        self.problem = problem
        super().__init__(f"release {version}: {problem}")
