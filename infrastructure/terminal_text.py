"""Text for a terminal: every character a terminal would act on, shown as its escape.

Agent names, error texts and answers come from anyone who can record a run or send a span, and a
terminal obeys the control sequences in what it is given: ``\\x1b[2J`` clears the screen (and a
red warning on it), ``\\r`` overwrites a line, ``\\u202e`` reverses what follows. Every output to a
terminal (the faces' consoles, ``agentmend.faces.terminal``; the log's text lines) passes through
:func:`terminal_text`, which shows each such character as its escape (``\\x1b``, ``\\r`` as
``\\x0d``, ``\\u202e``). It is idempotent: escaped text is printable ASCII where it was changed.
"""

from __future__ import annotations

__all__ = ["terminal_text"]


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_BIDI_AND_SEPARATORS = (
    0x061C,  # Arabic letter mark
    0x200E,  # left-to-right mark
    0x200F,  # right-to-left mark
    *range(0x202A, 0x202F),  # embeddings and overrides
    *range(0x2066, 0x206A),  # isolates
    0x2028,  # line separator
    0x2029,  # paragraph separator
)
_UNSAFE = {
    code: _escape(code) for code in (*range(0x00, 0x20), *range(0x7F, 0xA0), *_BIDI_AND_SEPARATORS)
}
_KEEP_NEWLINES = {code: text for code, text in _UNSAFE.items() if code not in (0x0A, 0x09)}


def terminal_text(text: str, *, newlines: bool = True) -> str:
    """``text`` with every character a terminal would act on shown as its escape.

    Args:
        newlines: keep line feeds and tabs (a multi-line message); False escapes them too
            (one line: a name in a table, a status line).
    """
    return text.translate(_KEEP_NEWLINES if newlines else _UNSAFE)
