"""What the fleet checker does with an issue it opens: report it, ask a person, or improve.

- ``report``: the issue is opened (and printed); nothing else.
- ``ask``: the checker asks whether to run a cycle for it (a row in the store,
  :mod:`agentmend.infrastructure.changes.cycle_requests`) and goes on judging; a person answers
  from any face, and the checker runs the cycle of an approved request at a later step, or holds
  a declined issue as a session's "no" does.
- ``improve``: the checker approves its own requests and runs the cycles unattended. Only with
  yolo mode on (``AGENTMEND_YOLO_MODE=true``, the explicit approval for changes nobody reviews;
  the audit records it) and only for a team with a published release, so that what a cycle
  keeps goes out as a canary release, judged on live runs, never straight to stable.

The cycles run one at a time on a thread of their own (with an event loop of its own), so the
checker keeps judging and keeps its seat while a cycle asks its questions. Every other gate of
a cycle holds, and the cycle claims its issue like any other, so a session that started a cycle
for the issue first wins. The checker acts as its own principal
(:meth:`Principal.fleet_checker`): it may publish canaries and settle rollouts, nothing else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from agentmend.infrastructure.changes.cycle_requests import CycleRequest, CycleRequests
from agentmend.infrastructure.changes.protocol.team_registry import team_id
from agentmend.infrastructure.detection.checker_seat import SeatHolder, read_checkers
from agentmend.infrastructure.errors import AgentmendError, ConfigurationError
from agentmend.infrastructure.models import IssueReport
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from agentmend.infrastructure.detection.detector import IssueDetector
    from agentmend.loop.cycle import CycleResult

__all__ = [
    "POLICIES",
    "CyclePolicy",
    "CycleRunner",
    "IssuePolicy",
    "PolicyName",
    "PolicyNote",
    "ReportPolicy",
    "check_unattended",
    "holding_checker",
]

log = get_logger(__name__)

PolicyName = Literal["report", "ask", "improve"]
POLICIES: tuple[PolicyName, ...] = ("report", "ask", "improve")


@dataclass(frozen=True, slots=True)
class PolicyNote:
    """Something the policy did, for the face to show: a question asked, a cycle's end."""

    issue_id: str
    agent: str
    text: str
    result: CycleResult | None = None


class IssuePolicy(Protocol):
    """The checker's policy: told of each issue it opens, and given a turn after each check."""

    name: PolicyName

    def opened(self, issue: IssueReport) -> PolicyNote | None:
        """The checker opened ``issue`` (or raised it again)."""

    def act(self) -> list[PolicyNote]:
        """A turn after a check while the checker holds the seat: never waits for a person."""

    def close(self) -> None:
        """Stop: a running cycle is waited for (it ends on its own bounds)."""


class CycleRunner(Protocol):
    """What runs the checker's cycles: a ``MetaOrchestrator`` on the checker's workspace."""

    @property
    def detector(self) -> IssueDetector: ...

    async def run_improvement_cycle(self, issue: IssueReport) -> CycleResult: ...

    def advance_watches(self, agent_name: str | None = None) -> Sequence[object]: ...


class ReportPolicy:
    """Open the issue, nothing else."""

    name: PolicyName = "report"

    def opened(self, issue: IssueReport) -> PolicyNote | None:
        return None

    def act(self) -> list[PolicyNote]:
        return []

    def close(self) -> None:
        return None


def holding_checker(store: Store, team_dir: Path) -> SeatHolder | None:
    """The fleet checker holding the seat of the team at ``team_dir`` now (None: none, or one
    silent past its term): while one does, the session and the MCP server leave it the
    team's issues."""
    now = time.time()
    live = [seat for seat in read_checkers(store) if not seat.lapsed(now)]
    if not live:  # the common case: no checker, and no team id to look up
        return None
    team = team_id(team_dir, store)
    return next((seat for seat in live if seat.team_id == team), None)


def check_unattended(yolo_mode: bool, has_release: bool, team_id: str) -> None:
    """Refuse ``improve`` without its explicit approval or without a release to canary against.

    Raises:
        ConfigurationError: one line naming what to set or do.
    """
    if not yolo_mode:
        raise ConfigurationError(
            "--on-issue improve runs cycles nobody reviews: set AGENTMEND_YOLO_MODE=true to "
            "approve that explicitly (the audit records it), or use --on-issue ask"
        )
    if not has_release:
        raise ConfigurationError(
            f"--on-issue improve publishes what it keeps as a canary release, and team "
            f"{team_id} has no published release to canary against: run agentmend release "
            "publish first, or use --on-issue ask or report"
        )


class CyclePolicy:
    """``ask`` or ``improve``: a request per issue, and a cycle for each approved one.

    Args:
        name: ``ask`` (a person answers) or ``improve`` (approved unattended; check it with
            :func:`check_unattended` first).
        requests: the store's cycle requests.
        team_id: the team the checker judges.
        principal: the checker's identity (:meth:`Principal.fleet_checker`).
        orchestrator: runs the cycles (built on the checker's workspace, as that principal,
            with its publisher, if the team publishes releases). One thread at a time uses
            it: the cycle thread while a cycle runs, the checker's otherwise.
        advance_rollouts: called at each turn to carry the team's running rollout on by its
            evidence (settling it), or None.
        stale_after_s: a request started this long ago by a checker that is gone is approved
            again, for this checker to run (``AGENTMEND_ISSUE_CLAIM_STALE_S``, the bound after
            which its cycle's claim on the issue may be taken over too).
    """

    def __init__(
        self,
        name: Literal["ask", "improve"],
        requests: CycleRequests,
        team_id: str,
        principal: Principal,
        orchestrator: CycleRunner,
        *,
        advance_rollouts: Callable[[], object] | None = None,
        stale_after_s: float = 3600.0,
    ) -> None:
        self.name: PolicyName = name
        self.requests = requests
        self.team_id = team_id
        self.principal = principal
        self.orchestrator = orchestrator
        self._advance = advance_rollouts
        self._stale_after_s = stale_after_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agentmend-checker-cycles", daemon=True
        )
        self._thread.start()
        self._running: tuple[CycleRequest, Future[CycleResult]] | None = None

    def opened(self, issue: IssueReport) -> PolicyNote | None:
        if issue.issue_id is None:
            return None
        request, created = self.requests.ask(
            self.team_id, issue, by=self.principal, approved=self.name == "improve"
        )
        if not created:
            return None
        if self.name == "improve":
            return PolicyNote(
                request.issue_id,
                request.agent,
                f"issue {request.issue_id}: a cycle for {request.agent} will run unattended",
            )
        return PolicyNote(
            request.issue_id,
            request.agent,
            f"issue {request.issue_id}: run a cycle for {request.agent}? answer with agentmend "
            f"issue approve {request.issue_id} (or decline {request.issue_id})",
        )

    def act(self) -> list[PolicyNote]:
        notes: list[PolicyNote] = []
        if self._advance is not None:
            try:
                self._advance()
            except AgentmendError as exc:  # the next turn tries again
                log.warning("checker_rollout_not_advanced", team=self.team_id, error=str(exc))
        if self._running is not None:
            request, future = self._running
            if not future.done():
                return notes
            self._running = None
            notes.append(self._ended(request, future))
        # (none of this process's is running: a running cycle returned above)
        self.requests.restart_stale(self.team_id, older_than_s=self._stale_after_s)
        try:  # a change a cycle here keeps on live runs (no eval suite) is judged here
            self.orchestrator.advance_watches()
        except AgentmendError as exc:  # the next turn tries again
            log.warning("checker_watch_not_advanced", team=self.team_id, error=str(exc))
        for declined in self.requests.of_team(self.team_id, "declined"):
            notes.append(self._hold(declined))
        for approved in self.requests.of_team(self.team_id, "approved"):
            if not self.requests.start(approved.issue_id):
                continue  # another checker took it between the read and the move
            future = asyncio.run_coroutine_threadsafe(
                self.orchestrator.run_improvement_cycle(approved.issue), self._loop
            )
            self._running = (approved, future)
            notes.append(
                PolicyNote(
                    approved.issue_id,
                    approved.agent,
                    f"issue {approved.issue_id}: cycle for {approved.agent} started "
                    f"(approved by {approved.answered_by})",
                )
            )
            break  # one cycle at a time
        return notes

    def _hold(self, request: CycleRequest) -> PolicyNote:
        """A declined issue is held, as a session's "no" holds it (no cycle thread runs)."""
        self.orchestrator.detector.cycle_finished(request.issue, kept=False, outcome="declined")
        self.requests.finish(request.issue_id, "declined")
        return PolicyNote(
            request.issue_id,
            request.agent,
            f"issue {request.issue_id}: declined by {request.answered_by}; held, no cycle",
        )

    def _ended(self, request: CycleRequest, future: Future[CycleResult]) -> PolicyNote:
        try:
            result = future.result()
        except Exception as exc:  # recorded by the cycle, which rolled back what it applied
            log.error("checker_cycle_failed", issue_id=request.issue_id, error=str(exc))
            self.requests.finish(request.issue_id, "error")
            return PolicyNote(
                request.issue_id,
                request.agent,
                f"issue {request.issue_id}: cycle for {request.agent} failed: {exc}",
            )
        self.requests.finish(request.issue_id, result.status)
        return PolicyNote(
            request.issue_id,
            request.agent,
            f"issue {request.issue_id}: cycle for {request.agent} ended: {result.summary()}",
            result,
        )

    def close(self) -> None:
        if self._running is not None:
            request, future = self._running
            concurrent.futures.wait([future])
            self._ended(request, future)  # its end is recorded on its request
            self._running = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._loop.close()
