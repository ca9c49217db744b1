"""A real, throwaway PostgreSQL server started from Debian's binaries, for tests and benchmarks.

The binaries are found through ``pg_config --bindir`` (Debian puts them outside ``PATH``). The
cluster lives in a directory under /tmp owned by the ``postgres`` user (pytest's own temporary
directory is closed to other users), made by ``initdb -N`` (no fsync of the new files, about
0.7 s). The server listens on 127.0.0.1 at a free port and on a Unix socket in that directory;
as root it runs as ``postgres`` through ``runuser``. :meth:`PgServer.stop` stops it by pid.

A test run shares one server among its pytest-xdist workers (``shared_pg_server``): the first
worker that needs it starts it under the run's lock and writes where it is; the others attach
to it; the controlling process stops it when the run ends (``stop_shared_pg_server``). Tests
that restart a server use one of their own.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from itertools import count
from pathlib import Path
from typing import Any

from session_shared import shared_lock

__all__ = ["PgServer", "PgUnavailable", "pg_bindir", "shared_pg_server", "stop_shared_pg_server"]

_SHARED = "postgresql"

_counter = count(1)


class PgUnavailable(Exception):
    """The PostgreSQL binaries (or the ``postgres`` user, as root) are missing."""


def pg_bindir() -> Path:
    """Where ``initdb``, ``pg_ctl`` and ``postgres`` are; raises PgUnavailable if nowhere."""
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        raise PgUnavailable("pg_config is not installed (apt-get install postgresql)")
    out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
    bindir = Path(out.stdout.strip())
    for name in ("initdb", "pg_ctl", "postgres"):
        if not (bindir / name).is_file():
            raise PgUnavailable(f"{bindir / name} is missing (apt-get install postgresql)")
    return bindir


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, waiting for a parent that is not us to reap it, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class PgServer:
    """One running cluster; ``create_database()`` gives each test a database of its own.

    Args:
        fsync: keep PostgreSQL's fsync on (the benchmark's setting); tests turn it off, which
            still survives a killed or restarted server (the OS keeps the written pages).
        running: a server another process of this run started (its ``describe()``), to attach
            to instead of starting one.
        max_connections: the server's ``max_connections`` (3 of them kept for superusers).
    """

    def __init__(
        self,
        *,
        fsync: bool = False,
        running: dict[str, Any] | None = None,
        password: str | None = None,
        max_connections: int = 200,
    ) -> None:
        self.bindir = pg_bindir()
        self._max_connections = max_connections
        self._as_postgres: list[str] = []
        owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PgUnavailable("running as root but there is no postgres user") from exc
            self._as_postgres = ["runuser", "-u", "postgres", "--"]
        self._fsync = fsync
        self.pid: int | None = None
        self.password = password
        if running is not None:
            self.base, self.port = Path(running["base"]), int(running["port"])
            self.data, self.pid = self.base / "data", int(running["pid"])
            return
        self.base = Path(tempfile.mkdtemp(prefix="agentmend-pg-", dir="/tmp"))
        if owner is not None:
            os.chown(self.base, owner.pw_uid, owner.pw_gid)
        self.data = self.base / "data"
        self.port = _free_port()
        auth = ["-A", "trust"]
        if password is not None:
            # TCP connections authenticate with passwords (SCRAM), as a fleet's server does
            secret = self.base / "pwfile"
            secret.write_text(password + "\n")
            if owner is not None:
                os.chown(secret, owner.pw_uid, owner.pw_gid)
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={secret}"]
        self._run(
            "initdb",
            "-N",
            *auth,
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "-D",
            str(self.data),
        )
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        command = [*self._as_postgres, str(self.bindir / tool), *args]
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed ({result.returncode}): {result.stderr.strip()}")

    def start(self) -> None:
        options = (
            f"-k {self.base} -h 127.0.0.1 -p {self.port}"
            f" -c max_connections={self._max_connections}"
            f" -c fsync={'on' if self._fsync else 'off'}"
        )
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            "60",
            "-D",
            str(self.data),
            "-l",
            str(self.base / "server.log"),
            "-o",
            options,
        )
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def shut_down(self) -> None:
        """Stop the server by its pid with a fast shutdown (every session ends, the cluster is
        kept): :meth:`start` brings it back on the same port with the same data."""
        pid = self.pid
        assert pid is not None, "the server is not running"
        os.kill(pid, signal.SIGINT)  # the postmaster's "fast" shutdown
        deadline = time.monotonic() + 60
        while _alive(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server (pid {pid}) did not stop within 60 s")
            time.sleep(0.05)
        self.pid = None

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate``: the server dies without a checkpoint and recovers."""
        self._run(
            "pg_ctl",
            "restart",
            "-w",
            "-t",
            "60",
            "-m",
            "immediate",
            "-D",
            str(self.data),
            "-l",
            str(self.base / "server.log"),
        )
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def url(self, dbname: str = "postgres", *, user: str = "postgres") -> str:
        secret = f":{self.password}" if self.password is not None and user == "postgres" else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(_counter)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def describe(self) -> dict[str, Any]:
        """Where the server is, for another process of the run to attach to."""
        return {"base": str(self.base), "port": self.port, "pid": self.pid}

    def stop(self) -> None:
        """Stop the server by its pid (immediate shutdown, then SIGKILL), remove the cluster.

        The cluster is thrown away, so nothing is checkpointed: an immediate shutdown ends at
        once however many databases the run made.
        """
        pid = self.pid
        self.pid = None
        if pid is not None:
            try:
                os.kill(pid, signal.SIGQUIT)  # the postmaster's "immediate" shutdown
            except ProcessLookupError:
                pid = None
            deadline = time.monotonic() + 30
            while pid is not None and time.monotonic() < deadline:
                if not _alive(pid):
                    break
                time.sleep(0.05)
            else:
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)


def shared_pg_server() -> PgServer:
    """The run's one server: started by the first caller, attached to by the others."""
    with shared_lock(_SHARED) as folder:
        where = folder / f"{_SHARED}.json"
        if where.exists():
            return PgServer(running=json.loads(where.read_text()))
        server = PgServer()
        where.write_text(json.dumps(server.describe()))
        return server


def stop_shared_pg_server(folder: Path) -> None:
    """Stop the run's server, if any process started one (the controlling process, at the end)."""
    where = folder / f"{_SHARED}.json"
    if where.exists():
        PgServer(running=json.loads(where.read_text())).stop()
        where.unlink()
