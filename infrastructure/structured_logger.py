"""structlog configuration, applied only when a program asks for it (never at import).

Logs go to stderr by default: the MCP server speaks its protocol on stdout, and structlog's own
default (stdout) would corrupt that stream.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from infrastructure.errors import InvalidArgument

__all__ = ["configure_logging"]


def configure_logging(
    level: str | int = "INFO", *, stream: TextIO | None = None, json: bool = False
) -> None:
    """Route structlog to ``stream`` (stderr by default) at ``level``, as text or JSON lines."""
    numeric = logging.getLevelName(level) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise InvalidArgument("level", level, "is not a log level")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
