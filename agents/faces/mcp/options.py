"""The MCP server's command-line options, in a module light enough for ``agentmend``'s parser.

``agentmend-mcp`` and ``agentmend mcp`` take the same options from here, so neither can lack
one the other has; building the parser imports nothing of the server itself.
"""

from __future__ import annotations

import argparse

__all__ = ["PROJECT_ROOT_ENV", "add_server_arguments"]

PROJECT_ROOT_ENV = "AGENTMEND_PROJECT_ROOT"


def add_server_arguments(parser: argparse.ArgumentParser, *, workspace: bool = True) -> None:
    """The server's options, shared by ``agentmend-mcp`` and ``agentmend mcp``.

    ``workspace=False`` leaves out ``--workspace`` and ``--store``, which ``agentmend`` gives
    every subcommand itself.
    """
    if workspace:
        parser.add_argument(
            "--workspace",
            help="the workspace folder (default: AGENTMEND_WORKSPACE, else ./.agentmend)",
        )
        parser.add_argument(
            "--store",
            help="the store: a SQLite file or postgresql://user@host/db (default: "
            "AGENTMEND_STORE_URL, else the store the workspace records, else its agentmend.db)",
        )
    parser.add_argument(
        "--root",
        help=f"the project root for code updates (default: {PROJECT_ROOT_ENV}, else the "
        "current directory)",
    )
    parser.add_argument(
        "--follow-releases",
        choices=["auto", "on", "off"],
        help="serve the team's releases, canary included (default: AGENTMEND_FOLLOW_RELEASES, "
        "else auto: when the team has published one)",
    )
    parser.add_argument("--release", type=int, help="serve this release only (no canary)")
    parser.add_argument("--log-level", default="INFO", help="stderr log level (default INFO)")
