"""A workspace records its store, so every face finds it whoever starts it: ``agentmend store
init URL`` and the first open given a URL record it without its password; a later open with no
URL (a child process with a bare environment, the MCP server as its client configs start it,
the receiver) opens the recorded store; another store given is refused in one line; a bad URL is
a named error that leaves the workspace as it was. On SQLite and on a real PostgreSQL server,
whose password, with a server that asks for one, comes from libpq's password file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import psycopg
import pytest
from cli_run import ROOT, run_cli
from pg_server import PgServer

from agentmend.faces.cli.otel import _store_location
from agentmend.faces.mcp.results import ToolOutput
from agentmend.faces.mcp.tools import AgentmendTools
from agentmend.faces.store_record import RECORD_FILE
from agentmend.faces.workspace import Workspace, WorkspaceError
from agentmend.infrastructure.settings import Settings

pytestmark = pytest.mark.usefixtures("restore_logging")

PASSWORD = "Pl4ntedStoreSecret"
ENVIRONMENT = ("AGENTMEND_STORE_URL", "AGENTMEND_WORKSPACE", "AGENTMEND_AUDIT_HMAC_KEY")


@pytest.fixture(autouse=True)
def _bare_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*ENVIRONMENT, "PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


def _with_password(url: str) -> str:
    """``url`` with the planted password (the shared test server accepts any); a SQLite path
    as it is."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@")


def _without_password(url: str) -> str:
    return url if url.startswith("postgresql://") else str(Path(url).absolute())


def _files(folder: Path) -> dict[str, bytes] | None:
    """Every file under ``folder`` and its bytes (None: no folder)."""
    if not folder.exists():
        return None
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _child(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``agentmend ARGV`` in a process of its own, without the agentmend and libpq
    variables of this one (``env`` adds some back)."""
    bare = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT and not k.startswith("PG")}
    return subprocess.run(
        [sys.executable, "-m", "agentmend.faces.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**bare, **(env or {})},
    )


def test_init_records_the_url_without_its_password(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    code, out, err = run_cli(
        capsys, "store", "init", _with_password(store_url), "--workspace", str(workspace)
    )
    assert code == 0, out + err
    assert (workspace / RECORD_FILE).read_text().strip() == _without_password(store_url)
    # the workspace is used (a store opened, a run recorded) and still holds no password
    with Workspace.open(workspace, settings=Settings(store_url=_with_password(store_url))) as ws:
        ws.monitor.record("research-agent", success=True, duration_ms=3.0)
    for name, data in (_files(workspace) or {}).items():
        assert PASSWORD.encode() not in data, f"{name} holds the password"
    assert PASSWORD not in out + err
    # again with the same store: nothing to force, and the record is the same
    code, out, err = run_cli(capsys, "store", "init", store_url, "--workspace", str(workspace))
    assert code == 0, out + err
    assert (workspace / RECORD_FILE).read_text().strip() == _without_password(store_url)


@pytest.mark.slow
def test_the_first_open_given_a_store_records_it_for_every_face(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    with Workspace.open(workspace, settings=Settings(store_url=_with_password(store_url))) as ws:
        for _ in range(3):
            ws.monitor.record("research-agent", success=True, duration_ms=3.0)
    assert (workspace / RECORD_FILE).read_text().strip() == _without_password(store_url)
    # a second process with no store in its environment: the command line
    done = _child("status", "--json", "--workspace", str(workspace))
    assert done.returncode == 0, done.stderr
    runs = {a["agent"]: a["runs"] for a in json.loads(done.stdout)["agents"]}
    assert runs["research-agent"] == 3
    assert not (workspace / "agentmend.db").exists()  # no new, empty SQLite file beside it
    # the MCP server as the README's client configs start it (a workspace and nothing else)
    tools = AgentmendTools(workspace, project_root=tmp_path, settings=Settings())

    async def status() -> ToolOutput:
        try:
            return await tools.status()
        finally:
            await tools.aclose()

    answer = anyio.run(status)
    runs = {a["name"]: a["executions"] for a in answer.data["agents"]}
    assert runs["research-agent"] == 3
    # the receiver and the fleet checker ask the same
    location, _ = _store_location(argparse.Namespace(workspace=workspace, store=None))
    assert str(location) == _without_password(store_url)


@pytest.mark.slow
def test_the_receiver_started_first_records_the_store_too(store_url: str, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bare = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT}
    argv = ["otel", "receive", "--port", str(port), "--token", "t", "--workspace", str(workspace)]
    process = subprocess.Popen(
        [sys.executable, "-m", "agentmend.faces.cli", *argv, "--store", _with_password(store_url)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=bare,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()  # the receiver says where it listens once it does
        assert f"127.0.0.1:{port}" in line, line
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert (workspace / RECORD_FILE).read_text().strip() == _without_password(store_url)


def test_a_store_given_that_is_not_the_recorded_one_is_refused_in_one_line(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    workspace = tmp_path / "ws"
    code, out, err = run_cli(capsys, "store", "init", store_url, "--workspace", str(workspace))
    assert code == 0, out + err
    other = _with_password(pg_url) if store_url.endswith(".db") else str(tmp_path / "other.db")
    before = _files(workspace)
    code, out, err = run_cli(capsys, "status", "--workspace", str(workspace), "--store", other)
    assert code == 3
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert _without_password(store_url) in err, err
    assert re.sub(f":{PASSWORD}@", ":***@", other) in err, err
    assert PASSWORD not in err
    with pytest.raises(WorkspaceError, match="records the store"):
        Workspace.open(workspace, settings=Settings(store_url=other))
    assert _files(workspace) == before
    # store init of another store needs --force, then that store is the workspace's
    code, out, err = run_cli(capsys, "store", "init", other, "--workspace", str(workspace))
    assert code == 2, err
    assert "--force" in err, err
    assert _files(workspace) == before
    code, out, err = run_cli(
        capsys, "store", "init", other, "--force", "--workspace", str(workspace)
    )
    assert code == 0, out + err
    assert (workspace / RECORD_FILE).read_text().strip() == _without_password(
        other.replace(f":{PASSWORD}@", "@")
    )


def test_a_server_workspace_that_records_no_store_gets_no_new_sqlite_file(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    with Workspace.open(workspace, settings=Settings(store_url=pg_url)) as ws:
        ws.manager.audit.append(
            agent_name="x", edit_type="note", old_value=None, new_value="1", user_id="t"
        )
    (workspace / RECORD_FILE).unlink()  # a workspace made before stores were recorded
    before = _files(workspace)
    code, out, err = run_cli(capsys, "history", "--workspace", str(workspace))
    assert code == 3, out + err
    assert "records no store URL: run `agentmend store init URL`" in err, err
    with pytest.raises(WorkspaceError, match="records no store URL"):
        Workspace.open(workspace, settings=Settings())
    assert _files(workspace) == before  # no agentmend.db made
    code, out, err = run_cli(capsys, "store", "init", pg_url, "--workspace", str(workspace))
    assert code == 0, out + err
    code, out, err = run_cli(capsys, "audit", "verify", "--json", "--workspace", str(workspace))
    assert json.loads(out)["rows_checked"] == 1, out + err


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("mysql://root@db/agentmend", "unsupported store URL mysql://"),
        (f"postgresql://postgres:{PASSWORD[:4]}/{PASSWORD[4:]}@db/x", "percent-encode"),
        ("postgresql://postgres@127.0.0.1:1/agentmend", "127.0.0.1"),
        ("TMP/a-file/agentmend.db", "TMP/a-file"),
        ("sqlite://", "names no database file"),
    ],
)
@pytest.mark.parametrize("workspace_state", ["new", "recorded"])
def test_a_bad_url_is_a_named_error_and_leaves_the_workspace_as_it_was(
    url: str,
    named: str,
    workspace_state: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    workspace = tmp_path / "ws"
    (tmp_path / "a-file").write_text("not a folder")
    url = url.replace("TMP", str(tmp_path))
    if workspace_state == "recorded":
        code, out, err = run_cli(
            capsys, "store", "init", str(tmp_path / "kept.db"), "--workspace", str(workspace)
        )
        assert code == 0, out + err
    before = _files(workspace)
    code, out, err = run_cli(capsys, "store", "init", url, "--force", "--workspace", str(workspace))
    assert code in (2, 3), out + err
    assert err.startswith("agentmend: "), err
    assert len(err.strip().splitlines()) == 1, err
    assert named.replace("TMP", str(tmp_path)) in err, err
    assert PASSWORD[4:] not in err
    assert _files(workspace) == before


def test_an_audit_key_is_made_once_and_kept_nowhere(
    store_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workspace = tmp_path / "ws"
    code, out, err = run_cli(
        capsys, "store", "init", store_url, "--new-audit-key", "--workspace", str(workspace)
    )
    assert code == 0, out + err
    found = re.search(r"^AGENTMEND_AUDIT_HMAC_KEY=([0-9a-f]{64})$", out, re.MULTILINE)
    assert found is not None, out
    key = found.group(1)
    assert "every agentmend process on every host" in " ".join(out.split())
    for name, data in (_files(workspace) or {}).items():
        assert key.encode() not in data, f"{name} holds the key"
    # the store gets audit rows under that key: a new key now would fail them, so none is made
    monkeypatch.setenv("AGENTMEND_AUDIT_HMAC_KEY", key)
    with Workspace.open(workspace, settings=Settings()) as ws:
        ws.manager.audit.append(
            agent_name="x", edit_type="note", old_value=None, new_value="1", user_id="t"
        )
    code, out, err = run_cli(
        capsys, "store", "init", store_url, "--new-audit-key", "--workspace", str(workspace)
    )
    assert code == 2, err
    assert "already set" in err, err
    monkeypatch.delenv("AGENTMEND_AUDIT_HMAC_KEY")
    code, out, err = run_cli(
        capsys, "store", "init", store_url, "--new-audit-key", "--workspace", str(workspace)
    )
    assert code == 2, err
    assert "1 audit rows written under a key" in err, err
    code, out, err = run_cli(capsys, "store", "init", store_url, "--workspace", str(workspace))
    assert code == 0, err
    assert "set the fleet's AGENTMEND_AUDIT_HMAC_KEY on this host" in " ".join(out.split())


# -- a server that asks for the password ----------------------------------------------------------

ROLE = "fleet_writer"


@pytest.fixture
def password_server(own_pg_server: PgServer) -> tuple[PgServer, str]:
    """A server of its own on which ``ROLE`` must give its password (SCRAM), owning a database;
    (the server, that database's URL without a password)."""
    hba = own_pg_server.data / "pg_hba.conf"
    rule = f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n"
    hba.write_text(rule + hba.read_text())  # before the trust rules: the first match decides
    with psycopg.connect(own_pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
        conn.execute(f"CREATE DATABASE fleet OWNER {ROLE}")
        conn.execute("SELECT pg_reload_conf()")
    url = f"postgresql://{ROLE}@127.0.0.1:{own_pg_server.port}/fleet"
    with pytest.raises(psycopg.OperationalError, match="password"):  # the rule is in force
        psycopg.connect(url, connect_timeout=10).close()
    return own_pg_server, url


@pytest.mark.slow
def test_the_password_comes_from_the_password_file(
    password_server: tuple[PgServer, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, url = password_server
    workspace = tmp_path / "ws"
    given = url.replace(f"{ROLE}@", f"{ROLE}:{PASSWORD}@")
    # the password only in the URL: the other faces could not open it, so nothing is recorded
    code, out, err = run_cli(capsys, "store", "init", given, "--workspace", str(workspace))
    assert code == 3, out + err
    assert "~/.pgpass" in err, err
    assert "the one given is not kept" in err, err
    assert PASSWORD not in err
    assert not workspace.exists()
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{server.port}:fleet:{ROLE}:{PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    code, out, err = run_cli(capsys, "store", "init", given, "--workspace", str(workspace))
    assert code == 0, out + err
    assert (workspace / RECORD_FILE).read_text().strip() == url
    # another process, with nothing but the password file: the same store
    done = _child(
        "store", "--json", "--workspace", str(workspace), env={"PGPASSFILE": str(passfile)}
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["path"] == f"postgresql://{ROLE}@127.0.0.1:{server.port}/fleet"
    # and without it, a named failure (not a fresh SQLite file)
    done = _child("store", "--json", "--workspace", str(workspace))
    assert done.returncode == 3, done.stdout
    assert "password" in done.stdout, done.stdout
    assert not (workspace / "agentmend.db").exists()
    for name, data in (_files(workspace) or {}).items():
        assert PASSWORD.encode() not in data, f"{name} holds the password"
