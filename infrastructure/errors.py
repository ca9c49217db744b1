"""One exception root with typed fields; callers match on types and fields, never on text.

Two families: misuse and configuration (raised at once: a bad spec file, a path outside the
root, a store that cannot be opened) and agent run failures (``AgentRunError``), which a
runtime returns inside an ``AgentResult`` as data and which the monitor records.
"""

from __future__ import annotations

import errno as errno_module
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = [
    "AgentRunError",
    "AgentmendError",
    "AuditChainError",
    "ConfigurationError",
    "ErrorKind",
    "InvalidArgument",
    "LockTimeout",
    "NotFound",
    "PathNotAllowed",
    "PostgresExtraMissing",
    "RollbackConflict",
    "SchemaBehind",
    "SpecError",
    "StoreError",
    "WrongArgumentType",
]


def _rebuild_error(cls: type[AgentmendError], args: tuple[Any, ...]) -> AgentmendError:
    """An instance of ``cls`` with ``args``, made without calling its ``__init__``.

    The fields come back from the pickled ``__dict__`` afterwards; calling ``__init__`` again
    would need its original arguments, which the message in ``args`` no longer holds.
    """
    error = cls.__new__(cls, *args)
    error.args = args
    return error


class AgentmendError(Exception):
    """Root of every error agentmend raises.

    Every subclass survives ``pickle`` and ``copy.deepcopy`` with its fields, however its
    ``__init__`` is shaped: errors cross process boundaries (multiprocessing, task queues).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's own reduce calls ``cls(*self.args)``, which fails for any subclass
        # whose __init__ takes fields rather than the message.
        return (_rebuild_error, (type(self), self.args), self.__dict__ or None)


class ConfigurationError(AgentmendError):
    """Settings or arguments that cannot work (a missing key, an unknown provider, ...)."""


class PostgresExtraMissing(ConfigurationError):
    """A ``postgresql://`` store was asked for without the ``[postgres]`` extra installed."""

    def __init__(self, module: str) -> None:
        self.module = module
        super().__init__(
            f"{module} is not installed: install agentmend[postgres] to use a PostgreSQL store"
        )


class InvalidArgument(AgentmendError, ValueError):
    """An argument a call cannot take; ``name`` says which, ``problem`` what is wrong with it.

    Also a ``ValueError``, so code written to catch the built-in error keeps working.
    """

    def __init__(self, name: str, value: object, problem: str) -> None:
        self.name = name
        self.value = value
        self.problem = problem
        super().__init__(f"{name} {problem}, got {value!r}")


class WrongArgumentType(InvalidArgument, TypeError):
    """An argument of a kind the call does not take; also a ``TypeError`` for older callers."""


class NotFound(AgentmendError, KeyError):
    """No record with this key; ``what`` names the kind of record. Also a ``KeyError``."""

    def __init__(self, what: str, key: str, where: str = "") -> None:
        self.what = what
        self.key = key
        super().__init__(f"no {what} with id {key!r}" + (f" {where}" if where else ""))

    def __str__(self) -> str:  # KeyError would show the repr of the message
        return str(self.args[0])


INSUFFICIENT_PRIVILEGE = "42501"
"""PostgreSQL's SQLSTATE for a statement its role may not run."""


class StoreError(AgentmendError):
    """The store cannot be opened, is not an agentmend database, or a statement failed.

    Attributes:
        path: the database file, when known.
        cause: SQLite's error name (``SQLITE_FULL``, ``SQLITE_BUSY``, ``SQLITE_IOERR``,
            ``SQLITE_CORRUPT``, ...) or PostgreSQL's SQLSTATE, when known.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, cause: str | None = None):
        self.path = str(path) if path is not None else None
        self.cause = cause
        super().__init__(message)

    @property
    def refused_to_role(self) -> bool:
        """Whether PostgreSQL refused the statement to the connected role (SQLSTATE 42501):
        the store's roles (``agentmend store grant``) leave it to another role."""
        return self.cause == INSUFFICIENT_PRIVILEGE


class LockTimeout(StoreError):
    """A lock another process holds was waited for as long as configured, then given up.

    The store's write lock, a team's lock or a file lock of the store's on this host; the
    holder may be slow, stuck or stopped. Nothing was written by the call that raised it.

    Attributes:
        lock: what was waited for (``the store's write lock``, ``team t1's lock``, ...).
        waited_s: how long, in seconds.
        setting: the ``Settings`` field that sets the wait (``AGENTMEND_`` + its upper case).
    """

    def __init__(
        self,
        lock: str,
        where: str,
        waited_s: float,
        setting: str,
        *,
        path: str | Path | None = None,
        cause: str | None = None,
    ) -> None:
        self.lock = lock
        self.waited_s = waited_s
        self.setting = setting
        super().__init__(
            f"gave up waiting for {lock} on {where} after {waited_s:g} s: another process "
            f"holds it (slow, stuck or stopped); to wait longer raise Settings.{setting} "
            f"(AGENTMEND_{setting.upper()})",
            path=path,
            cause=cause,
        )


class SchemaBehind(StoreError):
    """The store's tables are older than this agentmend, and this connection may not migrate.

    On a PostgreSQL store with agentmend's roles (``agentmend store grant``) only an
    administrator role changes the schema: workers and controllers refuse to start until one
    has run ``agentmend store migrate``.

    Attributes:
        component: the part of the store that is behind (``audit``, ``executions``, ...).
        found: its schema version in the store. needed: the version this agentmend needs.
    """

    def __init__(self, where: str, component: str, found: int, needed: int) -> None:
        self.component = component
        self.found = found
        self.needed = needed
        super().__init__(
            f"{where}: the store's {component!r} tables are at schema version {found}, this "
            f"agentmend needs {needed}, and this role may not migrate them: an administrator "
            "runs `agentmend store migrate URL` first",
            cause="schema_behind",
        )


class SpecError(AgentmendError):
    """An agent definition file that cannot be loaded; names the file and the field."""

    def __init__(self, path: str | Path | None, field: str | None, problem: str) -> None:
        self.path = str(path) if path is not None else None
        self.field = field
        self.problem = problem
        where = self.path or "<agent spec>"
        if field:
            where += f": field {field!r}"
        super().__init__(f"{where}: {problem}")


class PathNotAllowed(AgentmendError):
    """A path refused by confinement: outside its root (``..``, absolute, symlink) or a bad type."""

    def __init__(self, path: str | Path, root: str | Path, problem: str = "") -> None:
        self.path = str(path)
        self.root = str(root)
        self.problem = problem
        detail = f" ({problem})" if problem else ""
        super().__init__(f"path {self.path!r} is not allowed under {self.root}{detail}")


class RollbackConflict(AgentmendError):
    """A rollback that would destroy later work; ``force`` or ``cascade`` says to go ahead."""

    def __init__(
        self,
        change_id: str,
        problem: str,
        *,
        paths: tuple[str, ...] = (),
        dependents: tuple[str, ...] = (),
    ) -> None:
        self.change_id = change_id
        self.paths = paths
        self.dependents = dependents
        super().__init__(f"cannot roll back change {change_id}: {problem}")


class AuditChainError(AgentmendError):
    """The audit trail does not verify (raised only where the caller asked for strictness)."""


class ErrorKind(StrEnum):
    """Why an agent run failed, the same whichever runtime ran it."""

    RATE_LIMIT = "rate_limit"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    CONNECTION = "connection"
    TIMEOUT = "timeout"
    AUTHENTICATION = "authentication"
    BAD_REQUEST = "bad_request"
    MODEL_NOT_FOUND = "model_not_found"
    TRUNCATED = "truncated"
    MAX_TURNS = "max_turns"
    OUTPUT_INVALID = "output_invalid"
    TOOL_DENIED = "tool_denied"
    CANCELLED = "cancelled"
    RUNTIME = "runtime"

    @property
    def transient(self) -> bool:
        """Outages that pass on their own; not a configuration fault of the agent."""
        return self in _TRANSIENT


_TRANSIENT = frozenset(
    {
        ErrorKind.RATE_LIMIT,
        ErrorKind.OVERLOADED,
        ErrorKind.SERVER_ERROR,
        ErrorKind.CONNECTION,
    }
)


class AgentRunError(AgentmendError):
    """Why one agent run failed. Returned inside ``AgentResult.error``; raise it if you like."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.kind = kind
        self.message = message
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        super().__init__(f"{kind.value}: {message}")

    def __repr__(self) -> str:
        return f"AgentRunError(kind={self.kind.value!r}, message={self.message!r})"


class ChangeNotFound(AgentmendError):
    """No change with this id is in the history."""

    def __init__(self, change_id: str) -> None:
        self.change_id = change_id
        super().__init__(f"no change with id {change_id!r} in the history")


class ChangeStateError(AgentmendError):
    """A change cannot move from the state it is in to the one asked for."""

    def __init__(self, change_id: str, status: str, wanted: str, problem: str = "") -> None:
        self.change_id = change_id
        self.status = status
        self.wanted = wanted
        detail = f": {problem}" if problem else ""
        super().__init__(f"change {change_id} is {status}, cannot become {wanted}{detail}")


class PermissionRequired(AgentmendError):
    """The principal lacks a permission the action needs (acknowledging an audit break, ...)."""

    def __init__(self, user_id: str, permission: str, action: str) -> None:
        self.user_id = user_id
        self.permission = permission
        self.action = action
        super().__init__(f"{user_id!r} needs the {permission!r} permission to {action}")


__all__ += ["ChangeNotFound", "ChangeStateError", "PermissionRequired"]


class FileOperationError(AgentmendError):
    """The file system refused an operation on a file: full, read-only, denied, I/O error.

    Attributes:
        path: the file the operation was on.
        operation: what was being done (``write``, ``read``, ``delete``, ...).
        cause: the errno name (``ENOSPC``, ``EROFS``, ``EACCES``, ...).
        errno: the errno number.
    """

    def __init__(self, path: str | Path, operation: str, error: OSError | None = None) -> None:
        self.path = str(path)
        self.operation = operation
        self.errno = error.errno if error is not None else None
        self.cause = errno_name(self.errno)
        why = (error.strerror if error is not None else None) or "failed"
        super().__init__(f"cannot {operation} {self.path}: {why} ({self.cause})")


class FileTooLarge(AgentmendError):
    """A file over the size agentmend reads (``Settings.max_file_bytes``); nothing was read."""

    def __init__(self, path: str | Path, size: int, limit: int) -> None:
        self.path = str(path)
        self.size = size
        self.limit = limit
        super().__init__(f"{self.path} is {size} bytes, over the limit of {limit} bytes")


class InputTooLarge(AgentmendError, ValueError):
    """An input over a configured bound (a description, a plan, a request); nothing was stored.

    Attributes:
        what: the input, as the caller named it (``description``, ``plan files``, ...).
        size: its size (bytes or items, as ``unit`` says).
        limit: the bound, and ``setting`` the ``Settings`` field that sets it.
    """

    def __init__(self, what: str, size: int, limit: int, setting: str, unit: str = "bytes"):
        self.what = what
        self.size = size
        self.limit = limit
        self.setting = setting
        self.unit = unit
        super().__init__(
            f"{what} is {size} {unit}, over the limit of {limit} {unit} "
            f"(Settings.{setting}, AGENTMEND_{setting.upper()})"
        )


def errno_name(number: int | None) -> str:
    """``ENOSPC`` for 28: the name a person can search for; ``unknown`` when there is none."""
    if number is None:
        return "unknown"
    return errno_module.errorcode.get(number, f"errno {number}")


__all__ += ["FileOperationError", "FileTooLarge", "InputTooLarge", "errno_name"]
