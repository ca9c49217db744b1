"""The offline supervisor: a rule-based review of one concrete change, before it is written.

It reads the ``<proposed_change>`` block (the action, the diff, the agent's configuration before
and after, the paths written) and rejects the change when any rule below finds a concern:

* security: the new text (added diff lines, the new value, the rationale) carries injection
  markers; a path is absolute or climbs out with ``..``. A change that widens permissions
  (profile ``open`` or a custom allow/deny profile, a shell or file-writing tool added, the tool
  restriction removed, an agent created with either) is not refused here: whether the invoking
  principal may grant it is the role gate's decision, which runs before this review. It is
  approved as ``high`` risk with the widening listed, so the human approval gate shows it;
* correctness: ``max_tokens`` outside 1..64000, ``timeout_s`` outside (0, 3600], ``temperature``
  outside [0, 1], ``max_turns`` below 1, an empty model name, an empty prompt, a prompt cut to
  less than half its length;
* scope: the target field does not belong to the action's type, the configuration changes in
  fields other than the target, or the change is a code patch (not an agent definition edit).

A change it cannot read is rejected too: a reviewer that cannot see the change must not pass it.
Approved changes get risk ``low`` (parameters, docs) or ``medium`` (prompt, tools, model, agent
creation or deletion).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentmend.infrastructure.definitions.permissions import PROFILE_NAMES, SHELL_AND_WRITE_TOOLS
from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.llm.offline import OfflineCall
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.roles.playbooks.signatures import contains_injection
from agentmend.roles.prompt_blocks import PromptBlockError, extract_block
from agentmend.roles.schemas import SupervisorReview

__all__ = [
    "FIELDS_BY_TYPE",
    "MAX_MAX_TOKENS",
    "MAX_TIMEOUT_S",
    "SUPERVISOR_MARKERS",
    "review_change",
    "supervisor_policy",
]

log = get_logger(__name__)

MAX_MAX_TOKENS = 64_000
MAX_TIMEOUT_S = 3600.0

FIELDS_BY_TYPE: Mapping[ChangeType, frozenset[str]] = {
    ChangeType.PROMPT_MODIFICATION: frozenset({"system_prompt"}),
    ChangeType.PARAMETER_ADJUSTMENT: frozenset(
        {"temperature", "max_tokens", "timeout_s", "max_turns", "maxTurns"}
    ),
    ChangeType.TOOL_PERMISSION_CHANGE: frozenset({"tools", "permission_profile"}),
    ChangeType.MODEL_CHANGE: frozenset({"model"}),
    ChangeType.DOCS_EDIT: frozenset(),  # "docs/<path>", checked by prefix
    ChangeType.AGENT_CREATION: frozenset(),
    ChangeType.AGENT_DELETION: frozenset(),
    ChangeType.CODE_PATCH: frozenset(),
}
"""The target fields each kind of change may touch."""

SUPERVISOR_MARKERS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(regex, re.IGNORECASE)
    for regex in (
        r"\bdisregard\b",
        r"\bjailbreak",
        r"\bbypass\s+(?:the\s+|all\s+|any\s+)?(?:safety|permissions?|gates?|review|checks?)",
        r"\bdo anything now\b",
    )
)
"""Beyond the mediator's injection markers: wording no legitimate prompt edit needs."""

_LOW_RISK = frozenset({ChangeType.PARAMETER_ADJUSTMENT, ChangeType.DOCS_EDIT})


class _ProposedChange(BaseModel):
    model_config = ConfigDict(extra="ignore")

    action: ImprovementAction
    diff: str = ""
    old_config: dict[str, Any] | None = None
    new_config: dict[str, Any] | None = None
    paths: list[str] = Field(default_factory=list)


def _field_name(name: str | None) -> str | None:
    return "max_turns" if name == "maxTurns" else name


def _injected(text: str) -> bool:
    return contains_injection(text) or any(p.search(text) for p in SUPERVISOR_MARKERS)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _added_lines(diff: str) -> str:
    return "\n".join(
        line[1:]
        for line in diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _profile_concern(profile: Any) -> str | None:
    if isinstance(profile, str) and profile in ("locked", "standard"):
        return None
    if profile == "open":
        return "sets permission profile 'open' (any tool): widens permissions"
    if isinstance(profile, Mapping):
        return "sets a custom allow/deny permission profile: widens permissions"
    if isinstance(profile, str) and profile not in PROFILE_NAMES:
        return f"sets unknown permission profile {profile!r}"
    return f"sets permission profile {profile!r}"


def _added_tools(change: _ProposedChange) -> tuple[set[str], bool]:
    """(tools the change adds, whether it lifts the tool restriction altogether)."""
    action = change.action
    old_cfg, new_cfg = change.old_config or {}, change.new_config or {}
    old = old_cfg.get("tools", action.old_value if action.target_field == "tools" else None)
    if change.old_config is not None and change.new_config is not None:
        new = new_cfg.get("tools")
        if old is not None and new is None:
            return set(), True
        return set(new or ()) - set(old or ()), False
    value = action.new_value
    if isinstance(value, Mapping):
        return {str(t) for t in value.get("add", ()) or ()}, False
    if isinstance(value, list | tuple):
        return {str(t) for t in value} - set(old or ()), False
    if value is None and action.target_field == "tools" and old is not None:
        return set(), True
    return set(), False


def _numeric_concerns(name: str, value: Any) -> list[str]:
    if name == "max_tokens":
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not 1 <= value <= MAX_MAX_TOKENS
        ):
            return [f"max_tokens {value!r} is outside 1..{MAX_MAX_TOKENS}"]
    elif name == "timeout_s":
        if not _is_number(value) or not 0 < value <= MAX_TIMEOUT_S:
            return [f"timeout_s {value!r} is outside (0, {MAX_TIMEOUT_S:g}] s"]
    elif name == "temperature":
        if not _is_number(value) or not 0 <= value <= 1:
            return [f"temperature {value!r} is outside [0, 1]"]
    elif name == "max_turns" and (
        not isinstance(value, int) or isinstance(value, bool) or value < 1
    ):
        return [f"max_turns {value!r} is below 1"]
    return []


def _creation_concerns(text: Any) -> list[str]:
    if not isinstance(text, str):
        return ["agent creation without a Markdown definition"]
    try:
        spec = AgentSpec.from_markdown(text)
    except Exception as exc:  # any parse failure is a reason to refuse, not to crash
        return [f"the new agent's definition does not load: {exc}"]
    concerns: list[str] = []
    profile = spec.permission_profile
    concern = _profile_concern(profile if isinstance(profile, str) else profile.model_dump())
    if concern is not None:
        concerns.append(f"new agent {spec.name!r} {concern}")
    shell = sorted(set(spec.tools or ()) & SHELL_AND_WRITE_TOOLS)
    if shell:
        concerns.append(f"new agent {spec.name!r} declares shell/write tools: {', '.join(shell)}")
    return concerns


def _config_drift(change: _ProposedChange, target: str | None) -> list[str]:
    old, new = change.old_config, change.new_config
    if old is None or new is None:
        return []
    changed = {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}
    allowed = {target} if target else set()
    if change.action.action_type is ChangeType.DOCS_EDIT:
        allowed = {"docs", "full_system_prompt"}  # docs are appended to the full prompt
    extra = sorted(changed - allowed)
    if extra:
        return [f"changes {', '.join(extra)} beyond its target field {target!r}"]
    return []


def review_change(change: Mapping[str, Any]) -> SupervisorReview:
    """Review a decoded ``<proposed_change>`` block; never raises (unreadable -> rejected)."""
    try:
        proposed = _ProposedChange.model_validate(change)
    except ValidationError as exc:
        return _reject(
            [f"the proposed change cannot be read: {exc.error_count()} invalid field(s)"]
        )
    action = proposed.action
    kind = action.action_type
    target = _field_name(action.target_field)
    concerns: list[str] = []

    # scope
    if kind is ChangeType.CODE_PATCH:
        concerns.append("a code patch is not an agent definition change")
    elif kind is ChangeType.DOCS_EDIT:
        if not (target or "").startswith("docs/"):
            concerns.append(f"docs edit targets {action.target_field!r}, not a docs/<path>")
    elif kind in (ChangeType.AGENT_CREATION, ChangeType.AGENT_DELETION):
        if target is not None:
            concerns.append(f"{kind.value} targets field {target!r}; it must target none")
    elif target not in {_field_name(f) for f in FIELDS_BY_TYPE[kind]}:
        concerns.append(f"{kind.value} cannot target field {action.target_field!r}")
    concerns.extend(_config_drift(proposed, target))
    for path in proposed.paths:
        if (
            path.startswith(("/", "\\"))
            or re.match(r"^[A-Za-z]:", path)
            or ".." in re.split(r"[\\/]", path)
        ):
            concerns.append(f"path {path!r} leaves the definitions directory")

    # security: widening is for the role gate (which runs first) to allow; flag it high-risk
    widening: list[str] = []
    new_profile = (proposed.new_config or {}).get("permission_profile")
    old_profile = (proposed.old_config or {}).get("permission_profile")
    if target == "permission_profile":
        concern = _profile_concern(action.new_value)
        if concern is not None:
            widening.append(concern)
    elif new_profile is not None and new_profile != old_profile:
        concern = _profile_concern(new_profile)
        if concern is not None:
            widening.append(concern)
    if kind is ChangeType.TOOL_PERMISSION_CHANGE or target == "tools":
        added, unrestricted = _added_tools(proposed)
        shell = sorted(added & SHELL_AND_WRITE_TOOLS)
        if shell:
            widening.append(f"adds shell/file-writing tools: {', '.join(shell)}")
        if unrestricted:
            widening.append("removes the agent's tool restriction (every tool allowed)")
    if kind is ChangeType.AGENT_CREATION:
        widening.extend(_creation_concerns(action.new_value))
    new_text = [_added_lines(proposed.diff), *_strings(action.new_value), action.rationale]
    if any(_injected(text) for text in new_text):
        concerns.append("the new text carries instructions aimed at the reader (injection)")

    # correctness
    if kind is ChangeType.PARAMETER_ADJUSTMENT and target is not None:
        concerns.extend(_numeric_concerns(target, action.new_value))
    if kind is ChangeType.MODEL_CHANGE and not (
        isinstance(action.new_value, str) and action.new_value.strip()
    ):
        concerns.append(f"model {action.new_value!r} is not a model name")
    if kind is ChangeType.PROMPT_MODIFICATION:
        concerns.extend(_prompt_concerns(proposed))

    if concerns:
        return _reject(concerns + widening)
    if widening:
        return SupervisorReview(
            approved=True,
            risk="high",
            concerns=widening,
            reason=(
                "widens what the agent may do; approved only because the role gate before me "
                "checked that the invoking principal may grant it: a human should look at it"
            ),
        )
    risk: Literal["low", "medium"] = "low" if kind in _LOW_RISK else "medium"
    if kind is ChangeType.DOCS_EDIT and action.new_value is None:
        risk = "medium"  # deleting a document
    return SupervisorReview(
        approved=True,
        risk=risk,
        reason=f"{kind.value} of {action.target_agent}"
        + (f".{action.target_field}" if action.target_field else "")
        + ": in scope, values within limits, no permission widening, no injected instructions",
    )


def _prompt_concerns(change: _ProposedChange) -> list[str]:
    action = change.action
    value = action.new_value
    if isinstance(value, Mapping) and not (
        set(value) == {"append"} and isinstance(value["append"], str) and value["append"].strip()
    ):
        return ["a prompt change must be the new text or {'append': <non-empty text>}"]
    old = (change.old_config or {}).get("system_prompt")
    if not isinstance(old, str):
        old = action.old_value if isinstance(action.old_value, str) else None
    new = (change.new_config or {}).get("system_prompt")
    if not isinstance(new, str):
        if isinstance(value, str):
            new = value
        elif isinstance(value, Mapping) and old:
            new = f"{old}\n\n{value['append']}"
    if new is None:
        return []
    if not new.strip():
        return ["the new system prompt is empty"]
    if old and len(new.strip()) * 2 < len(old.strip()):
        return [
            f"removes more than half of the prompt ({len(old.strip())} -> {len(new.strip())} "
            "characters)"
        ]
    return []


def _reject(concerns: list[str]) -> SupervisorReview:
    return SupervisorReview(approved=False, risk="high", reason=concerns[0], concerns=concerns)


async def supervisor_policy(call: OfflineCall) -> SupervisorReview:
    """Review the change in the ``<proposed_change>`` block of the prompt."""
    try:
        block = extract_block(call.prompt, "proposed_change")
    except PromptBlockError as exc:
        review = _reject([f"nothing to review: {exc}"])
    else:
        review = (
            review_change(block)
            if isinstance(block, Mapping)
            else _reject(["the <proposed_change> block is not a JSON object"])
        )
    log.debug("supervisor_playbook_reviewed", approved=review.approved, reason=review.reason)
    return review
