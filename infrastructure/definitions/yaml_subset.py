"""The YAML underneath agent front matter: Claude Code's reading of it, and how to write it.

Loading uses YAML 1.2 core-schema scalars and refuses a repeated key; ``parse_either`` also
tries Claude Code's repaired copy (``agentmend.infrastructure.definitions.claude_compat``). Writing
uses PyYAML with list items indented under their key, quoting any string that YAML 1.1 or 1.2 would
read as something else, and (for files that only load through the repair) a variant that
double-quotes every string holding a YAML indicator, the form the repair leaves as it is.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import yaml

from agentmend.infrastructure.definitions.claude_compat import (
    CoreSchemaResolver,
    construct_core_float,
    construct_core_int,
    extend_dumper_resolvers,
    lenient_text,
)
from agentmend.infrastructure.errors import AgentmendError

__all__ = [
    "FIRST_LINE",
    "FrontMatterError",
    "dump_lines",
    "parse_either",
    "parse_yaml",
    "parses_as_list",
    "rewritten_by_repair",
    "scalar_token",
]

FIRST_LINE = 2
"""The file line of the first front matter line (line 1 is the opening '---')."""


class FrontMatterError(AgentmendError):
    """Text that is not Markdown with a YAML mapping as front matter; ``key`` is the culprit."""

    def __init__(self, problem: str, key: str | None = None) -> None:
        self.problem = problem
        self.key = key
        super().__init__(problem)


class _Loader(yaml.SafeLoader):
    """Safe loading of YAML 1.2 scalars that refuses a repeated key (PyYAML keeps the last)."""

    yaml_implicit_resolvers = CoreSchemaResolver.yaml_implicit_resolvers


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, Hashable):
            if key in seen:
                line = key_node.start_mark.line + FIRST_LINE
                raise FrontMatterError(f"key {key!r} is given twice (line {line})", str(key))
            seen.add(key)
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)
_Loader.add_constructor("tag:yaml.org,2002:int", construct_core_int)
_Loader.add_constructor("tag:yaml.org,2002:float", construct_core_float)


class _Dumper(yaml.SafeDumper):
    """Indents list items under their key, as people write them by hand."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


extend_dumper_resolvers(_Dumper)


class _QuotingDumper(_Dumper):
    """Writes a string holding a YAML indicator double-quoted, on one line.

    That is the form Claude Code's repair leaves as it is, for files that need the repair.
    """


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if _NEEDS_QUOTES.search(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_NEEDS_QUOTES = re.compile(r"[{}\[\]*&#!|>%@`:\n\r]")
_QuotingDumper.add_representer(str, _represent_str)


def parse_yaml(text: str) -> Any:
    """``text`` as strict YAML, typed as Claude Code types it (raises ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass


def parses_as_list(value: str) -> bool:
    """Whether ``value`` alone is a YAML sequence (the repair leaves such a value alone)."""
    try:
        return isinstance(parse_yaml(value), list)
    except (yaml.YAMLError, FrontMatterError):
        return False


def rewritten_by_repair(line: str) -> bool:
    """Whether Claude Code's repair would change what this one line means."""
    if line[:1] in " \t-#":
        return False
    text = line.rstrip("\r\n")
    repaired = lenient_text(text, parses_as_list)
    if repaired == text:
        return False
    try:
        return bool(parse_yaml(text) != parse_yaml(repaired))
    except (yaml.YAMLError, FrontMatterError):
        return True


def parse_either(text: str) -> Any:
    """``text`` parsed strictly, else as Claude Code's repair reads it (tab indentation)."""
    try:
        return parse_yaml(text)
    except (yaml.YAMLError, FrontMatterError):
        try:
            return parse_yaml(lenient_text(text, parses_as_list))
        except (yaml.YAMLError, FrontMatterError):
            return None


def scalar_token(value: Any, style: str, flow: bool) -> str | None:
    """One scalar written in ``style`` on one line (inside a flow list when ``flow``)."""
    text = yaml.dump(
        [value],
        Dumper=_Dumper,
        default_flow_style=flow,
        default_style=style or None,
        allow_unicode=True,
        width=1 << 30,
    )
    text = text.rstrip("\n")
    token = text[1:-1] if flow else text.removeprefix("- ")
    if "\n" in token or not token:
        return None
    try:
        back = parse_yaml(f"[{token}]" if flow else f"- {token}")
    except (yaml.YAMLError, FrontMatterError):
        return None
    return token if back == [value] else None


def dump_lines(
    mapping: dict[str, Any], indent: int, newline: str, *, quote_indicators: bool = False
) -> list[str]:
    """``mapping`` as front matter lines, indented by ``indent`` spaces.

    With ``quote_indicators``, every string holding a YAML indicator is double-quoted on one
    line, so that Claude Code's repair leaves the lines as they are.
    """
    text = _dump_text(mapping, allow_unicode=True, quote_all=quote_indicators)
    if parse_yaml(text) != mapping:
        # PyYAML mangles a raw NEL (and kin) it writes itself; escaped, it survives
        text = _dump_text(mapping, allow_unicode=False, quote_all=quote_indicators)
    pad = " " * indent
    # blank lines can be part of a multi-line scalar: keep them, and keep them empty
    return [(pad + line if line else line) + newline for line in text.split("\n")[:-1]]


def _dump_text(mapping: dict[str, Any], *, allow_unicode: bool, quote_all: bool = False) -> str:
    return yaml.dump(
        mapping,
        Dumper=_QuotingDumper if quote_all else _Dumper,
        default_flow_style=False,
        allow_unicode=allow_unicode,
        sort_keys=False,
        width=1 << 30,
    )
