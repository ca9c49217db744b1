"""One key's new value written in the style its author chose for the old one.

People write the same list three ways (``tools: [Read, "Grep"]``, ``tools: Read, Grep`` and a
block of ``- Read`` lines) and quote scalars as they like. Rewriting a changed value in
PyYAML's house style would turn a one-word change into a reformatted block, so a flow list stays
a flow list with each kept item's original spelling (its quotes) and new items quoted the way
most of the old ones were; a block list keeps its item indentation and its untouched lines; a
quoted one-line scalar stays quoted the same way. Anything this does not understand (multi-line
flow lists, nested items, block scalars) returns ``None`` and the caller writes the value in the
default style; every result is parsed back by the caller before it is kept.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["restyled"]

_ITEM = re.compile(r"(?P<prefix>[ \t]*-[ \t]+)(?P<rest>.*)", re.S)

Render = Callable[[Any, str, bool], str | None]
"""``render(value, style, flow)``: one scalar in ``style`` (``"``, ``'``, plain ``""``), on one
line, fit for a flow list when ``flow``; None when it cannot be written so."""


@dataclass(frozen=True, slots=True)
class _Token:
    """A scalar as written: its text, its style and what follows it on the line."""

    text: str
    style: str
    tail: str


def restyled(
    block: Sequence[str],
    head: str,
    old: Any,
    new: Any,
    newline: str,
    render: Render,
) -> list[str] | None:
    """The lines of ``block`` (one key and its value) with the value changed to ``new``.

    Args:
        block: the key's current lines; the first is ``key: ...``.
        head: the first line up to and including the ``:`` after the key.
        old: the value the block holds now, as parsed.
        new: the value to write.
        newline: the file's line break.
        render: writes one scalar in a given style, or returns None when it cannot.
    """
    inline = block[0][len(head) :].rstrip("\r\n")
    spacing = inline[: len(inline) - len(inline.lstrip(" \t"))]
    inline = inline[len(spacing) :]
    if isinstance(new, list) and all(isinstance(item, str) for item in new):
        if not isinstance(old, list):
            return None
        if inline.startswith("[") and len(block) == 1:
            flow = _flow_list(inline, old, new, render)
            return None if flow is None else [head + spacing + flow + newline]
        if (not inline or inline.startswith("#")) and len(block) > 1:
            items = _block_list(block[1:], old, new, newline, render)
            return None if items is None else [block[0], *items]
        return None
    if isinstance(new, str) and isinstance(old, str) and len(block) == 1 and inline:
        token = _scalar(inline)
        if token is None:
            return None
        text = render(new, token.style, False)
        if text is None:
            return None
        return [head + spacing + text + token.tail + newline]
    return None


def _scalar(text: str) -> _Token | None:
    """The scalar at the start of ``text`` (a one-line value) and the rest of the line."""
    if text.startswith('"'):
        index = 1
        while index < len(text):
            if text[index] == "\\":
                index += 2
                continue
            if text[index] == '"':
                return _Token(text[: index + 1], '"', text[index + 1 :])
            index += 1
        return None
    if text.startswith("'"):
        index = 1
        while index < len(text):
            if text[index] == "'":
                if text[index + 1 : index + 2] == "'":
                    index += 2
                    continue
                return _Token(text[: index + 1], "'", text[index + 1 :])
            index += 1
        return None
    if text[:1] in ("|", ">", "[", "{", "&", "*", "!"):
        return None
    comment = re.search(r"[ \t]+#", text)
    end = comment.start() if comment is not None else len(text.rstrip(" \t"))
    return _Token(text[:end], "", text[end:])


def _flow_list(inline: str, old: list[Any], new: list[str], render: Render) -> str | None:
    """``[a, "b"]`` with ``new`` as items: kept items spelled as before, new ones alike."""
    tokens: list[_Token] = []
    rest = inline[1:]
    opening = rest[: len(rest) - len(rest.lstrip(" "))]
    rest = rest.lstrip(" ")
    separator = ", "
    while not rest.startswith("]"):
        token = _scalar(rest) if rest[:1] in "\"'" else _flow_plain(rest)
        if token is None:
            return None
        tokens.append(token)
        rest = token.tail.lstrip(" ")
        if rest.startswith(","):
            after = rest[1:]
            separator = "," + after[: len(after) - len(after.lstrip(" "))]
            rest = after.lstrip(" ")
        elif not rest.startswith("]"):
            return None
    closing = inline[: len(inline) - len(rest)]
    closing = closing[len(closing.rstrip(" ")) :]
    tail = rest[1:]
    if len(tokens) != len(old):
        return None
    style = _usual_style(tokens)
    spelled = _merge([t.text for t in tokens], old, new, lambda item: render(item, style, True))
    if spelled is None:
        return None
    inner = separator.join(spelled)
    return "[" + (opening + inner + closing if inner else "") + "]" + tail


def _flow_plain(text: str) -> _Token | None:
    match = re.match(r"[^,\[\]{}#\"']*", text)
    if match is None:
        return None
    item = match.group().rstrip(" ")
    if not item:
        return None
    return _Token(item, "", text[len(item) :])


def _block_list(
    lines: Sequence[str], old: list[Any], new: list[str], newline: str, render: Render
) -> list[str] | None:
    """``- a`` lines with ``new`` as items: kept lines (and comments before them) stay."""
    units: list[list[str]] = []
    pending: list[str] = []
    prefix = None
    tokens: list[_Token] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            pending.append(line)
            continue
        match = _ITEM.fullmatch(line)
        if match is None:
            return None  # a continuation line: an item that spans lines
        body = match["rest"].rstrip("\r\n")
        token = _scalar(body)
        if token is None or not token.text:
            return None
        prefix = prefix or match["prefix"]
        tokens.append(token)
        units.append([*pending, line])
        pending = []
    if prefix is None or len(units) != len(old) or pending:
        return None
    style = _usual_style(tokens)

    def fresh(item: str) -> str | None:
        text = render(item, style, False)
        return None if text is None else f"{prefix}{text}{newline}"

    merged = _merge(["".join(unit) for unit in units], old, new, fresh)
    return None if merged is None else [line for text in merged for line in _lines(text)]


def _merge(
    spelled: list[str], old: list[Any], new: list[str], fresh: Callable[[str], str | None]
) -> list[str] | None:
    """``new`` spelled with the old spellings where items are kept (a minimal edit)."""
    result: list[str] = []
    matcher = difflib.SequenceMatcher(a=[repr(item) for item in old], b=[repr(i) for i in new])
    for tag, a_start, a_end, b_start, b_end in matcher.get_opcodes():
        if tag == "equal":
            result.extend(spelled[a_start:a_end])
            continue
        for item in new[b_start:b_end]:
            text = fresh(item)
            if text is None:
                return None
            result.append(text)
    return result


def _usual_style(tokens: Sequence[_Token]) -> str:
    """The quoting most items use (ties and empty lists: plain, YAML's own default)."""
    counts = {style: sum(t.style == style for t in tokens) for style in ("", '"', "'")}
    return max(counts, key=lambda style: (counts[style], style == ""))


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)
