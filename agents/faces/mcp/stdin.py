"""A size and depth pre-filter in front of the MCP server's stdin, so no request can stall it.

The SDK's stdio transport reads a whole line and parses it: a line of hundreds of megabytes is
held in memory whole, and a request nested 200,000 levels deep is never answered. Here each
line is read in bounded chunks: past ``Settings.max_request_bytes`` the rest of the line is
read and dropped without being kept, and a line nested deeper than
``Settings.max_request_depth`` is not parsed. Either gets a JSON-RPC error (``-32600``, with the
request's id when it can be found cheaply, else ``null``) and the server reads the next line.
Every other line is checked the way the SDK's reader checks it: the SDK drops a line that is not
a JSON-RPC message without a word, so here such a line is answered, ``-32700`` when it is not
JSON at all and ``-32600`` when it is JSON but no JSON-RPC message. That parses each line twice
(here and in the SDK); lines are bounded and parsing is a small part of any tool call.

The depth check never recurses and never parses: strings are taken out and everything but
brackets is dropped with bytes methods; a line with fewer brackets than the bound passes at
once, else one regular expression (bracket nesting up to a fixed depth is a regular language)
matches the brackets in one pass of C code: about a second for 10 MB of nothing but brackets,
a few milliseconds to refuse 200,000 levels. Whether an opening bracket closes with its own
kind is left to the JSON parser; only depth is bounded here.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import anyio
import anyio.to_thread

from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

__all__ = [
    "INVALID_REQUEST",
    "PARSE_ERROR",
    "BoundedLines",
    "nesting_exceeds",
    "not_a_message",
    "refusal_reason",
    "serve_stdio",
]

log = get_logger(__name__)

INVALID_REQUEST = -32600
"""JSON-RPC's code for a request the server will not take."""
PARSE_ERROR = -32700
"""JSON-RPC's code for a line that is not JSON."""

_CHUNK = 8 << 20
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")')


def outside_strings(line: bytes) -> bytes:
    """``line`` with every JSON string's content taken out, in a few passes of C code.

    Escapes pair from the left as JSON reads them, so removing ``\\\\`` pairs and then
    ``\\"`` leaves only the quotes that open and close strings; splitting there, the even
    parts are what lies outside strings.
    """
    unescaped = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[::2])


@functools.lru_cache(maxsize=4)
def _nested_at_most(depth: int) -> re.Pattern[bytes]:
    """Balanced brackets nested at most ``depth`` deep: a regular language at a fixed depth.

    Possessive repeats never backtrack, so a match is one pass over the brackets in C code.
    """
    pattern = b""
    for _ in range(depth):
        pattern = rb"(?:[\[{]" + pattern + rb"[\]}])*+"
    return re.compile(pattern)


def nesting_exceeds(line: bytes, max_depth: int) -> bool:
    """True when ``line``'s arrays and objects may nest deeper than ``max_depth``.

    A line with more brackets than the bound whose brackets do not balance counts too: telling
    the two apart would take the parse this check exists to avoid. A line with fewer brackets
    cannot nest too deep, balanced or not; the JSON parser reports it.
    """
    brackets = outside_strings(line).translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") <= max_depth:
        return False
    return _nested_at_most(max_depth).fullmatch(brackets) is None


def request_id(line: bytes) -> int | str | None:
    """The top-level ``id`` of a JSON-RPC line, found without parsing it (None if unsure)."""
    for match in _ID.finditer(line, 0, min(len(line), 1 << 16)):
        prefix = outside_strings(line[: match.start()])
        depth = prefix.count(b"{") + prefix.count(b"[") - prefix.count(b"}") - prefix.count(b"]")
        if depth == 1:
            raw = match.group(1)
            if raw.startswith(b'"'):
                with contextlib.suppress(UnicodeDecodeError):
                    return raw[1:-1].decode("utf-8")
                return None
            return int(raw)
    return None


def refusal_reason(line: bytes, max_depth: int) -> str | None:
    """Why ``line`` (within the size bound) is refused, or None to pass it on."""
    if nesting_exceeds(line, max_depth):
        return (
            f"request nested deeper than {max_depth} levels (Settings.max_request_depth), "
            "or its brackets do not balance"
        )
    return None


def not_a_message(line: bytes) -> tuple[int, str] | None:
    """The JSON-RPC error code and message for a line the SDK's reader would drop, else None."""
    import mcp_types as types
    from pydantic import ValidationError

    if not line.strip():
        return None  # the SDK reads blank lines as nothing, and so do clients
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        if any(error["type"] == "json_invalid" for error in errors):
            return PARSE_ERROR, "Parse error: the line is not JSON"
        return INVALID_REQUEST, "Invalid Request: the line is JSON but not a JSON-RPC message"
    return None


@dataclass(frozen=True)
class Refusal:
    """One refused line: the id to answer, why, and JSON-RPC's code for it."""

    request_id: int | str | None
    message: str
    code: int = INVALID_REQUEST


class BoundedLines:
    """The lines of a binary stream for the SDK's reader, refused lines taken out.

    Args:
        stream: the binary stream (stdin's descriptor, read in a worker thread).
        max_bytes: the longest line passed on.
        max_depth: the deepest nesting passed on.
        refuse: called with each :class:`Refusal`, to answer it.
    """

    def __init__(
        self,
        stream: BinaryIO,
        *,
        max_bytes: int,
        max_depth: int,
        refuse: Callable[[Refusal], Any],
    ) -> None:
        self._stream = stream
        self.max_bytes, self.max_depth, self._refuse = max_bytes, max_depth, refuse

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:
            line = await self._read(self.max_bytes + 1)
            if not line:
                return
            if len(line) > self.max_bytes and not line.endswith(b"\n"):
                size = len(line) + await self._drain()
                ident = request_id(line)
                log.warning("mcp_request_refused", reason="too_large", bytes=size)
                await self._answer(
                    Refusal(
                        ident,
                        f"request of {size} bytes is over the limit of {self.max_bytes} bytes "
                        "(Settings.max_request_bytes)",
                    )
                )
                continue
            reason = refusal_reason(line, self.max_depth)
            if reason is not None:
                log.warning("mcp_request_refused", reason="too_deep", bytes=len(line))
                await self._answer(Refusal(request_id(line), reason))
                continue
            problem = not_a_message(line)
            if problem is not None:
                code, message = problem
                log.warning("mcp_request_refused", reason="not_a_message", code=code)
                ident = request_id(line) if code == INVALID_REQUEST else None
                await self._answer(Refusal(ident, message, code))
                continue
            yield line.decode("utf-8", errors="replace")

    async def _read(self, limit: int) -> bytes:
        """At most ``limit`` bytes, up to and with the next newline (in a worker thread)."""
        return await anyio.to_thread.run_sync(self._stream.readline, limit, abandon_on_cancel=True)

    async def _drain(self) -> int:
        """Read the rest of an oversized line in bounded chunks; returns the bytes dropped."""
        dropped = 0
        while True:
            chunk = await self._read(_CHUNK)
            dropped += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                return dropped

    async def _answer(self, refusal: Refusal) -> None:
        result = self._refuse(refusal)
        if hasattr(result, "__await__"):
            await result


@contextlib.contextmanager
def _claimed_stdin() -> Any:
    """stdin's descriptor for the server alone: fd 0 reads EOF for everything else meanwhile."""
    private = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        # closefd=False: a worker thread may still block on it after the server stops
        yield os.fdopen(private, "rb", closefd=False)
    finally:
        os.dup2(private, 0)


async def serve_stdio(server: MCPServer, *, max_bytes: int, max_depth: int) -> None:
    """Run ``server`` over stdio with the pre-filter in front of its reader."""
    import mcp_types as types
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage

    with _claimed_stdin() as raw:
        answers: list[Any] = []
        ready = anyio.Event()

        async def refuse(refusal: Refusal) -> None:
            error = types.JSONRPCError(
                jsonrpc="2.0",
                id=refusal.request_id,
                error=types.ErrorData(code=refusal.code, message=refusal.message),
            )
            await ready.wait()
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await answers[0].send(SessionMessage(error))

        lines = BoundedLines(raw, max_bytes=max_bytes, max_depth=max_depth, refuse=refuse)
        async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
            answers.append(write_stream)
            ready.set()
            lowlevel = server._lowlevel_server  # what run_stdio_async runs, with our stdin
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
