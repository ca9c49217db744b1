"""The offline self-improver: one playbook per failure signature, sized by the quoted evidence.

It reads three blocks of its prompt: ``<analysis>`` (the mediator's finding), ``<agent_config>``
(the responsible agent's current settings) and ``<available_models>``. Every number it proposes
comes from the configuration and from the evidence quotes, never from knowledge of what made
the agent fail:

==================  =================================================================
truncation          max_tokens = max(2 x current, needed x 1.25), rounded up to 256,
                    capped at the model's output limit
tool_denied         tools += the tools the denial quotes (only when the definition
                    declares tools and lacks them; a tool the definition already allows
                    is refused by the permission profile, which only an administrator
                    widens, so nothing is proposed)
model_unavailable   model = the first available model that was not reported missing,
                    preferring one the agent says is served and one of the same family
timeout             timeout_s = max(2 x current, quoted full run time x 1.5); when that
                    would pass 3600 s, a faster model family instead (haiku < sonnet <
                    opus), else timeout_s = 3600 s
format_violation    append the format instruction the evidence quotes (else one built
                    from the quoted heading, else a generic one) as the prompt's last line
rate_limit          nothing: transient, not a configuration fault
unknown             nothing: no change without a diagnosis
==================  =================================================================

Each action carries the analysis confidence (capped at ``MAX_CONFIDENCE``), so a weak analysis
yields actions the confidence gate refuses.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentmend.infrastructure.errors import AgentRunError, ErrorKind
from agentmend.infrastructure.llm.offline import OfflineCall
from agentmend.infrastructure.models import ChangeType
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.roles.playbooks.signatures import (
    denied_tools,
    format_instruction,
    full_run_seconds,
    missing_models,
    needed_tokens,
    required_heading,
    round_up,
    served_models,
)
from agentmend.roles.prompt_blocks import PromptBlockError, extract_block
from agentmend.roles.schemas import ImprovementPlan, ProposedAction

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TIMEOUT_S",
    "FALLBACK_OUTPUT_LIMIT",
    "GENERIC_FORMAT_INSTRUCTION",
    "MAX_CONFIDENCE",
    "MAX_TIMEOUT_S",
    "improver_policy",
    "plan_for",
]

log = get_logger(__name__)

MAX_CONFIDENCE = 0.95
DEFAULT_MAX_TOKENS = 4096
"""What an agent without ``max_tokens`` runs with (the runtimes' default)."""
DEFAULT_TIMEOUT_S = 300.0
"""What an agent without ``timeout_s`` runs with (the runtimes' default)."""
MAX_TIMEOUT_S = 3600.0
FALLBACK_OUTPUT_LIMIT = 64_000
"""The cap when the prompt does not give the model's output limit (the supervisor's cap too).

The limit comes from the prompt, never from a table here that would age with every model
release: ``agent_config.max_output_tokens``, or ``<available_models>`` given as objects with
``name`` and ``max_output_tokens``."""
GENERIC_FORMAT_INSTRUCTION = (
    "Format: keep exactly to the output format this prompt describes, from the first line of "
    "your reply."
)


class _Analysis(BaseModel):
    model_config = ConfigDict(extra="ignore")

    responsible_agent: str
    cause_category: str
    identified_cause: str = ""
    confidence: float = Field(ge=0.0, le=1.0)
    evidence: list[str] = Field(default_factory=list)
    recommendations: list[str] = Field(default_factory=list)


class _Config(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    model: str | None = None
    max_tokens: int | None = None
    timeout_s: float | None = None
    max_turns: int | None = None
    temperature: float | None = None
    tools: list[str] | None = None
    permission_profile: Any = "standard"
    system_prompt: str = ""
    max_output_tokens: int | None = None


def _read(prompt: str) -> tuple[_Analysis, _Config, list[str], dict[str, int]]:
    try:
        analysis = _Analysis.model_validate(extract_block(prompt, "analysis"))
        config = _Config.model_validate(extract_block(prompt, "agent_config"))
    except PromptBlockError as exc:
        raise AgentRunError(ErrorKind.BAD_REQUEST, f"improver playbook: {exc}") from exc
    except ValidationError as exc:
        raise AgentRunError(
            ErrorKind.BAD_REQUEST,
            f"improver playbook: malformed <analysis> or <agent_config>: {exc}",
        ) from exc
    try:
        raw_models = extract_block(prompt, "available_models")
    except PromptBlockError:
        raw_models = []
    models: list[str] = []
    limits: dict[str, int] = {}
    # a list of names, or of {"name", "max_output_tokens"} objects
    for item in raw_models if isinstance(raw_models, list) else []:
        if isinstance(item, str) and item.strip():
            models.append(item.strip())
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            models.append(item["name"])
            if isinstance(item.get("max_output_tokens"), int):
                limits[item["name"]] = item["max_output_tokens"]
    return analysis, config, models, limits


def _family(model: str) -> str:
    match = re.search(r"opus|sonnet|haiku", model.casefold())
    return match.group(0) if match else re.sub(r"[-.\d]+$", "", model.casefold())


def _output_limit(model: str | None, limits: dict[str, int], config: _Config) -> int:
    if config.max_output_tokens is not None:
        return config.max_output_tokens
    if model is not None and model in limits:
        return limits[model]
    return FALLBACK_OUTPUT_LIMIT


def _action(
    change: ChangeType, analysis: _Analysis, target_field: str, value: Any, why: str
) -> ProposedAction:
    return ProposedAction(
        action_type=change,
        target_agent=analysis.responsible_agent,
        target_field=target_field,
        new_value=value,
        rationale=why,
        confidence=round(min(analysis.confidence, MAX_CONFIDENCE), 2),
    )


def _truncation(analysis: _Analysis, config: _Config, limits: dict[str, int]) -> ImprovementPlan:
    current = config.max_tokens or DEFAULT_MAX_TOKENS
    need = needed_tokens(analysis.evidence)
    wanted = max(2 * current, math.ceil(need * 1.25) if need else 0)
    cap = _output_limit(config.model, limits, config)
    target = min(round_up(wanted, 256), cap)
    if target <= current:
        return ImprovementPlan(
            summary=f"max_tokens is {current}, already at the model's output limit of {cap}; "
            "raising it further is not possible"
        )
    basis = f"answers need up to {need} output tokens" if need else "answers are cut off"
    why = f"{basis}; max_tokens {current} truncates them, so raise it to {target}"
    return ImprovementPlan(
        actions=[_action(ChangeType.PARAMETER_ADJUSTMENT, analysis, "max_tokens", target, why)],
        summary=f"raise max_tokens from {current} to {target}",
    )


def _tool_denied(analysis: _Analysis, config: _Config) -> ImprovementPlan:
    tools = denied_tools(analysis.evidence)
    if not tools:
        return ImprovementPlan(summary="the evidence names no refused tool; nothing to grant")
    if config.tools is None:
        return ImprovementPlan(
            summary=f"{', '.join(tools)} refused although the definition declares no tool list: "
            "the permission profile refuses it, and widening a profile needs an administrator"
        )
    missing = [tool for tool in tools if tool not in config.tools]
    if not missing:
        return ImprovementPlan(
            summary=f"{', '.join(tools)} is already among the declared tools: the permission "
            "profile refuses it, and widening a profile needs an administrator"
        )
    why = f"runs fail because {', '.join(missing)} is denied and the task needs it"
    return ImprovementPlan(
        actions=[
            _action(ChangeType.TOOL_PERMISSION_CHANGE, analysis, "tools", {"add": missing}, why)
        ],
        summary=f"add {', '.join(missing)} to {config.name}'s tools",
    )


def _model_unavailable(analysis: _Analysis, config: _Config, models: list[str]) -> ImprovementPlan:
    missing = set(missing_models(analysis.evidence))
    if config.model:
        missing.add(config.model)
    candidates = [m for m in models if m not in missing]
    served = served_models(analysis.evidence)
    if served:
        candidates = [m for m in candidates if m in served] or candidates
    if not candidates:
        return ImprovementPlan(summary="no other available model to switch to")
    reference = config.model or next(iter(sorted(missing)), "")
    same = [m for m in candidates if reference and _family(m) == _family(reference)]
    choice = (same or candidates)[0]
    gone = ", ".join(sorted(missing)) or "the configured model"
    why = f"requests fail because {gone} is not available; {choice} is"
    return ImprovementPlan(
        actions=[_action(ChangeType.MODEL_CHANGE, analysis, "model", choice, why)],
        summary=f"switch {config.name} to {choice}",
    )


def _timeout(analysis: _Analysis, config: _Config, models: list[str]) -> ImprovementPlan:
    current = config.timeout_s or DEFAULT_TIMEOUT_S
    full = full_run_seconds(analysis.evidence)
    wanted = float(math.ceil(max(2 * current, full * 1.5 if full else 0.0)))
    if wanted > MAX_TIMEOUT_S:
        # no timeout within reason lets the run finish: a faster model is the other lever
        faster = _faster_model(config.model, models)
        if faster is not None:
            basis = f"a complete run takes about {full:g} s" if full else "runs hit the timeout"
            why = (
                f"{basis}, beyond what a {MAX_TIMEOUT_S:g} s timeout allows; {faster} "
                f"generates faster than {config.model}"
            )
            return ImprovementPlan(
                actions=[_action(ChangeType.MODEL_CHANGE, analysis, "model", faster, why)],
                summary=f"switch {config.name} to the faster {faster}",
            )
    target = min(wanted, MAX_TIMEOUT_S)
    if target <= current:
        return ImprovementPlan(
            summary=f"timeout_s is {current:g}, already at the {MAX_TIMEOUT_S:g} s cap, and "
            "no faster model is available"
        )
    basis = f"a complete run takes about {full:g} s" if full else "runs hit the timeout"
    why = f"{basis}; timeout_s {current:g} cuts them off, so raise it to {target:g}"
    return ImprovementPlan(
        actions=[_action(ChangeType.PARAMETER_ADJUSTMENT, analysis, "timeout_s", target, why)],
        summary=f"raise timeout_s from {current:g} to {target:g}",
    )


_FASTEST_FIRST = ("haiku", "sonnet", "opus")
"""Model families by generation speed, as their vendor positions them."""


def _faster_model(model: str | None, models: list[str]) -> str | None:
    family = _family(model or "")
    if family not in _FASTEST_FIRST:
        return None
    faster = _FASTEST_FIRST[: _FASTEST_FIRST.index(family)]
    return next((m for m in models if _family(m) in faster), None)


def _last_line(prompt: str) -> str:
    lines = [line.strip() for line in prompt.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _format_violation(analysis: _Analysis, config: _Config) -> ImprovementPlan:
    instruction = format_instruction(analysis.evidence)
    if instruction is None:
        heading = required_heading(analysis.evidence)
        instruction = (
            f"Format: start your reply with a '{heading}' heading."
            if heading is not None
            else GENERIC_FORMAT_INSTRUCTION
        )
    if " ".join(_last_line(config.system_prompt).split()) == " ".join(instruction.split()):
        return ImprovementPlan(
            summary="the prompt already ends with the format instruction; restating it again "
            "would change nothing"
        )
    why = (
        "replies break the required format; restate the format instruction as the prompt's "
        "last line"
    )
    return ImprovementPlan(
        actions=[
            _action(
                ChangeType.PROMPT_MODIFICATION,
                analysis,
                "system_prompt",
                {"append": instruction},
                why,
            )
        ],
        summary=f"append the format instruction to {config.name}'s prompt",
    )


def plan_for(
    analysis: Mapping[str, Any],
    config: Mapping[str, Any],
    available_models: Sequence[str] = (),
    model_limits: Mapping[str, int] | None = None,
) -> ImprovementPlan:
    """The playbook's plan for one analysis of one agent, from the blocks' decoded JSON.

    Raises:
        pydantic.ValidationError: ``analysis`` or ``config`` lacks a field the playbook needs.
    """
    return _plan(
        _Analysis.model_validate(analysis),
        _Config.model_validate(config),
        list(available_models),
        dict(model_limits or {}),
    )


def _plan(
    analysis: _Analysis, config: _Config, models: list[str], limits: dict[str, int]
) -> ImprovementPlan:
    category = analysis.cause_category
    if analysis.responsible_agent != config.name:
        return ImprovementPlan(
            summary=f"the configuration given is {config.name!r}'s, not that of the responsible "
            f"agent {analysis.responsible_agent!r}; nothing proposed"
        )
    if category == "truncation":
        return _truncation(analysis, config, limits)
    if category == "tool_denied":
        return _tool_denied(analysis, config)
    if category == "model_unavailable":
        return _model_unavailable(analysis, config, models)
    if category == "timeout":
        return _timeout(analysis, config, models)
    if category == "format_violation":
        return _format_violation(analysis, config)
    if category == "rate_limit":
        return ImprovementPlan(
            summary="rate limits and overload are transient, not a configuration fault: "
            "no configuration change; wait for the API to recover"
        )
    return ImprovementPlan(
        summary=f"no playbook for cause category {category!r}: no change without a diagnosis"
    )


async def improver_policy(call: OfflineCall) -> ImprovementPlan:
    """Read the analysis and the agent's configuration; propose the category's fix."""
    analysis, config, models, limits = _read(call.prompt)
    plan = _plan(analysis, config, models, limits)
    log.debug(
        "improver_playbook_planned",
        agent=analysis.responsible_agent,
        category=analysis.cause_category,
        actions=len(plan.actions),
    )
    return plan
