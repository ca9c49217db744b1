"""Settings: thresholds, paths and provider choice, from arguments or ``AGENTMEND_*`` variables.

Nothing is read at import: a ``Settings()`` reads the environment when it is made, so importing
agentmend inside a user's test run changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.redaction import redact_url

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_PLAN_BYTES",
    "DEFAULT_MAX_PLAN_FILES",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_REQUEST_DEPTH",
    "DEFAULT_MAX_TEXT_BYTES",
    "DEFAULT_MAX_TOOL_ARGUMENT_BYTES",
    "SETTINGS_FILE",
    "InvalidSetting",
    "Provider",
    "Settings",
    "load_settings",
    "workspace_settings",
]

DEFAULT_MAX_TEXT_BYTES = 64 * 1024
DEFAULT_MAX_PLAN_FILES = 100
DEFAULT_MAX_FILE_BYTES = 1024 * 1024
DEFAULT_MAX_PLAN_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_TOOL_ARGUMENT_BYTES = 1024 * 1024
DEFAULT_MAX_REQUEST_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_REQUEST_DEPTH = 64

Provider = Literal["offline", "anthropic", "claude-agent-sdk"]


class Settings(BaseSettings):
    """Everything the loop can be tuned by; each field has the default a production team wants."""

    model_config = SettingsConfigDict(env_prefix="AGENTMEND_", extra="forbid", frozen=True)

    workspace: Path = Path(".agentmend")
    # where the store is: a SQLite file or sqlite:///path, or postgresql://user@host/db for a
    # fleet (the [postgres] extra); unset, the workspace's own agentmend.db
    store_url: str | None = None
    provider: Provider = "offline"
    # record and replay (agentmend.infrastructure.llm.cassette): run the agents and roles on the
    # Messages API and store every exchange in this cassette file (record, needs the key), or
    # serve a cassette's exchanges with no key and no network (replay); either one wins over
    # ``provider``
    record: Path | None = None
    replay: Path | None = None
    # nothing waits forever on the store: a write waits this long for the store's write lock
    # (PostgreSQL's lock_timeout, SQLite's busy timeout) or a store file lock on this host,
    # and an apply or rollback this long for its team's lock, then fails with LockTimeout
    store_lock_timeout_s: float = Field(default=30.0, gt=0)
    team_lock_timeout_s: float = Field(default=900.0, gt=0)
    # PostgreSQL sessions: a statement running longer is cancelled (statement_timeout), and a
    # session left inside a transaction without a word this long is ended by the server
    # (idle_in_transaction_session_timeout), which frees the locks of a stopped process;
    # migrations and ``store copy`` are exempt
    store_statement_timeout_s: float = Field(default=300.0, gt=0)
    store_idle_transaction_timeout_s: float = Field(default=60.0, gt=0)
    # PostgreSQL reached through a transaction pooler (PgBouncer's pool_mode = transaction):
    # a session keeps nothing between transactions (no prepared statements, no startup
    # options), so the two bounds above are then the database role's own settings
    store_transaction_pooler: bool = False
    # the session and the MCP server as workers: follow the team's releases when it has some
    # (auto), insist (on) or serve the team folder (off); serve_release pins one release
    follow_releases: Literal["auto", "on", "off"] = "auto"
    serve_release: int | None = Field(default=None, ge=1)
    # how often such a worker checks the releases it serves against what was published
    release_check_interval_s: float = Field(default=10.0, gt=0)

    # detection
    detection_mode: Literal["statistical", "rules"] = "statistical"
    false_alarm_rate: float = Field(default=0.001, gt=0, lt=1)
    baseline_n: int = Field(default=500, ge=10)
    # the smallest baseline the false-alarm guarantee covers: below it, the fixed rules stand in
    min_baseline_n: int = Field(default=30, ge=10)
    # an issue whose cycle ended with no change is held (not raised again) for this many runs
    # of the agent, doubling at each repeat up to the ceiling, unless it clears first
    issue_backoff_runs: int = Field(default=100, ge=1)
    issue_backoff_max_runs: int = Field(default=6400, ge=1)
    # a cycle claims its issue (one cycle per issue, fleet-wide); a claim this old is taken to
    # be a dead claimant's, and the next cycle may take it
    issue_claim_stale_s: float = Field(default=3600.0, gt=0)

    # the runs between record() and the store: bounded, so a caller that outruns the store
    # slows down ("wait") or has its newest runs refused and counted ("drop")
    max_record_backlog: int = Field(default=100_000, ge=1)
    record_backlog_policy: Literal["wait", "drop"] = "wait"
    record_backlog_wait_s: float = Field(default=1.0, ge=0)
    # how long closing a monitor (and the exit hook) writes before reporting what is left
    close_timeout_s: float = Field(default=10.0, ge=0)

    # retention of old rows (None keeps them forever): raw runs older than the days, or
    # beyond the newest runs per agent, and decisions older than their days; never an
    # agent's baseline, the runs of an open issue or a change under verification, or audit
    retention_run_days: float | None = Field(default=None, gt=0)
    retention_runs_per_agent: int | None = Field(default=None, ge=1)
    retention_decision_days: float | None = Field(default=None, gt=0)

    # how a change is verified on an eval suite: "sequential" runs before/after pairs and stops
    # as soon as an always-valid test decides (about half the model calls); "fixed" runs every
    # case every repeat on both sides, then judges
    verification_design: Literal["sequential", "fixed"] = "sequential"

    # improvement budget and gates
    max_improvements_per_session: int = Field(default=5, ge=0)  # the interactive session
    # long-running processes (library use, the MCP server): a rolling budget per team
    max_improvements_per_window: int = Field(default=5, ge=0)
    improvement_window_s: float = Field(default=3600.0, gt=0)
    min_confidence: float = Field(default=0.7, ge=0, le=1)
    auto_decision_timeout: float = Field(default=30.0, gt=0)
    yolo_mode: bool = False

    # who automatic cycles, the demo and the MCP server act for: standard rights unless
    # an admin is configured here (only an admin may grant open profiles or shell tools)
    principal_id: str = "agentmend"
    principal_name: str = "agentmend (automatic)"
    principal_admin: bool = False
    # tools a ``standard`` profile may call although they are not known to be read-only
    # (names or patterns, e.g. ``["mcp__docs__*"]``): Task/Agent, MCP and unknown tools are
    # privileged unless listed here
    read_only_tools: tuple[str, ...] = ()

    # the audit trail: an HMAC key kept outside the workspace makes the chain unforgeable
    audit_hmac_key: SecretStr | None = None

    # code-level updates: the command that validates a change (never taken from tool input)
    test_command: tuple[str, ...] = ("pytest", "-x", "-q")
    test_timeout_s: float = Field(default=600.0, gt=0)

    # bounds on every input a caller or a model controls: over one is an InputTooLarge (or,
    # on the MCP server's stdin, a JSON-RPC error) within a second, and nothing is stored
    max_text_bytes: int = Field(default=DEFAULT_MAX_TEXT_BYTES, ge=1)
    """A description, a rationale or a reason, in UTF-8 bytes."""
    max_plan_files: int = Field(default=DEFAULT_MAX_PLAN_FILES, ge=1)
    """Files in one code plan or change group."""
    max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, ge=1)
    """One file's content: written by a plan or a change, or read as an agent's doc."""
    max_plan_bytes: int = Field(default=DEFAULT_MAX_PLAN_BYTES, ge=1)
    """All the file contents of one code plan or change group together."""
    max_tool_argument_bytes: int = Field(default=DEFAULT_MAX_TOOL_ARGUMENT_BYTES, ge=1)
    """One argument of an MCP tool call, as JSON."""
    max_request_bytes: int = Field(default=DEFAULT_MAX_REQUEST_BYTES, ge=1024)
    """One JSON-RPC message on the MCP server's stdin."""
    max_request_depth: int = Field(default=DEFAULT_MAX_REQUEST_DEPTH, ge=4)
    """Nesting of arrays and objects in one JSON-RPC message."""

    def __repr_args__(self) -> Any:
        # repr() and str() of the settings are logged and shown: never the store's password
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "store_url" and value else value

    def shown(self) -> dict[str, Any]:
        """The settings as data to show (a tool's answer): secrets masked, as in ``repr``."""
        data = self.model_dump(mode="json")
        if data.get("store_url"):
            data["store_url"] = redact_url(data["store_url"])
        if data.get("audit_hmac_key") is not None:
            data["audit_hmac_key"] = "(set)"
        return data

    @property
    def default_principal(self) -> Principal:
        return Principal(
            user_id=self.principal_id,
            name=self.principal_name,
            permissions=frozenset({ADMIN}) if self.principal_admin else frozenset(),
        )


class InvalidSetting(ConfigurationError):
    """A setting's value cannot be used: ``setting`` is the ``AGENTMEND_*`` variable (or the
    argument) that holds it, ``value`` the value given; the message says what is allowed."""

    def __init__(self, setting: str, value: str, message: str) -> None:
        self.setting = setting
        self.value = value
        super().__init__(message)


SETTINGS_FILE = "settings.env"
"""A workspace's own settings (``agentmend init`` writes one): ``AGENTMEND_*=value`` lines."""


def workspace_settings(folder: Path) -> dict[str, Any]:
    """The settings ``<folder>/settings.env`` holds, as overrides for ``load_settings``.

    One ``AGENTMEND_NAME=value`` per line; blank lines and ``#`` comments are skipped; a value
    starting with ``[`` is a JSON list. A variable set in the environment wins over the file,
    so it is left out. No file, no settings.

    Raises:
        InvalidSetting: a line is not ``AGENTMEND_NAME=value`` or names no setting (the file
            and line are named).
    """
    import json

    path = folder / SETTINGS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSetting(str(path), "", f"{path} cannot be read: {exc}") from None
    found: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, equals, value = line.partition("=")
        name, value = name.strip(), value.strip()
        field = name.removeprefix(_ENV_PREFIX).lower()
        if not equals or not name.startswith(_ENV_PREFIX) or field not in Settings.model_fields:
            raise InvalidSetting(
                name,
                value,
                f"{path} line {number}: {name!r} is not an agentmend setting "
                "(AGENTMEND_NAME=value, see docs/settings.md)",
            )
        if name in os.environ:
            continue
        if value.startswith("["):
            try:
                found[field] = json.loads(value)
                continue
            except json.JSONDecodeError:
                pass
        found[field] = value
    return found


def load_settings(**overrides: Any) -> Settings:
    """``Settings(**overrides)``, read from ``AGENTMEND_*``, with a bad value as one clear error.

    Every face (the session, the ``agentmend`` command, the MCP server) and every default
    ``Settings`` of the library is made here, so a mistyped variable reads the same wherever
    it is met: the variable, the value it holds and what is allowed.

    Raises:
        InvalidSetting: a value cannot be used, naming the variable (or the argument, for an
            override), the value given and what is allowed.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = [_describe(error, overrides) for error in exc.errors()]
        (setting, value, _), text = problems[0], "; ".join(text for _, _, text in problems)
        raise InvalidSetting(setting, value, text) from None
    except SettingsError as exc:  # a value pydantic-settings could not even decode (JSON lists)
        cause = str(exc)
        field = next((f for f in Settings.model_fields if f'field "{f}"' in cause), None)
        name = f"{_ENV_PREFIX}{field.upper()}" if field else "an AGENTMEND_* variable"
        value = os.environ.get(name, "") if field else ""
        allowed = _ALLOWED_FORMAT.get(field or "", "it cannot be read")
        raise InvalidSetting(name, value, f"{name}={value!r} is not allowed: {allowed}") from None


_ENV_PREFIX = "AGENTMEND_"
_ALLOWED_FORMAT = {
    "test_command": 'should be a JSON list of strings, e.g. ["pytest", "-x", "-q"]',
}


def _describe(error: Any, overrides: dict[str, Any]) -> tuple[str, str, str]:
    """(setting name, value, one-line text) for one pydantic error."""
    field = str(error["loc"][0]) if error.get("loc") else "?"
    if field in overrides:
        name, value = field, str(overrides[field])
    else:
        name = f"{_ENV_PREFIX}{field.upper()}"
        value = os.environ.get(name, str(error.get("input", "")))
    allowed = _ALLOWED_FORMAT.get(field) or "should be " + str(error["msg"]).removeprefix(
        "Input should be "
    )
    return name, value, f"{name}={value!r} is not allowed: {allowed}"
