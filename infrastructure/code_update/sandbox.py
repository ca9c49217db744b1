"""Running a plan's validation in a throwaway copy, so the tests cannot touch the real tree.

What runs the tests is the change itself as much as the project: test code, a conftest or the
code under test can write anywhere the process may. So validation never runs in the project
root. It copies the project's tracked files (``git ls-files`` when the root is a git work
tree, else every file outside version-control, virtualenv, cache and agentmend folders) into a
fresh temporary folder, writes the plan's files there, and runs the test command in the copy
with ``HOME`` and ``TMPDIR`` inside it. The real tree changes only after validation passes.

Containment, where the machine offers Linux user namespaces (``unshare --user --mount``): the
command runs in a private mount namespace in which every mount but the copy (and ``/proc``,
``/dev``, ``/sys``) is remounted read-only, so nothing outside the copy can be written: not the
project, not the user's home, not the agentmend store. Without user namespaces the copy, the
redirected ``HOME`` and ``TMPDIR`` and the import check still apply, but a test that writes to
an absolute path outside the copy is not stopped. Not contained either way: the network, other
processes of the same user (signals), ``/dev/shm``, and reads of anything readable.

The project may be installed in editable mode pointing at the real tree, in which case the tests
would quietly import the real code instead of the copy. The copy is put first on
``PYTHONPATH``, and for pytest a small plugin (``-p agentmend_import_probe``) records every
imported module's ``__file__``: a module imported from the real tree fails validation. pytest
also writes a JUnit XML report, whose counts of collected and passed tests are compared with a
baseline run of the unchanged copy (see ``agentmend.infrastructure.code_update.suite_guard``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agentmend.infrastructure.code_update.validation import run_tests

__all__ = [
    "SandboxRun",
    "SuiteCounts",
    "is_pytest",
    "namespaces_available",
    "project_copy",
    "run_in_copy",
    "tracked_files",
]

_SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", ".agent", ".agentmend", ".venv", "venv", "env", "__pycache__",
     ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".nox", "node_modules", "build",
     "dist", ".eggs"}
)  # fmt: skip
_PROBE_MODULE = "agentmend_import_probe"
_PROBE = '''"""Written by agentmend: records where every module was imported from."""
import json, os, sys

def pytest_sessionfinish(session, exitstatus):
    found = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            found[name] = os.path.realpath(path)
    with open(os.environ["AGENTMEND_IMPORT_REPORT"], "w", encoding="utf-8") as out:
        json.dump(found, out)
'''
# Every mount but the copy (and the kernel's own) read-only, then the command.
_CONTAIN = r"""
copy="$1"; shift
mount --bind "$copy" "$copy" || exit 97
cd "$PWD" || exit 97  # the working folder again, now through the writable mount
for mp in $(awk '{print $5}' /proc/self/mountinfo); do
  case "$mp" in /proc|/proc/*|/dev|/dev/*|/sys|/sys/*|"$copy") continue;; esac
  mount -o remount,bind,ro "$mp" 2>/dev/null
done
exec "$@"
"""


@dataclass(frozen=True, slots=True)
class SuiteCounts:
    """Tests collected and passed, from a JUnit XML report."""

    collected: int
    passed: int


@dataclass(frozen=True, slots=True)
class SandboxRun:
    """One run of the test command in a copy."""

    exit_code: int | None
    timed_out: bool
    output: str
    duration_s: float
    contained: bool  # everything outside the copy was read-only
    counts: SuiteCounts | None  # None: not pytest, or it wrote no report
    real_tree_imports: tuple[str, ...]  # modules the run imported from the real tree


def is_pytest(command: Iterable[str]) -> bool:
    """Whether ``command`` runs pytest (``pytest ...`` or ``python -m pytest ...``)."""
    argv = list(command)
    if not argv:
        return False
    if Path(argv[0]).name in ("pytest", "py.test"):
        return True
    return (
        "-m" in argv and argv.index("-m") + 1 < len(argv) and argv[argv.index("-m") + 1] == "pytest"
    )


@functools.cache
def namespaces_available() -> bool:
    """Whether ``unshare`` can make a user and mount namespace here (checked once)."""
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def tracked_files(root: Path, skip: Iterable[str] = ()) -> list[str]:
    """The project's files, root-relative: git's tracked files, else a walk without caches."""
    skipped = tuple(s.strip("/") for s in skip if s)
    names: list[str] = []
    if (root / ".git").exists() and shutil.which("git") is not None:
        done = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"],
            capture_output=True,
            check=False,
        )  # fmt: skip
        if done.returncode == 0:
            names = [n for n in done.stdout.decode("utf-8", "replace").split("\0") if n]
    if not names:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
            base = Path(folder).relative_to(root)
            names.extend((base / f).as_posix() for f in files)
    return sorted(
        n for n in names
        if not any(n == s or n.startswith(s + "/") for s in skipped)
        and not set(Path(n).parts) & {".agent", ".git"}
    )  # fmt: skip


@contextmanager
def project_copy(
    root: Path, files: Iterable[str], changes: Mapping[str, bytes | None]
) -> Iterator[Path]:
    """A temporary copy of ``files`` (root-relative, from ``tracked_files``) with ``changes``
    (path -> bytes, None deletes) written in; removed on exit."""
    with tempfile.TemporaryDirectory(prefix="agentmend-validate-") as tmp:
        copy = Path(tmp) / "project"
        copy.mkdir()
        for rel in files:
            source = root / rel
            if source.is_symlink() or not source.is_file():
                continue  # a link could point back into the real tree
            target = copy / rel
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError):
                continue  # changed underneath since it was listed: the copy has the tree as now
        for rel, data in changes.items():
            target = copy / rel
            if data is None:
                target.unlink(missing_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        yield copy


def run_in_copy(
    copy: Path,
    real_root: Path,
    files: Iterable[str],
    command: tuple[str, ...],
    timeout_s: float,
) -> SandboxRun:
    """Run ``command`` in ``copy`` of ``real_root``'s ``files``: HOME and TMPDIR inside it,
    contained where possible."""
    work = copy.parent / "agentmend-sandbox"
    for folder in (work, copy / ".home", copy / ".tmp"):
        folder.mkdir(exist_ok=True)
    junit, imports = work / "junit.xml", work / "imports.json"
    for stale in (junit, imports):
        stale.unlink(missing_ok=True)
    argv = list(command)
    pytest = is_pytest(argv)
    if pytest:
        (work / f"{_PROBE_MODULE}.py").write_text(_PROBE, encoding="utf-8")
        argv += ["-p", _PROBE_MODULE, f"--junitxml={junit}", "-p", "no:cacheprovider"]
    env = {
        **os.environ,
        "HOME": str(copy / ".home"),
        "TMPDIR": str(copy / ".tmp"),
        "PYTHONPATH": os.pathsep.join(
            [str(work), str(copy), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        "PYTHONDONTWRITEBYTECODE": "1",
        "AGENTMEND_IMPORT_REPORT": str(imports),
    }
    contained = namespaces_available()
    if contained:
        argv = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private",
                "sh", "-c", _CONTAIN, "agentmend-contain", str(copy.parent), *argv]  # fmt: skip
    exit_code, timed_out, output, duration = run_tests(tuple(argv), copy, timeout_s, env=env)
    return SandboxRun(
        exit_code=exit_code,
        timed_out=timed_out,
        output=output,
        duration_s=duration,
        contained=contained,
        counts=_junit_counts(junit) if pytest else None,
        real_tree_imports=_real_tree_imports(imports, real_root, frozenset(files))
        if pytest
        else (),
    )


def _junit_counts(path: Path) -> SuiteCounts | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    collected = failed = 0
    for suite in suites:
        tests = int(suite.get("tests", 0))
        collected += tests
        failed += sum(int(suite.get(k, 0)) for k in ("failures", "errors", "skipped"))
    return SuiteCounts(collected=collected, passed=collected - failed)


def _real_tree_imports(report: Path, real_root: Path, files: frozenset[str]) -> tuple[str, ...]:
    """Modules imported from one of the project's own files in the real tree, not the copy:
    the real code was tested, not the change (a virtualenv inside the root does not count)."""
    try:
        found: dict[str, str] = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ("(no import report: the import check could not run)",)
    real = real_root.resolve()
    wrong = []
    for name, path in found.items():
        where = Path(path)
        if where.is_relative_to(real) and where.relative_to(real).as_posix() in files:
            wrong.append(f"{name} ({path})")
    return tuple(sorted(wrong))
