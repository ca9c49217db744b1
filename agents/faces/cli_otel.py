"""``agentmend otel receive``: the OTLP/HTTP receiver (``agentmend.faces.otel_receiver``)."""

from __future__ import annotations

import argparse

from agentmend.faces.cli import Subcommand

__all__ = ["SUBCOMMANDS"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    from agentmend.faces.otel_receiver import add_arguments

    add_arguments(parser)


def _run(args: argparse.Namespace) -> int:
    from agentmend.faces.otel_receiver import run

    return run(args)


SUBCOMMANDS = (
    Subcommand(
        path=("otel", "receive"),
        help="take agent runs from OpenTelemetry traces (OTLP/HTTP on /v1/traces)",
        run=_run,
        example="agentmend otel receive --port 4318 --workspace .agentmend",
        add_arguments=_arguments,
    ),
)
