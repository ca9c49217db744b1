"""Validating a plan in a throwaway copy of the project, before the real tree changes.

The order: copy the project's files with the plan written in and compile the changed Python
(a syntax error ends it there); run the test command on a copy of the unchanged project for
the baseline counts (pytest only, and only when the test changes are not approved anyway);
run it on the changed copy. Validation passes when everything compiles, the tests pass, no
module came from the real tree, and the collected and passed counts did not drop (or the test
changes were approved). See ``agentmend.infrastructure.code_update.sandbox`` for what is contained.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from agentmend.infrastructure.code_update.sandbox import project_copy, run_in_copy, tracked_files
from agentmend.infrastructure.code_update.suite_guard import count_drop
from agentmend.infrastructure.code_update.validation import (
    OUTPUT_TAIL_CHARS,
    ValidationReport,
    compile_error,
)

__all__ = ["validate_in_copy"]


def validate_in_copy(
    root: Path,
    changes: Mapping[str, bytes | None],
    command: Iterable[str],
    timeout_s: float,
    *,
    skip: Iterable[str] = (),
    tests_approved: bool = False,
) -> ValidationReport:
    """Validate ``changes`` (root-relative path -> new bytes, None deletes) in a copy.

    Args:
        skip: root-relative folders not copied (the agentmend workspace).
        tests_approved: the plan's test changes were approved on a channel the MCP client
            cannot drive, so the counts may drop.
    """
    argv = tuple(command)
    files = tracked_files(root, skip)
    python = tuple(p for p, data in changes.items() if data is not None and p.endswith(".py"))
    baseline = None
    if argv and not tests_approved:
        with project_copy(root, files, {}) as copy:
            baseline = run_in_copy(copy, root, files, argv, timeout_s)
    with project_copy(root, files, changes) as copy:
        errors = tuple(e for rel in python if (e := compile_error(copy / rel, rel)) is not None)
        if errors or not argv:
            return ValidationReport(compiled=python, compile_errors=errors, test_command=argv)
        run = run_in_copy(copy, root, [*files, *changes], argv, timeout_s)
    passed = run.exit_code == 0 and not run.timed_out
    before = baseline.counts if baseline is not None else None
    drop = None if tests_approved else count_drop(before, run.counts)
    return ValidationReport(
        compiled=python,
        test_command=argv,
        tests_run=True,
        tests_passed=passed,
        exit_code=run.exit_code,
        timed_out=run.timed_out,
        duration_s=round(run.duration_s, 3),
        output_tail=run.output[-OUTPUT_TAIL_CHARS:],
        sandbox="namespace" if run.contained else "copy",
        tests_collected=run.counts.collected if run.counts else None,
        tests_passed_count=run.counts.passed if run.counts else None,
        baseline_collected=baseline.counts.collected if baseline and baseline.counts else None,
        baseline_passed=baseline.counts.passed if baseline and baseline.counts else None,
        real_tree_imports=run.real_tree_imports,
        needs_test_approval=drop,
    )
