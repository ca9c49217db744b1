"""A really full (or read-only) file system for fault tests: a small tmpfs mounted for the test.

Mounting needs root (or a user namespace); where it is not possible the tests that need it are
skipped and ``test_resource_faults.py``'s ``RLIMIT_FSIZE`` child covers the write path instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(mountpoint: Path, size_kib: int = 1024) -> Iterator[Path]:
    """A tmpfs of ``size_kib`` at ``mountpoint`` for the block; unmounted afterwards."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(mountpoint)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc}); the RLIMIT_FSIZE test covers writes")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False, timeout=30)


def remount_read_only(mountpoint: Path) -> None:
    subprocess.run(
        ["mount", "-o", "remount,ro", str(mountpoint)], check=True, capture_output=True, timeout=30
    )


def fill(folder: Path) -> Path:
    """Fill ``folder``'s file system to the last byte with a filler file; returns its path."""
    filler = folder / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            block = b"\0" * chunk
            while True:
                try:
                    if os.write(fd, block) < chunk:
                        break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler
