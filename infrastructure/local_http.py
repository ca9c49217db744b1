"""What every HTTP server agentmend runs shares: the ``Host`` check, concurrency, time limits.

A server on loopback is still reachable from a web page through DNS rebinding: the page's own
name is made to resolve to 127.0.0.1, and the browser sends that name as ``Host``.
``HostCheck`` answers only the names the server is bound to (the loopback names and the bound
address) and those its operator allows (a receiver behind a load balancer); an IP literal
cannot be rebound, so a server bound to every address also answers the machine's addresses.

``LocalHTTPServer`` serves each connection on a thread of its own, with a time limit on every
read, so a client that sends half a request line holds one thread for ``request_timeout_s``
and blocks nobody; connections past ``max_connections`` are closed at once. It counts the
requests being answered, so a program that stops can wait for them (``drain``).
"""

from __future__ import annotations

import http.server
import ipaddress
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LOOPBACK_NAMES", "HostCheck", "LocalHTTPServer", "is_loopback"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_EVERY_ADDRESS = frozenset({"", "0.0.0.0", "::"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address to bind) is this machine's loopback only."""
    name = host.strip().strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_name(header: str) -> str:
    """The name in a ``Host`` header: no port, no brackets, lower case, no trailing dot."""
    text = header.strip().lower()
    if text.startswith("["):  # [::1]:4318
        return text[1:].split("]", 1)[0]
    if text.count(":") == 1:  # name:port (a bare IPv6 address has more than one)
        text = text.split(":", 1)[0]
    return text.rstrip(".")


class HostCheck:
    """The ``Host`` values a server answers: its bound names, and ``allowed`` (``*``: any).

    Args:
        bound_host: the address the server listens on.
        allowed: more names to answer (a load balancer's, a proxy's); ``*`` turns the check off.
    """

    def __init__(self, bound_host: str, allowed: Iterable[str] = ()) -> None:
        extra = {host_name(name) for name in allowed if name.strip()}
        self.any = "*" in extra
        self.every_address = bound_host.strip("[]") in _EVERY_ADDRESS
        self.names = frozenset(LOOPBACK_NAMES | {host_name(bound_host)} | extra)

    def allows(self, header: str | None) -> bool:
        if self.any:
            return True
        if not header:
            return False  # HTTP/1.1 requires one; a browser always sends it
        name = host_name(header)
        return name in self.names or (self.every_address and _is_ip(name))


class LocalHTTPServer(http.server.ThreadingHTTPServer):
    """A thread per connection, reads with a time limit, a bound on open connections.

    Args:
        address: (host, port) to bind; port 0 picks a free one.
        handler: the request handler class; its ``timeout`` is set to ``request_timeout_s``.
        request_timeout_s: the longest any read from a client may wait.
        max_connections: connections served at once; more are closed unanswered.
    """

    daemon_threads = True  # a client that never finishes must not keep the process alive

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[http.server.BaseHTTPRequestHandler],
        *,
        request_timeout_s: float = 30.0,
        max_connections: int = 64,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        timed = type(handler.__name__, (handler,), {"timeout": request_timeout_s})
        super().__init__(address, timed)
        self.max_connections = max_connections
        self._connections = 0
        self._answering = 0
        self._changed = threading.Condition()

    # -- connections: counted, bounded

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._changed:
            full = self._connections >= self.max_connections
            if not full:
                self._connections += 1
        if full:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._changed:
                self._connections -= 1
                self._changed.notify_all()

    # -- requests: counted, so stopping can wait for those being answered

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Count one request as being answered while inside (``drain`` waits for it)."""
        with self._changed:
            self._answering += 1
        try:
            yield
        finally:
            with self._changed:
                self._answering -= 1
                self._changed.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Wait until no request is being answered, at most ``timeout_s``; whether none is."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._answering:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True
