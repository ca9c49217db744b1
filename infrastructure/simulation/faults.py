"""Faults the simulated runtime can be given, and the configuration each one is fixed by.

A fault changes the world an agent works in (its tasks need longer answers, a new tool, its model
is gone, its requests got slower, its replies wander off format, the API throttles it), never its
definition file. Whether a run then fails is decided by the agent's *current* configuration, so
the right edit to the definition file really restores success and a wrong edit really does not.

Failure conditions (``need`` is the answer length of one call, which varies by ``TOKEN_SPREAD``):

* ``TRUNCATION``: answers need ``token_factor`` times the agent's usual tokens. A run fails with
  ``TRUNCATED`` (stop reason ``max_tokens``) iff ``max_tokens < need``. Fix: raise ``max_tokens``
  to at least ``answer_tokens * token_factor * (1 + TOKEN_SPREAD)``; a model change does nothing.
* ``TOOL_DENIED``: the task needs ``tool`` (default: the agent's ``extra_tool``). A run fails
  with ``TOOL_DENIED`` (and ``permission_denials``) iff ``tools`` is declared and lacks it.
  Fix: add the tool to ``tools``.
* ``MODEL_RETIRED``: ``model`` (default: the model the agent runs on at its next run) is gone
  for this agent. A run fails with ``MODEL_NOT_FOUND`` (404) iff the definition's model resolves
  to it. Fix: switch to another available model. An unknown or retired name in the definition
  fails the same way with no fault at all.
* ``SLOW``: every request of the agent takes ``latency_factor`` times longer. A run fails with
  ``TIMEOUT`` iff its simulated duration exceeds ``timeout_s``. Fix: raise ``timeout_s`` to the
  slowed duration (the agent reports how far it got) or switch to a faster model
  (``claude-haiku-4-5`` generates about 2.7 times faster than ``claude-sonnet-4-6``).
* ``FORMAT_DRIFT``: replies keep to the format only while the format instruction is the last
  thing the system prompt says. A run fails with ``OUTPUT_INVALID`` iff the prompt's last
  non-blank line is not ``FORMAT_INSTRUCTION`` (shipped prompts state it mid-prompt). Fix: restate
  ``FORMAT_INSTRUCTION`` at the end of the prompt. A prompt without the instruction fails with
  no fault at all.
* ``RATE_LIMIT_STORM``: the agent's next ``calls`` runs fail with ``RATE_LIMIT`` (429), then the
  fault clears by itself. No configuration change helps; waiting does.
* ``UNKNOWN``: every run fails with ``RUNTIME`` and an opaque ``message`` after doing its work.
  No configuration change helps; only ``heal`` clears it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from enum import StrEnum

from agentmend.infrastructure.errors import ConfigurationError, InvalidArgument

__all__ = ["Fault", "FaultKind", "faults_from_json", "faults_to_json"]


class FaultKind(StrEnum):
    """What changed in an agent's world; see the module docstring for each one's condition."""

    TRUNCATION = "truncation"
    TOOL_DENIED = "tool_denied"
    MODEL_RETIRED = "model_retired"
    SLOW = "slow"
    FORMAT_DRIFT = "format_drift"
    RATE_LIMIT_STORM = "rate_limit_storm"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault with its parameters; a parameter matters only to its own kind.

    Attributes:
        kind: which fault.
        token_factor: TRUNCATION: how many times longer answers now need to be.
        tool: TOOL_DENIED: the tool the task now needs (None: the agent's ``extra_tool``).
        model: MODEL_RETIRED: the model that is gone (None: the one the agent runs on next).
        latency_factor: SLOW: how many times longer each request takes.
        calls: RATE_LIMIT_STORM: how many of the agent's runs are throttled.
        message: UNKNOWN: the opaque error text (None: a generated one).
    """

    kind: FaultKind
    token_factor: float = 3.0
    tool: str | None = None
    model: str | None = None
    latency_factor: float = 8.0
    calls: int = 6
    message: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FaultKind):
            raise InvalidArgument("kind", self.kind, "must be a FaultKind")
        if self.token_factor < 1:
            raise InvalidArgument("token_factor", self.token_factor, "must be at least 1")
        if self.latency_factor < 1:
            raise InvalidArgument("latency_factor", self.latency_factor, "must be at least 1")
        if self.calls < 1:
            raise InvalidArgument("calls", self.calls, "must be at least 1")
        if self.tool is not None and not self.tool.strip():
            raise InvalidArgument("tool", self.tool, "must be a tool name")


def faults_to_json(faults: Mapping[str, Sequence[Fault]]) -> str:
    """``faults`` (agent -> its faults) as JSON, for a workspace to keep between processes."""
    kept = [
        {"agent": agent, **asdict(fault), "kind": fault.kind.value}
        for agent, agent_faults in sorted(faults.items())
        for fault in agent_faults
    ]
    return json.dumps({"version": 1, "faults": kept}, indent=2) + "\n"


def faults_from_json(text: str, *, source: str) -> dict[str, list[Fault]]:
    """The faults :func:`faults_to_json` wrote; ``source`` names the text in errors.

    Raises:
        ConfigurationError: the text is not such a document (naming ``source`` and why).
    """
    names = {f.name for f in fields(Fault)}
    try:
        document = json.loads(text)
        if not isinstance(document, dict) or document.get("version") != 1:
            raise ValueError("not a version 1 faults document")
        out: dict[str, list[Fault]] = {}
        for entry in document["faults"]:
            agent = entry.pop("agent")
            if not isinstance(agent, str) or not set(entry) <= names:
                raise ValueError(f"unexpected entry {sorted(entry)!r}")
            entry["kind"] = FaultKind(entry["kind"])
            out.setdefault(agent, []).append(Fault(**entry))
    except (ValueError, KeyError, TypeError, AttributeError, InvalidArgument) as exc:
        raise ConfigurationError(
            f"{source}: not a file of injected faults ({exc}); delete it to start with none"
        ) from None
    return out
