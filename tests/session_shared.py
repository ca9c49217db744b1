"""What a test run builds once, for every pytest-xdist worker: a folder per resource, behind a lock.

The controlling pytest process makes one folder for the run (``pytest_configure`` in
``conftest.py``) and hands it to its workers in ``AGENTMEND_TEST_SHARED_DIR``; it removes the
folder at the end, after stopping the PostgreSQL server the workers share. ``shared_folder``
builds a resource (the demo workspace, the wheel's venv) the first time any worker asks for it,
under an exclusive ``flock``, and returns the same finished folder to everyone after. A build that
fails leaves nothing behind, so the next asker tries again and reports its own error.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["SHARED_DIR_ENV", "make_run_folder", "run_folder", "shared_folder", "shared_lock"]

SHARED_DIR_ENV = "AGENTMEND_TEST_SHARED_DIR"


def make_run_folder() -> Path:
    """The controller's folder for this run (the environment carries it to the workers)."""
    folder = Path(tempfile.mkdtemp(prefix="agentmend-tests-"))
    os.environ[SHARED_DIR_ENV] = str(folder)
    return folder


def run_folder() -> Path:
    """This run's shared folder; a process outside a test run gets a folder of its own."""
    given = os.environ.get(SHARED_DIR_ENV)
    if given:
        return Path(given)
    return make_run_folder()


@contextmanager
def shared_lock(name: str) -> Iterator[Path]:
    """Hold the run-wide lock called ``name``; yields the run's shared folder."""
    folder = run_folder()
    with open(folder / f"{name}.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def shared_folder(name: str, build: Callable[[Path], object]) -> Path:
    """The folder ``name``, built by ``build(folder)`` once per test run, whoever asks first."""
    with shared_lock(name) as root:
        target, done = root / name, root / f"{name}.built"
        if done.exists():
            return target
        shutil.rmtree(target, ignore_errors=True)  # a build that failed half-way
        target.mkdir()
        try:
            build(target)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        done.touch()
        return target
