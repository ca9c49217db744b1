"""``agentmend serve`` over real HTTP with hostile headers and a client that stops halfway.

The page is answered only to requests naming the server (loopback names), so a web page cannot
read it through DNS rebinding; a client that sends half a request line blocks nobody else (the
read timeout that then cuts it off is the receiver's server's, tested with the receiver).
"""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
from test_report import start_server, stop_server

from agentmend.faces.workspace import Workspace


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    workspace = tmp_path_factory.mktemp("serve") / "ws"
    Workspace.open(workspace).close()  # the simulated team and its store
    process, url = start_server(workspace)
    yield process, int(url.rstrip("/").rsplit(":", 1)[1])
    stop_server(process)


def _status_line(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        return conn.recv(4096).split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    "host", [b"evil.example", b"evil.example:80", b"127.0.0.1.nip.example", b""]
)
def test_a_host_that_is_not_the_servers_gets_no_page(
    served: tuple[subprocess.Popen[str], int], host: bytes
) -> None:
    _, port = served
    header = b"Host: " + host + b"\r\n" if host else b""
    line = _status_line(port, b"GET / HTTP/1.1\r\n" + header + b"Connection: close\r\n\r\n")
    assert line.split(b" ")[1] == b"403"


@pytest.mark.parametrize("host", [b"127.0.0.1", b"localhost", b"[::1]"])
def test_the_loopback_names_get_the_page(
    served: tuple[subprocess.Popen[str], int], host: bytes
) -> None:
    _, port = served
    request = b"GET /main HTTP/1.1\r\nHost: " + host + b":" + str(port).encode() + b"\r\n\r\n"
    assert _status_line(port, request).split(b" ")[1] == b"200"


def test_half_a_request_line_blocks_nobody(served: tuple[subprocess.Popen[str], int]) -> None:
    _, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as stalled:
        stalled.sendall(b"GET /ma")  # and nothing more
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/main", timeout=5) as answer:
            assert answer.status == 200  # answered while the stalled client holds on
