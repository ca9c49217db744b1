"""An agent's reference docs: the ``<dir>/<name>/docs/`` folder beside its definition file.

``<name>`` is the name's path form (``agentmend.infrastructure.definitions.names.path_name``): the
name itself unless it holds a character no file name may hold.

An agent may carry documents (glossaries, house rules, examples) that are appended to
its system prompt. They are read when the definition is loaded, as ``(docs/<relative path>,
text)`` pairs in path order, so the prompt is the same on every machine. The folder is
confined: a docs folder or file that resolves outside it (through a symlink) is skipped with a
warning; hidden entries are skipped. So is, with a warning naming the file and the reason, any
file that is not a regular file (a FIFO, socket or device is never opened for long: reads are
non-blocking and checked on the descriptor), loops, cannot be read, is not UTF-8 text, or is
over ``Settings.max_file_bytes``: one bad doc never stops a team from loading.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from agentmend.infrastructure.definitions.names import path_name
from agentmend.infrastructure.errors import FileOperationError, FileTooLarge, PathNotAllowed
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.atomic import resolve_inside
from agentmend.infrastructure.settings import DEFAULT_MAX_FILE_BYTES
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["read_agent_docs", "with_agent_docs"]

log = get_logger(__name__)


def read_agent_docs(
    definition_dir: Path, name: str, *, max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> tuple[tuple[str, str], ...]:
    """``(docs/<relative path>, text)`` of the agent's docs, sorted; bad files are skipped."""
    try:
        docs_dir = resolve_inside(definition_dir, Path(path_name(name)) / "docs")
    except PathNotAllowed as exc:
        log.warning("ignored_agent_docs", agent=name, reason=f"docs folder: {exc.problem}")
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
                data = confined.read(docs_dir, resolved.relative_to(docs_dir), max_bytes=max_bytes)
                text = (data or b"").decode("utf-8")
            except (PathNotAllowed, FileOperationError, FileTooLarge) as exc:
                reason = exc.problem if isinstance(exc, PathNotAllowed) else str(exc)
                log.warning("ignored_agent_doc", agent=name, doc=str(relative), reason=reason)
                continue
            except UnicodeDecodeError:
                log.warning("ignored_agent_doc", agent=name, doc=str(relative), reason="not text")
                continue
            if "\x00" in text:
                log.warning("ignored_agent_doc", agent=name, doc=str(relative), reason="binary")
                continue
            found.append((relative.as_posix(), text))
    return tuple((f"docs/{relative}", text) for relative, text in sorted(found))


def with_agent_docs(system_prompt: str, docs: Sequence[tuple[str, str]]) -> str:
    """``system_prompt`` with ``docs`` appended inside ``<agent_docs>``, one block per file."""
    if not docs:
        return system_prompt
    sections = "\n\n".join(f"# {path}\n{text.rstrip()}" for path, text in docs)
    block = f"<agent_docs>\n{sections}\n</agent_docs>"
    return f"{system_prompt}\n\n{block}" if system_prompt else block
