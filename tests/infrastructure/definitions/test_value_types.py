"""A changed number keeps the YAML type its author wrote: ``timeout_s: 24`` raised to 56.0 is
written ``timeout_s: 56``, a float stays a float, and a value that is not whole stays as it is,
whether the key's line is edited in place or the mapping is written again."""

from __future__ import annotations

import pytest

from agentmend.infrastructure.definitions.frontmatter import (
    Edit,
    apply_edits,
    apply_edits_to_mapping,
    as_old_type,
)

FRONT = ["name: writer\n", "agentmend:\n", "  timeout_s: 24\n", "  temperature: 0.5\n"]


@pytest.mark.parametrize(
    ("key", "value", "line"),
    [
        ("timeout_s", 56.0, "  timeout_s: 56\n"),
        ("timeout_s", 56.5, "  timeout_s: 56.5\n"),
        ("temperature", 1.0, "  temperature: 1.0\n"),
        ("temperature", 0.25, "  temperature: 0.25\n"),
    ],
)
def test_an_edited_line_keeps_the_authors_number_type(key: str, value: float, line: str) -> None:
    edited = apply_edits(FRONT, [Edit(("agentmend", key), value)], "\n")
    assert edited is not None
    assert line in edited


def test_a_mapping_written_again_keeps_it_too() -> None:
    mapping = {"name": "w", "max_tokens": 2048, "agentmend": {"timeout_s": 24}}
    edits = [Edit(("max_tokens",), 4608.0), Edit(("agentmend", "timeout_s"), 56.0)]
    updated = apply_edits_to_mapping(mapping, edits)
    assert updated["max_tokens"] == 4608
    assert isinstance(updated["max_tokens"], int)
    assert isinstance(updated["agentmend"]["timeout_s"], int)


def test_only_whole_numbers_over_whole_numbers_change_type() -> None:
    assert as_old_type(True, 1.0) == 1.0  # a bool is not a number written by hand
    assert isinstance(as_old_type(True, 1.0), float)
    assert as_old_type(None, 3.0) == 3.0
    assert isinstance(as_old_type(None, 3.0), float)  # a new key: as the change says
    assert as_old_type(3, "three") == "three"
