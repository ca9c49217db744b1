"""Settings: thresholds, paths and provider choice, from arguments or ``AGENTMEND_*`` variables.

Nothing is read at import: a ``Settings()`` reads the environment when it is made, so importing
agentmend inside a user's test run changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from infrastructure.principal import ADMIN, Principal

__all__ = ["Provider", "Settings"]

Provider = Literal["offline", "anthropic", "claude-agent-sdk"]


class Settings(BaseSettings):
    """Everything the loop can be tuned by; each field has the default a production team wants."""

    model_config = SettingsConfigDict(env_prefix="AGENTMEND_", extra="forbid", frozen=True)

    workspace: Path = Path(".agentmend")
    provider: Provider = "offline"

    # detection
    detection_mode: Literal["statistical", "rules"] = "statistical"
    false_alarm_rate: float = Field(default=0.001, gt=0, lt=1)
    baseline_n: int = Field(default=500, ge=10)
    # the smallest baseline the false-alarm guarantee covers: below it, seed 003's rules stand in
    min_baseline_n: int = Field(default=30, ge=10)
    # an issue whose cycle ended with no change is held (not raised again) for this many runs
    # of the agent, doubling at each repeat up to the ceiling, unless it clears first
    issue_backoff_runs: int = Field(default=100, ge=1)
    issue_backoff_max_runs: int = Field(default=6400, ge=1)

    # improvement budget and gates
    max_improvements_per_session: int = Field(default=5, ge=0)
    min_confidence: float = Field(default=0.7, ge=0, le=1)
    auto_decision_timeout: float = Field(default=30.0, gt=0)
    yolo_mode: bool = False

    # who automatic cycles, the demo and the MCP server act for: standard rights unless
    # an admin is configured here (only an admin may grant open profiles or shell tools)
    principal_id: str = "agentmend"
    principal_name: str = "agentmend (automatic)"
    principal_admin: bool = False

    # the audit trail: an HMAC key kept outside the workspace makes the chain unforgeable
    audit_hmac_key: SecretStr | None = None

    # code-level updates: the command that validates a change (never taken from tool input)
    test_command: tuple[str, ...] = ("pytest", "-x", "-q")
    test_timeout_s: float = Field(default=600.0, gt=0)

    @property
    def default_principal(self) -> Principal:
        return Principal(
            user_id=self.principal_id,
            name=self.principal_name,
            permissions=frozenset({ADMIN}) if self.principal_admin else frozenset(),
        )
