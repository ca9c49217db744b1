"""What every ``agentmend`` command group shares: exit codes, ``Subcommand``, one-line errors."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "CommandError",
    "Subcommand",
    "print_json",
    "workspace_path",
]

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3


@dataclass(frozen=True)
class Subcommand:
    """One ``agentmend`` subcommand.

    ``add_arguments`` declares its flags (``--workspace`` is added for it); ``run`` carries it
    out and returns the exit code. ``path`` nests it (``("audit", "verify")`` is
    ``agentmend audit verify``). ``example`` is shown at the end of its ``--help``.
    """

    path: tuple[str, ...]
    help: str
    run: Callable[[argparse.Namespace], int]
    example: str
    add_arguments: Callable[[argparse.ArgumentParser], None] = field(default=lambda _: None)
    json_output: bool = False
    workspace: bool = True


class CommandError(Exception):
    """A subcommand's one-line failure, with the exit code it ends with."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def workspace_path(args: argparse.Namespace) -> Path:
    """The workspace a subcommand works on: ``--workspace``, else the environment, else default."""
    given = getattr(args, "workspace", None)
    if given is not None:
        return Path(given)
    return Path(os.environ.get("AGENTMEND_WORKSPACE") or ".agentmend")


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout (what ``--json`` promises)."""
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
