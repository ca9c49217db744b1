"""Validating a code update: the changed Python compiles, and the project's tests pass in time.

The test command comes from settings only (``Settings.test_command``), never from a request, so
a caller who can propose a change cannot choose what proves it. It runs in the project root in
a process group of its own, so a timeout kills the whole tree it started, not just its leader.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

__all__ = [
    "OUTPUT_TAIL_CHARS",
    "ValidationReport",
    "compile_error",
    "failure_reason",
    "validate_files",
]

OUTPUT_TAIL_CHARS = 4000
_KILL_GRACE_S = 5.0


class ValidationReport(BaseModel):
    """What validation found: compile errors, then the test command's outcome."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compiled: tuple[str, ...] = ()
    compile_errors: tuple[str, ...] = ()
    test_command: tuple[str, ...] = ()
    tests_run: bool = False
    tests_passed: bool | None = None  # None: no test command configured, or not reached
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    output_tail: str = ""
    sandbox: str = ""  # "namespace" (outside read-only), "copy" (a copy only), "" (in place)
    tests_collected: int | None = None  # from the JUnit report (pytest only)
    tests_passed_count: int | None = None
    baseline_collected: int | None = None  # the same counts on the unchanged copy
    baseline_passed: int | None = None
    real_tree_imports: tuple[str, ...] = ()  # modules imported from the real tree, not the copy
    needs_test_approval: str | None = None  # why the counts need the test approval

    @property
    def passed(self) -> bool:
        return (
            not self.compile_errors
            and self.tests_passed is not False
            and not self.real_tree_imports
            and self.needs_test_approval is None
        )


def compile_error(path: Path, name: str) -> str | None:
    """None when the file compiles; else ``name:line: message``. Nothing is executed."""
    try:
        compile(path.read_bytes(), name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{name}:{exc.lineno or '?'}: {exc.msg}"
    except (ValueError, RecursionError, MemoryError, OSError) as exc:
        return f"{name}: {type(exc).__name__}: {exc}"
    return None


def validate_files(
    root: Path, python_files: Iterable[str], command: Iterable[str], timeout_s: float
) -> ValidationReport:
    """Compile ``python_files`` (relative to ``root``), then run ``command`` there.

    The tests are not run when something does not compile (the failure is already known).
    An empty ``command`` runs no tests (``tests_passed`` stays None).
    """
    compiled = tuple(python_files)
    errors = tuple(e for rel in compiled if (e := compile_error(root / rel, rel)) is not None)
    argv = tuple(command)
    if errors or not argv:
        return ValidationReport(compiled=compiled, compile_errors=errors, test_command=argv)
    exit_code, timed_out, output, duration = run_tests(argv, root, timeout_s)
    return ValidationReport(
        compiled=compiled,
        test_command=argv,
        tests_run=True,
        tests_passed=exit_code == 0 and not timed_out,
        exit_code=exit_code,
        timed_out=timed_out,
        duration_s=round(duration, 3),
        output_tail=output[-OUTPUT_TAIL_CHARS:],
    )


def run_tests(
    command: tuple[str, ...],
    cwd: Path,
    timeout_s: float,
    *,
    env: Mapping[str, str] | None = None,
) -> tuple[int | None, bool, str, float]:
    """(exit code, timed out, output, seconds) of ``command`` run in its own process group."""
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a timeout kills every child it started
        )
    except OSError as exc:
        return None, False, f"cannot run the test command {command[0]!r}: {exc}", 0.0
    try:
        out, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            out, _ = process.communicate(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # a grandchild left the group and holds the pipe
            process.kill()
            process.wait()
            out = b""
        note = f"\n[agentmend: the test command ran past {timeout_s:g}s and was killed]"
        text = out.decode("utf-8", "replace") + note
        return process.returncode, True, text, time.monotonic() - started
    return process.returncode, False, out.decode("utf-8", "replace"), time.monotonic() - started


def failure_reason(report: ValidationReport) -> str:
    """Why validation failed, in one line."""
    if report.compile_errors:
        return "does not compile: " + "; ".join(report.compile_errors)
    command = " ".join(report.test_command)
    if report.real_tree_imports:
        return "the tests imported the real tree, not the validated copy: " + ", ".join(
            report.real_tree_imports[:5]
        )
    if report.tests_passed and report.needs_test_approval is not None:
        return (
            f"{report.needs_test_approval}; only an approval of the test changes on a terminal "
            "allows that (agentmend code approve-tests)"
        )
    if report.timed_out:
        return f"the tests ran past the time limit ({command})"
    return f"the tests failed (exit code {report.exit_code}: {command})"
