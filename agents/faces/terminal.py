"""Text for a terminal: stored names and texts are shown, never obeyed.

Agent names, error texts and answers come from anyone who can record a run or send a span, and a
terminal obeys the control sequences in what it is given: ``\\x1b[2J`` clears the screen (and the
red audit warning on it), ``\\r`` overwrites a line, ``\\u202e`` reverses what follows. So every
face that writes to a terminal passes its text through :func:`terminal_text`
(:mod:`agentmend.infrastructure.terminal_text`, which the log's text renderer uses too), and the
consoles the faces print with (:func:`safe_console`) apply it to everything they render, tables
and styled text included.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

from agentmend.infrastructure.terminal_text import terminal_text

__all__ = ["safe_console", "terminal_text"]


def safe_console(**options: Any) -> Console:
    """A ``rich`` console that escapes (:func:`terminal_text`) every text it renders."""
    return _console_class()(**options)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console, ConsoleOptions, RenderableType
    from rich.segment import Segment
    from rich.text import Text

    class SafeConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Text:
            return super().render_str(terminal_text(text), **kwargs)

        def render(
            self, renderable: RenderableType, options: ConsoleOptions | None = None
        ) -> Iterable[Segment]:
            # styled text built by hand never passes through render_str: escaped here
            for segment in super().render(renderable, options):
                if segment.control or segment.text.isprintable():
                    yield segment
                else:
                    yield Segment(terminal_text(segment.text), segment.style)

    return SafeConsole
