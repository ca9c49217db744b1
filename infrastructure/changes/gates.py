"""The six gates every concrete change passes, in order, before a byte is written.

1. ``BudgetGate``: the improvement manager's session budget and rollback brake.
2. ``ConfidenceGate``: an action less sure than ``min_confidence`` is not applied.
3. ``ScopeGate``: every file inside the team directory, with an allowed extension; never an
   eval suite, never the ``evals`` key (a change must not make its own exam easier).
4. ``RoleGate``: no change grants more than the invoking principal could.
5. ``SupervisorGate``: a separate review of the concrete change.
6. ``HumanApprovalGate``: a person says yes within the timeout, or ``yolo_mode`` skips it and
   the verdict says so.

``default_gates`` builds them in that order; ``agentmend.infrastructure.changes.proposal.run_gates``
runs them and stops at the first refusal. Every gate answers with a ``GateVerdict`` (a refusal is
data the cycle records), and a gate that cannot decide refuses: a change nobody could judge is not
made.

Role rules (``RoleGate``)
-------------------------
A principal with the ``admin`` permission may make any change. Any other principal may make
every change except one that needs admin, which is one that:

- sets ``permission_profile`` to ``open`` or to a custom allow/deny profile (setting ``locked``
  or ``standard`` is always allowed; keeping a profile an admin set earlier is not a grant);
- adds to ``tools`` a privileged tool (see ``permissions.tool_class``: shell or file-writing,
  also in Claude Code's specifier form such as ``Bash(git log:*)``; ``Task``/``Agent``; an MCP
  tool ``mcp__*``; any tool nobody classed) unless the ``read_only_tools`` setting lists it,
  or a wildcard pattern; adding a read-only or self-edit tool stays within ``standard`` and is
  allowed, removing tools always is;
- drops the ``tools`` declaration (or creates an agent without one): an agent that declares
  no tools is offered every tool, which is a grant of everything;
- newly lets the agent call a privileged tool (shell or file-writing, ``Task``/``Agent``, an
  MCP tool, a tool nobody classed; see ``permissions.tool_class``), as
  ``permissions.allowed_tools`` computes it before and after with the ``read_only_tools``
  setting (the same function and setting the runtimes enforce);
- changes a Claude Code key that widens what the agent may do: ``permissionMode`` to anything
  but ``default`` or ``plan``, new ``mcpServers``, any change to ``hooks`` (they run
  commands), or removing an entry from ``disallowedTools``;
- is a code patch, or carries no new agent definition to judge (other than a deletion).

Creating an agent is judged as granting everything the new definition holds, so a non-admin
may create an agent with a ``locked`` or ``standard`` profile and a tool list free of shell and
write tools, and nothing else. Deleting an agent grants nothing. The agent that asks for its own
change never counts: the principal is whoever invoked the cycle.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentmend.infrastructure.changes.proposal import (
    ApprovalCallback,
    ChangeReviewer,
    Gate,
    GateVerdict,
    ProposedChange,
)
from agentmend.infrastructure.definitions.widening import definition_widening
from agentmend.infrastructure.errors import AgentmendError, ConfigurationError, PathNotAllowed
from agentmend.infrastructure.files.atomic import resolve_inside
from agentmend.infrastructure.models import ChangeType
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec
    from agentmend.infrastructure.settings import Settings

__all__ = [
    "DEFAULT_ALLOWED_SUFFIXES",
    "EVAL_SUITE_SUFFIXES",
    "BudgetGate",
    "BudgetSource",
    "ChangeRefused",
    "ConfidenceGate",
    "HumanApprovalGate",
    "RoleGate",
    "ScopeGate",
    "SupervisorGate",
    "admin_requirements",
    "default_gates",
    "require_passed",
]

log = get_logger(__name__)

DEFAULT_ALLOWED_SUFFIXES: frozenset[str] = frozenset({".md", ".yaml", ".yml", ".json", ".txt"})
EVAL_SUITE_SUFFIXES: tuple[str, ...] = (".evals.yaml", ".evals.yml")
_RESERVED_DIR = ".agent"


class ChangeRefused(AgentmendError):
    """A gate refused a change; ``gate`` and ``reason`` come from its verdict."""

    def __init__(self, verdict: GateVerdict) -> None:
        self.verdict = verdict
        self.gate = verdict.gate
        self.reason = verdict.reason
        super().__init__(f"refused by the {verdict.gate} gate: {verdict.reason}")


def require_passed(verdicts: Sequence[GateVerdict]) -> None:
    """Raise ``ChangeRefused`` for the first refusal among ``verdicts`` (``run_gates``' result)."""
    for verdict in verdicts:
        if not verdict.passed:
            raise ChangeRefused(verdict)


def _pass(gate: str, reason: str, **details: Any) -> GateVerdict:
    return GateVerdict(gate=gate, passed=True, reason=reason, details=details)


def _refuse(gate: str, reason: str, **details: Any) -> GateVerdict:
    return GateVerdict(gate=gate, passed=False, reason=reason, details=details)


# -- 1. budget -----------------------------------------------------------------------------


class BudgetSource(Protocol):
    """What the budget gate asks: ``ImprovementManager`` is one."""

    def can_make_improvement(self) -> tuple[bool, str]: ...


class BudgetGate:
    """Refuses once the manager's session budget is spent or recent changes keep failing.

    The manager counts applied changes, so a group gated action by action and then applied
    together is checked against the count before the group; the caller keeps a group within
    the remaining budget.
    """

    name = "budget"

    def __init__(self, manager: BudgetSource) -> None:
        self.manager = manager

    async def check(self, change: ProposedChange) -> GateVerdict:
        allowed, reason = self.manager.can_make_improvement()
        details = {
            key: getattr(self.manager, attribute)
            for key, attribute in (
                ("applied_this_session", "session_improvement_count"),
                ("session_budget", "max_improvements_per_session"),
            )
            if hasattr(self.manager, attribute)
        }
        frees_up_at = getattr(self.manager, "budget_frees_up_at", None)
        when = frees_up_at() if frees_up_at is not None else None
        if when is not None:  # a rolling budget: say when improving can resume
            details["budget_frees_up_at"] = when.isoformat()
        if allowed:
            return _pass(self.name, "within the improvement budget", **details)
        return _refuse(self.name, reason, **details)


# -- 2. confidence -------------------------------------------------------------------------


class ConfidenceGate:
    """Refuses an action whose ``confidence_score`` is below ``min_confidence``."""

    name = "confidence"

    def __init__(self, min_confidence: float = 0.7) -> None:
        if not 0.0 <= min_confidence <= 1.0:
            raise ConfigurationError(f"min_confidence must be in [0, 1], got {min_confidence}")
        self.min_confidence = min_confidence

    async def check(self, change: ProposedChange) -> GateVerdict:
        score = change.action.confidence_score
        details = {"confidence": score, "min_confidence": self.min_confidence}
        if score < self.min_confidence:
            return _refuse(
                self.name, f"confidence {score:.2f} is below {self.min_confidence:.2f}", **details
            )
        return _pass(self.name, f"confidence {score:.2f} >= {self.min_confidence:.2f}", **details)


# -- 3. scope ------------------------------------------------------------------------------


class ScopeGate:
    """Every edit inside ``change.root`` with an allowed extension, and never an eval suite.

    Paths are checked with ``files.resolve_inside``, so absolute paths, ``..`` and symlinks
    that leave the root are refused, and the refusal names the offending path.
    """

    name = "scope"

    def __init__(self, allowed_suffixes: Iterable[str] = DEFAULT_ALLOWED_SUFFIXES) -> None:
        self.allowed_suffixes = frozenset(allowed_suffixes)
        bad = sorted(s for s in self.allowed_suffixes if not s.startswith("."))
        if bad:
            raise ConfigurationError(f"allowed suffixes start with a dot: got {bad[0]!r}")

    async def check(self, change: ProposedChange) -> GateVerdict:
        return self.judge(change)

    def judge(self, change: ProposedChange) -> GateVerdict:
        """The verdict, synchronously: a few ``stat`` calls, no I/O worth a thread."""
        if not change.edits:
            return _refuse(self.name, "the change writes no file")
        root = Path(change.root).resolve()
        protected = _suite_paths(change.old_spec, change.new_spec)
        for edit in change.edits:
            try:
                target = resolve_inside(root, edit.path, allowed_suffixes=self.allowed_suffixes)
            except PathNotAllowed as exc:
                return _refuse(self.name, str(exc), path=edit.path)
            relative = target.relative_to(root)
            if not relative.parts:
                return _refuse(self.name, f"path {edit.path!r} is the root itself", path=edit.path)
            if relative.parts[0] == _RESERVED_DIR:
                return _refuse(
                    self.name,
                    f"path {edit.path!r} lies in {_RESERVED_DIR}/, reserved for agentmend",
                    path=edit.path,
                )
            if target.name.endswith(EVAL_SUITE_SUFFIXES) or target in protected:
                return _refuse(
                    self.name,
                    f"path {edit.path!r} is an eval suite; a change must not edit its own exam",
                    path=edit.path,
                )
        new, old = change.new_spec, change.old_spec
        if new is not None and new.evals != (old.evals if old is not None else None):
            return _refuse(
                self.name,
                f"the change sets the evals key of agent {new.name!r} "
                f"({old.evals if old is not None else None!r} -> {new.evals!r}); "
                "a change must not choose its own exam",
            )
        paths = [edit.path for edit in change.edits]
        return _pass(self.name, f"{len(paths)} file(s) inside {root}", paths=paths)


def _suite_paths(*specs: AgentSpec | None) -> frozenset[Path]:
    return frozenset(
        Path(spec.evals_path).absolute().resolve()
        for spec in specs
        if spec is not None and spec.evals_path is not None
    )


# -- 4. role -------------------------------------------------------------------------------


class RoleGate:
    """Refuses a change that needs the admin permission when the principal lacks it.

    See the module docstring for the exact rules (``admin_requirements`` computes them).
    """

    name = "role"

    def __init__(self, principal: Principal, *, read_only_tools: Iterable[str] = ()) -> None:
        self.principal = principal
        self.read_only_tools = tuple(read_only_tools)

    async def check(self, change: ProposedChange) -> GateVerdict:
        needs = admin_requirements(change, read_only_tools=self.read_only_tools)
        who = {"user_id": self.principal.user_id, "user_name": self.principal.name}
        if not needs:
            return _pass(self.name, "grants nothing beyond a standard principal's rights", **who)
        if self.principal.is_admin:
            return _pass(self.name, "admin may " + "; ".join(needs), needs_admin=needs, **who)
        log.warning(
            "refused_escalation",
            agent=change.action.target_agent,
            user_id=self.principal.user_id,
            needs=needs,
        )
        return _refuse(
            self.name,
            f"{self.principal.name} ({self.principal.user_id}) lacks the admin permission "
            f"needed to {'; '.join(needs)}",
            needs_admin=needs,
            **who,
        )


def admin_requirements(change: ProposedChange, *, read_only_tools: Iterable[str] = ()) -> list[str]:
    """What in ``change`` needs the admin permission (empty: any principal may make it).

    ``read_only_tools`` is the setting of that name, as the runtimes apply it.
    """
    action = change.action
    if action.action_type is ChangeType.CODE_PATCH:
        return ["apply a code patch (it can change anything)"]
    old, new = change.old_spec, change.new_spec
    if new is None:
        if action.action_type is ChangeType.AGENT_DELETION:
            return []
        return ["make a change that carries no agent definition to judge"]
    return definition_widening(old, new, read_only_tools=read_only_tools)


# -- 5. supervisor -------------------------------------------------------------------------


class SupervisorGate:
    """Delegates to the supervisor; its rejection (or failure) aborts with its reason."""

    name = "supervisor"

    def __init__(self, reviewer: ChangeReviewer) -> None:
        self.reviewer = reviewer

    async def check(self, change: ProposedChange) -> GateVerdict:
        try:
            verdict = await self.reviewer.review(change)
        except Exception as exc:  # an unavailable reviewer is a "no", never a silent pass
            return _refuse(self.name, f"supervisor unavailable: {str(exc) or type(exc).__name__}")
        details = dict(verdict.details)
        if verdict.gate != self.name:
            details.setdefault("reviewer", verdict.gate)
        return GateVerdict(
            gate=self.name, passed=verdict.passed, reason=verdict.reason, details=details
        )


# -- 6. human approval ---------------------------------------------------------------------


class HumanApprovalGate:
    """A person approves within ``timeout_s``; silence, an error or anything but True refuses.

    With ``yolo_mode`` the gate passes without asking, and its verdict records that it was
    skipped (``details["skipped"] == "yolo_mode"``) so the audit never implies a human said yes.
    """

    name = "human_approval"

    def __init__(
        self, callback: ApprovalCallback | None, *, yolo_mode: bool, timeout_s: float
    ) -> None:
        if not timeout_s > 0:
            raise ConfigurationError(f"approval timeout_s must be positive, got {timeout_s}")
        if callback is not None:
            _check_takes_the_change(callback)
        self.callback = callback
        self.yolo_mode = yolo_mode
        self.timeout_s = timeout_s

    async def check(self, change: ProposedChange) -> GateVerdict:
        if self.yolo_mode:
            return _pass(self.name, "skipped: yolo_mode is on", skipped="yolo_mode")
        if self.callback is None:
            return _refuse(
                self.name, "no approval callback and yolo_mode is off: nobody can approve"
            )
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = self.callback(change)
                if inspect.isawaitable(answer):
                    answer = await answer
        except TimeoutError:
            return _refuse(
                self.name,
                f"no answer within {self.timeout_s:g}s means reject",
                timeout_s=self.timeout_s,
            )
        except Exception as exc:
            return _refuse(self.name, f"approval failed: {str(exc) or type(exc).__name__}")
        if answer is True:
            return _pass(self.name, "approved by a human")
        return _refuse(self.name, "rejected by a human")


def _check_takes_the_change(callback: ApprovalCallback) -> None:
    """Refuse, when it is given, a callback that cannot be called with the change."""
    try:
        inspect.signature(callback).bind(object())
    except TypeError:
        raise ConfigurationError(
            "approval_callback must take one argument, the ProposedChange to approve "
            "(e.g. `lambda change: True`, or an async def)"
        ) from None
    except ValueError:  # a builtin without a signature: it is called as it is
        return


def default_gates(
    *,
    manager: BudgetSource,
    principal: Principal,
    reviewer: ChangeReviewer,
    approval_callback: ApprovalCallback | None = None,
    settings: Settings | None = None,
    min_confidence: float | None = None,
    yolo_mode: bool | None = None,
    approval_timeout_s: float | None = None,
    allowed_suffixes: Iterable[str] = DEFAULT_ALLOWED_SUFFIXES,
) -> list[Gate]:
    """The six gates in order. Unset thresholds come from ``settings``, else the defaults
    (``min_confidence`` 0.7, ``yolo_mode`` off, a 30 s approval timeout)."""

    def pick(value: Any, setting: str, default: Any) -> Any:
        if value is not None:
            return value
        return getattr(settings, setting) if settings is not None else default

    return [
        BudgetGate(manager),
        ConfidenceGate(pick(min_confidence, "min_confidence", 0.7)),
        ScopeGate(allowed_suffixes),
        RoleGate(principal, read_only_tools=pick(None, "read_only_tools", ())),
        SupervisorGate(reviewer),
        HumanApprovalGate(
            approval_callback,
            yolo_mode=pick(yolo_mode, "yolo_mode", False),
            timeout_s=pick(approval_timeout_s, "auto_decision_timeout", 30.0),
        ),
    ]
