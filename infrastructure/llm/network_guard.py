"""Keeps test runs away from real model APIs.

Two layers, because one cannot reach everywhere:

- ``refuse_non_loopback()`` patches the socket layer of this process (``socket.socket.connect``,
  ``connect_ex``, ``socket.getaddrinfo``, ``gethostbyname``; ``socket.create_connection`` and
  asyncio go through these) so that anything other than a loopback address is refused with
  ``NetworkRefusedError``. The test suite turns it on for every test (``tests/conftest.py``)
  unless the test carries the ``allow_network`` marker.
- A subprocess (the Claude Code CLI) is out of reach of a socket patch, so runtimes that hand a
  base URL to a subprocess, or build a client, call ``refuse_real_api_under_tests(url)``: when
  the environment variable ``AGENTMEND_TESTING=1`` is set (the test suite sets it in
  ``pytest_configure``), a base URL that is not loopback raises ``ConfigurationError``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from agentmend.infrastructure.errors import AgentmendError, ConfigurationError

__all__ = [
    "TESTING_ENV_VAR",
    "NetworkGuard",
    "NetworkRefusedError",
    "is_loopback_host",
    "is_loopback_url",
    "refuse_non_loopback",
    "refuse_real_api_under_tests",
    "under_tests",
]

TESTING_ENV_VAR = "AGENTMEND_TESTING"
"""Set to ``1`` while the test suite runs; runtimes then refuse non-loopback API URLs."""

_LOCAL_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})


class NetworkRefusedError(AgentmendError, ConnectionRefusedError):
    """A connection (or name lookup) to a non-loopback host refused by the test guard.

    It is a ``ConnectionRefusedError`` so network code handles it as the refusal it is.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        super().__init__(
            f"network access to {target} refused: tests may only reach 127.0.0.1/localhost "
            "(mark the test with @pytest.mark.allow_network to opt in)"
        )


def is_loopback_host(host: str | None) -> bool:
    """True for localhost names, loopback IPs and the unspecified address (which is local)."""
    if host is None or host == "":
        return True
    name = host.strip("[]").lower()
    if name in _LOCAL_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def is_loopback_url(url: str) -> bool:
    """True when ``url`` names a loopback host (``http://127.0.0.1:8080``, ``http://localhost``)."""
    parts = urlsplit(url if "//" in url else f"//{url}")
    return bool(parts.hostname) and is_loopback_host(parts.hostname)


def under_tests() -> bool:
    """True while the test suite runs (``AGENTMEND_TESTING=1``)."""
    return os.environ.get(TESTING_ENV_VAR) == "1"


def refuse_real_api_under_tests(base_url: str | None) -> None:
    """Under tests, raise ``ConfigurationError`` unless ``base_url`` is loopback.

    ``None`` means the SDK's default, the real API, and is refused too.
    """
    if not under_tests():
        return
    if base_url is None or not is_loopback_url(base_url):
        shown = base_url or "the default (real) API URL"
        raise ConfigurationError(
            f"{TESTING_ENV_VAR}=1 but the model API base URL is {shown}: tests may only use a "
            "loopback server such as the fake Messages API"
        )


@dataclass
class NetworkGuard:
    """What the guard refused while active (a test can fail on refusals a client swallowed)."""

    refused: list[str] = field(default_factory=list)


def _address_host(address: Any) -> str | None:
    """The host of an AF_INET/AF_INET6 address tuple, None for other families (AF_UNIX)."""
    if isinstance(address, tuple) and address and isinstance(address[0], str):
        return address[0]
    return None


@contextmanager
def refuse_non_loopback() -> Iterator[NetworkGuard]:
    """Refuse non-loopback connections and lookups in this process while the block runs.

    Nesting is fine: the innermost guard refuses first and records the refusal.
    """
    guard = NetworkGuard()
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo
    real_gethostbyname = socket.gethostbyname

    def check(host: str | None, port: object = None) -> None:
        if not is_loopback_host(host):
            target = f"{host}:{port}" if port is not None else str(host)
            guard.refused.append(target)
            raise NetworkRefusedError(target)

    def connect(self: Any, address: Any) -> None:
        host = _address_host(address)
        if host is not None:
            check(host, address[1])
        real_connect(self, address)

    def connect_ex(self: Any, address: Any) -> int:
        host = _address_host(address)
        if host is not None:
            check(host, address[1])
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        check(name, port)
        return real_getaddrinfo(host, port, *args, **kwargs)

    def gethostbyname(host: str) -> str:
        check(host)
        return real_gethostbyname(host)

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo
    socket.gethostbyname = gethostbyname
    try:
        yield guard
    finally:
        socket.socket.connect = real_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = real_connect_ex  # type: ignore[method-assign]
        socket.getaddrinfo = real_getaddrinfo
        socket.gethostbyname = real_gethostbyname
