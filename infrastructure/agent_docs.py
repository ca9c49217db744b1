"""An agent's reference docs: the ``<dir>/<name>/docs/`` folder beside its definition file.

``<name>`` is the name's path form (``infrastructure.agent_names.path_name``): the name itself
unless it holds a character no file name may hold.

Seed 002 lets an agent carry documents (glossaries, house rules, examples) that are appended to
its system prompt. They are read when the definition is loaded, as ``(docs/<relative path>,
text)`` pairs in path order, so the prompt is the same on every machine. The folder is
confined: a docs folder or file that resolves outside it (through a symlink) is skipped with a
warning; hidden entries and files that are not UTF-8 text are skipped too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from infrastructure.agent_names import path_name
from infrastructure.errors import PathNotAllowed
from infrastructure.files import resolve_inside
from infrastructure.structured_logger import get_logger

__all__ = ["read_agent_docs", "with_agent_docs"]

log = get_logger(__name__)


def read_agent_docs(definition_dir: Path, name: str) -> tuple[tuple[str, str], ...]:
    """``(docs/<relative path>, text)`` of the agent's docs, sorted; escapes are ignored."""
    try:
        docs_dir = resolve_inside(definition_dir, Path(path_name(name)) / "docs")
    except PathNotAllowed:
        log.warning("ignored_agent_docs", agent=name, reason="docs folder leaves its directory")
        return ()
    if not docs_dir.is_dir():
        return ()
    found: list[tuple[str, str]] = []
    # symlinked folders are not walked; symlinked files are checked against the docs folder
    for root, dirs, files in os.walk(docs_dir):
        dirs[:] = [folder for folder in dirs if not folder.startswith(".")]
        for file_name in files:
            relative = (Path(root) / file_name).relative_to(docs_dir)
            if file_name.startswith("."):
                continue
            try:
                resolved = resolve_inside(docs_dir, relative)
                text = resolved.read_bytes().decode("utf-8")
            except PathNotAllowed:
                log.warning("ignored_agent_doc", agent=name, doc=str(relative), reason="escape")
                continue
            except (OSError, UnicodeDecodeError):
                log.warning("ignored_agent_doc", agent=name, doc=str(relative), reason="not text")
                continue
            if "\x00" not in text:
                found.append((relative.as_posix(), text))
    return tuple((f"docs/{relative}", text) for relative, text in sorted(found))


def with_agent_docs(system_prompt: str, docs: Sequence[tuple[str, str]]) -> str:
    """``system_prompt`` with ``docs`` appended inside ``<agent_docs>`` (seed 002's layout)."""
    if not docs:
        return system_prompt
    sections = "\n\n".join(f"# {path}\n{text.rstrip()}" for path, text in docs)
    block = f"<agent_docs>\n{sections}\n</agent_docs>"
    return f"{system_prompt}\n\n{block}" if system_prompt else block
