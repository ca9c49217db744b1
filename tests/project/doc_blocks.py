"""Every fenced code block of the README and of ``docs/``, with the kind its marker names.

A block is marked by an HTML comment on the line just before its fence, invisible on GitHub and
in the built site: ``<!-- example: KIND -->``. ``KINDS`` says how a test runs each kind; a block
without a marker, or with a kind not listed, fails ``test_docs_examples.py``. Only ``text`` (a
figure) and ``not-run`` (listed in ``NOT_RUN`` with its reason) are not run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from user_project import ROOT

__all__ = ["KINDS", "NOT_RUN", "WHEELHOUSE", "Block", "blocks", "documents", "of_kind"]

# kind -> how it is checked (tests/project/test_docs_examples.py unless named)
KINDS = {
    "python": "run as a script, in page order, in one project with agentmend installed",
    "pytest": "run under pytest in a project with only the documented install",
    "agent-file": "loaded as the project's agent file, nothing broken",
    "shell": "run with `sh -e` in a fresh project per page, with agentmend installed",
    "install": "run from a copy of the checkout in a fresh venv, offline (a wheelhouse)",
    "own-team": "run by test_own_team_in_ci.py: recorded on a fake API, replayed offline",
    "ci-step": "GitHub Actions steps: each `run` run by test_own_team_in_ci.py after the record",
    "server": "started as printed, answers (its first line), stopped with SIGTERM, exits 0",
    "mcp-config": "the configured server started over stdio, its six tools listed",
    "fleet-setup": "run by test_docs_fleet.py: the first host's lines and another host's in two "
    "workspaces, on a real PostgreSQL server that asks for the password",
    "pgbouncer-config": "its session settings (pool mode, ignored startup parameters) are "
    "those the tests run PgBouncer with (tests/pgbouncer.py, sixty recorders through it)",
    "make": "each target dry-run with `make -n` (running `make test` would run the suite "
    "inside itself; `make run` installs on first use)",
    "text": "a figure (a diagram, a folder tree): nothing to run",
    "not-run": "listed in NOT_RUN with the reason it cannot run offline",
}

# (page, the block's first line) -> why it cannot run here; keep this list short
NOT_RUN: dict[tuple[str, str], str] = {}

# The wheelhouse `make` fills (Makefile: WHEELHOUSE): the install examples build agentmend with
# the setuptools and wheel there, never reaching a registry.
WHEELHOUSE = Path(os.environ.get("AGENTMEND_TEST_WHEELHOUSE") or ROOT / ".venv" / "wheelhouse")

_MARKER = re.compile(r"^<!-- example: ([\w-]+) -->$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, what its marker says, and its text as printed."""

    page: str  # relative to the repository
    line: int  # of the opening fence
    kind: str | None  # None: no marker
    language: str
    text: str

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0] if self.text else ""

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.kind or 'unmarked'})"


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _parse(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence, info = opening.groups()
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        marker = _MARKER.match(lines[index - 1].strip()) if index else None
        body = [line.removeprefix(indent) for line in lines[index + 1 : end]]
        found.append(
            Block(
                page=path.relative_to(ROOT).as_posix(),
                line=index + 1,
                kind=marker.group(1) if marker else None,
                language=info.strip().split(" ")[0],
                text="\n".join(body) + "\n",
            )
        )
        index = end + 1
    return found


def blocks() -> list[Block]:
    """Every block of every page, README first, pages in path order, blocks in page order."""
    return [block for path in documents() for block in _parse(path)]


def of_kind(kind: str) -> list[Block]:
    return [block for block in blocks() if block.kind == kind]
