"""The ``agentmend`` command: one console script, a subcommand per face.

    agentmend session                 the interactive session (as ``python main.py``)
    agentmend history --json          the changes made to the agents, as data
    agentmend audit verify            does the audit chain verify? (exit 1 if not)

Subcommands are ``Subcommand`` values (``agentmend.faces.cli.common``), one module of this
package per command group, listed in the one table of ``_subcommands``; adding one is adding a
value to such a module (or a module to that table). Each subcommand gets
``--workspace`` (default ``AGENTMEND_WORKSPACE``, else ``./.agentmend``) and, where its output
is data, ``--json``. Its ``run`` imports what it needs, so ``agentmend --help`` stays quick.

Exit codes: 0 ok, 1 a problem was found (the audit chain does not verify, a rollback was
refused), 2 a usage error (bad arguments, an unknown change id, a bad setting), 3 the store or
workspace is unavailable. Errors are one line on stderr: ``agentmend: <what to fix>``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from agentmend.faces.cli.common import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    Subcommand,
    print_json,
)
from agentmend.faces.terminal import terminal_text

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse with the usage error in one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        from agentmend.infrastructure.redaction import redact

        sys.stderr.write(f"agentmend: {redact(message)} (see `{self.prog} --help`)\n")
        raise SystemExit(EXIT_USAGE)


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def _subcommands() -> list[Subcommand]:
    """Every subcommand, in the order ``--help`` lists them: the one table of command groups."""
    from agentmend.faces.cli import (
        ci_gates,
        commands,
        otel,
        release,
        report,
        safeguards,
        store,
        store_admin,
        watch,
    )

    groups = (commands, report, ci_gates, safeguards, otel, watch, release, store, store_admin)
    # ``store copy`` comes after ``store``, under which it sits
    return [command for group in groups for command in group.SUBCOMMANDS]


def build_parser(
    subcommands: Sequence[Subcommand] | None = None, *, argv: Sequence[str] | None = None
) -> argparse.ArgumentParser:
    """The whole command line: every subcommand, nested by its path.

    Given the ``argv`` it will parse, only the subcommand that ``argv`` names is built with its
    arguments: adding a subcommand's arguments may import its module (the session's alone takes
    most of a second), and building all of them costs tens of milliseconds, which ``agentmend
    status`` and ``agentmend --version`` should not pay. Words that name no subcommand (a typo,
    ``--help``) get every subcommand without its arguments, so the usage error or the help
    lists every one.
    """
    named = _leading_words(argv) if argv is not None else None
    commands = list(subcommands if subcommands is not None else _subcommands())
    if named is not None:
        wanted = [
            c
            for c in commands
            if tuple(named[: len(c.path)]) == c.path or tuple(c.path[: len(named)]) == tuple(named)
        ]
        if named and wanted:
            commands = wanted
    parser = _Parser(
        prog="agentmend",
        description="Keep a team of LLM agents healthy: record, detect, question, fix, prove.",
        epilog=_EPILOG,
        formatter_class=_formatter,
    )
    parser.add_argument("--version", action="version", version=f"agentmend {_version()}")
    groups: dict[tuple[str, ...], argparse._SubParsersAction[Any]] = {}
    parents: dict[tuple[str, ...], argparse.ArgumentParser] = {(): parser}
    leaves: set[tuple[str, ...]] = set()
    for command in commands:
        for depth in range(1, len(command.path) + 1):
            prefix, name = command.path[: depth - 1], command.path[depth - 1]
            if command.path[:depth] in parents:
                continue
            if prefix not in groups:
                groups[prefix] = parents[prefix].add_subparsers(
                    title="commands", metavar="COMMAND", dest=f"command_{depth}"
                )
                # a command that is also a group (``store`` and ``store copy``) runs itself
                # when no subcommand follows
                groups[prefix].required = prefix not in leaves
            leaf = depth == len(command.path)
            sub = groups[prefix].add_parser(
                name,
                help=command.help if leaf else f"{name} commands",
                description=command.help if leaf else None,
                epilog=f"example:\n  {command.example}" if leaf else None,
                formatter_class=_formatter,
            )
            parents[command.path[:depth]] = sub
            if leaf:
                if named is None or tuple(named[: len(command.path)]) == command.path:
                    command.add_arguments(sub)
                _common_arguments(sub, command)
                sub.set_defaults(subcommand=command)
                leaves.add(command.path)
    return parser


def _leading_words(argv: Sequence[str]) -> list[str]:
    """The words ``argv`` starts with, up to its first option: the subcommand's path."""
    words = []
    for word in argv:
        if word.startswith("-"):
            break
        words.append(word)
    return words


_EPILOG = """\
examples:
  agentmend session                    talk to the simulated team, offline
  agentmend audit verify --json        check the audit trail, as data

exit codes: 0 ok, 1 a problem was found, 2 usage error, 3 store or workspace unavailable"""


def _common_arguments(parser: argparse.ArgumentParser, command: Subcommand) -> None:
    if command.workspace:
        parser.add_argument(
            "--workspace",
            type=Path,
            metavar="DIR",
            default=None,
            help="workspace folder (default: $AGENTMEND_WORKSPACE, else ./.agentmend)",
        )
    if command.workspace and "--store" not in parser._option_string_actions:
        parser.add_argument(
            "--store",
            metavar="URL",
            default=None,
            help="the store: a SQLite file or postgresql://user@host/db (default: "
            "$AGENTMEND_STORE_URL, else the store the workspace records, else its agentmend.db)",
        )
    if command.json_output:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentmend")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``agentmend`` with ``argv`` (default ``sys.argv[1:]``); the exit code."""
    from agentmend.infrastructure.errors import LockTimeout
    from agentmend.infrastructure.redaction import redact
    from agentmend.infrastructure.structured_logger import configure_logging

    given = list(argv) if argv is not None else sys.argv[1:]
    args = build_parser(argv=given).parse_args(given)
    command: Subcommand = args.subcommand
    # stdout carries the command's output (and --json): the library's log goes to stderr, and
    # only warnings unless a subcommand (the session, the MCP server) sets its own level
    configure_logging("WARNING", stream=sys.stderr)
    try:
        return command.run(args)
    except CommandError as exc:  # it may quote a stored name or a URL: escaped and masked
        return _failed(args, redact(str(exc)), exc.code)
    except LockTimeout as exc:  # another process holds a lock (stopped, stuck): one line
        return _failed(args, redact(str(exc)), EXIT_UNAVAILABLE)
    except KeyboardInterrupt:
        sys.stderr.write("agentmend: interrupted\n")
        return 130
    except BrokenPipeError:
        # the reader went away (``agentmend history --json | head``): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _failed(args: argparse.Namespace, message: str, code: int) -> int:
    """A command's failure, said once: as JSON on stdout under ``--json`` (what a program
    parsing the output reads), else as one escaped line on stderr. Returns ``code``."""
    if getattr(args, "json", False):
        print_json({"error": message, "exit_code": code})
    else:
        sys.stderr.write(f"agentmend: {terminal_text(message)}\n")
    return code
