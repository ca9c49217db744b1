"""A release on a worker's disk: an immutable directory, and the team link switched to it.

Layout under a worker's own folder (``root``), for the team link ``agents``::

    agents -> .releases/v7-1a2b3c4d5e6f       the team directory agents read (a symlink)
    .releases/v7-1a2b3c4d5e6f/                 release 7, whole, never written again
    .releases/v8-9f8e7d6c5b4a/                 the canary, when there is one
    .releases/.staging-v9-...-<token>/         a release being written (never read)

A release is written into a staging directory through the confined layer (files the linked
release already holds with the same bytes are hard-linked, not written), its manifest last,
then the directory is renamed to its final name, and only then is the link switched
(``rename(2)`` of a new link over the old one). So a reader (a running agent, Claude Code
reading ``.claude/agents/``) sees one whole release or the next, never a mix; a worker killed at
any instant leaves the link on a whole release and at most a staging directory, which the next
start removes. A final directory is complete by construction (the rename comes last), so it is
reused, never rewritten.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.atomic import sha256_bytes
from agentmend.infrastructure.files.links import (
    link_target,
    remove_tree,
    rename_directory,
    swap_link,
    write_new_tree,
)
from agentmend.infrastructure.releases.log import Release, ReleaseLog
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["MANIFEST", "ReleaseDirectories", "ServedRelease"]

log = get_logger(__name__)

MANIFEST = ".release.json"
"""The file naming a materialized release (team, version, content hash), written last."""

_STAGING = ".staging-"


@dataclass(frozen=True, slots=True)
class ServedRelease:
    """A materialized release: its version, content hash and directory."""

    version: int
    content_hash: str
    directory: Path


class ReleaseDirectories:
    """The materialized releases of one team in a worker's own folder, and its team link.

    Args:
        root: the worker's folder (created when missing); nothing outside it is touched.
        link: the team directory's path under ``root`` (``agents``, ``.claude/agents``).
    """

    def __init__(self, root: str | Path, link: str = "agents") -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        parts = PurePosixPath(link).parts
        self.link = link
        self.store_dir = "/".join((*parts[:-1], ".releases"))
        confined.make_dirs(str(self.root), self.store_dir)

    @property
    def team_dir(self) -> Path:
        """The team directory agents read: the link to the stable release."""
        return self.root / self.link

    def remove_staging(self) -> int:
        """Remove what materializations killed midway left (only this worker writes here)."""
        removed = 0
        for name in confined.list_names(str(self.root), self.store_dir):
            if name.startswith(_STAGING):
                remove_tree(str(self.root), f"{self.store_dir}/{name}")
                removed += 1
        if removed:
            log.warning("release_staging_removed", root=str(self.root), count=removed)
        return removed

    def linked(self) -> ServedRelease | None:
        """The release the team link points at (None: no link yet, or no manifest there)."""
        target = link_target(str(self.root), self.link)
        if target is None:
            return None
        name = PurePosixPath(target).name
        return self._served(name)

    def materialize(self, releases: ReleaseLog, version: int) -> ServedRelease:
        """Release ``version`` as a whole directory here (reused when already here).

        Raises:
            NotFound: the team has no such release. StoreError: its bytes do not match its
                hashes (a damaged store). FileOperationError: the disk refused.
        """
        release = releases.get(version)
        name = f"v{release.version}-{release.content_hash[:12]}"
        existing = self._served(name)
        if existing is not None:
            return existing
        files = releases.files(version)
        _check_hashes(release, files)
        staging = f"{self.store_dir}/{_STAGING}{name}-{secrets.token_hex(4)}"
        root = str(self.root)
        hashes = dict(release.files)
        manifest = {
            "team": release.team_id,
            "version": version,
            "hash": release.content_hash,
            "files": hashes,
        }
        write_new_tree(root, staging, files, same_as=self._unchanged(hashes))
        confined.write(root, f"{staging}/{MANIFEST}", json.dumps(manifest))
        rename_directory(root, staging, f"{self.store_dir}/{name}")
        log.info("release_materialized", version=version, directory=name, files=len(files))
        served = self._served(name)
        assert served is not None
        return served

    def _unchanged(self, hashes: dict[str, str]) -> dict[str, str]:
        """Files of the linked release with the same bytes (hard-linked rather than written).

        Releases are immutable, so sharing an inode between two of them is safe.
        """
        linked = self.linked()
        if linked is None:
            return {}
        raw = confined.read(str(self.root), f"{self.store_dir}/{linked.directory.name}/{MANIFEST}")
        old = json.loads(raw or b"{}").get("files", {})
        where = f"{self.store_dir}/{linked.directory.name}"
        return {path: f"{where}/{path}" for path, sha in hashes.items() if old.get(path) == sha}

    def switch(self, served: ServedRelease) -> None:
        """Point the team link at ``served`` in one ``rename(2)``."""
        swap_link(str(self.root), self.link, f".releases/{served.directory.name}")

    def prune(self, keep: set[int]) -> None:
        """Remove materialized releases whose versions are not in ``keep`` (nor linked)."""
        linked = self.linked()
        for name in confined.list_names(str(self.root), self.store_dir):
            served = None if name.startswith(".") else self._served(name)
            if served is None or served.version in keep:
                continue
            if linked is not None and served.version == linked.version:
                continue
            remove_tree(str(self.root), f"{self.store_dir}/{name}")

    def _served(self, name: str) -> ServedRelease | None:
        raw = confined.read(str(self.root), f"{self.store_dir}/{name}/{MANIFEST}")
        if raw is None:
            return None
        manifest = json.loads(raw)
        return ServedRelease(
            int(manifest["version"]), str(manifest["hash"]), self.root / self.store_dir / name
        )


def _check_hashes(release: Release, files: dict[str, bytes]) -> None:
    expected = dict(release.files)
    if set(expected) != set(files) or any(
        sha256_bytes(data) != expected[path] for path, data in files.items()
    ):
        raise StoreError(f"release {release.version}: its files do not match their hashes")
