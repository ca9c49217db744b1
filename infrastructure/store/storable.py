"""Text either backend takes, whatever a caller or a span sent.

PostgreSQL refuses text holding a NUL character, and no driver can encode a lone surrogate
(``"\\ud800"``, which Python strings may hold) as UTF-8; one such value fails its whole batch,
and a writer that retries the batch stops for good. A huge value (a two-million-character agent
name) is stored whole and then repeated in every page and report that shows it. So text bound
for the store passes through :func:`storable_text` first: NUL and every surrogate code point
become visible escapes (``\\x00``, ``\\ud800``), and text over its bound is cut, keeping a
digest of the whole so two long values that differ only past the cut stay distinct.

The check is cheap for the common case (short ASCII without NUL), so it can run on every row.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from typing import Any, Final

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_EXTRA_CHARS",
    "MAX_NAME_CHARS",
    "MAX_NUMBER",
    "MAX_VALUE_CHARS",
    "json_document",
    "json_storable_as_is",
    "storable_count",
    "storable_json",
    "storable_number",
    "storable_text",
]

MAX_NAME_CHARS: Final = 256
"""An agent name, a source: longer than any real name, short enough for one table cell."""
MAX_ERROR_CHARS: Final = 4_000
"""An error text: the message and the start of a traceback."""
MAX_VALUE_CHARS: Final = 4_000
"""One string inside a run's extra fields."""
MAX_EXTRA_CHARS: Final = 64_000
"""A run's extra fields, as JSON text."""
MAX_NUMBER: Final = 1e12
"""The largest count or measure stored for one run (tokens, milliseconds, dollars): far above
any real run, far below what a total of millions of runs may reach in a 64-bit column."""

_TRUNCATED_KEY = "agentmend.truncated_keys"


def storable_text(text: str, limit: int | None) -> str:
    """``text`` with NUL and surrogates escaped, cut to at most ``limit`` characters (None:
    never cut).

    A cut keeps the start and ends with ``...[N chars, sha256 <12 hex>]`` naming the length and
    a digest of the whole (escaped) text.
    """
    if limit is None:
        limit = sys.maxsize
    if len(text) <= limit and text.isascii() and "\x00" not in text:
        return text  # the common case, in constant time for ASCII
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # surrogates: shown as \udxxx, as Python's repr shows them
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    tail = f"...[{len(text):,} chars, sha256 {digest}]"
    return text[: max(limit - len(tail), 0)] + tail


def storable_count(value: float) -> int:
    """A whole count in ``[0, MAX_NUMBER]`` (``10**30`` or ``1.5`` tokens fit no column)."""
    if type(value) is int and 0 <= value <= MAX_NUMBER:
        return value
    return int(min(max(value, 0), MAX_NUMBER))


def storable_number(value: float) -> float:
    """A finite measure in ``[0, MAX_NUMBER]``: infinity fits no histogram bin."""
    if 0.0 <= value <= MAX_NUMBER:
        return value
    return 0.0 if math.isnan(value) else min(max(value, 0.0), MAX_NUMBER)


def storable_json(text: str) -> str:
    """JSON text of an object, made storable: no ``\\u0000`` escape (PostgreSQL's ``jsonb``
    refuses it, so every query reading the field would fail), no ``NaN`` or ``Infinity`` (not
    JSON, which ``jsonb`` refuses as well: such a number is stored as null), each string at most
    ``MAX_VALUE_CHARS``, the whole at most ``MAX_EXTRA_CHARS`` (the keys that did not fit are
    dropped, and counted under ``agentmend.truncated_keys``).

    ``text`` is what the monitor's JSON encoder wrote: JSON escapes a raw NUL and a lone
    surrogate is only ever written escaped, so neither can be in it raw, but their escapes can
    (a lone ``\\ud800`` is refused by ``jsonb`` too).
    """
    if json_storable_as_is(text):
        return text
    try:
        document = json.loads(text)
    except ValueError:  # not JSON after all: keep it as (storable) text
        return json.dumps({"text": storable_text(text, MAX_VALUE_CHARS)})
    cleaned = _clean(document)
    out = json.dumps(cleaned, sort_keys=True)
    if len(out) <= MAX_EXTRA_CHARS:
        return out
    if not isinstance(cleaned, dict):
        return json.dumps({"text": storable_text(out, MAX_VALUE_CHARS)})
    kept: dict[str, Any] = {}
    size = 2
    for key in sorted(cleaned):
        item = len(json.dumps({key: cleaned[key]})) - 1
        if size + item > MAX_EXTRA_CHARS - 64:
            continue
        kept[key] = cleaned[key]
        size += item
    kept[_TRUNCATED_KEY] = len(cleaned) - len(kept)
    return json.dumps(kept, sort_keys=True)


def json_document(value: Any) -> str:
    """``value`` as JSON text that every query reading it as JSON can take, nothing cut: a NaN
    or infinite number as null, NUL and lone surrogates in text escaped as ``storable_text``
    shows them; an object of no JSON type as its ``str()``.

    For a document the store keeps whole and reads with its JSON functions (a decision's or a
    plan's payload), where one such value in one row would fail every query over the table.

    Raises:
        ValueError: no JSON can hold ``value`` (a cycle, nesting past the recursion limit).
    """
    try:
        try:
            text = json.dumps(value, default=str, allow_nan=False)
        except ValueError:  # NaN or infinity somewhere (written as null below), or a cycle
            text = None
        if text is not None and "\\u0000" not in text and "\\ud" not in text:
            return text
        return json.dumps(_clean(value, None, None), default=str)
    except RecursionError:  # a cycle, as _clean meets it, or nesting no JSON writer follows
        raise ValueError("no JSON can hold it: it holds a cycle or is nested too deeply") from None


def json_storable_as_is(text: str) -> bool:
    """Whether :func:`storable_json` keeps ``text`` as it is, told without parsing it."""
    return (
        len(text) <= MAX_EXTRA_CHARS
        and "\\u0000" not in text
        and "\\ud" not in text  # (a surrogate escape, \\udxxx, may be a lone one jsonb refuses)
        and "NaN" not in text
        and "Infinity" not in text  # (either may be inside a string: then checked, and kept)
    )


def _clean(
    value: Any, text_chars: int | None = MAX_VALUE_CHARS, key_chars: int | None = MAX_NAME_CHARS
) -> Any:
    """``value`` with every text storable (cut to ``text_chars``, a key to ``key_chars``; None:
    never cut) and every NaN or infinite number as None."""
    if isinstance(value, str):
        return storable_text(value, text_chars)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        cleaned = {}
        for key, item in value.items():
            name = storable_text(key, key_chars) if isinstance(key, str) else key
            cleaned[name] = _clean(item, text_chars, key_chars)
        return cleaned
    if isinstance(value, list | tuple):
        return [_clean(v, text_chars, key_chars) for v in value]
    return value
