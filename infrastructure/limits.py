"""Bounds on every input a caller or a model controls, checked before anything is stored.

A hostile or confused model can answer with a 50 MB rationale or a plan of a hundred
megabyte files; accepted, that costs gigabytes of memory and database and stalls the server
that took it. Each bound is a ``Settings`` field with a documented default; a check is a
length comparison (no parsing, no copy), so an input over a bound is refused in well under a
second with an :class:`~agentmend.infrastructure.errors.InputTooLarge` naming the input, its size,
the bound and the setting, and nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentmend.infrastructure.errors import InputTooLarge
from agentmend.infrastructure.settings import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_PLAN_BYTES,
    DEFAULT_MAX_PLAN_FILES,
    DEFAULT_MAX_TEXT_BYTES,
    DEFAULT_MAX_TOOL_ARGUMENT_BYTES,
)

if TYPE_CHECKING:
    from agentmend.infrastructure.models import ImprovementAction
    from agentmend.infrastructure.settings import Settings

__all__ = ["InputLimits", "utf8_size"]


def utf8_size(value: str | bytes) -> int:
    """The bytes ``value`` takes as UTF-8, counted without encoding a large string twice."""
    if isinstance(value, bytes):
        return len(value)
    if value.isascii():
        return len(value)
    return len(value.encode("utf-8", errors="surrogatepass"))


@dataclass(frozen=True, slots=True)
class InputLimits:
    """The bounds of ``Settings`` (``max_text_bytes``, ``max_plan_files``, ...), as checks."""

    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES
    max_plan_files: int = DEFAULT_MAX_PLAN_FILES
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_plan_bytes: int = DEFAULT_MAX_PLAN_BYTES
    max_tool_argument_bytes: int = DEFAULT_MAX_TOOL_ARGUMENT_BYTES

    @classmethod
    def of(cls, settings: Settings) -> InputLimits:
        return cls(
            max_text_bytes=settings.max_text_bytes,
            max_plan_files=settings.max_plan_files,
            max_file_bytes=settings.max_file_bytes,
            max_plan_bytes=settings.max_plan_bytes,
            max_tool_argument_bytes=settings.max_tool_argument_bytes,
        )

    def text(self, what: str, value: str | bytes | None) -> None:
        """Refuse a description, rationale or reason over ``max_text_bytes``."""
        if value is not None:
            _check(what, utf8_size(value), self.max_text_bytes, "max_text_bytes")

    def file(self, what: str, content: str | bytes | None) -> None:
        """Refuse one file's content over ``max_file_bytes``."""
        if content is not None:
            _check(what, utf8_size(content), self.max_file_bytes, "max_file_bytes")

    def files(self, what: str, items: Sized) -> None:
        """Refuse more than ``max_plan_files`` files in one plan or change group."""
        _check(what, len(items), self.max_plan_files, "max_plan_files", unit="files")

    def contents(self, what: str, contents: Iterable[str | bytes | None]) -> None:
        """Refuse contents over ``max_file_bytes`` each or ``max_plan_bytes`` together."""
        total = 0
        for content in contents:
            if content is not None:
                size = utf8_size(content)
                _check(f"a file of the {what}", size, self.max_file_bytes, "max_file_bytes")
                total += size
        _check(f"the {what}'s files together", total, self.max_plan_bytes, "max_plan_bytes")

    def tool_argument(self, name: str, value: Any) -> None:
        """Refuse one tool argument whose JSON is over ``max_tool_argument_bytes``.

        A string is measured directly; anything else by its JSON, which stops being built at
        no point short of the whole value, so the JSON-RPC request bound (checked before the
        request is parsed) is what keeps this one cheap.
        """
        if value is None:
            return
        size = utf8_size(value) if isinstance(value, str) else utf8_size(_json(value))
        _check(f"argument {name!r}", size, self.max_tool_argument_bytes, "max_tool_argument_bytes")

    def action(self, action: ImprovementAction) -> None:
        """Refuse an action whose rationale or new value is over its bound."""
        self.text("rationale", action.rationale)
        if isinstance(action.new_value, str):
            self.file("new_value", action.new_value)


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _check(what: str, size: int, limit: int, setting: str, *, unit: str = "bytes") -> None:
    if size > limit:
        raise InputTooLarge(what, size, limit, setting, unit)
