"""On one host the OS user is the trust domain: an administrator's claim
(``AGENTMEND_PRINCIPAL_ADMIN=true``) holds only for a real uid among the team's administrators
(the workspace folder's owner and its ``admin-uids`` file, never the caller's environment).
A real child process run as ``nobody`` is refused in one line."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmend.faces.cli.app import build_parser, main
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.principal import ADMIN_UIDS_FILE, admin_uid_refusal

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture
def shared_workspace() -> Iterator[Path]:
    """A SQLite workspace another OS user can open (outside pytest's owner-only folders)."""
    top = Path(tempfile.mkdtemp(prefix="agentmend-uid-"))
    folder = top / "ws"
    Workspace.open(folder).close()
    for path in (top, *top.rglob("*")):
        path.chmod(0o777 if path.is_dir() else 0o666)
    yield folder
    shutil.rmtree(top)


def _as_nobody(folder: Path, **env: str) -> tuple[int, str]:
    """``agentmend audit acknowledge`` in a forked child whose real uid is ``nobody``'s (the
    interpreter itself lies where ``nobody`` cannot execute it, so the child is forked)."""
    nobody = pwd.getpwnam("nobody")
    build_parser()  # imported before the fork: nobody cannot read this interpreter's files
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.dup2(write_end, 2)
            sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - not pytest's capture
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            for name in [k for k in os.environ if k.startswith("AGENTMEND_")]:
                del os.environ[name]
            os.environ.update(AGENTMEND_PRINCIPAL_ADMIN="true", **env)
            code = main(["audit", "acknowledge", "--workspace", str(folder)])
        except BaseException:  # shown to the parent through the pipe
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8", errors="replace") as err:
        text = err.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="running a child as another user needs root")
def test_an_admin_claim_from_another_uid_is_refused_in_one_line(shared_workspace: Path) -> None:
    code, err = _as_nobody(shared_workspace)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert "uid 65534 is not one of this team's administrator uids (0;" in lines[0]
    # naming itself in its own environment, or in a list anyone may write, changes nothing
    listed = shared_workspace / ADMIN_UIDS_FILE
    listed.write_text("65534\n")
    listed.chmod(0o666)
    code, err = _as_nobody(shared_workspace, AGENTMEND_ADMIN_UIDS="[65534]")
    assert code == 2, err
    assert "uid 65534 is not one of" in err
    # listed by the workspace's owner, the same child passes the check (nothing to acknowledge)
    listed.chmod(0o644)
    code, err = _as_nobody(shared_workspace)
    assert "administrator uids" not in err
    assert code == 0, err


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_rollback_as_administrator_from_an_unlisted_uid_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ws"
    Workspace.open(folder).close()
    monkeypatch.setenv("AGENTMEND_PRINCIPAL_ADMIN", "true")
    folder.chmod(0o777)
    os.chown(folder, os.getuid() + 1, -1)  # the folder of another user's team
    assert main(["rollback", "c-1", "--workspace", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert "rolling back as an administrator needs an administrator" in err
    assert len(err.splitlines()) == 1


def test_the_default_administrator_is_the_workspace_owner(tmp_path: Path) -> None:
    assert admin_uid_refusal("x", tmp_path) is None  # this process owns tmp_path
    (tmp_path / ADMIN_UIDS_FILE).write_text("12, nope\n")
    refusal = admin_uid_refusal("approving test changes", tmp_path)
    assert refusal is not None
    assert refusal.startswith("approving test changes refused: ")
    assert "cannot be read as a list of uids" in refusal
