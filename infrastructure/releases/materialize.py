"""A release on a worker's disk: an immutable directory, and the team link switched to it.

Layout under a worker's own folder (``root``), for the team link ``agents``::

    agents -> .releases/v7-1a2b3c4d5e6f       the team directory agents read (a symlink)
    .releases/v7-1a2b3c4d5e6f/                 release 7, whole, never written again
    .releases/v8-9f8e7d6c5b4a/                 the canary, when there is one
    .releases/.staging-v9-...-<token>/         a release being written (never read)

A release is written into a staging directory through the confined layer, its manifest last,
then the directory is renamed to its final name, and only then is the link switched
(``rename(2)`` of a new link over the old one). So a reader (a running agent, Claude Code
reading ``.claude/agents/``) sees one whole release or the next, never a mix; a worker killed at
any instant leaves the link on a whole release and at most a staging directory, which the next
start removes. A final directory is complete by construction (the rename comes last), so it is
reused, never rewritten.

What was published is what is served: every release has files of its own (no file is shared
between two releases, so an edit of one never reaches another), its bytes are checked against
the release's content address before they are written, and its files are read-only (0444) in
folders nobody may write (0555) before it gets its final name, so an edit, an editor's save by
rename or an added file is refused to anyone but root or the worker's own user changing a mode
first. :meth:`ReleaseDirectories.check` compares a served directory with its manifest (cheaply:
the mode, size, times and inode of each file and folder, hashing only when one of them changed),
and finds a file or folder made writable again. A directory found different is replaced from
the store (:meth:`ReleaseDirectories.replace`), and sealed again; removing one (an old release,
a staging left by a kill) makes its folders writable first.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from agentmend.infrastructure.errors import AgentmendError, StoreError
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.atomic import sha256_bytes
from agentmend.infrastructure.files.links import (
    READ_ONLY_FILE,
    link_target,
    open_tree,
    remove_tree,
    rename_directory,
    seal_tree,
    swap_link,
    write_new_tree,
)
from agentmend.infrastructure.releases.content import content_hash, file_hashes, read_team_files
from agentmend.infrastructure.releases.log import Release, ReleaseLog
from agentmend.infrastructure.structured_logger import get_logger

__all__ = ["MANIFEST", "ReleaseDirectories", "ServedRelease"]

log = get_logger(__name__)

MANIFEST = ".release.json"
"""The file naming a materialized release (team, version, content hash), written last."""

_STAGING = ".staging-"

_Stamp = tuple[tuple[str, tuple[int, ...] | None], ...]


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
        # what each served directory looked like when its bytes last matched its manifest
        self._stamps: dict[Path, _Stamp] = {}

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
                hashes or its content address (a damaged store). FileOperationError: the disk
                refused.
        """
        release = releases.get(version)
        name = f"v{release.version}-{release.content_hash[:12]}"
        existing = self._served(name)
        if existing is not None and existing.content_hash == release.content_hash:
            return existing
        if existing is not None:  # a manifest naming other content: not this release
            return self.replace(releases, version)
        self._write(release, releases.files(version), name)
        served = self._served(name)
        assert served is not None
        return served

    def replace(self, releases: ReleaseLog, version: int) -> ServedRelease:
        """Put release ``version`` back as published, from the store, over a copy found
        different: each file that differs is replaced in one ``rename(2)`` (a reader sees the
        edited bytes or the published ones, never none), a file added is removed, the
        manifest written again. A copy that cannot be repaired so (a symlink put inside) is
        removed and materialized anew.

        Raises:
            as :meth:`materialize`.
        """
        release = releases.get(version)
        name = f"v{release.version}-{release.content_hash[:12]}"
        files = releases.files(version)
        _check_hashes(release, files)
        where = f"{self.store_dir}/{name}"
        root = str(self.root)
        self._stamps.pop(self.root / where, None)
        if confined.is_directory(root, where):
            try:
                self._repair(release, files, where)
            except AgentmendError as exc:
                log.warning("release_not_repaired", version=version, error=str(exc))
                remove_tree(root, where)
                self._write(release, files, name)
        else:
            self._write(release, files, name)
        log.warning("release_rematerialized", version=version, directory=name)
        served = self._served(name)
        assert served is not None
        return served

    def _repair(self, release: Release, files: dict[str, bytes], where: str) -> None:
        root = str(self.root)
        try:
            found = file_hashes(read_team_files(self.root / where))
        except AgentmendError:
            found = {}  # unreadable as a team (a symlink inside): every file written again
        expected = dict(release.files)
        open_tree(root, where)  # files are renamed into its folders, added ones removed
        for path, data in files.items():
            if found.get(path) != expected[path]:
                confined.write(root, f"{where}/{path}", data)
        for path in sorted(set(found) - set(files)):
            confined.delete(root, f"{where}/{path}")
        confined.write(root, f"{where}/{MANIFEST}", json.dumps(_manifest(release)))
        seal_tree(root, where)

    def _write(self, release: Release, files: dict[str, bytes], name: str) -> None:
        """Write ``release`` into a new staging directory, then rename it to ``name``."""
        _check_hashes(release, files)
        staging = f"{self.store_dir}/{_STAGING}{name}-{secrets.token_hex(4)}"
        root = str(self.root)
        # every file written anew: a file shared with another release would carry an edit of
        # one into the other
        write_new_tree(root, staging, files, mode=READ_ONLY_FILE)
        confined.write(root, f"{staging}/{MANIFEST}", json.dumps(_manifest(release)))
        seal_tree(root, staging)  # read-only from the moment it has its final name
        rename_directory(root, staging, f"{self.store_dir}/{name}")
        log.info("release_materialized", version=release.version, directory=name, files=len(files))

    def check(self, served: ServedRelease, *, full: bool = False) -> str | None:
        """What differs between ``served``'s directory and what was published (None: nothing).

        Compares the directory with its manifest, and the manifest with the content address in
        the directory's name, and finds a file or folder of it that is writable. Cheap when
        nothing changed since the last check that found it whole (the mode, size, times and
        inode of each file and folder); ``full``, or any of those changed, reads and hashes
        every file (a file added, removed or edited is found).
        """
        directory = served.directory
        raw = confined.read(str(self.root), f"{self.store_dir}/{directory.name}/{MANIFEST}")
        try:
            listed = json.loads(raw or b"{}")["files"]
            expected = {str(k): str(v) for k, v in listed.items()}
        except (ValueError, KeyError, AttributeError, TypeError):
            return "its manifest is missing or unreadable"
        address = content_hash(expected)
        if address != served.content_hash or not directory.name.endswith(address[:12]):
            return "its manifest does not match its content address"
        stamp = _stamp(directory, expected)
        if not full and self._stamps.get(directory) == stamp:
            return None
        self._stamps.pop(directory, None)
        try:
            found = file_hashes(read_team_files(directory))
        except AgentmendError as exc:
            return f"unreadable: {exc}"
        problem = _difference(expected, found) or _writable(stamp)
        if problem is None:
            self._stamps[directory] = stamp
        return problem

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
        directory = self.root / self.store_dir / name
        try:
            manifest = json.loads(raw)
            return ServedRelease(int(manifest["version"]), str(manifest["hash"]), directory)
        except (ValueError, KeyError, TypeError):
            # an edited manifest: the release its name says, with no content address, which
            # every check finds different and the store puts back
            version = name[1:].split("-", 1)[0]
            return ServedRelease(int(version), "", directory) if version.isdigit() else None


def _check_hashes(release: Release, files: dict[str, bytes]) -> None:
    expected = dict(release.files)
    if set(expected) != set(files) or any(
        sha256_bytes(data) != expected[path] for path, data in files.items()
    ):
        raise StoreError(f"release {release.version}: its files do not match their hashes")
    # a file row pointed at another blob matches that blob's hash, not the release's address
    if content_hash(file_hashes(files)) != release.content_hash:
        raise StoreError(
            f"release {release.version}: its files do not match its content address "
            f"{release.content_hash[:12]}"
        )


def _manifest(release: Release) -> dict[str, object]:
    return {
        "team": release.team_id,
        "version": release.version,
        "hash": release.content_hash,
        "files": dict(release.files),
    }


def _difference(expected: dict[str, str], found: dict[str, str]) -> str | None:
    """The first way ``found`` differs from ``expected`` (path -> sha256), or None."""
    for path in sorted(set(expected) | set(found)):
        if path not in found:
            return f"{path} is missing"
        if path not in expected:
            return f"{path} was added"
        if found[path] != expected[path]:
            return f"{path} does not match its hash"
    return None


def _writable(stamp: _Stamp) -> str | None:
    """The first file or folder of a release that anyone may write (it should be sealed)."""
    for rel, info in stamp:
        if info is not None and info[0] & 0o222:
            return f"{rel} is writable (mode {info[0] & 0o777:o})"
    return None


def _stamp(directory: Path, files: dict[str, str]) -> _Stamp:
    """Mode, size, times and inode of each folder and file of a release, its manifest
    included (None: absent)."""
    folders = {"."} | {str(parent) for path in files for parent in PurePosixPath(path).parents}
    found: list[tuple[str, tuple[int, ...] | None]] = []
    for rel in [*sorted(folders), *sorted(files), MANIFEST]:
        try:
            info = os.lstat(directory / rel)
        except OSError:
            found.append((rel, None))
            continue
        found.append(
            (rel, (info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino))
        )
    return tuple(found)
