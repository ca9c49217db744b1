"""YAML front matter that can be edited one key at a time.

Agent definitions are files people read, diff and review, so changing one setting must show up
as a change to that setting's lines, with every comment, blank line, key order and quoting
choice elsewhere left as the author wrote it; re-dumping the mapping with a YAML library would
throw all of that away. Edits here are therefore line-oriented: find the lines of one key's
block and replace or delete just those. The editor understands only the plain block-mapping
layout people write by hand; on anything else it returns ``None`` so the caller can fall back to
re-dumping the front matter. The caller re-parses every result either way, so a wrong edit is
caught, never written.

Parsing follows Claude Code (see ``agentmend.infrastructure.definitions.claude_compat``): YAML 1.2
scalars, and one retry on Claude Code's repaired copy when the front matter is not strict YAML. A
changed value is written in its author's style
(``agentmend.infrastructure.definitions.value_style``) and, in a file that only loads through the
repair, in a form that the repair leaves as it is.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from agentmend.infrastructure.definitions.claude_compat import lenient_text
from agentmend.infrastructure.definitions.value_style import restyled
from agentmend.infrastructure.definitions.yaml_subset import (
    FIRST_LINE,
    FrontMatterError,
    dump_lines,
    parse_either,
    parse_yaml,
    parses_as_list,
    rewritten_by_repair,
    scalar_token,
)

__all__ = [
    "Document",
    "Edit",
    "FrontMatterError",
    "ParsedFront",
    "apply_edits",
    "apply_edits_to_mapping",
    "dump_mapping",
    "load_mapping",
    "parse_front",
    "render_document",
    "replace_body",
    "split_document",
    "split_lines",
]


_KEY_LINE = re.compile(
    r"""(?P<indent>[ \t]*)(?P<key>[A-Za-z0-9_][\w.-]*|"[^"\\\n]*"|'[^'\n]*')[ \t]*:(?=\s|$)"""
)
_SEQUENCE_ITEM = re.compile(r"-(?:\s|$)")


def split_lines(text: str) -> list[str]:
    """Split after each ``\\n`` only, keeping it, so ``\\r\\n`` and YAML's rarer breaks stay put."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


@dataclass(frozen=True, slots=True)
class Document:
    """A Markdown file cut into its fences, front matter lines (line breaks kept) and body."""

    opening: str
    front: tuple[str, ...]
    closing: str
    body: str

    @property
    def newline(self) -> str:
        """The file's line break, for the lines an edit adds."""
        return "\r\n" if self.opening.endswith("\r\n") else "\n"


def split_document(text: str) -> Document:
    """Cut ``text`` at its ``---`` fences; raises ``FrontMatterError`` if there are none."""
    lines = split_lines(text)
    if not lines or lines[0].lstrip("\ufeff").rstrip() != "---":
        raise FrontMatterError("no YAML front matter: the file must start with a '---' line")
    for index in range(1, len(lines)):
        if "---" in lines[index] and lines[index].rstrip() != "---":
            # Claude Code ends the front matter at the first '---' anywhere, even mid-line
            key = _key_at(lines[1 : index + 1], index - 1)
            raise FrontMatterError(
                f"'---' inside the front matter (line {index + 1}): Claude Code would end "
                "the front matter there",
                key,
            )
        if lines[index].rstrip() == "---":
            body = "".join(lines[index + 1 :])
            return Document(lines[0], tuple(lines[1:index]), lines[index], body)
    raise FrontMatterError("the front matter has no closing '---' line")


def replace_body(doc: Document, text: str) -> str:
    """The body with its text replaced, the whitespace around it kept, in the file's line breaks."""
    body = doc.body
    text = text.replace("\n", doc.newline)
    if not body.strip():
        return (body or doc.newline) + text + doc.newline if text else body
    lead = body[: len(body) - len(body.lstrip())]
    trail = body[len(body.rstrip()) :]
    return lead + text + trail


def render_document(mapping: dict[str, Any], body: str) -> str:
    """A new Markdown file: the mapping as front matter, then a blank line and the body."""
    front = "".join(dump_mapping(mapping, "\n"))
    return f"---\n{front}---\n" + (f"\n{body}\n" if body else "")


@dataclass(frozen=True, slots=True)
class ParsedFront:
    """Front matter as Claude Code reads it; ``lenient`` when only its repaired copy parses."""

    mapping: dict[str, Any]
    lenient: bool


def load_mapping(front: Sequence[str]) -> dict[str, Any]:
    """Parse front matter lines into a mapping with string keys, as Claude Code does."""
    return parse_front(front).mapping


def parse_front(front: Sequence[str]) -> ParsedFront:
    """Parse front matter lines as Claude Code does: strict YAML, else its repaired copy.

    Raises:
        FrontMatterError: neither parses (the error is the repaired copy's, as Claude Code
            reports it, naming the key at its line), or the result is not a string-keyed mapping.
    """
    text = "".join(front)
    lenient = False
    try:
        data = parse_yaml(text)
    except yaml.YAMLError:
        lenient = True
        data = _load_lenient(front, lenient_text(text, parses_as_list))
    if data is None:
        return ParsedFront({}, lenient)
    if not isinstance(data, dict):
        raise FrontMatterError("the front matter must be a mapping of keys to values")
    for key in data:
        if not isinstance(key, str):
            raise FrontMatterError(f"key {key!r} is not a string", str(key))
    return ParsedFront(data, lenient)


def _load_lenient(front: Sequence[str], text: str) -> Any:
    """The repaired copy parsed; the repair keeps line numbers, so errors point at the file."""
    try:
        return parse_yaml(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line if mark is not None else None
        where = f" at line {line + FIRST_LINE}" if line is not None else ""
        problem = exc.problem or str(exc)
        raise FrontMatterError(f"invalid YAML{where}: {problem}", _key_at(front, line)) from None
    except yaml.YAMLError as exc:
        raise FrontMatterError(f"invalid YAML: {exc}") from None


def dump_mapping(mapping: dict[str, Any], newline: str) -> list[str]:
    """Render a whole mapping as front matter lines (the fallback when no surgical edit works)."""
    return dump_lines(mapping, 0, newline)


@dataclass(frozen=True, slots=True)
class Edit:
    """Set ``path`` to ``value``, or remove it with ``delete``.

    ``path`` is one top-level key, or a top-level key and one key of the mapping under it
    (``("agentmend", "max_tokens")``): the only depths agent definitions need.
    """

    path: tuple[str, ...]
    value: Any = None
    delete: bool = False


def apply_edits_to_mapping(mapping: dict[str, Any], edits: Sequence[Edit]) -> dict[str, Any]:
    """The mapping the edits describe; keeps key order, new keys go last, empty parents go."""
    result = copy.deepcopy(mapping)
    for edit in edits:
        head, *rest = edit.path
        if not rest:
            if edit.delete:
                result.pop(head, None)
            else:
                result[head] = as_old_type(result.get(head), edit.value)
            continue
        parent = result.get(head)
        if not isinstance(parent, dict):
            if edit.delete:
                continue
            parent = result[head] = {}
        if edit.delete:
            parent.pop(rest[0], None)
            if not parent:
                del result[head]
        else:
            parent[rest[0]] = as_old_type(parent.get(rest[0]), edit.value)
    return result


def as_old_type(old: Any, new: Any) -> Any:
    """``new`` as a whole number where the author wrote one and the new value is whole
    (``timeout_s: 24`` raised to 56.0 stays ``56``): a value's YAML type is the author's."""
    whole_before = isinstance(old, int) and not isinstance(old, bool)
    if whole_before and isinstance(new, float) and new.is_integer():
        return int(new)
    return new


def apply_edits(
    front: Sequence[str], edits: Sequence[Edit], newline: str, *, lenient: bool = False
) -> list[str] | None:
    """Front matter lines with ``edits`` applied to only their keys' lines.

    Args:
        front: the front matter lines as read.
        edits: what to change.
        newline: the file's line break, for added lines.
        lenient: the front matter loads only through Claude Code's repair (``ParsedFront``);
            changed lines are then written so that the repair leaves them as they are.

    Returns ``None`` when the layout is one this editor does not understand (flow mappings,
    keys it cannot find reliably); the caller then re-dumps the mapping instead.
    """
    lines = list(front)
    for edit in edits:
        if not _apply(lines, edit, _Writer(newline, lenient)):
            return None
    return lines


@dataclass(frozen=True, slots=True)
class _Writer:
    """How new lines are written in this file: its line break, and whether it is lenient."""

    newline: str
    lenient: bool

    def dump(self, mapping: dict[str, Any], indent: int) -> list[str]:
        lines = dump_lines(mapping, indent, self.newline)
        if self.lenient and any(rewritten_by_repair(line) for line in lines):
            lines = dump_lines(mapping, indent, self.newline, quote_indicators=True)
        return lines

    def fits(self, lines: Sequence[str]) -> bool:
        """Whether ``lines`` read the same strictly and through the repair (if it applies)."""
        return not self.lenient or not any(rewritten_by_repair(line) for line in lines)


def _apply(lines: list[str], edit: Edit, writer: _Writer) -> bool:
    top = _blocks(lines, 0, len(lines), 0)
    if top is None:
        return False
    head, *rest = edit.path
    if not rest:
        _replace(lines, top.get(head), len(lines), head, edit, 0, writer)
        return True
    key = rest[0]
    span = top.get(head)
    if span is None:
        if not edit.delete:
            lines.extend(writer.dump({head: {key: edit.value}}, 0))
        return True
    first, last = span
    parsed = _key_of(lines[first])
    inline = parsed[2].strip() if parsed is not None else "?"
    if inline and not inline.startswith("#"):
        # `head: {a: 1}` cannot be edited line by line: rewrite that key's lines only
        try:
            current = load_mapping(lines[first:last]).get(head)
        except FrontMatterError:
            return False
        if current is not None and not isinstance(current, dict):
            return False
        updated = apply_edits_to_mapping({head: current or {}}, [edit])
        lines[first:last] = writer.dump(updated, 0) if updated.get(head) else []
        return True
    children = [index for index in range(first + 1, last) if not _is_filler(lines[index])]
    indent = _indent_of(lines[children[0]]) if children else 2
    if indent == 0:
        return False
    kids = _blocks(lines, first + 1, last, indent)
    if kids is None:
        return False
    if edit.delete and set(kids) == {key}:
        del lines[first:last]  # the mapping would be left empty: drop it whole
        return True
    _replace(lines, kids.get(key), last, key, edit, indent, writer)
    return True


def _replace(
    lines: list[str],
    span: tuple[int, int] | None,
    insert_at: int,
    key: str,
    edit: Edit,
    indent: int,
    writer: _Writer,
) -> None:
    if edit.delete:
        if span is not None:
            del lines[span[0] : span[1]]
        return
    if span is None:
        lines[insert_at:insert_at] = writer.dump({key: edit.value}, indent)
        return
    first, last = span
    old = parse_either("".join(lines[first:last]))
    value = as_old_type(old.get(key) if isinstance(old, dict) else None, edit.value)
    kept = _in_authors_style(lines[first:last], key, value, writer)
    if kept is not None:
        lines[first:last] = kept
        return
    new = writer.dump({key: value}, indent)
    if last - first == 1 and len(new) == 1:
        comment = _trailing_comment(lines[first], indent)
        with_comment = [new[0][: -len(writer.newline)] + comment + writer.newline]
        if comment and writer.fits(with_comment):
            new = with_comment
    lines[first:last] = new


def _in_authors_style(block: list[str], key: str, value: Any, writer: _Writer) -> list[str] | None:
    """The key's lines with ``value`` in the style of the old value, if that works out."""
    match = _KEY_LINE.match(block[0])
    if match is None or (writer.lenient and rewritten_by_repair(block[0])):
        return None  # a line only the repair reads right: written afresh, in a form both read
    old = parse_either("".join(block))
    if not isinstance(old, dict) or key not in old:
        return None
    if isinstance(old[key], dict) and isinstance(value, dict):
        new = _mapping_in_authors_style(block, old[key], value, writer)
    else:
        new = restyled(
            block, block[0][: match.end()], old[key], value, writer.newline, scalar_token
        )
    if new is None or not writer.fits(new):
        return None
    parsed = parse_either("".join(new))
    return new if isinstance(parsed, dict) and _same_value(parsed.get(key), value) else None


def _mapping_in_authors_style(
    block: list[str], old: dict[str, Any], value: dict[str, Any], writer: _Writer
) -> list[str] | None:
    """A block mapping (``permission_profile:`` with ``allow``/``deny``) changed key by key."""
    parsed = _key_of(block[0])
    inline = parsed[2].strip() if parsed is not None else "?"
    if set(old) != set(value) or (inline and not inline.startswith("#")):
        return None
    lines = list(block)
    children = [index for index in range(1, len(lines)) if not _is_filler(lines[index])]
    if not children:
        return None
    spans = _blocks(lines, 1, len(lines), _indent_of(lines[children[0]]))
    if spans is None or set(spans) != set(old):
        return None
    # bottom-up, so the spans above an edited child stay where they are
    for child, (first, last) in sorted(spans.items(), key=lambda item: -item[1][0]):
        if _same_value(old[child], value[child]):
            continue
        changed = _in_authors_style(lines[first:last], child, value[child], writer)
        if changed is None:
            return None
        lines[first:last] = changed
    return lines


def _same_value(a: Any, b: Any) -> bool:
    return type(a) is type(b) and bool(a == b)


def _key_of(line: str) -> tuple[int, str, str] | None:
    """``(indent, key, rest of the line)`` for a ``key:`` line, else ``None``."""
    match = _KEY_LINE.match(line)
    if match is None:
        return None
    key = match["key"]
    if key[0] in "\"'":
        key = key[1:-1]
    return len(match["indent"]), key, line[match.end() :]


def _key_at(front: Sequence[str], line: int | None) -> str | None:
    """The top-level key whose block holds ``line``, to name the field of a YAML error."""
    if line is None:
        return None
    for index in range(min(line, len(front) - 1), -1, -1):
        parsed = _key_of(front[index])
        if parsed is not None and parsed[0] == 0:
            return parsed[1]
    return None


def _is_filler(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def _indent_of(line: str) -> int:
    """The indentation as Claude Code sees it: its repair turns each leading tab into 2 spaces."""
    spaces = len(line) - len(line.lstrip(" "))
    tabs = len(line) - len(line.lstrip("\t"))
    return spaces or 2 * tabs


def _blocks(
    lines: list[str], start: int, end: int, indent: int
) -> dict[str, tuple[int, int]] | None:
    """Map each key at ``indent`` in ``lines[start:end]`` to its line span, or ``None``.

    A block is the key line and its continuation lines (deeper indentation, or ``- `` items at
    the same indentation); blank and comment lines at its end are left out, so they stay with
    whatever follows them.
    """
    starts: list[tuple[str, int]] = []
    for index in range(start, end):
        line = lines[index]
        if _is_filler(line):
            continue
        column = _indent_of(line)
        if column > indent or (column == indent and _SEQUENCE_ITEM.match(line.lstrip(" \t"))):
            if not starts:
                return None
            continue
        parsed = _key_of(line)
        if column < indent or parsed is None or any(key == parsed[1] for key, _ in starts):
            return None
        starts.append((parsed[1], index))
    blocks: dict[str, tuple[int, int]] = {}
    for position, (key, first) in enumerate(starts):
        last = starts[position + 1][1] if position + 1 < len(starts) else end
        parsed = _key_of(lines[first])
        # in a block scalar, '#' lines are text, not comments
        block_scalar = parsed is not None and parsed[2].lstrip().startswith(("|", ">"))
        while last - 1 > first and (
            not lines[last - 1].strip()
            or (not block_scalar and lines[last - 1].lstrip().startswith("#"))
        ):
            last -= 1
        blocks[key] = (first, last)
    return blocks


def _trailing_comment(line: str, indent: int) -> str:
    """The ``  # ...`` comment ending a one-line ``key: value``, so an edit can keep it."""
    content = line.rstrip("\r\n")
    try:
        whole = parse_yaml(content[indent:])
    except (yaml.YAMLError, FrontMatterError):
        return ""
    for match in re.finditer(r"[ \t]+#", content):
        try:
            head = parse_yaml(content[indent : match.start()])
        except (yaml.YAMLError, FrontMatterError):
            continue
        if head == whole:
            return content[match.start() :]
    return ""
