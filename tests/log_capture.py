"""Capture agentmend's stdlib log records in a test, whatever logging a face configured."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def captured_records(
    name: str = "agentmend", level: int = logging.DEBUG
) -> Iterator[list[logging.LogRecord]]:
    """The records logged under ``name`` from ``level`` on while the block runs."""
    logger = logging.getLogger(name)
    keep, before = _Keep(), logger.level
    logger.addHandler(keep)
    logger.setLevel(level)
    try:
        yield keep.records
    finally:
        logger.removeHandler(keep)
        logger.setLevel(before)
