"""What a release holds: a team directory's files, checked to parse, and their hashes.

A release is every file of the team directory (agent definitions, their eval suites, their
``docs/`` folders) except hidden entries (``.agent/`` holds backups and locks; ``.`` names are
temporary files). It is content-addressed: its hash covers every path and the SHA-256 of every
file, so two releases with the same hash hold the same bytes.

A release is refused before anything is written if a definition or an eval suite does not parse,
or a docs file is not UTF-8 text: a worker must never be handed a team it cannot load. The error
names the file.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from agentmend.infrastructure.definitions.spec import AgentSpec, SpecWarning
from agentmend.infrastructure.definitions.widening import definition_widening
from agentmend.infrastructure.errors import SpecError
from agentmend.infrastructure.evaluation.evals import SUITE_SUFFIX, parse_eval_suite
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.atomic import sha256_bytes
from agentmend.infrastructure.releases.errors import ReleaseRefused

__all__ = [
    "MAX_FILE_BYTES",
    "check_release",
    "content_hash",
    "read_team_files",
    "release_widening",
]

MAX_FILE_BYTES = 4 * 1024 * 1024
"""The largest file a release takes (a definition or a doc is text, a few KB)."""


def read_team_files(directory: str | Path) -> dict[str, bytes]:
    """Every file of a team directory by relative POSIX path, read through the confined layer.

    Hidden entries are skipped (``.agent/``, temporary files); a symlink inside is refused by
    the confined layer, so a release never copies what lies outside the team.
    """
    root = str(directory)
    found: dict[str, bytes] = {}
    pending = [""]
    while pending:
        folder = pending.pop()
        names = confined.list_names(root, folder) if folder else _top_names(root)
        for name in names:
            if name.startswith("."):
                continue
            rel = f"{folder}/{name}" if folder else name
            if confined.is_directory(root, rel):
                pending.append(rel)
                continue
            data = confined.read(root, rel, max_bytes=MAX_FILE_BYTES)
            if data is not None:
                found[rel] = data
    return dict(sorted(found.items()))


def _top_names(root: str) -> list[str]:
    path = Path(root)
    if not path.is_dir():
        raise ReleaseRefused(root, "the team directory does not exist")
    return sorted(entry.name for entry in path.iterdir())


def check_release(files: Mapping[str, bytes]) -> None:
    """Refuse a release a worker could not load, naming the first file that fails.

    Raises:
        ReleaseRefused: a path that is not a plain relative path, no agent definition, a
            definition or eval suite that does not parse, two definitions of one agent, or a
            file that is not UTF-8 text.
    """
    names: dict[str, str] = {}
    for path, data in files.items():
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or any(p.startswith(".") for p in pure.parts):
            raise ReleaseRefused(path, "not a plain relative path")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReleaseRefused(path, f"not UTF-8 text ({exc.reason})") from None
        if len(pure.parts) != 1:
            continue  # docs and other files: text is all a worker needs of them
        try:
            if path.endswith(SUITE_SUFFIX):
                parse_eval_suite(text, Path(path))
            elif path.endswith(".md") and path.lower() != "readme.md":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", SpecWarning)  # unknown keys are kept
                    spec = AgentSpec.from_markdown(text)
                if spec.name in names:
                    raise ReleaseRefused(path, f"agent {spec.name!r} is also in {names[spec.name]}")
                names[spec.name] = path
        except SpecError as exc:
            raise ReleaseRefused(path, exc.problem) from None
    if not names:
        raise ReleaseRefused("(release)", "it holds no agent definition (*.md)")


def content_hash(file_hashes: Mapping[str, str]) -> str:
    """The release's address: SHA-256 over every ``path`` and its file's SHA-256, sorted."""
    digest = hashlib.sha256()
    for path in sorted(file_hashes):
        digest.update(f"{path}\x00{file_hashes[path]}\n".encode())
    return digest.hexdigest()


def file_hashes(files: Mapping[str, bytes]) -> dict[str, str]:
    """``{path: sha256}`` of ``files``."""
    return {path: sha256_bytes(data) for path, data in files.items()}


__all__ += ["file_hashes"]


def _agent_specs(files: Mapping[str, bytes]) -> dict[str, AgentSpec]:
    """The agent definitions among a release's files, by agent name (files that do not parse
    are left out: ``check_release`` refuses them before anything is written)."""
    specs: dict[str, AgentSpec] = {}
    for path, data in files.items():
        if "/" in path or not path.endswith(".md") or path.lower() == "readme.md":
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SpecWarning)
                spec = AgentSpec.from_markdown(data.decode("utf-8"))
        except (SpecError, UnicodeDecodeError):
            continue
        specs[spec.name] = spec
    return specs


def release_widening(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> list[str]:
    """What the agents of ``after`` may do that those of ``before`` could not, a line per agent.

    The rule is the role gate's (:func:`definition_widening`: a more open permission profile,
    privileged or wildcard tools, undeclared tools, MCP servers, hooks, ...), so a release needs
    an administrator exactly when making its change in a cycle would. Empty when nothing widens.
    """
    old, new = _agent_specs(before), _agent_specs(after)
    lines: list[str] = []
    for name, spec in sorted(new.items()):
        widens = definition_widening(old.get(name), spec)
        if widens:
            lines.append(f"{name}: {'; '.join(widens)}")
    return lines
