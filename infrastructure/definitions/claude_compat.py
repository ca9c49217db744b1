"""Front matter as Claude Code reads it, where that differs from strict YAML.

Claude Code parses an agent file's front matter as YAML 1.2 (core schema) and, when that
fails, retries exactly once on a repaired copy: every one-line ``key: value`` at the left margin
whose value holds a YAML indicator (``: ``, ``#``, ``[``, ``{``, ``*``, ``&``, ``!``, ``|``,
``>``, ``%``, ``@`` or a backtick) and is not already quoted (or a flow list) is wrapped in
double quotes, and every leading tab becomes two spaces. Many public agent files rely on this
(``description: Use this agent when: ...``). ``lenient_text`` is that repair, ported rule for
rule from the bundled CLI (2.1.x, ``claude_agent_sdk/_bundled/claude``), so agentmend accepts
and refuses the same files. Two consequences of the rule are kept on purpose because Claude
Code has them too: a CRLF line is never repaired (its value cannot match up to the ``\\r``), and
in a repaired file a ``# comment`` after such a value becomes part of the value.

The resolvers here give YAML 1.2's core-schema scalars (``yes``, ``on``, ``1_000`` and
``2024-01-01`` are strings; ``0o17``, ``0x1F`` and ``1e3`` are numbers; ``True`` is a boolean),
which is what Claude Code's parser gives (checked through ``claude plugin validate``, which names
the type of a ``name`` that is not a string); PyYAML's default is YAML 1.1.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml

__all__ = [
    "CoreSchemaResolver",
    "construct_core_float",
    "construct_core_int",
    "extend_dumper_resolvers",
    "lenient_text",
]

# JavaScript's \s and its '.', which the CLI's regular expressions use
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_JS_DOT = "[^\n\r\u2028\u2029]"
# /^([a-zA-Z_-]+):\s+(\S.*)$/ on one line (no 'm' flag: '$' is the end of the line)
_REPAIRABLE = re.compile(rf"([a-zA-Z_-]+):[{_JS_SPACE}]+([^{_JS_SPACE}]{_JS_DOT}*)")
# /[{}[\]*&#!|>%@`]|: /
_INDICATOR = re.compile(r"[{}\[\]*&#!|>%@`]|: ")
# /^\t+/gm: in JavaScript '^' with the 'm' flag also matches after \r, U+2028 and U+2029
_LEADING_TABS = re.compile("(?:\\A|(?<=[\n\r\u2028\u2029]))\t+")


def lenient_text(text: str, parses_as_list: Callable[[str], bool]) -> str:
    """Claude Code's repaired copy of front matter ``text`` (the input to its one retry).

    Args:
        text: the front matter, without its ``---`` fences.
        parses_as_list: whether a ``[...]`` value parses as a YAML sequence on its own (such a
            value is left as it is).
    """
    lines = []
    for line in text.split("\n"):
        match = _REPAIRABLE.fullmatch(line)
        if match is not None:
            key, value = match.groups()
            quoted = (value.startswith('"') and value.endswith('"')) or (
                value.startswith("'") and value.endswith("'")
            )
            flow_list = value.startswith("[") and value.endswith("]") and parses_as_list(value)
            if not quoted and not flow_list and _INDICATOR.search(value):
                escaped = value.replace("\\", "\\\\").replace('"', '\\"')
                line = f'{key}: "{escaped}"'
        lines.append(line)
    return _LEADING_TABS.sub(lambda tabs: "  " * len(tabs.group()), "\n".join(lines))


class CoreSchemaResolver(yaml.resolver.Resolver):
    """Plain scalars typed as YAML 1.2's core schema, as Claude Code's parser types them."""

    # PyYAML keeps resolvers in a class attribute; this class's own dict, not the base's
    yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012


_CORE_RESOLVERS: list[tuple[str, str, str]] = [
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    (
        "tag:yaml.org,2002:int",
        r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$",
        "-+0123456789",
    ),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+.0123456789",
    ),
]

for _tag, _pattern, _first in _CORE_RESOLVERS:
    CoreSchemaResolver.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))
CoreSchemaResolver.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)


def construct_core_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    """A YAML 1.2 integer: decimal (a leading 0 is not octal), ``0o`` octal, ``0x`` hex."""
    value = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    if value.startswith("0o"):
        return int(value[2:], 8)
    if value.startswith("0x"):
        return int(value[2:], 16)
    return int(value, 10)


def construct_core_float(loader: yaml.SafeLoader, node: yaml.Node) -> float:
    """A YAML 1.2 float (``1e3`` included, which YAML 1.1 leaves a string)."""
    value = str(loader.construct_scalar(node)).lower()  # type: ignore[arg-type]
    if value.endswith(".inf"):
        return float("-inf") if value.startswith("-") else float("inf")
    if value == ".nan":
        return float("nan")
    return float(value)


def extend_dumper_resolvers(dumper: type[yaml.SafeDumper]) -> None:
    """Make ``dumper`` quote a string that *either* YAML 1.1 or 1.2 would read as non-string.

    PyYAML decides to quote by asking its resolver; with both rule sets, what it writes reads
    back as the same string in PyYAML and in Claude Code.
    """
    for tag, pattern, first in _CORE_RESOLVERS:
        dumper.add_implicit_resolver(tag, re.compile(pattern), list(first))
