"""Which store a workspace uses, the same for every face whoever starts it.

A workspace on another store than its own ``agentmend.db`` (a PostgreSQL server, a SQLite file
elsewhere) records that store's URL in ``<workspace>/store-url``, without its password: the
session, the MCP server, every ``agentmend`` command, the receiver and the fleet checker then
open that store with no ``--store`` and no ``AGENTMEND_STORE_URL``. libpq finds the password
as for any URL that names none: ``PGPASSWORD``, the password file (``PGPASSFILE``, default
``~/.pgpass``) or a service file (``PGSERVICEFILE``).

The URL is recorded by ``agentmend store init URL`` or by the first open given one (``--store``,
``AGENTMEND_STORE_URL``, ``Settings(store_url=...)``) when none is recorded. A URL given later
still wins, but only when it names the recorded store: another one is refused
(``StoreMismatch``, one line naming both), since a face that quietly opened a second store
would show and change a history the others never see; ``agentmend store init URL --force``
records another store on purpose. A workspace whose history is on a server but that records no
URL (made before the record existed) is refused too rather than given a new, empty SQLite file.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentmend.infrastructure.errors import ConfigurationError, StoreError
from agentmend.infrastructure.files.atomic import atomic_write
from agentmend.infrastructure.redaction import redact_url

__all__ = [
    "DB_NAME",
    "RECORD_FILE",
    "StoreMismatch",
    "UnrecordedServerStore",
    "is_server_url",
    "needs_record",
    "record_store",
    "recorded_store",
    "same_store",
    "sqlite_path",
    "store_for",
    "without_password",
]

DB_NAME = "agentmend.db"
RECORD_FILE = "store-url"

_PG_SCHEMES = ("postgresql://", "postgres://")
_SQLITE_SCHEME = "sqlite://"


class StoreMismatch(ConfigurationError):
    """The store given (``--store``, ``AGENTMEND_STORE_URL``) is not the one the workspace
    records; names both, passwords masked."""

    def __init__(self, recorded: str, given: str) -> None:
        self.recorded = recorded
        self.given = redact_url(given)
        super().__init__(
            f"it records the store {recorded} but {self.given} was given (--store or "
            "AGENTMEND_STORE_URL): drop the given one, or record it with "
            "`agentmend store init URL --force`"
        )


class UnrecordedServerStore(ConfigurationError):
    """The workspace keeps its history on a server but records no URL for it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        super().__init__(
            f"its history is on a PostgreSQL server (per-host files in {folder}) but it records "
            "no store URL: run `agentmend store init URL` once (or give --store or "
            "AGENTMEND_STORE_URL)"
        )


def is_server_url(location: str | Path) -> bool:
    return str(location).startswith(_PG_SCHEMES)


def without_password(location: str | Path) -> str:
    """What is recorded for ``location``: a PostgreSQL URL without its password, or the
    absolute path of a SQLite file.

    Raises:
        StoreError: not a store URL, or a PostgreSQL URL whose password cannot be taken out.
        PostgresExtraMissing: a PostgreSQL URL without psycopg installed.
    """
    if is_server_url(location):
        from agentmend.infrastructure.store.postgres import without_password as strip

        return strip(str(location))
    return str(sqlite_path(location))


def same_store(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one store (passwords aside; a path and ``sqlite://``
    alike). A URL that cannot be read is not the same as anything."""
    if is_server_url(a) != is_server_url(b):
        return False
    try:
        if is_server_url(a):
            from agentmend.infrastructure.store.postgres import connection_parameters

            return connection_parameters(str(a)) == connection_parameters(str(b))
        return sqlite_path(a) == sqlite_path(b)
    except (StoreError, ConfigurationError):
        return False


def recorded_store(folder: Path) -> str | None:
    """The store URL ``folder`` records, or None.

    Raises:
        ConfigurationError: the record is there but empty or not a store URL.
    """
    path = folder / RECORD_FILE
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path} cannot be read: {exc}") from exc
    if not text or "\n" in text:
        raise ConfigurationError(
            f"{path} holds no single store URL: run `agentmend store init URL --force`"
        )
    return text


def store_for(folder: Path, given: str | None) -> str | Path:
    """The store ``folder``'s faces open: ``given`` if it names the recorded store (or none is
    recorded), else the recorded one, else the workspace's own ``agentmend.db``.

    Raises:
        StoreMismatch: ``given`` names another store than the recorded one.
        UnrecordedServerStore: nothing given or recorded, but the folder holds a server
            store's per-host files and no ``agentmend.db``.
        ConfigurationError: the record cannot be read.
    """
    recorded = recorded_store(folder) if folder.is_dir() else None
    if given:
        # a URL that cannot be read is left to the store to name; it cannot be the recorded one
        if recorded is not None and not same_store(given, recorded) and _readable(given):
            raise StoreMismatch(redact_url(recorded), given)
        return given
    if recorded is not None:
        return recorded
    default = folder / DB_NAME
    if folder.is_dir() and not default.exists() and _holds_server_files(folder):
        raise UnrecordedServerStore(folder)
    return default


def needs_record(folder: Path, given: str | None) -> bool:
    """Whether a store opened from ``given`` is to be recorded in ``folder``: one was given,
    none is recorded, and it is not the workspace's own file."""
    if not given or recorded_store(folder) is not None:
        return False
    return not same_store(given, folder / DB_NAME)


def record_store(folder: Path, location: str | Path) -> str:
    """Record ``location`` (without its password) as ``folder``'s store; what was recorded.

    Written whole or not at all (a temporary file renamed over the record).

    Raises:
        StoreError: ``location`` is no store URL, or its password cannot be taken out.
        OSError: the record cannot be written.
    """
    text = without_password(location)
    atomic_write(folder / RECORD_FILE, text + "\n")
    return text


def sqlite_path(location: str | Path) -> Path:
    """The absolute path of the SQLite file ``location`` names (a path or ``sqlite://``).

    Raises:
        StoreError: ``location`` is another kind of URL, or names no file.
    """
    text = os.fspath(location)
    if text.startswith(_SQLITE_SCHEME):
        text = text[len(_SQLITE_SCHEME) :]
        if text.startswith("//"):
            text = "/" + text.lstrip("/")
    elif "://" in text:
        raise StoreError(
            f"unsupported store URL {redact_url(text)}: use a file path, sqlite:///path or "
            "postgresql://..."
        )
    if not text:
        raise StoreError("the store URL names no database file")
    return Path(text).absolute()


def _readable(location: str) -> bool:
    try:
        without_password(location)
    except (StoreError, ConfigurationError):
        return False
    return True


def _holds_server_files(folder: Path) -> bool:
    """A PostgreSQL store's per-host files are named ``<db>@<host>_<port>...``."""
    return any("@" in entry.name for entry in folder.iterdir() if entry.is_file())
