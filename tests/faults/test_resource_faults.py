"""A really full disk, a read-only file system, a denied permission and a full store.

Each fault gives the package's error naming the cause and the file, leaves no file half-written
and no temporary file behind, and leaves nothing stuck: a failed apply is FAILED, a failed
rollback is completed once space is back, a plan moves to failed with the reason, and the
monitor keeps the runs it could not write and says so.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from full_disk import fill, remount_read_only, small_tmpfs
from tiny_project import make_project

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.code_update.updater import CodeUpdater, FileOperation
from agentmend.infrastructure.errors import FileOperationError, StoreError
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.models import ChangeStatus, ChangeType, ImprovementAction
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.store.api import Store
from agentmend.roles.code_review import CodeReviewer

ROOT = Path(__file__).resolve().parents[2]
OLD = b"---\nname: writer\n---\n" + b"old prompt\n" * 20_000  # ~220 KB


def _action() -> ImprovementAction:
    return ImprovementAction(
        target_agent="writer", action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.name != "filler.bin" and ".agent" not in p.parts
    }


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*.tmp")]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk", size_kib=1024) as mount:
        yield mount


def test_an_apply_on_a_full_disk_names_enospc_and_the_file_and_writes_nothing(
    disk: Path, manager: ImprovementManager
) -> None:
    (disk / "writer.md").write_bytes(OLD)
    fill(disk)
    before = _files(disk)
    with pytest.raises(FileOperationError) as caught:
        manager.apply(_action(), path="writer.md", new_content=OLD + b"more\n", root=disk)
    assert caught.value.cause == "ENOSPC"
    assert caught.value.path == str(disk / "writer.md")
    assert "No space left on device" in str(caught.value)
    assert _files(disk) == before
    assert _leftovers(disk) == []
    [record] = manager.get_history()
    assert record.status is ChangeStatus.FAILED
    assert record.rollback_info is not None
    assert "ENOSPC" in record.rollback_info["reason"]


def test_a_rollback_on_a_full_disk_fails_by_name_and_completes_once_space_is_back(
    disk: Path, manager: ImprovementManager
) -> None:
    (disk / "writer.md").write_bytes(OLD)
    applied = manager.apply(_action(), path="writer.md", new_content="short\n", root=disk)
    filler = fill(disk)
    with pytest.raises(FileOperationError) as caught:
        manager.rollback_by_id(applied.change_id, reason="undo")
    assert caught.value.cause == "ENOSPC"
    assert (disk / "writer.md").read_bytes() == b"short\n"  # whole, not half-restored
    assert _leftovers(disk) == []
    filler.unlink()
    manager.recover()  # what the next open (or apply or rollback on the root) does
    record = manager.get_change(applied.change_id)
    assert record is not None
    assert record.status is ChangeStatus.ROLLED_BACK
    assert (disk / "writer.md").read_bytes() == OLD


def test_a_read_only_file_system_names_erofs(disk: Path, manager: ImprovementManager) -> None:
    (disk / "writer.md").write_bytes(OLD)
    remount_read_only(disk)
    with pytest.raises(FileOperationError) as caught:
        manager.apply(_action(), path="writer.md", new_content="new\n", root=disk)
    assert caught.value.cause == "EROFS"
    assert caught.value.path.startswith(str(disk))
    assert (disk / "writer.md").read_bytes() == OLD


@pytest.mark.slow
async def test_a_plan_executed_on_a_full_disk_moves_to_failed_with_the_reason(
    disk: Path, manager: ImprovementManager
) -> None:
    project = make_project(disk / "proj")
    fill(disk)
    settings = Settings.model_validate({"test_command": ()})  # compile only: no suite to compare
    updater = CodeUpdater(project, manager=manager, reviewer=CodeReviewer(None), settings=settings)
    plan = updater.create_plan(
        "a big module",
        [FileOperation(path="calc/big.py", operation="create", content="X=1\n" * 50_000)],
    )
    updater.approve(plan.plan_id)
    result = await asyncio.wait_for(updater.execute(plan.plan_id), 60)
    # validation in a throwaway copy on the same full disk fails first: the plan ends without
    # touching the real tree, and the reason names the cause
    assert result.success is False
    assert result.status in ("failed", "rolled_back")
    assert "ENOSPC" in result.reason or "No space left" in result.reason
    assert updater.get(plan.plan_id).status in ("failed", "rolled_back")
    assert not (project / "calc" / "big.py").exists()
    assert _leftovers(project) == []


def test_a_full_store_is_a_store_error_and_the_monitor_keeps_the_runs(disk: Path) -> None:
    store = Store(disk / "agentmend.db")
    monitor = PerformanceMonitor(store, flush_interval_s=0.05)
    try:
        monitor.record("writer", success=True, duration_ms=1.0)
        monitor.flush()
        filler = fill(disk)
        for _ in range(100):
            monitor.record("writer", success=False, duration_ms=2.0, error="x" * 1000)
        with pytest.raises(StoreError, match="full"):
            monitor.flush()
        unwritten, error = monitor.write_backlog()
        assert unwritten == 100
        assert error is not None
        assert "full" in error
        assert monitor._thread.is_alive()  # the background writer keeps going
        filler.unlink()
        monitor.flush()
        assert monitor.write_backlog() == (0, None)
        count = store.connection().execute("SELECT count(*) FROM executions").fetchone()[0]
        assert count == 101
    finally:
        monitor.close()
        store.close()


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A folder every user can reach (pytest's own are private to their owner)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


def test_a_denied_permission_names_eacces(public_tmp: Path) -> None:
    """Root passes every permission check, so the write runs in a child as nobody."""
    root = public_tmp / "team"
    root.mkdir(mode=0o755)
    (root / "writer.md").write_bytes(b"old\n")
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from agentmend.infrastructure.files import confined
        from agentmend.infrastructure.errors import FileOperationError
        if os.getuid() == 0:  # imports first: nobody may not read the interpreter's folders
            os.setgid(65534)
            os.setuid(65534)
        try:
            confined.write({str(root)!r}, "writer.md", b"new\\n")
        except FileOperationError as exc:
            print(exc.cause, exc.path)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.split() == ["EACCES", str(root / "writer.md")], done.stderr
    assert (root / "writer.md").read_bytes() == b"old\n"


def test_a_file_size_limit_in_a_child_fails_the_write_by_name_and_keeps_the_old_bytes(
    tmp_path: Path,
) -> None:
    """Where no tmpfs can be mounted, RLIMIT_FSIZE makes the write fail for real (EFBIG)."""
    root = tmp_path / "team"
    root.mkdir()
    (root / "writer.md").write_bytes(b"old\n")
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        from agentmend.infrastructure.files import confined
        from agentmend.infrastructure.errors import FileOperationError
        try:
            confined.write({str(root)!r}, "writer.md", b"x" * 200_000)
        except FileOperationError as exc:
            print(exc.cause, exc.path)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.split() == ["EFBIG", str(root / "writer.md")], done.stderr
    assert (root / "writer.md").read_bytes() == b"old\n"
    assert _leftovers(root) == []
    assert confined.read(root, "writer.md") == b"old\n"
