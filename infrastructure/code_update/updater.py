"""Code-level updates: plan, approve, execute with validation, roll back.

A plan (``agentmend.infrastructure.code_update.plans``) is a set of file operations, or a
unified diff turned
into them, under a project root, with a description. It lives in the store's ``plans`` table
and moves through::

    planned --approve--> approved --execute--> completed --rollback--> rolled_back
                                       |---> rolled_back   (validation failed: never applied)
                                       |---> refused       (a gate said no; nothing written)
                                       '---> failed        (the apply failed; nothing left)

Before anything is written the plan passes the gates the improvement cycle uses, in its order:
``ScopeGate`` (the path rules again, at execution time), ``SupervisorGate`` (a separate review
of the concrete diff) and ``HumanApprovalGate``, which passes only for a plan a person approved
(``approve``), or, with ``yolo_mode``, skips asking and says so in its verdict and in the audit
(an ``approval_skipped`` row). Code plans do not pass the role gate (which reserves code patches
for admins) nor the budget gate: the caller is the person who approves them, and every change
is proven by the project's own tests or undone.

Executing first validates the plan in a throwaway copy of the project
(``agentmend.infrastructure.code_update.copy_validation``): every ``.py`` file written compiles,
then ``Settings.test_command`` passes within ``Settings.test_timeout_s``, the code under test came
from the copy, and the test counts did not drop. A plan that changes what configures or selects
the tests (``agentmend.infrastructure.code_update.suite_guard``) is refused unless its test changes
were approved with ``approve_test_changes``, which the MCP server never calls. Only a plan that
passes is applied to the real tree, as ONE change group of ``ImprovementManager.apply_group``
(old bytes in the store, human-readable backups under ``<root>/.agent/backups/``, crash
recovery that restores a group whole). The root's lock (``<root>/.agent/agentmend.lock``, the
manager's own, re-entrant) is held from the hash check through the validation and the write,
so no other update of that root interleaves. A plan that fails validation ends
``rolled_back`` with the real tree never touched.

A plan is executed under a lease of the executing process (its id stored with ``executing``);
the plan's change group is held by it. A plan whose process died (or stopped past the lease's
expiry) is settled at the next start of any face (and by ``recover``, before every execute and
rollback): its group restored and the plan marked failed (``interrupted``); ``status`` never
reports it active
(``agentmend.infrastructure.code_update.plan_recovery``). A process that resumes after losing its
lease writes nothing more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from uuid import uuid4

from agentmend.infrastructure.changes.gates import HumanApprovalGate, ScopeGate, SupervisorGate
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager, LeaseLost
from agentmend.infrastructure.changes.proposal import (
    ChangeReviewer,
    Gate,
    GateVerdict,
    ProposedChange,
    run_gates,
)
from agentmend.infrastructure.changes.protocol.decisions import (
    get_plan,
    list_plans,
    record_decision,
    save_plan,
    update_plan,
)
from agentmend.infrastructure.changes.protocol.files import root_lock
from agentmend.infrastructure.code_update.copy_validation import validate_in_copy
from agentmend.infrastructure.code_update.plan_recovery import (
    plan_is_live,
    settle_interrupted_plans,
)
from agentmend.infrastructure.code_update.plans import (
    CODE_SUFFIXES,
    CODE_TARGET,
    FINISHED_STATUSES,
    PENDING_STATUSES,
    PLAN_KIND,
    CodePlan,
    CodeUpdateError,
    ExecutionResult,
    FileOperation,
    PlanNotFound,
    PlanPaths,
    PlanStateError,
    RollbackResult,
    UpdateStatus,
    code_plan,
    proposed_change,
    stale_reason,
    state_hint,
)
from agentmend.infrastructure.code_update.suite_guard import flagged_test_files
from agentmend.infrastructure.code_update.validation import ValidationReport, failure_reason
from agentmend.infrastructure.errors import AgentmendError, PathNotAllowed, RollbackConflict
from agentmend.infrastructure.limits import InputLimits
from agentmend.infrastructure.models import ChangeType, ImprovementAction, utc_now
from agentmend.infrastructure.principal import ChangeAuthor
from agentmend.infrastructure.settings import Settings, load_settings
from agentmend.infrastructure.structured_logger import get_logger

__all__ = [
    "CODE_SUFFIXES",
    "CODE_TARGET",
    "CodePlan",
    "CodeUpdateError",
    "CodeUpdater",
    "ExecutionResult",
    "FileOperation",
    "PlanNotFound",
    "PlanStateError",
    "RollbackResult",
    "UpdateStatus",
    "ValidationReport",
]

log = get_logger(__name__)


class CodeUpdater:
    """Plans, approves, executes (with validation and automatic rollback) and rolls back.

    Args:
        root: the project root every path is relative to (and where tests run).
        manager: the improvement manager whose store holds the plans and whose change groups
            carry the writes.
        reviewer: the supervisor (``agentmend.infrastructure.changes.proposal.ChangeReviewer``).
        settings: ``yolo_mode``, ``auto_decision_timeout``, ``test_command``,
            ``test_timeout_s``.
        protected: folders no plan may touch besides ``.agent/`` and ``.git/`` (the agentmend
            workspace, whose agent definitions change only through the cycle's gates).
        allowed_suffixes: the extensions a plan may write.

    Raises:
        CodeUpdateError: ``root`` is not a directory.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        manager: ImprovementManager,
        reviewer: ChangeReviewer,
        settings: Settings | None = None,
        protected: Iterable[str | Path] = (),
        allowed_suffixes: Iterable[str] = CODE_SUFFIXES,
    ) -> None:
        self.paths = PlanPaths.of(root, protected=protected, allowed_suffixes=allowed_suffixes)
        self.root = self.paths.root
        if not self.root.is_dir():
            raise CodeUpdateError(f"project root {self.root} is not a directory")
        self.manager = manager
        self.store = manager.store
        self.reviewer = reviewer
        self.settings = settings if settings is not None else load_settings()
        self._scope = ScopeGate(self.paths.allowed_suffixes)
        list_plans(self.store, limit=0)  # the plans table exists before any transaction

    # -- reading ---------------------------------------------------------------------------

    def get(self, plan_id: str) -> CodePlan:
        """The plan with this id.

        Raises:
            PlanNotFound: no code plan of this root has that id.
        """
        plan = get_plan(self.store, plan_id)
        if plan is None or plan.payload.get("kind") != PLAN_KIND:
            raise PlanNotFound(plan_id)
        if plan.payload.get("root") != str(self.root):
            raise PlanNotFound(plan_id)  # another project's plan
        return code_plan(plan)

    def plans(self, *, limit: int = 200) -> list[CodePlan]:
        """This root's code plans, oldest first."""
        return [
            code_plan(p)
            for p in list_plans(self.store, limit=limit)
            if p.payload.get("kind") == PLAN_KIND and p.payload.get("root") == str(self.root)
        ]

    def _with_status(self, status: str) -> list[CodePlan]:
        """Every code plan of this root with ``status``, however many other plans are newer."""
        match = {"kind": PLAN_KIND, "root": str(self.root)}
        return [
            code_plan(p) for p in list_plans(self.store, status=status, limit=None, payload=match)
        ]

    def status(self) -> UpdateStatus:
        """Pending plans, the last finished execution and the one running now, if any.

        A plan is reported active only while its executing process lives; one whose process
        is gone is settled at the next start of a face (``plan_recovery``) or by
        :meth:`recover`, never by this read.
        """
        plans = self.plans()
        finished = [p for p in plans if p.status in FINISHED_STATUSES and p.result is not None]
        return UpdateStatus(
            pending_plans=tuple(p for p in plans if p.status in PENDING_STATUSES),
            last_execution=max(finished, key=lambda p: p.updated) if finished else None,
            active_improvement=next(
                (p for p in self._with_status("executing") if plan_is_live(self.manager, p)),
                None,
            ),
        )

    # -- plan and approve ------------------------------------------------------------------

    def create_plan(
        self,
        description: str | None,
        files: Sequence[FileOperation | dict[str, Any]] | None = None,
        *,
        diff: str | None = None,
        created_by: str = "mcp",
    ) -> CodePlan:
        """Validate and store a plan; nothing under the root is written.

        Give ``files`` or ``diff`` (a unified diff), not both.

        Raises:
            CodeUpdateError: a missing or invalid field, named.
            PathNotAllowed: a path outside the root, with a wrong extension, or reserved.
        """
        if not description or not description.strip():
            raise CodeUpdateError("description is required to make a plan", field="description")
        limits = InputLimits.of(self.settings)
        limits.text("description", description)
        limits.file("diff", diff)
        if files:
            limits.files("plan", files)
            limits.contents("plan", [_content(f) for f in files])
        has_files = bool(files)
        has_diff = diff is not None and bool(diff.strip())
        if has_files == has_diff:
            raise CodeUpdateError(
                "a plan needs files (a non-empty list) or diff (a unified diff), not both",
                field="files",
            )
        if has_diff:
            assert diff is not None
            operations, source = self.paths.from_diff(diff), "diff"
        else:
            operations = [
                f if isinstance(f, FileOperation) else FileOperation.model_validate(f)
                for f in files or ()
            ]
            source = "files"
        planned, _ = self.paths.check(operations)
        text = description.strip()
        change = proposed_change(self.root, text, planned, plan_id="(new)")
        verdict = self._scope.judge(change)
        if not verdict.passed:  # an eval suite: a change must not edit its own exam
            raise PathNotAllowed(str(verdict.details.get("path", "")), self.root, verdict.reason)
        plan_id = "plan-" + uuid4().hex[:12]
        payload = {
            "kind": PLAN_KIND,
            "root": str(self.root),
            "source": source,
            "files": [p.model_dump() for p in planned],
            "diff": change.diff,
            "created_by": created_by,
            "test_files": list(flagged_test_files(p.path for p in planned)),
        }
        stored = save_plan(
            self.store, description=text, payload=payload, status="planned", plan_id=plan_id
        )
        record_decision(
            self.store,
            "code_update.planned",
            agent_name=CODE_TARGET,
            payload={"plan_id": plan_id, "paths": [p.path for p in planned], "by": created_by},
        )
        log.info("code_plan_created", plan_id=plan_id, files=len(planned))
        return code_plan(stored)

    def approve(self, plan_id: str, *, approved_by: str = "mcp") -> CodePlan:
        """Record a person's approval of a planned change (the human approval gate's answer).

        Raises:
            PlanNotFound, PlanStateError: unknown plan, or not ``planned``.
            AuditChainBroken: the audit head and the database disagree.
        """
        if self.get(plan_id).status == "planned":  # the unknown and the settled fail below
            self.manager.audit.ensure_appendable()
        with self.store.transaction():
            plan = self.get(plan_id)
            if plan.status != "planned":
                raise PlanStateError(plan_id, plan.status, "be approved", state_hint(plan.status))
            updated = self._set(
                plan, "approved", approved_by=approved_by, approved_at=utc_now().isoformat()
            )
        self.manager.audit.append(
            agent_name=CODE_TARGET,
            edit_type="code_plan_approved",
            old_value=None,
            new_value=f"{plan_id}: {plan.description}",
            user_id=approved_by,
        )
        record_decision(
            self.store,
            "code_update.approved",
            agent_name=CODE_TARGET,
            payload={"plan_id": plan_id, "by": approved_by},
        )
        return updated

    def approve_test_changes(self, plan_id: str, *, approved_by: str) -> CodePlan:
        """Approve a plan's changes to its own tests (see ``code_update.suite_guard``).

        Only a channel the MCP client cannot drive calls this: ``agentmend code approve-tests``
        on a terminal or the interactive session. It also lets the test counts drop.

        Raises:
            PlanNotFound, PlanStateError: unknown plan, or already executed.
            AuditChainBroken: the audit head and the database disagree.
        """
        plan = self.get(plan_id)
        if plan.status not in ("planned", "approved"):
            raise PlanStateError(
                plan_id, plan.status, "have its test changes approved", state_hint(plan.status)
            )
        self.manager.audit.append(
            agent_name=CODE_TARGET,
            edit_type="code_plan_tests_approved",
            old_value=None,
            new_value=f"{plan_id}: {', '.join(plan.test_files) or '(test counts may drop)'}",
            user_id=approved_by,
        )
        with self.store.transaction():
            updated = self._set(self.get(plan_id), plan.status, tests_approved_by=approved_by)
        record_decision(
            self.store,
            "code_update.tests_approved",
            agent_name=CODE_TARGET,
            payload={"plan_id": plan_id, "by": approved_by, "paths": list(plan.test_files)},
        )
        return updated

    # -- execute ---------------------------------------------------------------------------

    async def execute(self, plan_id: str) -> ExecutionResult:
        """Gate, apply as one group, validate, and keep or roll back; see the module docstring.

        A refusal, a failed apply and a failed validation are results (``success`` False);
        only a request that does not fit the plan raises.

        Raises:
            PlanNotFound, PlanStateError: unknown plan, not approved (and no ``yolo_mode``), or
                already executed.
        """
        plan = self.get(plan_id)
        self._check_executable(plan)
        stale = stale_reason(plan, self.root)
        if stale:
            return await asyncio.to_thread(self._refuse, plan_id, stale, ())
        change = proposed_change(self.root, plan.description, plan.files, plan_id=plan_id)
        verdicts = tuple(await run_gates(change, self._gates(plan_id)))
        record_decision(
            self.store,
            "code_update.gates",
            agent_name=CODE_TARGET,
            payload={"plan_id": plan_id, "verdicts": [v.model_dump(mode="json") for v in verdicts]},
        )
        refusal = next((v for v in verdicts if not v.passed), None)
        if refusal is not None:
            why = f"refused by the {refusal.gate} gate: {refusal.reason}"
            return await asyncio.to_thread(self._refuse, plan_id, why, verdicts)
        # Blocking work (the root's flock, file writes, the test run) stays off the event loop.
        return await asyncio.to_thread(self._apply_and_validate, plan_id, verdicts)

    def _check_executable(self, plan: CodePlan) -> None:
        if plan.status == "approved":
            return
        if plan.status == "planned":
            if self.settings.yolo_mode:
                return
            raise PlanStateError(
                plan.plan_id, plan.status, "be executed", "approve it first (action approve)"
            )
        raise PlanStateError(plan.plan_id, plan.status, "be executed", state_hint(plan.status))

    def _gates(self, plan_id: str) -> list[Gate]:
        async def approved(change: ProposedChange) -> bool:
            return self.get(plan_id).approved_by is not None

        return [
            self._scope,
            SupervisorGate(self.reviewer),
            HumanApprovalGate(
                approved,
                yolo_mode=self.settings.yolo_mode,
                timeout_s=self.settings.auto_decision_timeout,
            ),
        ]

    def _refuse(
        self, plan_id: str, reason: str, verdicts: tuple[GateVerdict, ...]
    ) -> ExecutionResult:
        result = ExecutionResult(
            plan_id=plan_id, success=False, status="refused", reason=reason, verdicts=verdicts
        )
        with root_lock(self.root):  # the manager's root lock (re-entrant)
            plan = self.get(plan_id)
            self._check_executable(plan)  # not executed by someone else meanwhile
            self._set(plan, "refused", result=result)
        record_decision(
            self.store,
            "code_update.refused",
            agent_name=CODE_TARGET,
            payload={"plan_id": plan_id, "reason": reason},
        )
        log.info("code_plan_refused", plan_id=plan_id, reason=reason)
        return result

    def _apply_and_validate(
        self, plan_id: str, verdicts: tuple[GateVerdict, ...]
    ) -> ExecutionResult:
        with root_lock(self.root):  # the manager's root lock (re-entrant)
            self._recover_interrupted()
            plan = self.get(plan_id)
            self._check_executable(plan)
            stale = stale_reason(plan, self.root)
            if stale:  # the files changed while the gates ran
                return self._refuse(plan_id, stale, verdicts)
            if plan.test_files and plan.tests_approved_by is None:
                why = (
                    f"the plan changes what configures or selects the tests "
                    f"({', '.join(plan.test_files)}); that needs an approval on a terminal: "
                    f"agentmend code approve-tests {plan_id}"
                )
                return self._refuse(plan_id, why, verdicts)
            if plan.approved_by is None:  # only reachable with yolo_mode
                self.manager.audit.append(
                    agent_name=CODE_TARGET,
                    edit_type="approval_skipped",
                    old_value=None,
                    new_value=f"{plan_id}: yolo_mode is on; no person approved this plan",
                    user_id="yolo_mode",
                )
            with self.manager.hold_lease() as keeper:
                # the lease id is stored with "executing": if this process dies from here on,
                # the next start of any face settles the plan (plan_recovery)
                plan = self._set(plan, "executing", lease_id=keeper.lease_id)
                result = self._apply_validate_locked(plan, verdicts, keeper.lease_id)
                if result.status != "executing":  # settled here: nothing is left to own
                    self.manager.release_lease(keeper.lease_id, result.status)
            if result.status != "executing":
                self._set(plan, result.status, result=result)
        record_decision(
            self.store,
            "code_update.executed",
            agent_name=CODE_TARGET,
            payload=result.model_dump(mode="json", exclude={"verdicts"}),
        )
        log.info("code_plan_executed", plan_id=plan_id, status=result.status)
        return result

    def _apply_validate_locked(
        self, plan: CodePlan, verdicts: tuple[GateVerdict, ...], lease: str
    ) -> ExecutionResult:
        """Validate in a throwaway copy; only a plan that passes is applied to the real tree.

        All under the root's lock and ``lease``. A result with status ``executing`` means the
        lease was lost (this process was stopped past its expiry): recovery settles the plan
        and its changes, and nothing more is written here.
        """
        base = {"plan_id": plan.plan_id, "verdicts": verdicts}
        changes = {f.path: None if f.content is None else f.content.encode("utf-8")
                   for f in plan.files}  # fmt: skip
        skip = [
            folder.relative_to(self.root).as_posix()
            for folder in self.paths.protected
            if folder.is_relative_to(self.root) and folder != self.root
        ]
        try:
            report = validate_in_copy(
                self.root,
                changes,
                self.settings.test_command,
                self.settings.test_timeout_s,
                skip=skip,
                tests_approved=plan.tests_approved_by is not None,
            )
        except BaseException as exc:
            self._set(plan, "failed")
            self.manager.release_lease(lease, "failed")
            log.error("code_plan_validation_error", plan_id=plan.plan_id, error=str(exc))
            raise
        checked = {**base, "files_modified": 0, "tests_passed": report.tests_passed,
                   "validation": report}  # fmt: skip
        if not report.passed:
            why = f"validation failed: {failure_reason(report)}"
            return ExecutionResult(
                **checked, success=False, status="rolled_back", reason=why,
                restored_identical=not stale_reason(plan, self.root),
            )  # fmt: skip
        actions = [
            (
                ImprovementAction(
                    target_agent=CODE_TARGET,
                    action_type=ChangeType.CODE_PATCH,
                    target_field=f.path,
                    rationale=f"{plan.plan_id}: {plan.description}",
                    confidence_score=1.0,
                ),
                f.path,
                changes[f.path],
            )
            for f in plan.files
        ]
        try:
            records = self.manager.apply_group(
                actions,
                root=self.root,
                author=ChangeAuthor(
                    via=f"code_update:{plan.plan_id}", user_id=plan.approved_by or "yolo_mode"
                ),
                lease=lease,
            )
        except AgentmendError as exc:  # the manager wrote nothing or put it all back
            return ExecutionResult(
                **base, success=False, status="failed", reason=f"could not apply: {exc}"
            )
        except Exception as exc:  # OSError, sqlite3.Error: the manager put back what it could
            failed = ExecutionResult(
                **base,
                success=False,
                status="failed",
                reason=f"could not apply: {type(exc).__name__}: {exc}",
            )
            self._settle_failed(plan, failed)
            raise
        change_ids = tuple(r.change_id for r in records)
        plan = self._set(plan, "executing", change_ids=list(change_ids),
                         group_id=records[0].group_id)  # fmt: skip
        done = {**checked, "files_modified": len(plan.files), "change_ids": change_ids}
        try:
            self.manager.mark_kept(change_ids[0], report.model_dump(mode="json"), lease=lease)
        except LeaseLost as exc:
            log.warning("code_plan_lease_lost", plan_id=plan.plan_id, lease_id=lease)
            return ExecutionResult(**done, success=False, status="executing", reason=str(exc))
        except BaseException as exc:
            self._undo(plan, f"could not keep: {type(exc).__name__}: {exc}", lease)
            self._set(plan, "failed")
            raise
        return ExecutionResult(
            **done,
            success=True,
            status="completed",
            reason="validated in a copy, then applied"
            if report.tests_run
            else "compiled in a copy, then applied (no test command configured)",
            validation_passed=True,
        )

    def _undo(self, plan: CodePlan, reason: str, lease: str) -> bool:
        """Roll the plan's group back; True when every file is byte-identical to before.

        This process holds the root's lock, so no recovery restores the files meanwhile, even
        if the lease was lost: the rollback is consistent either way, and the lease is then
        released (or recovery finds nothing left to settle).
        """
        if plan.change_ids:
            # force: whatever the tests left in these files, the plan's "before" wins
            self.manager.rollback_by_id(plan.change_ids[0], reason=reason, force=True)
        self.manager.release_lease(lease, "rolled_back")
        return not stale_reason(plan, self.root)

    def _settle_failed(self, plan: CodePlan, result: ExecutionResult) -> None:
        """Mark ``plan`` failed and record why, before an unexpected error propagates.

        If the store itself is failing this cannot be written either; the plan then stays
        ``executing`` and the next recovery settles it, so this never hides the error.
        """
        try:
            self._set(plan, "failed", result=result)
            record_decision(
                self.store,
                "code_update.executed",
                agent_name=CODE_TARGET,
                payload=result.model_dump(mode="json", exclude={"verdicts"}),
            )
        except Exception as exc:
            log.error("code_plan_not_settled", plan_id=plan.plan_id, error=str(exc))
        log.warning("code_plan_failed", plan_id=plan.plan_id, reason=result.reason)

    # -- rollback --------------------------------------------------------------------------

    def rollback(
        self, plan_id: str | None = None, *, reason: str | None, requested_by: str = "mcp"
    ) -> RollbackResult:
        """Undo a completed plan (default: the newest one) with ``reason``.

        Raises:
            CodeUpdateError: no reason, no completed plan, or files changed since (named).
            PlanNotFound, PlanStateError: unknown plan, or one that is not completed.
        """
        if not reason or not reason.strip():
            raise CodeUpdateError("reason is required to roll back", field="reason")
        with root_lock(self.root):  # the manager's root lock (re-entrant)
            self._recover_interrupted()
            if plan_id is None:
                done = self._with_status("completed")
                if not done:
                    raise CodeUpdateError("no completed plan to roll back", field="planId")
                plan = max(done, key=lambda p: p.updated)
            else:
                plan = self.get(plan_id)
            if plan.status != "completed" or not plan.change_ids:
                hint = state_hint(plan.status)
                raise PlanStateError(plan.plan_id, plan.status, "be rolled back", hint)
            try:
                rolled = self.manager.rollback_by_id(
                    plan.change_ids[0],
                    reason=f"rollback: {reason.strip()}",
                    author=ChangeAuthor(user_id=requested_by),
                )
            except RollbackConflict as exc:
                paths = ", ".join(exc.paths) or "(none named)"
                raise CodeUpdateError(
                    f"cannot roll back plan {plan.plan_id}: {exc} (files: {paths})",
                    plan_id=plan.plan_id,
                ) from exc
            if not rolled:
                raise PlanStateError(plan.plan_id, "no longer applied", "be rolled back")
            result = RollbackResult(
                plan_id=plan.plan_id,
                success=True,
                reason=reason.strip(),
                files_restored=len(plan.files),
                paths=tuple(f.path for f in plan.files),
            )
            self._set(plan, "rolled_back", rollback=result.model_dump(mode="json"))
        record_decision(
            self.store,
            "code_update.rolled_back",
            agent_name=CODE_TARGET,
            payload={**result.model_dump(mode="json"), "by": requested_by},
        )
        return result

    def recover(self) -> list[str]:
        """Settle plans a dead process left ``executing``; returns their ids.

        Also done before every execute and rollback. Waits while another process executes a
        plan of this root (it holds the root's lock), so a live execution is never taken for
        a dead one.
        """
        with root_lock(self.root):  # the manager's root lock (re-entrant)
            return self._recover_interrupted()

    def _recover_interrupted(self) -> list[str]:
        """Settle plans a dead process left ``executing`` (the caller holds the root's lock).

        A plan with a lease is settled by its lease (``plan_recovery``); one without (executed
        by an older agentmend) is taken as dead because this process holds the lock its
        executor held throughout.
        """
        settled = settle_interrupted_plans(self.manager, root=self.root, wait=True)
        for plan in self._with_status("executing"):
            if plan.lease_id is not None:
                continue
            by = f"code_update:{plan.plan_id}"
            live = [r.change_id for r in self.manager.changes.live_by(CODE_TARGET, by)]
            if live:
                self.manager.rollback_by_id(live[0], reason="interrupted while validating",
                                            force=True)  # fmt: skip
            result = ExecutionResult(
                plan_id=plan.plan_id,
                success=False,
                status="failed",
                reason="interrupted: the process executing it stopped; its changes were undone",
                rollback_performed=bool(live),
                restored_identical=not stale_reason(plan, self.root),
            )
            self._set(plan, "failed", result=result)
            log.warning("code_plan_recovered", plan_id=plan.plan_id, rolled_back=bool(live))
            settled.append(plan.plan_id)
        return settled

    # -- helpers ---------------------------------------------------------------------------

    def _set(
        self, plan: CodePlan, status: str, *, result: ExecutionResult | None = None, **extra: Any
    ) -> CodePlan:
        stored = get_plan(self.store, plan.plan_id)
        if stored is None:
            raise PlanNotFound(plan.plan_id)
        payload = {**stored.payload, **extra}
        if result is not None:
            payload["result"] = result.model_dump(mode="json")
        return code_plan(update_plan(self.store, plan.plan_id, status=status, payload=payload))


def _content(item: FileOperation | dict[str, Any]) -> str | None:
    content = item.content if isinstance(item, FileOperation) else item.get("content")
    return content if isinstance(content, str) else None
