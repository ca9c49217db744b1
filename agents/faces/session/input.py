"""What the interactive session reads: its flags, and standard input one line at a time."""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["LineReader", "add_arguments", "parse_args", "settings_overrides"]


def add_arguments(parser: argparse.ArgumentParser, *, workspace: bool = True) -> None:
    """The session's flags, shared by ``main.py`` and ``agentmend session``."""
    if workspace:
        parser.add_argument("--workspace", type=Path, help="workspace folder (default .agentmend)")
        parser.add_argument(
            "--store",
            metavar="URL",
            help="the store: a SQLite file or postgresql://user@host/db (default "
            "AGENTMEND_STORE_URL, else the store the workspace records, else its agentmend.db)",
        )
    parser.add_argument(
        "--provider",
        choices=["offline", "anthropic", "claude-agent-sdk"],
        help="which runtime runs the agents and the roles (default offline)",
    )
    parser.add_argument("--agents", type=Path, help="a folder of agent definitions to run")
    cassette = parser.add_mutually_exclusive_group()
    cassette.add_argument(
        "--record",
        type=Path,
        metavar="CASSETTE",
        help="run on the Messages API (needs ANTHROPIC_API_KEY) and store every exchange here",
    )
    cassette.add_argument(
        "--replay",
        type=Path,
        metavar="CASSETTE",
        help="serve the exchanges recorded in CASSETTE: no key, no network",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated team")
    parser.add_argument("--demo", action="store_true", help="run the scripted demo and exit")
    parser.add_argument(
        "--follow-releases",
        choices=["auto", "on", "off"],
        help="serve the team's releases, canary included (default AGENTMEND_FOLLOW_RELEASES, "
        "else auto: when the team has published one)",
    )
    parser.add_argument("--release", type=int, metavar="N", help="serve release N only (no canary)")
    parser.add_argument(
        "--routing-key",
        metavar="KEY",
        help="route every question typed here by KEY (a user id: one arm for the session); "
        "default a random key per question",
    )
    parser.add_argument("--verbose", action="store_true", help="log every step to stderr")


def parse_args(
    argv: list[str] | None, prog: str = "main.py", *, description: str | None = None
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    return parser.parse_args(argv)


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``Settings`` fields the flags set (the rest come from ``AGENTMEND_*``)."""
    overrides: dict[str, Any] = {}
    if args.provider:
        overrides["provider"] = args.provider
    if getattr(args, "store", None):
        overrides["store_url"] = args.store
    if getattr(args, "follow_releases", None):
        overrides["follow_releases"] = args.follow_releases
    if getattr(args, "release", None) is not None:
        overrides["serve_release"] = args.release
    for name in ("record", "replay"):
        if getattr(args, name, None) is not None:
            overrides[name] = getattr(args, name)
    return overrides


class LineReader:
    """Standard input as an async queue of lines, read by one daemon thread.

    One reader for the whole session means a prompt inside a cycle (y/n) and the command
    loop never race for the same line, and a prompt can time out without a stuck thread.
    The end of input is for good: once seen, every later read is None at once, so no prompt
    after it waits for a line that cannot come.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = loop
        self.ended = False
        self._thread = threading.Thread(target=self._pump, name="stdin-reader", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for line in sys.stdin:
            if not self._hand_over(line.rstrip("\n")):
                return
        self._hand_over(None)

    def _hand_over(self, line: str | None) -> bool:
        """Queue ``line`` on the session's loop; False once that loop is closed. A session run
        inside a longer-lived process (an app, a test) ends while this thread still waits on
        standard input: what arrives after that has no reader left, and is dropped quietly."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, line)
        except RuntimeError:  # the loop is closed
            return False
        return True

    async def read(self) -> str | None:
        """The next line, or None at (and after) the end of input."""
        if self.ended:
            return None
        line = await self._queue.get()
        if line is None:
            self.ended = True
        return line
