"""A real PgBouncer in transaction mode in front of a test PostgreSQL server (Debian's package).

It listens on 127.0.0.1 at a free port, trusts every user named in its user list (the test
server's ``postgres``), hands each client transaction one of ``pool_size`` server sessions,
and ignores the ``options`` startup parameter (as a fleet's PgBouncer must for clients that
send one). As root it runs as ``postgres`` (PgBouncer refuses to run as root).
:meth:`PgBouncer.stop` stops it by its pid.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from pg_server import PgServer, PgUnavailable

__all__ = ["PgBouncer"]

_BINARY = "/usr/sbin/pgbouncer"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# what docs/fleet/postgresql.md tells a fleet to set, and what the tests run PgBouncer with
# (tests/project/test_docs_examples.py holds the page's block to these)
SESSION_SETTINGS = {
    "pool_mode": "transaction",
    "ignore_startup_parameters": "options,extra_float_digits",
}


def pgbouncer_binary() -> str:
    """Debian's ``pgbouncer``; PgUnavailable naming the package when it is not installed."""
    binary = shutil.which("pgbouncer") or _BINARY
    if not Path(binary).is_file():
        raise PgUnavailable("pgbouncer is not installed (apt-get install pgbouncer)")
    return binary


class PgBouncer:
    """One running PgBouncer; :meth:`url` names a database of ``server`` through it."""

    def __init__(self, server: PgServer, *, pool_size: int, max_clients: int = 400) -> None:
        binary = pgbouncer_binary()
        self.base = Path(tempfile.mkdtemp(prefix="agentmend-pgbouncer-", dir="/tmp"))
        user: str | None = None
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.base, owner.pw_uid, owner.pw_gid)
            user = "postgres"
        self.port = _free_port()
        (self.base / "users.txt").write_text('"postgres" ""\n')
        ini = self.base / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.base / 'users.txt'}\n"
            + "".join(f"{name} = {value}\n" for name, value in SESSION_SETTINGS.items())
            + f"default_pool_size = {pool_size}\n"
            f"max_client_conn = {max_clients}\nmax_db_connections = {pool_size}\n"
            f"logfile = {self.base / 'pgbouncer.log'}\n"
        )
        self._process = subprocess.Popen(
            [binary, str(ini)],
            user=user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("pgbouncer did not start") from None
                time.sleep(0.05)

    def url(self, server_url: str) -> str:
        """The URL of ``server_url``'s database through this PgBouncer."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{server_url.rsplit('/', 1)[1]}"

    def log(self) -> str:
        path = self.base / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self.base, ignore_errors=True)
