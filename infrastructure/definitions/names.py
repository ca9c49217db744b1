"""Agent names as Claude Code accepts them, and the form agentmend uses in file paths.

Claude Code loads an agent whose ``name`` is any non-empty string of at most 256 characters
(counted as JavaScript does, in UTF-16 units) that does not start with ``-`` and holds no ``:``
once NFKC-normalised (``:`` is its plugin namespace separator). Real files use dots and
non-Latin letters (``powershell-5.1-expert``, ``重构``), so agentmend accepts the same names.

A name also becomes part of paths: the definition ``<name>.md`` of a new agent, the docs folder
``<name>/docs/`` and the eval suite ``<name>.evals.yaml``. ``path_name`` is the name itself
whenever it is safe as one path component on every common file system, which covers every name
made of letters (of any script), digits, ``.``, ``_``, ``-`` and spaces inside. Otherwise (a
``/`` or ``\\``, a control character, one of ``<>"|?*``, a leading ``.``, a leading or trailing
space or dot, more than 200 UTF-8 bytes) each such character becomes ``-`` and
``-<8 hex digits of the name's SHA-256>`` is appended, so two names never share a path.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

__all__ = ["MAX_NAME_LENGTH", "name_problem", "path_name"]

MAX_NAME_LENGTH = 256
"""Claude Code's limit on a name, in UTF-16 code units."""

_MAX_PATH_BYTES = 200  # leaves room for ".evals.yaml" within the usual 255-byte file name
_UNSAFE = re.compile(r'[\x00-\x1f\x7f/\\<>"|?*]')


def name_problem(name: str) -> str | None:
    """Why Claude Code would not load an agent of this name, or None when it would."""
    if not name:
        return "must not be empty"
    if name.startswith("-"):
        return "must not start with '-' (Claude Code's rule)"
    if len(name.encode("utf-16-le")) // 2 > MAX_NAME_LENGTH:
        return f"must be at most {MAX_NAME_LENGTH} characters (Claude Code's rule)"
    if ":" in unicodedata.normalize("NFKC", name):
        return "must not contain ':', Claude Code's plugin namespace separator"
    return None


def path_name(name: str) -> str:
    """The form of ``name`` used as a file or folder name (the name itself when it is safe)."""
    safe = (
        not _UNSAFE.search(name)
        and not name.startswith(".")
        and name == name.strip(" .")
        and len(name.encode("utf-8")) <= _MAX_PATH_BYTES
    )
    if safe:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    base = _UNSAFE.sub("-", name).strip(" .")
    while len(base.encode("utf-8")) > _MAX_PATH_BYTES - 9:
        base = base[:-1]
    return f"{base}-{digest}" if base else digest
