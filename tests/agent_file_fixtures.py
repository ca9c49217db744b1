"""The project's own agent files in each form Claude Code reads, and what each must read as.

Every file in ``tests/fixtures/agent_files/`` is listed here with what Claude Code makes of it,
written out by hand from the file (not from agentmend's reading): the fields a valid file gives,
or the field agentmend names when Claude Code refuses the file. ``test_agent_file_forms.py``
holds agentmend to this table; ``test_claude_code_agreement.py`` holds the table to the bundled
Claude Code CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "agent_files"


@dataclass(frozen=True)
class Reads:
    """A file Claude Code loads, and its fields."""

    name: str
    description: str
    tools: tuple[str, ...] | None
    model: str | None
    prompt: str


@dataclass(frozen=True)
class Refused:
    """A file Claude Code does not load; ``field`` is the key agentmend names."""

    field: str


EXPECTED: dict[str, Reads | Refused] = {
    "colon-description.md": Reads(
        "colon-description",
        "Use this agent when: the user asks for a review. Examples: a pull request, a patch.",
        ("Read", "Grep"),
        "sonnet",
        "You review changes and say what is wrong, line by line.",
    ),
    "examples-description.md": Reads(
        "examples-description",
        'Use this agent to cut a release. Examples: <example>Context: a tag is due. user: "Cut'
        ' 1.2" assistant: "I will use the release agent"</example>',
        ("Read", "Bash"),
        "opus",
        "You cut releases: bump the version, write the changelog, tag.",
    ),
    "tab-indented.md": Reads(
        "tab-indented",
        "Lists its tools with tab indentation.",
        ("Read", "Grep"),
        "haiku",
        "You search the code base.",
    ),
    "crlf.md": Reads(
        "crlf-agent",
        "Written on Windows, with CRLF line breaks.",
        ("Read", "Write"),
        "sonnet",
        "You edit files.\nKeep CRLF.",
    ),
    "flow-double-quoted.md": Reads(
        "flow-double-quoted",
        "Declares its tools as a JSON-style list.",
        ("Read", "Grep", "Glob"),
        "sonnet",
        "You read and search.",
    ),
    "flow-single-quoted.md": Reads(
        "flow-single-quoted",
        "Declares its tools as a single-quoted flow list.",
        ("Read", "Grep"),
        "haiku",
        "You summarise.",
    ),
    "flow-empty.md": Reads("flow-empty", "Has no tools at all.", (), "haiku", "You only think."),
    "comma-quoted.md": Reads(
        "comma-quoted",
        "Tools as one quoted comma string without spaces.",
        ("Read", "Grep", "Glob"),
        "sonnet",
        "You look things up.",
    ),
    "block-mixed.md": Reads(
        "block-mixed",
        "A block list with quoted and unquoted items and a comment.",
        ("Read", "Bash(git log:*)", "Grep"),
        "claude-sonnet-4-6",
        "You read history.",
    ),
    "comments.md": Reads(
        "comments",
        "Reviews documentation for accuracy.",
        ("Read", "Grep"),
        "haiku",
        "You review docs.",
    ),
    "dotted-name.md": Reads(
        "shell-5.1-expert",
        "Use when scripting Windows PowerShell 5.1.",
        ("Read", "Bash"),
        "sonnet",
        "You write PowerShell 5.1 scripts.",
    ),
    "non-latin-name.md": Reads(
        "重构助手",
        "代码重构专家。擅长改善代码结构，并在不改变功能的情况下增强可维护性。",
        ("Read", "Edit"),
        "sonnet",
        "你是一名代码重构专家。",
    ),
    "no-final-newline.md": Reads(
        "no-final-newline",
        "The file ends without a line break.",
        ("Read",),
        "haiku",
        "You answer in one line.",
    ),
    "yaml12-scalars.md": Reads(
        "yaml12-scalars",
        "Yes",
        ("Read",),
        "2025-01-01",
        "Claude Code reads YAML 1.2: the description is the string Yes, the model a string.",
    ),
    # a CRLF line is never repaired by Claude Code: the unquoted ': ' stays an error
    "crlf-colon.md": Refused("description"),
    # an unindented continuation holding ': ' is not YAML, repaired or not
    "unindented-continuation.md": Refused("description"),
    "name-with-colon.md": Refused("name"),
    "name-with-leading-dash.md": Refused("name"),
    "description-list.md": Refused("description"),
}

VALID = sorted(name for name, expected in EXPECTED.items() if isinstance(expected, Reads))
INVALID = sorted(name for name, expected in EXPECTED.items() if isinstance(expected, Refused))


def fixture_text(file_name: str) -> str:
    """The fixture's exact text (line breaks as written)."""
    return (FIXTURES / file_name).read_bytes().decode("utf-8")
