"""Effectors: an ``ImprovementAction`` turned into the exact bytes it would write.

``plan_change`` is the one place that knows how each ``ChangeType`` maps onto an agent's
definition file (or its ``docs/`` folder). It writes nothing: it returns a ``ProposedChange``
holding the old and new bytes of every file, the agent before and after, and a unified diff, so
the gates, the supervisor and a human judge the concrete change, and the ``ImprovementManager``
applies (and can undo) exactly what was judged. Going through ``AgentSpec.with_changes`` and
``to_markdown`` means only the changed lines of a definition change, and the new file is proven
to load back before anyone sees it.

Mapping (``action_type``: ``target_field`` -> ``new_value``):

- PROMPT_MODIFICATION: ``system_prompt`` (or None) -> the new prompt text, or
  ``{"append": "text"}`` to add a paragraph at the end.
- PARAMETER_ADJUSTMENT: ``temperature`` | ``max_tokens`` | ``timeout_s`` | ``max_turns``
  (``maxTurns`` too) -> a number (a numeric string or a whole float is accepted for an integer).
- TOOL_PERMISSION_CHANGE: ``tools`` -> the new list, ``{"add": [...]}`` and/or
  ``{"remove": [...]}``; or ``permission_profile`` -> ``locked`` | ``standard`` | ``open`` |
  ``{"allow": [...], "deny": [...]}``.
- MODEL_CHANGE: ``model`` (or None) -> a name in ``available_models``.
- DOCS_EDIT: ``docs/<relative path>`` -> the file's text; None deletes it.
- AGENT_CREATION: the full Markdown definition (``<root>/<name>.md``; the name must be new).
- AGENT_DELETION: removes the agent's definition file (its docs and eval suite stay).
- CODE_PATCH is not an agent-definition change and is refused here.

Every refusal is an ``InvalidChange`` naming the agent, the field and what was wrong; a change
that would change nothing is refused too, so a no-op never reaches verification.
"""

from __future__ import annotations

import difflib
import math
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentmend.infrastructure.changes.proposal import FileEdit, ProposedChange
from agentmend.infrastructure.definitions.spec import (
    CLAUDE_CODE_KEYS,
    AgentSpec,
    PermissionProfile,
    SpecWarning,
)
from agentmend.infrastructure.errors import (
    AgentmendError,
    FileOperationError,
    PathNotAllowed,
    SpecError,
)
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.atomic import resolve_inside
from agentmend.infrastructure.frozen import freeze
from agentmend.infrastructure.models import ChangeType, ImprovementAction
from agentmend.infrastructure.structured_logger import get_logger

__all__ = [
    "PARAMETER_FIELDS",
    "InvalidChange",
    "group_entries",
    "plan_change",
]

log = get_logger(__name__)

PARAMETER_FIELDS: Mapping[str, str] = {
    "temperature": "temperature",
    "max_tokens": "max_tokens",
    "timeout_s": "timeout_s",
    "max_turns": "max_turns",
    "maxTurns": "max_turns",
}
"""``target_field`` names a PARAMETER_ADJUSTMENT accepts -> the AgentSpec field they set."""

_INT_FIELDS = frozenset({"max_tokens", "max_turns"})
_DOCS_PREFIX = "docs/"


class InvalidChange(AgentmendError):
    """An action that cannot become a change: names the agent, the field and the problem."""

    def __init__(self, agent: str, field: str | None, problem: str) -> None:
        self.agent = agent
        self.field = field
        self.problem = problem
        where = f"agent {agent!r}" + (f", field {field!r}" if field else "")
        super().__init__(f"cannot change {where}: {problem}")


@dataclass(frozen=True, slots=True)
class _Context:
    action: ImprovementAction
    root: Path
    specs: Mapping[str, AgentSpec]
    available_models: Collection[str]

    @property
    def agent(self) -> str:
        return self.action.target_agent

    def fail(self, field: str | None, problem: str) -> InvalidChange:
        return InvalidChange(self.agent, field, problem)


@dataclass(frozen=True, slots=True)
class _Current:
    """The agent as it is on disk now: spec, definition path relative to root, file bytes."""

    spec: AgentSpec
    rel: str
    data: bytes


def plan_change(
    action: ImprovementAction,
    *,
    root: str | Path,
    specs: Mapping[str, AgentSpec],
    available_models: Collection[str],
) -> ProposedChange:
    """The concrete change ``action`` asks for, with ``old_value`` filled in; writes nothing.

    Args:
        action: what to change (see the module docstring for each type's fields and values).
        root: the team's definition directory; every path of the change lies inside it.
        specs: the team's agents as loaded from ``root`` (``load_agent_specs``).
        available_models: the model names a model change (or a new agent) may use.

    Raises:
        InvalidChange: unknown agent or field, an invalid value, a model not available, a docs
            path leaving the agent's ``docs/``, a definition that changed on disk since it was
            loaded, a change that changes nothing, or a CODE_PATCH.
    """
    root_path = Path(root).resolve()
    ctx = _Context(action, root_path, specs, available_models)
    if not root_path.is_dir():
        raise ctx.fail(None, f"the team directory {root_path} does not exist")
    planner = _PLANNERS.get(action.action_type)
    if planner is None:
        raise ctx.fail(
            action.target_field,
            f"{action.action_type.value} is not an agent-definition change; "
            "code patches go through the code-update path",
        )
    if action.action_type is not ChangeType.AGENT_CREATION and action.target_agent not in specs:
        raise _unknown_agent(ctx)
    change = planner(ctx)
    log.debug(
        "planned_change",
        agent=action.target_agent,
        action_type=action.action_type.value,
        field=change.metadata.get("field"),
        paths=[edit.path for edit in change.edits],
    )
    return change


def group_entries(change: ProposedChange) -> list[tuple[ImprovementAction, str, bytes | None]]:
    """``(action, path, new_content)`` per edit: what ``ImprovementManager.apply_group`` takes."""
    return [(change.action, edit.path, edit.new_content) for edit in change.edits]


# -- the current agent ---------------------------------------------------------------------


def _current(ctx: _Context) -> _Current:
    spec = ctx.specs.get(ctx.agent)
    if spec is None:
        raise _unknown_agent(ctx)
    rel = _definition_path(ctx, spec)
    try:
        data = confined.read(ctx.root, rel)
    except (PathNotAllowed, FileOperationError) as exc:
        raise ctx.fail(None, f"cannot read {rel}: {exc}") from None
    if data is None:
        raise ctx.fail(None, f"its definition file {rel} does not exist")
    try:
        loaded = spec.to_markdown().encode("utf-8")
    except SpecError as exc:
        raise ctx.fail(exc.field, exc.problem) from None
    if loaded != data:
        # planning on a stale view would record a wrong old value and overwrite someone's edit
        raise ctx.fail(None, f"{rel} changed on disk since it was loaded; reload and plan again")
    return _Current(spec, rel, data)


def _unknown_agent(ctx: _Context) -> InvalidChange:
    known = ", ".join(sorted(ctx.specs)) or "(none)"
    return ctx.fail(None, f"unknown agent; known agents: {known}")


def _definition_path(ctx: _Context, spec: AgentSpec) -> str:
    if spec.source_path is None:
        return f"{spec.path_name}.md"
    try:
        target = resolve_inside(ctx.root, Path(spec.source_path).absolute(), allow_absolute=True)
    except PathNotAllowed as exc:
        raise ctx.fail(None, f"its definition lies outside the team directory: {exc}") from None
    return target.relative_to(ctx.root).as_posix()


def _changed(
    ctx: _Context, current: _Current, field: str, old_value: Any, **changes: Any
) -> ProposedChange:
    """The change that sets ``changes`` on the current spec and rewrites its definition."""
    try:
        new_spec = current.spec.with_changes(**changes)
        new_data = new_spec.to_markdown().encode("utf-8")
    except SpecError as exc:
        raise ctx.fail(field, exc.problem) from None
    if new_spec == current.spec:
        raise ctx.fail(field, "the new value is the current one; the change would change nothing")
    edit = FileEdit(current.rel, current.data, new_data)
    return _proposed(ctx, field, old_value, (edit,), current.spec, new_spec)


def _proposed(
    ctx: _Context,
    field: str | None,
    old_value: Any,
    edits: tuple[FileEdit, ...],
    old_spec: AgentSpec | None,
    new_spec: AgentSpec | None,
) -> ProposedChange:
    action = ctx.action.model_copy(update={"old_value": freeze(old_value)})
    return ProposedChange(
        action=action,
        root=ctx.root,
        edits=edits,
        old_spec=old_spec,
        new_spec=new_spec,
        diff="".join(_diff(edit) for edit in edits),
        metadata={"field": field, "paths": [edit.path for edit in edits]},
    )


def _diff(edit: FileEdit) -> str:
    old = _text(edit.old_content).splitlines(keepends=True)
    new = _text(edit.new_content).splitlines(keepends=True)
    before = f"a/{edit.path}" if edit.old_content is not None else "/dev/null"
    after = f"b/{edit.path}" if edit.new_content is not None else "/dev/null"
    lines = list(difflib.unified_diff(old, new, before, after))
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


def _field(ctx: _Context, allowed: Sequence[str], default: str | None) -> str:
    field = ctx.action.target_field
    if field is None and default is not None:
        return default
    if field is None or field not in allowed:
        kind = ctx.action.action_type.value
        raise ctx.fail(field, f"{kind} supports target_field {' | '.join(allowed)}")
    return field


# -- one planner per change type -----------------------------------------------------------


def _plan_prompt(ctx: _Context) -> ProposedChange:
    field = _field(ctx, ("system_prompt",), "system_prompt")
    current = _current(ctx)
    old = current.spec.system_prompt
    value = ctx.action.new_value
    if isinstance(value, Mapping):
        if set(value) != {"append"} or not isinstance(value["append"], str):
            raise ctx.fail(field, 'give the new prompt text or {"append": "text"}')
        addition = value["append"].strip()
        if not addition:
            raise ctx.fail(field, "the text to append is empty")
        new = f"{old}\n\n{addition}" if old else addition
    elif isinstance(value, str):
        new = value
    else:
        raise ctx.fail(field, f'give the new prompt text or {{"append": "text"}}, got {value!r}')
    if not new.strip():
        raise ctx.fail(field, "the system prompt must not be empty")
    return _changed(ctx, current, field, old, system_prompt=new)


def _plan_parameter(ctx: _Context) -> ProposedChange:
    field = _field(ctx, tuple(PARAMETER_FIELDS), None)
    name = PARAMETER_FIELDS[field]
    current = _current(ctx)
    value = _number(ctx, field, ctx.action.new_value, integer=name in _INT_FIELDS)
    return _changed(ctx, current, field, getattr(current.spec, name), **{name: value})


def _number(ctx: _Context, field: str, value: Any, *, integer: bool) -> int | float:
    """A model may say ``"4096"`` or ``4096.0``; anything else not a number is refused."""
    kind = "an integer" if integer else "a number"
    number: int | float
    if isinstance(value, bool) or value is None:
        raise ctx.fail(field, f"the new value must be {kind}, got {value!r}")
    if isinstance(value, int | float):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ctx.fail(field, f"the new value must be {kind}, got {value!r}") from None
    else:
        raise ctx.fail(field, f"the new value must be {kind}, got {value!r}")
    if not math.isfinite(number):
        raise ctx.fail(field, f"the new value must be a finite number, got {value!r}")
    if integer:
        if isinstance(number, float) and not number.is_integer():
            raise ctx.fail(field, f"the new value must be {kind}, got {value!r}")
        return int(number)
    return float(number)


def _plan_tools(ctx: _Context) -> ProposedChange:
    field = _field(ctx, ("tools", "permission_profile"), None)
    current = _current(ctx)
    if field == "permission_profile":
        old_profile = current.spec.permission_profile
        profile = _profile(ctx, field, ctx.action.new_value)
        return _changed(ctx, current, field, _plain(old_profile), permission_profile=profile)
    old_tools = current.spec.tools
    tools = _tool_list(ctx, field, old_tools, ctx.action.new_value)
    return _changed(ctx, current, field, _plain(old_tools), tools=tools)


def _profile(ctx: _Context, field: str, value: Any) -> str | PermissionProfile:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"allow", "deny"})
        if unknown:
            raise ctx.fail(field, f"a custom profile has only allow and deny, not {unknown[0]!r}")
        try:
            return PermissionProfile.model_validate(dict(value))
        except ValidationError as exc:
            raise ctx.fail(field, f"invalid custom profile: {_first_error(exc)}") from None
    raise ctx.fail(
        field, f"give locked, standard, open or {{'allow': [...], 'deny': [...]}}, got {value!r}"
    )


def _tool_list(
    ctx: _Context, field: str, old: tuple[str, ...] | None, value: Any
) -> tuple[str, ...]:
    if isinstance(value, str | list | tuple):
        return _names(ctx, field, value)
    if not isinstance(value, Mapping) or not value or set(value) - {"add", "remove"}:
        raise ctx.fail(field, 'give the new tool list, {"add": [...]} or {"remove": [...]}')
    if old is None:
        raise ctx.fail(
            field,
            "the agent declares no tools (it is offered every tool); give the full list instead",
        )
    tools = list(old)
    for name in _names(ctx, field, value.get("remove", ())):
        if name not in tools:
            raise ctx.fail(field, f"cannot remove {name!r}: the agent does not declare it")
        tools.remove(name)
    tools.extend(name for name in _names(ctx, field, value.get("add", ())) if name not in tools)
    return tuple(tools)


def _names(ctx: _Context, field: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, list | tuple) or not all(
        isinstance(item, str) and item.strip() for item in value
    ):
        raise ctx.fail(field, f"tool names must be a list of non-empty strings, got {value!r}")
    return tuple(item.strip() for item in value)


def _plan_model(ctx: _Context) -> ProposedChange:
    field = _field(ctx, ("model",), "model")
    current = _current(ctx)
    value = ctx.action.new_value
    if not isinstance(value, str) or not value.strip():
        raise ctx.fail(field, f"the new model must be a non-empty name, got {value!r}")
    model = value.strip()
    _check_model(ctx, field, model)
    return _changed(ctx, current, field, current.spec.model, model=model)


def _check_model(ctx: _Context, field: str, model: str) -> None:
    if model not in ctx.available_models:
        available = ", ".join(sorted(ctx.available_models)) or "(none)"
        raise ctx.fail(field, f"model {model!r} is not available; available models: {available}")


def _plan_docs(ctx: _Context) -> ProposedChange:
    field = ctx.action.target_field or ""
    if not field.startswith(_DOCS_PREFIX) or not field[len(_DOCS_PREFIX) :].strip("/"):
        raise ctx.fail(field or None, "docs_edit needs target_field 'docs/<relative path>'")
    relative = field[len(_DOCS_PREFIX) :]
    current = _current(ctx)
    name = current.spec.path_name
    definition_dir = (ctx.root / current.rel).parent
    docs_dir = definition_dir / name / "docs"
    try:
        target = resolve_inside(ctx.root, docs_dir.relative_to(ctx.root) / relative)
    except PathNotAllowed as exc:
        raise ctx.fail(field, f"path {relative!r} must stay inside {name}/docs/: {exc}") from None
    if docs_dir not in target.parents:
        raise ctx.fail(field, f"path {relative!r} resolves outside {name}/docs/ (a symlink)")
    doc_name = target.relative_to(docs_dir)
    if any(part.startswith(".") for part in doc_name.parts):
        raise ctx.fail(field, f"hidden file {relative!r} would never reach the agent's prompt")
    if target.is_dir():
        raise ctx.fail(field, f"{relative!r} is a directory, not a file")
    _check_not_an_eval_suite(ctx, field, target)
    try:
        old = confined.read(ctx.root, target.relative_to(ctx.root))
    except (PathNotAllowed, FileOperationError) as exc:
        raise ctx.fail(field, f"cannot read {relative!r}: {exc}") from None
    content = ctx.action.new_value
    if content is None:
        if old is None:
            raise ctx.fail(field, f"cannot delete {relative!r}: there is no such doc")
        new = None
    elif isinstance(content, str):
        if "\x00" in content:
            raise ctx.fail(field, "doc content must be text (it holds a NUL character)")
        new = content.encode("utf-8")
    else:
        raise ctx.fail(field, f"doc content must be text (or None to delete), got {content!r}")
    if new == old:
        raise ctx.fail(field, "the new content is the current one; the change would change nothing")
    key = f"docs/{doc_name.as_posix()}"
    docs = dict(current.spec.docs)
    if content is None:
        docs.pop(key, None)
    else:
        docs[key] = content
    try:
        new_spec = current.spec.with_changes(docs=tuple(sorted(docs.items())))
    except SpecError as exc:
        raise ctx.fail(field, exc.problem) from None
    rel = target.relative_to(ctx.root).as_posix()
    old_value = None if old is None else old.decode("utf-8", errors="replace")
    return _proposed(ctx, field, old_value, (FileEdit(rel, old, new),), current.spec, new_spec)


def _check_not_an_eval_suite(ctx: _Context, field: str, target: Path) -> None:
    """A doc must not be any agent's eval suite: a change must not edit its own exam."""
    for spec in ctx.specs.values():
        suite = spec.evals_path
        if suite is not None and Path(suite).absolute().resolve() == target:
            raise ctx.fail(field, f"{target.name} is the eval suite of agent {spec.name!r}")


def _plan_creation(ctx: _Context) -> ProposedChange:
    text = ctx.action.new_value
    if not isinstance(text, str) or not text.strip():
        raise ctx.fail(None, "agent_creation needs the full Markdown definition as new_value")
    with warnings.catch_warnings():
        # unknown keys are refused below, with a clearer message than the warning's
        warnings.simplefilter("ignore", SpecWarning)
        try:
            spec = AgentSpec.from_markdown(text)
        except SpecError as exc:
            raise ctx.fail(exc.field, f"invalid definition: {exc.problem}") from None
    unknown = sorted(set(spec.extra) - CLAUDE_CODE_KEYS)
    if unknown:
        # a key nobody reads is at best a typo and at worst a smuggled setting
        raise ctx.fail(unknown[0], "invalid definition: not a Claude Code or agentmend key")
    if spec.name != ctx.agent:
        raise ctx.fail("name", f"the definition is named {spec.name!r}, not {ctx.agent!r}")
    if spec.name in ctx.specs:
        raise ctx.fail("name", "an agent of that name already exists")
    if spec.model is not None:
        _check_model(ctx, "model", spec.model)
    rel = f"{spec.path_name}.md"
    try:
        target = resolve_inside(ctx.root, rel)
    except PathNotAllowed as exc:
        raise ctx.fail("name", str(exc)) from None
    literal = ctx.root / rel
    if literal.exists() or literal.is_symlink():
        raise ctx.fail("name", f"{rel} already exists")
    new_spec = spec.with_changes(source_path=target)
    edit = FileEdit(rel, None, text.encode("utf-8"))
    return _proposed(ctx, None, None, (edit,), None, new_spec)


def _plan_deletion(ctx: _Context) -> ProposedChange:
    current = _current(ctx)
    edit = FileEdit(current.rel, current.data, None)
    old_value = current.data.decode("utf-8", errors="replace")
    return _proposed(ctx, None, old_value, (edit,), current.spec, None)


def _plain(value: Any) -> Any:
    """A field's value as JSON-friendly data, for ``old_value`` in the history and audit."""
    if isinstance(value, PermissionProfile):
        return {"allow": list(value.allow), "deny": list(value.deny)}
    if isinstance(value, tuple):
        return list(value)
    return value


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    return f"{location}: {first['msg']}" if location else first["msg"]


_PLANNERS: dict[ChangeType, Callable[[_Context], ProposedChange]] = {
    ChangeType.PROMPT_MODIFICATION: _plan_prompt,
    ChangeType.PARAMETER_ADJUSTMENT: _plan_parameter,
    ChangeType.TOOL_PERMISSION_CHANGE: _plan_tools,
    ChangeType.MODEL_CHANGE: _plan_model,
    ChangeType.DOCS_EDIT: _plan_docs,
    ChangeType.AGENT_CREATION: _plan_creation,
    ChangeType.AGENT_DELETION: _plan_deletion,
}
