"""Self-edit operations as tools an agent can call in its own tool loop.

An agent may change its own system prompt, its docs, its permission profile and its model. The
tools only turn the call into an ``ImprovementAction`` for the calling agent and hand it to
``apply``; they write nothing themselves.

The production path is ``MetaOrchestrator.self_edit_tools(agent_name)``, which binds ``apply``
to ``MetaOrchestrator.apply_self_edit``: the action is planned by the effector, the agent's eval
suite (else the sample query) runs on its current definition, every gate judges the change in
order with each verdict recorded, the manager applies it (history, backup, audit row with the
old and new value and the invoking user), the suite runs again, and the change is kept or rolled
back byte for byte, all recorded in the store as a cycle. Through that binding a self-edit meets
exactly the gates and the verification any other change meets. In particular the role gate
judges it by the *invoking principal's* rights (the orchestrator's principal), never by the
agent's: an agent cannot escalate beyond the user it works for.

``self_edit_tools(agent_name, apply)`` itself guarantees only what it does: build the action and
report ``apply``'s answer or refusal. Whatever ``apply`` is given decides which gates run; one
that skips them (a test double, say) skips them.

The agent does not say how sure it is: the tools take no ``confidence``, and a ``confidence``
argument is refused by the input schema (and ignored if a runtime passes raw arguments on). A
self-edit has no analysis behind it, so there is nothing its confidence could honestly measure;
it carries a fixed, neutral one, the confidence gate's own threshold
(``settings.min_confidence`` with the default gates), set by whoever binds the tools
(``MetaOrchestrator`` does, and ``apply_self_edit`` sets it again on any action it is given).
The confidence gate therefore neither refuses nor favours a self-edit; the role, supervisor and
human gates and the verification on the agent's eval suite are what decide.

Each call has a permission action string (``tool:self_edit:system_prompt``,
``tool:self_edit:docs <path>``, ``tool:self_edit:permissions <profile>``,
``tool:self_edit:model <model>``), computed from its arguments by ``permission_action_for``;
``ToolSpec.permission_action`` holds the argument-free prefix. Pass ``authorize`` to check the
string before anything is proposed. Any refusal (authorization, an invalid change, a gate, a
failed verification) reaches the model as a tool error naming the reason, and what stays on
disk is what was there before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentmend.infrastructure.errors import AgentmendError, ConfigurationError
from agentmend.infrastructure.llm.base import ToolError, ToolSpec
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.settings import Settings
from agentmend.loop.cycle import CycleResult

__all__ = [
    "SELF_EDIT_TOOL_NAMES",
    "ApplyAction",
    "Authorize",
    "CustomProfileInput",
    "SelfEditDocsInput",
    "SelfEditModelInput",
    "SelfEditNotKept",
    "SelfEditPermissionsInput",
    "SelfEditSystemPromptInput",
    "permission_action_for",
    "self_edit_tools",
    "verified_apply",
]

ApplyAction = Callable[[ImprovementAction], Awaitable[str]]
"""Makes one action (in production ``MetaOrchestrator.apply_self_edit``: plan, gates, apply,
verify, keep or roll back); returns a message for the model. It raises an ``AgentmendError``
(``SelfEditNotKept``, ``InvalidChange``, ``ChangeRefused``, ...) when the edit is not made."""

VerifiedEdit = Callable[[ImprovementAction], Awaitable[CycleResult]]
"""``MetaOrchestrator.apply_self_edit``: one action through plan, gates, apply and verification."""

Authorize = Callable[[str], bool]
"""Whether a permission action string (``tool:self_edit:model claude-haiku-4-5``) is allowed."""

SELF_EDIT_TOOL_NAMES = (
    "self_edit_system_prompt",
    "self_edit_docs",
    "self_edit_permissions",
    "self_edit_model",
)

_PREFIX = "tool:self_edit:"
_DOCS = "docs/"
NEUTRAL_CONFIDENCE: float = Settings.model_fields["min_confidence"].default
"""A self-edit's confidence when the caller sets none: the default ``min_confidence``."""


class _SelfEditInput(BaseModel):
    # no confidence field: a self-edit's confidence is not the agent's to set (module docstring)
    model_config = ConfigDict(extra="forbid")

    rationale: str = Field(default="", description="Why you make this change (kept in history).")


class SelfEditSystemPromptInput(_SelfEditInput):
    new_prompt: str = Field(
        min_length=1, description="Your complete new system prompt (replaces the current one)."
    )

    @field_validator("new_prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the new system prompt must not be empty")
        return value


class SelfEditDocsInput(_SelfEditInput):
    path: str = Field(
        min_length=1,
        description="File path inside your docs folder, e.g. 'notes/style.md' "
        "(the 'docs/' prefix shown in <agent_docs> may be included).",
    )
    content: str = Field(description="The file's complete new content.")


class CustomProfileInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allow: list[str] = Field(default_factory=list, description="Tool name patterns allowed.")
    deny: list[str] = Field(default_factory=list, description="Tool name patterns denied.")


class SelfEditPermissionsInput(_SelfEditInput):
    profile: Literal["locked", "standard", "open"] | CustomProfileInput = Field(
        description="locked (no tools), standard (declared tools, no shell or file writes), "
        "open (any tool; needs an admin), or a custom {allow, deny} profile (needs an admin)."
    )


class SelfEditModelInput(_SelfEditInput):
    model: str = Field(min_length=1, description="The model to switch to (an available one).")


def _docs_path(path: str) -> str:
    """The path relative to the docs folder (the ``docs/`` shown in the prompt is dropped)."""
    return path[len(_DOCS) :] if path.startswith(_DOCS) else path


class SelfEditNotKept(AgentmendError):
    """A self-edit that was not kept: refused, invalid, not needed, or rolled back.

    Attributes:
        result: the recorded cycle of the self-edit (``status`` says which).
    """

    def __init__(self, result: CycleResult) -> None:
        self.result = result
        outcome = result.outcomes[0] if result.outcomes else None
        refusal = outcome.refused_by if outcome is not None else None
        if refusal is not None:
            message = f"refused by the {refusal.gate} gate: {refusal.reason}"
        elif result.status == "rolled_back":
            message = f"applied, then rolled back: {result.rollback_reason or result.error}"
        elif result.status == "rollback_blocked":
            message = (
                f"applied, then not kept ({result.rollback_reason or result.error}); the "
                f"rollback left {', '.join(result.rollback_blocked)} as edited since"
            )
        else:
            message = f"self-edit not applied ({result.status}): {result.error}"
        super().__init__(message)


def verified_apply(edit: VerifiedEdit) -> ApplyAction:
    """The ``apply`` for a gated and verified path: a kept edit's answer for the model is its
    change ids and verdict, a watched one's (an agent without an eval suite) says it is live and
    judged on the agent's next runs; anything else raises ``SelfEditNotKept`` (a tool error)."""

    async def apply(action: ImprovementAction) -> str:
        result = await edit(action)
        if result.status == "watching" and result.watch is not None:
            return (
                f"applied change {', '.join(result.change_ids)} to {action.target_agent}'s "
                f"{action.target_field}; with no eval suite it is watched on your live runs: "
                "rolled back as soon as they show it hurts, kept only once they show it helps"
            )
        if result.status != "kept":
            raise SelfEditNotKept(result)
        verdict = result.verification
        return (
            f"kept change {', '.join(result.change_ids)} to {action.target_agent}'s "
            f"{action.target_field}: {verdict.reason if verdict is not None else 'verified'}"
        )

    return apply


def permission_action_for(tool_name: str, arguments: Mapping[str, Any]) -> str:
    """The permission action string a gate checks for one call of a self-edit tool.

    Raises:
        ConfigurationError: an unknown tool, or an argument the string needs is missing.
    """

    def argument(key: str) -> Any:
        if key not in arguments:
            raise ConfigurationError(f"{tool_name}: missing argument {key!r}")
        return arguments[key]

    if tool_name == "self_edit_system_prompt":
        return f"{_PREFIX}system_prompt"
    if tool_name == "self_edit_docs":
        return f"{_PREFIX}docs {_docs_path(str(argument('path')))}"
    if tool_name == "self_edit_permissions":
        profile = argument("profile")
        label = "custom" if isinstance(profile, Mapping | BaseModel) else str(profile)
        return f"{_PREFIX}permissions {label}"
    if tool_name == "self_edit_model":
        return f"{_PREFIX}model {argument('model')}"
    known = ", ".join(SELF_EDIT_TOOL_NAMES)
    raise ConfigurationError(f"unknown self-edit tool {tool_name!r}; known: {known}")


def self_edit_tools(
    agent_name: str,
    apply: ApplyAction,
    *,
    authorize: Authorize | None = None,
    confidence: float = NEUTRAL_CONFIDENCE,
) -> list[ToolSpec]:
    """The four self-edit tools for ``agent_name``, in ``SELF_EDIT_TOOL_NAMES`` order.

    Args:
        agent_name: the agent the tools edit (always the caller: an agent edits only itself).
        apply: makes an action; see ``ApplyAction`` (``MetaOrchestrator.self_edit_tools``
            passes the gated and verified path).
        authorize: checks each call's permission action string first; a False refuses it.
        confidence: the confidence every action carries, whatever the agent sends: the
            confidence gate's threshold, so that gate neither refuses nor favours a self-edit
            (see the module docstring).
    """
    if not agent_name:
        raise ConfigurationError("self_edit_tools needs the agent's name")
    if not 0.0 <= confidence <= 1.0:
        raise ConfigurationError(f"confidence must be in [0, 1], got {confidence}")

    def action(
        arguments: Mapping[str, Any], kind: ChangeType, field: str, value: Any
    ) -> ImprovementAction:
        return ImprovementAction(
            target_agent=agent_name,
            action_type=kind,
            target_field=field,
            new_value=value,
            rationale=str(arguments.get("rationale") or "self-edit requested by the agent"),
            confidence_score=confidence,  # never the agent's: see the module docstring
        )

    build: dict[str, Callable[[Mapping[str, Any]], ImprovementAction]] = {
        "self_edit_system_prompt": lambda a: action(
            a, ChangeType.PROMPT_MODIFICATION, "system_prompt", a["new_prompt"]
        ),
        "self_edit_docs": lambda a: action(
            a, ChangeType.DOCS_EDIT, _DOCS + _docs_path(a["path"]), a["content"]
        ),
        "self_edit_permissions": lambda a: action(
            a, ChangeType.TOOL_PERMISSION_CHANGE, "permission_profile", a["profile"]
        ),
        "self_edit_model": lambda a: action(a, ChangeType.MODEL_CHANGE, "model", a["model"]),
    }

    def handler(tool_name: str) -> Callable[[dict[str, Any]], Awaitable[str]]:
        async def handle(arguments: dict[str, Any]) -> str:
            permission = permission_action_for(tool_name, arguments)
            if authorize is not None and not authorize(permission):
                raise ToolError(f"permission denied: {permission}")
            try:
                return await apply(build[tool_name](arguments))
            except AgentmendError as exc:
                raise ToolError(str(exc)) from exc

        return handle

    descriptions: dict[str, tuple[type[BaseModel], str]] = {
        "self_edit_system_prompt": (
            SelfEditSystemPromptInput,
            "Replace your own system prompt. Takes effect on your next run.",
        ),
        "self_edit_docs": (
            SelfEditDocsInput,
            "Create or update a file in your docs folder (appended to your prompt inside "
            "<agent_docs>). Folders are created as needed; paths cannot leave the docs folder.",
        ),
        "self_edit_permissions": (
            SelfEditPermissionsInput,
            "Change your permission profile. Anyone may set locked or standard; open and custom "
            "profiles need the invoking user to be an admin.",
        ),
        "self_edit_model": (
            SelfEditModelInput,
            "Switch the model you run on; it must be one of the available models.",
        ),
    }
    return [
        ToolSpec(
            name=name,
            description=descriptions[name][1],
            handler=handler(name),
            input_model=descriptions[name][0],
            permission_action=_PREFIX + name.removeprefix("self_edit_"),
        )
        for name in SELF_EDIT_TOOL_NAMES
    ]
