"""``agentmend serve``: the report page, live from the store, on 127.0.0.1 only.

Read-only: GET only, every other method is refused. A request gets the page as the store is
now: it is rendered again when the store changed since the last rendering (``LatestPage``: the
database's commits and the audit head file), else the last one is served, so an idle store costs
nothing however often the page asks. The page fetches ``/main`` every few seconds and swaps it
in, so new runs show without a reload (with JavaScript off it is the static page of that moment).

Only requests naming the server in ``Host`` (loopback names) are answered, so a web page cannot
read the report through DNS rebinding; each connection has its thread and a time limit on
reads, so a client that stops halfway blocks nobody else
(``agentmend.infrastructure.local_http``).
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from typing import Any

from agentmend.infrastructure.local_http import HostCheck, LocalHTTPServer

__all__ = ["LIVE_SCRIPT", "LatestPage", "serve"]

LIVE_SCRIPT = """
<script>(function(){function tick(){fetch('/main',{cache:'no-store'}).then(function(r){
return r.ok?r.text():null}).then(function(t){if(t===null)return;var m=document.querySelector(
'main');var box=document.getElementById('filter');var q=box?box.value:'';m.innerHTML=t;
var nb=document.getElementById('filter');if(nb){nb.hidden=false;nb.value=q;
nb.dispatchEvent(new Event('input'));}}).catch(function(){});}setInterval(tick,3000);})();
</script>"""

_MAIN = re.compile(r"<main>(.*)</main>", re.S)


class LatestPage:
    """The page, rendered again only when ``version()`` differs from the last rendering's.

    The version is taken before rendering, so a change that lands during a rendering makes
    the next request render again rather than being taken as shown.
    """

    def __init__(self, render: Callable[[], str], version: Callable[[], object]) -> None:
        self.render = render
        self.version = version
        self.renderings = 0
        self._page: str | None = None
        self._key: object = None
        self._lock = threading.Lock()  # requests come on threads of their own

    def __call__(self) -> str:
        with self._lock:
            key = self.version()
            if self._page is None or key != self._key:
                self._page, self._key = self.render(), key
                self.renderings += 1
            return self._page


def _handler(render: Callable[[], str], hosts: HostCheck) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "agentmend"

        def do_GET(self) -> None:
            if not hosts.allows(self.headers.get("Host")):
                self.close_connection = True
                self._send(403, "text/plain", b"the Host is not this server's")
                return
            if self.path not in ("/", "/main", "/index.html"):
                self._send(404, "text/plain", b"not found")
                return
            page = render()
            if self.path == "/main":
                match = _MAIN.search(page)
                body = match.group(1) if match else ""
            else:
                body = page.replace("</body>", LIVE_SCRIPT + "</body>")
            self._send(200, "text/html; charset=utf-8", body.encode("utf-8"))

        def do_POST(self) -> None:
            self._send(405, "text/plain", b"read-only")

        do_PUT = do_DELETE = do_PATCH = do_POST

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # the console shows where the page is; requests are not news

    return Handler


def serve(
    opened: Any,
    *,
    port: int,
    render: Callable[..., str],
    version: Callable[[], object] | None = None,
) -> int:
    """Serve until interrupted; prints the address first (``port=0`` picks a free one).

    ``version()`` says what the page depends on (see ``LatestPage``); without it every request
    renders the page afresh.

    Raises:
        OSError: the port cannot be bound (taken, or not allowed).
    """
    page: Callable[[], str] = lambda: render(opened)  # noqa: E731
    if version is not None:
        page = LatestPage(page, version)
    # requests come on threads of their own, but the store is read on one: its connection is
    # per thread, and SQLite's data_version (what ``version`` reads) is per connection
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentmend-serve-reader")
    server = LocalHTTPServer(
        ("127.0.0.1", port),
        _handler(lambda: reader.submit(page).result(), HostCheck("127.0.0.1")),
        request_timeout_s=10.0,
    )
    try:
        host, bound = server.server_address[:2]
        sys.stdout.write(f"serving the report on http://{host!s}:{bound}/ (Ctrl-C stops)\n")
        sys.stdout.flush()
        server.serve_forever()
    except KeyboardInterrupt:
        return 0
    finally:
        server.server_close()
        reader.shutdown(wait=False)
    return 0
