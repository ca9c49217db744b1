"""Code update plans: what a plan is, what its results are, and which paths it may touch.

A plan's files are checked when it is made and again when it runs: inside the project root
(``files.resolve_inside``: absolute paths, ``..`` and symlink escapes are refused), with an
allowed extension (``CODE_SUFFIXES``), never in ``.agent/`` (agentmend's backups and lock) or
``.git/``, never in a protected folder (the agentmend workspace, whose agent definitions change
only through the improvement cycle's gates). A create must name a new file, a modify or delete
an existing one; the hash of each file as it was is kept, so a plan never overwrites work done
after it was made. A unified diff is turned into the same operations, so the rest of the
protocol sees one kind of plan.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agentmend.infrastructure.changes.proposal import FileEdit, GateVerdict, ProposedChange
from agentmend.infrastructure.changes.protocol.decisions import Plan
from agentmend.infrastructure.code_update.unified_diff import (
    DiffError,
    apply_patch,
    parse_unified_diff,
)
from agentmend.infrastructure.code_update.validation import ValidationReport
from agentmend.infrastructure.errors import AgentmendError, PathNotAllowed
from agentmend.infrastructure.files.atomic import read_if_exists, resolve_inside, sha256_bytes
from agentmend.infrastructure.frozen import FrozenDict
from agentmend.infrastructure.models import ChangeType, ImprovementAction

__all__ = [
    "CODE_SUFFIXES",
    "CODE_TARGET",
    "FINISHED_STATUSES",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "PENDING_STATUSES",
    "PLAN_KIND",
    "CodePlan",
    "CodeUpdateError",
    "ExecutionResult",
    "FileOperation",
    "PlanNotFound",
    "PlanPaths",
    "PlanStateError",
    "PlanStatus",
    "PlannedFile",
    "RollbackResult",
    "UpdateStatus",
    "code_plan",
    "proposed_change",
    "read_file",
    "stale_reason",
    "state_hint",
]

CODE_SUFFIXES: frozenset[str] = frozenset({".py", ".md", ".json", ".yaml", ".yml", ".toml", ".txt"})
CODE_TARGET = "project"
"""The ``target_agent`` of code changes in the history and the audit: they touch no agent."""
PLAN_KIND = "code_update"
"""``payload["kind"]`` of code plans in the store's shared ``plans`` table."""
MAX_FILES = 100
MAX_FILE_BYTES = 1_000_000
_RESERVED = (".agent", ".git")

PlanStatus = Literal[
    "planned", "approved", "executing", "completed", "rolled_back", "refused", "failed"
]
PENDING_STATUSES: tuple[str, ...] = ("planned", "approved")
FINISHED_STATUSES: tuple[str, ...] = ("completed", "rolled_back", "refused", "failed")


# -- errors -------------------------------------------------------------------------------


class CodeUpdateError(AgentmendError):
    """A request that cannot be carried out; names the plan, field or path that is wrong."""

    def __init__(self, message: str, *, plan_id: str | None = None, field: str | None = None):
        self.plan_id = plan_id
        self.field = field
        super().__init__(message)


class PlanNotFound(CodeUpdateError):
    def __init__(self, plan_id: str) -> None:
        super().__init__(f"no code update plan with id {plan_id!r}", plan_id=plan_id)


class PlanStateError(CodeUpdateError):
    """The plan is not in a state that allows the action (execute before approve, ...)."""

    def __init__(self, plan_id: str, status: str, wanted: str, hint: str = "") -> None:
        self.status = status
        detail = f": {hint}" if hint else ""
        super().__init__(f"plan {plan_id} is {status}, cannot {wanted}{detail}", plan_id=plan_id)


def state_hint(status: str) -> str:
    """What to do about a plan in ``status`` when the action asked for does not fit it."""
    return {
        "approved": "it is already approved",
        "executing": "it is being executed now",
        "completed": "it was already executed; make a new plan",
        "rolled_back": "it was rolled back; make a new plan",
        "refused": "a gate refused it; make a new plan",
        "failed": "it failed; make a new plan",
    }.get(status, "")


# -- models -------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FileOperation(_Model):
    """One file of a plan as a caller gives it (paths relative to the project root)."""

    path: str
    operation: Literal["create", "modify", "delete"]
    content: str | None = None


class PlannedFile(_Model):
    """One file of a stored plan: its root-relative path, the hash it had, what it becomes."""

    path: str
    operation: Literal["create", "modify", "delete"]
    base_sha256: str | None
    content: str | None


class CodePlan(_Model):
    """A stored plan, as every action reports it."""

    plan_id: str
    description: str
    status: PlanStatus
    root: str
    files: tuple[PlannedFile, ...]
    diff: str
    source: Literal["files", "diff"] = "files"
    created: datetime
    updated: datetime
    created_by: str | None = None
    approved_by: str | None = None
    approved_at: str | None = None
    change_ids: tuple[str, ...] = ()
    group_id: str | None = None
    lease_id: str | None = None
    result: FrozenDict[str, Any] | None = None
    rollback: FrozenDict[str, Any] | None = None
    test_files: tuple[str, ...] = ()  # paths that configure, select or are tests (flagged)
    tests_approved_by: str | None = None  # who approved the test changes, on a terminal


class ExecutionResult(_Model):
    """The outcome of executing a plan: what was written, validated, tested; why; the verdicts."""

    plan_id: str
    success: bool
    status: PlanStatus
    reason: str
    files_modified: int = 0
    validation_passed: bool = False
    tests_passed: bool | None = None
    rollback_performed: bool = False
    restored_identical: bool | None = None
    change_ids: tuple[str, ...] = ()
    verdicts: tuple[GateVerdict, ...] = ()
    validation: ValidationReport | None = None


class RollbackResult(_Model):
    plan_id: str
    success: bool
    reason: str
    files_restored: int
    paths: tuple[str, ...] = ()


class UpdateStatus(_Model):
    pending_plans: tuple[CodePlan, ...]
    last_execution: CodePlan | None
    active_improvement: CodePlan | None


def code_plan(plan: Plan) -> CodePlan:
    """The typed view of a stored code plan."""
    p = plan.payload
    return CodePlan(
        plan_id=plan.plan_id,
        description=plan.description,
        status=plan.status,
        root=str(p.get("root", "")),
        files=tuple(PlannedFile.model_validate(f) for f in p.get("files", ())),
        diff=str(p.get("diff", "")),
        source=p.get("source", "files"),
        created=plan.created,
        updated=plan.updated,
        created_by=p.get("created_by"),
        approved_by=p.get("approved_by"),
        approved_at=p.get("approved_at"),
        change_ids=tuple(p.get("change_ids", ())),
        group_id=p.get("group_id"),
        lease_id=p.get("lease_id"),
        result=p.get("result"),
        rollback=p.get("rollback"),
        test_files=tuple(p.get("test_files", ())),
        tests_approved_by=p.get("tests_approved_by"),
    )


# -- paths and operations -----------------------------------------------------------------


def read_file(path: Path) -> bytes | None:
    """The file's bytes, None when there is no file.

    Raises:
        PathNotAllowed: a symlink at the name, or not a regular file.
    """
    return read_if_exists(path)


def _encode(content: str | None) -> bytes | None:
    return None if content is None else content.encode("utf-8")


def stale_reason(plan: CodePlan, root: Path) -> str:
    """Why the plan no longer fits the files under ``root`` (empty: it still does)."""
    changed = []
    for f in plan.files:
        data = read_file(root / f.path)
        if (None if data is None else sha256_bytes(data)) != f.base_sha256:
            changed.append(f.path)
    return "files changed since the plan was made: " + ", ".join(changed) if changed else ""


@dataclass(frozen=True)
class PlanPaths:
    """The path rules of one project root: what a plan may touch there."""

    root: Path
    protected: tuple[Path, ...] = ()
    allowed_suffixes: frozenset[str] = CODE_SUFFIXES

    @classmethod
    def of(
        cls,
        root: str | Path,
        *,
        protected: Iterable[str | Path] = (),
        allowed_suffixes: Iterable[str] = CODE_SUFFIXES,
    ) -> PlanPaths:
        return cls(
            Path(root).resolve(),
            tuple(Path(p).resolve() for p in protected),
            frozenset(allowed_suffixes),
        )

    def target(self, raw: str, field: str) -> tuple[Path, str]:
        """(absolute path, root-relative POSIX path) of ``raw``, or the reason it is refused.

        Raises:
            CodeUpdateError: an empty path. PathNotAllowed: any other refusal, naming the path.
        """
        if not raw or not raw.strip() or "\x00" in raw:
            raise CodeUpdateError(f"{field}: the path is empty or invalid", field=field)
        target = resolve_inside(self.root, raw, allowed_suffixes=self.allowed_suffixes)
        rel = target.relative_to(self.root)
        if not rel.parts:
            raise PathNotAllowed(raw, self.root, "it is the root itself")
        if rel.parts[0] in _RESERVED:
            raise PathNotAllowed(raw, self.root, f"'{rel.parts[0]}/' is reserved")
        for folder in self.protected:
            if target == folder or folder in target.parents:
                raise PathNotAllowed(raw, self.root, f"it lies in the agentmend workspace {folder}")
        if target.is_dir():
            raise PathNotAllowed(raw, self.root, "it is a directory")
        return target, rel.as_posix()

    def from_diff(self, diff: str) -> list[FileOperation]:
        """The file operations a unified diff amounts to, applied to the files as they are.

        Raises:
            CodeUpdateError: the diff cannot be read or does not apply (file and hunk named).
            PathNotAllowed: a path it names is refused.
        """
        try:
            patches = parse_unified_diff(diff)
        except DiffError as exc:
            raise CodeUpdateError(str(exc), field="diff") from exc
        operations: list[FileOperation] = []
        for patch in patches:
            target, _ = self.target(patch.path, "diff")
            data = read_file(target)
            try:
                original = None if data is None else data.decode("utf-8")
                content = apply_patch(original, patch)
            except UnicodeDecodeError as exc:
                raise CodeUpdateError(f"diff: {patch.path}: not UTF-8 text", field="diff") from exc
            except DiffError as exc:
                raise CodeUpdateError(str(exc), field="diff") from exc
            operations.append(
                FileOperation(path=patch.path, operation=patch.operation, content=content)
            )
        return operations

    def check(
        self, operations: Sequence[FileOperation]
    ) -> tuple[list[PlannedFile], list[FileEdit]]:
        """The planned files (with the hash each has now) and the edits they make.

        Raises:
            CodeUpdateError: a missing field, a create of an existing file, a modify or delete
                of a missing one, a duplicate, too many files or too much content (named).
            PathNotAllowed: a refused path.
        """
        if len(operations) > MAX_FILES:
            raise CodeUpdateError(f"files: at most {MAX_FILES} per plan", field="files")
        planned: list[PlannedFile] = []
        edits: list[FileEdit] = []
        seen: set[str] = set()
        for index, op in enumerate(operations):
            field = f"files[{index}]"
            target, rel = self.target(op.path, f"{field}.path")
            if rel in seen:
                raise CodeUpdateError(f"{field}.path: {op.path!r} appears twice", field=field)
            seen.add(rel)
            old = read_file(target)
            _check_operation(op, field, exists=old is not None)
            new = _encode(op.content)
            if new is not None and len(new) > MAX_FILE_BYTES:
                raise CodeUpdateError(
                    f"{field}.content: larger than {MAX_FILE_BYTES} bytes", field=field
                )
            base = None if old is None else sha256_bytes(old)
            planned.append(PlannedFile(path=rel, operation=op.operation, base_sha256=base,
                                       content=op.content))  # fmt: skip
            edits.append(FileEdit(rel, old, new))
        return planned, edits


def _check_operation(op: FileOperation, field: str, *, exists: bool) -> None:
    if op.operation == "create" and exists:
        raise CodeUpdateError(
            f"{field}: cannot create {op.path!r}: it already exists (use modify)", field=field
        )
    if op.operation != "create" and not exists:
        raise CodeUpdateError(
            f"{field}: cannot {op.operation} {op.path!r}: it does not exist", field=field
        )
    if op.operation == "delete" and op.content is not None:
        raise CodeUpdateError(f"{field}.content: a delete takes no content", field=field)
    if op.operation != "delete" and op.content is None:
        raise CodeUpdateError(
            f"{field}.content is required to {op.operation} {op.path!r}", field=f"{field}.content"
        )


def proposed_change(
    root: Path, description: str, files: Sequence[PlannedFile], *, plan_id: str
) -> ProposedChange:
    """The plan as the gates see it: one code patch, every file's bytes as they are and will be."""
    edits = tuple(FileEdit(f.path, read_file(root / f.path), _encode(f.content)) for f in files)
    action = ImprovementAction(
        target_agent=CODE_TARGET,
        action_type=ChangeType.CODE_PATCH,
        new_value={"plan_id": plan_id, "files": [f.path for f in files]},
        rationale=description,
        confidence_score=1.0,
    )
    return ProposedChange(
        action=action,
        root=root,
        edits=edits,
        diff="".join(_diff(edit) for edit in edits),
        metadata={"plan_id": plan_id, "description": description},
    )


def _diff(edit: FileEdit) -> str:
    def lines(data: bytes | None) -> list[str]:
        return [] if data is None else data.decode("utf-8", "replace").splitlines(keepends=True)

    before = f"a/{edit.path}" if edit.old_content is not None else "/dev/null"
    after = f"b/{edit.path}" if edit.new_content is not None else "/dev/null"
    out = difflib.unified_diff(lines(edit.old_content), lines(edit.new_content), before, after)
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)
