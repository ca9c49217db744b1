"""Agent definitions as files: Claude Code subagent Markdown, extended under one key.

An agent is the Markdown file Claude Code reads from ``.claude/agents/<name>.md``: YAML front
matter (``name``, ``description``, ``tools``, ``model``, ``maxTurns``, ...) and the system prompt
as the body, so the claude-agent-sdk can load it with no translation. agentmend's own settings
live under a single ``agentmend:`` mapping so they can never collide with a key Claude Code
adds later. The file is the source of truth and people review its diffs, so saving a changed
spec rewrites only the lines of what changed (see
``agentmend.infrastructure.definitions.frontmatter``), and saving an unchanged one writes back the
very bytes it was read from. Files are read as Claude Code reads them: front matter that is not
strict YAML goes through Claude Code's own repair, and names follow its rule
(``agentmend.infrastructure.definitions.names``).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from agentmend.infrastructure.definitions.docs import read_agent_docs, with_agent_docs
from agentmend.infrastructure.definitions.frontmatter import (
    Document,
    Edit,
    FrontMatterError,
    apply_edits,
    apply_edits_to_mapping,
    dump_mapping,
    parse_front,
    render_document,
    replace_body,
    split_document,
)
from agentmend.infrastructure.definitions.names import name_problem, path_name
from agentmend.infrastructure.errors import (
    FileOperationError,
    FileTooLarge,
    PathNotAllowed,
    SpecError,
)
from agentmend.infrastructure.files import confined
from agentmend.infrastructure.files.atomic import atomic_write
from agentmend.infrastructure.frozen import FrozenDict, thaw
from agentmend.infrastructure.settings import DEFAULT_MAX_FILE_BYTES
from agentmend.infrastructure.structured_logger import get_logger

if TYPE_CHECKING:
    from claude_agent_sdk import AgentDefinition

__all__ = [
    "AGENTMEND_KEYS",
    "CLAUDE_CODE_KEYS",
    "AgentSpec",
    "PermissionProfile",
    "ProfileName",
    "SpecWarning",
    "load_agent_specs",
]

log = get_logger(__name__)

ProfileName = Literal["locked", "standard", "open"]

AGENTMEND_KEYS = ("temperature", "max_tokens", "timeout_s", "permission_profile", "evals")
"""The keys allowed inside the ``agentmend:`` mapping, which are also the field names."""

# typed fields that are top-level front matter keys: python name -> key in the file
_TOP_KEYS = {
    "name": "name",
    "description": "description",
    "tools": "tools",
    "model": "model",
    "max_turns": "maxTurns",
}
_FILE_FIELDS = (*_TOP_KEYS, *AGENTMEND_KEYS, "system_prompt", "extra")
_RESERVED = frozenset({*_TOP_KEYS.values(), "agentmend"})


class SpecWarning(UserWarning):
    """A definition that loads but has something odd about it (an unknown top-level key)."""


def _names(value: Any) -> Any:
    """Claude Code accepts a tool list or a comma-separated string; both become a tuple."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list | tuple):
        for item in value:
            if not isinstance(item, str) or not item.strip():
                raise ValueError(f"every entry must be a non-empty string, got {item!r}")
        return tuple(value)
    return value


class PermissionProfile(BaseModel):
    """A custom permission profile: the tool patterns an agent may and may not use."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    _as_tuple = field_validator("allow", "deny", mode="before")(_names)


class _ClaudeCodeKeys(BaseModel):
    """Claude Code's other subagent keys, type-checked so the SDK is never handed junk."""

    model_config = ConfigDict(extra="allow", strict=True)

    disallowedTools: list[str] | str | None = None
    skills: list[str] | str | None = None
    memory: Literal["user", "project", "local"] | None = None
    mcpServers: list[str | dict[str, Any]] | None = None
    initialPrompt: str | None = None
    background: bool | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | int | None = None
    permissionMode: (
        Literal["default", "acceptEdits", "plan", "bypassPermissions", "dontAsk", "auto"] | None
    ) = None
    hooks: dict[str, Any] | None = None
    autoCompactWindow: int | None = None
    omitClaudeMd: bool | None = None
    isolation: str | None = None
    color: str | None = None


CLAUDE_CODE_KEYS = frozenset({*_TOP_KEYS.values(), *_ClaudeCodeKeys.model_fields})
"""Front matter keys Claude Code reads for a subagent (from the bundled CLI's schema)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Origin:
    """The file a spec was read from, so a save can change only what changed."""

    text: str
    document: Document
    raw: dict[str, Any]
    fields: dict[str, Any]
    lenient: bool  # the front matter loads only through Claude Code's repair


class AgentSpec(BaseModel):
    """One agent's definition, as loaded from (and saved to) its Markdown file.

    Equality compares the fields only; the remembered source text is not part of it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str
    description: str = Field(min_length=1)
    tools: tuple[str, ...] | None = None
    model: str | None = Field(default=None, min_length=1)
    max_turns: int | None = Field(default=None, gt=0)
    system_prompt: str = ""
    temperature: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    max_tokens: int | None = Field(default=None, gt=0)
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    permission_profile: ProfileName | PermissionProfile = "standard"
    evals: str | None = Field(default=None, min_length=1)
    extra: FrozenDict[str, Any] = Field(default_factory=FrozenDict)
    docs: tuple[tuple[str, str], ...] = ()
    source_path: Path | None = Field(default=None, strict=False)  # str or Path

    _origin: _Origin | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        problem = name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    _tools = field_validator("tools", mode="before")(_names)

    @field_validator("system_prompt", mode="before")
    @classmethod
    def _normalise_prompt(cls, value: Any) -> Any:
        # Claude Code trims the body; line breaks are the file's business, not the prompt's
        return value.replace("\r\n", "\n").strip() if isinstance(value, str) else value

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, value: FrozenDict[str, Any]) -> FrozenDict[str, Any]:
        clash = sorted(_RESERVED & set(value))
        if clash:
            raise ValueError(f"{clash[0]!r} is a typed field, not an extra key")
        _ClaudeCodeKeys.model_validate(thaw(value))
        return value

    @field_validator("docs", mode="before")
    @classmethod
    def _docs_as_tuples(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return tuple(tuple(item) if isinstance(item, list) else item for item in value)
        return value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AgentSpec):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    @property
    def full_system_prompt(self) -> str:
        """The system prompt with the agent's docs appended inside ``<agent_docs>``."""
        return with_agent_docs(self.system_prompt, self.docs)

    @property
    def path_name(self) -> str:
        """The name as used in file names (``<path_name>.md``, ``<path_name>/docs/``)."""
        return path_name(self.name)

    @property
    def evals_path(self) -> Path | None:
        """``evals`` resolved against the definition file's directory."""
        if self.evals is None:
            return None
        base = self.source_path.parent if self.source_path is not None else Path()
        return base / self.evals

    @classmethod
    def from_file(cls, path: str | Path) -> AgentSpec:
        """Load a definition file, with its ``<dir>/<name>/docs/`` folder if it has one.

        Only a regular file is read (checked on the opened descriptor, opened non-blocking, so
        a FIFO never hangs the load); a symlinked definition is read where it points.

        Raises:
            SpecError: the file cannot be read (missing, a loop, not a regular file, over
                ``Settings.max_file_bytes``), is not UTF-8, or does not validate.
        """
        try:
            real = Path(path).resolve()
        except (RuntimeError, OSError):  # Python 3.11 reports a symlink loop as RuntimeError
            raise SpecError(path, None, "cannot read the file: a symlink loop") from None
        try:
            data = confined.read(real.parent, real.name, max_bytes=DEFAULT_MAX_FILE_BYTES)
        except PathNotAllowed as exc:
            raise SpecError(path, None, f"cannot read the file: {exc.problem}") from None
        except (FileOperationError, FileTooLarge) as exc:
            raise SpecError(path, None, f"cannot read the file: {exc}") from None
        if data is None:
            raise SpecError(path, None, "cannot read the file: No such file or directory")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError(path, None, f"not UTF-8 text ({exc.reason})") from None
        return cls.from_markdown(text, path)

    @classmethod
    def from_markdown(cls, text: str, path: str | Path | None = None) -> AgentSpec:
        """Parse definition text; ``path`` names it in errors and locates its ``docs/``."""
        spec, unknown = _parse(text, path, load_docs=path is not None)
        for key in unknown:
            warnings.warn(
                f"{path or '<agent spec>'}: unknown front matter key {key!r} kept as it is",
                SpecWarning,
                stacklevel=2,
            )
        return spec

    def with_changes(self, **changes: Any) -> AgentSpec:
        """A validated copy with ``changes`` (python field names); saving it stays surgical."""
        unknown = sorted(set(changes) - set(type(self).model_fields))
        if unknown:
            raise SpecError(self.source_path, unknown[0], "not a field of AgentSpec")
        data = {name: getattr(self, name) for name in type(self).model_fields}
        data.update(changes)
        spec = _validate(data, self.source_path)
        spec._origin = self._origin
        return spec

    def to_markdown(self) -> str:
        """The file text: the original text with only the changed keys' lines (or body) redone."""
        origin = self._origin
        try:
            if origin is None:
                return self._checked(_render_fresh(self))
            edits = self._edits(origin)
            body_changed = self.system_prompt != origin.fields["system_prompt"]
            if not edits and not body_changed:
                return origin.text
            doc = origin.document
            body = replace_body(doc, self.system_prompt) if body_changed else doc.body
            closing = doc.closing
            if body and not closing.endswith("\n"):
                closing += doc.newline
            front = apply_edits(doc.front, edits, doc.newline, lenient=origin.lenient)
            if front is not None:
                text = doc.opening + "".join(front) + closing + body
                if self._matches(text):
                    return text
            mapping = apply_edits_to_mapping(origin.raw, edits)
            redumped = "".join(dump_mapping(mapping, doc.newline))
            return self._checked(doc.opening + redumped + closing + body)
        except yaml.YAMLError as exc:
            raise SpecError(self.source_path, None, f"cannot render as YAML: {exc}") from None

    def save(self, path: str | Path | None = None) -> Path:
        """Write ``to_markdown()`` atomically to ``path`` (default: where it was loaded from)."""
        target = Path(path) if path is not None else self.source_path
        if target is None:
            raise SpecError(None, None, "the spec has no source_path; pass the path to save to")
        atomic_write(target, self.to_markdown().encode("utf-8"))
        log.info("saved_agent_spec", agent=self.name, path=str(target))
        return target

    def to_agent_definition(self) -> AgentDefinition:
        """The claude-agent-sdk's ``AgentDefinition`` for this agent (docs included)."""
        from claude_agent_sdk import AgentDefinition

        # forward every extra key this SDK version's AgentDefinition knows
        accepted = {field.name for field in dataclasses.fields(AgentDefinition)}
        options: dict[str, Any] = {}
        for key, value in self.extra.items():
            if key in accepted and key in CLAUDE_CODE_KEYS:
                comma_list = key in ("disallowedTools", "skills") and isinstance(value, str)
                options[key] = list(_names(value)) if comma_list else thaw(value)
        return AgentDefinition(
            description=self.description,
            prompt=self.full_system_prompt,
            tools=list(self.tools) if self.tools is not None else None,
            model=self.model,
            maxTurns=self.max_turns,
            **options,
        )

    def _edits(self, origin: _Origin) -> list[Edit]:
        before = origin.fields
        edits: list[Edit] = []
        for field, key in _TOP_KEYS.items():
            if getattr(self, field) != before[field]:
                edits.append(_edit((key,), self._raw(field, origin)))
        for field in AGENTMEND_KEYS:
            if getattr(self, field) != before[field]:
                edits.append(_edit(("agentmend", field), self._raw(field, origin)))
        old, new = before["extra"], self.extra
        for key, value in new.items():
            if key not in old or not _same(old[key], value):
                edits.append(Edit((key,), thaw(value)))
        edits.extend(Edit((key,), delete=True) for key in old if key not in new)
        return edits

    def _raw(self, field: str, origin: _Origin | None) -> Any:
        """A field's value as it is written in the file."""
        value = getattr(self, field)
        if field == "tools" and value is not None:
            written = origin.raw.get("tools") if origin is not None else None
            if isinstance(written, str) and not any("," in tool for tool in value):
                # keep the author's comma-separated style, and their spacing after commas
                tight = "," in written and ", " not in written
                return ("," if tight else ", ").join(value)
            return list(value)
        if isinstance(value, PermissionProfile):
            return {"allow": list(value.allow), "deny": list(value.deny)}
        return value

    def _matches(self, text: str) -> bool:
        """Whether ``text`` loads back to this spec: the proof every written file must pass."""
        try:
            parsed, _ = _parse(text, None, load_docs=False)
        except SpecError:
            return False
        return _file_fields(parsed) == _file_fields(self)

    def _checked(self, text: str) -> str:
        if not self._matches(text):
            raise SpecError(self.source_path, None, "the rendered file would not load back")
        return text


def _edit(path: tuple[str, ...], value: Any) -> Edit:
    return Edit(path, delete=True) if value is None else Edit(path, value)


def _same(a: Any, b: Any) -> bool:
    # True == 1 in Python, but `true` and `1` are different things in a file
    return type(a) is type(b) and bool(a == b)


def _file_fields(spec: AgentSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in _FILE_FIELDS}


def _render_fresh(spec: AgentSpec) -> str:
    """The file for a spec that was never read from one."""
    mapping: dict[str, Any] = {}
    for field, key in _TOP_KEYS.items():
        if getattr(spec, field) is not None:
            mapping[key] = spec._raw(field, None)
    mapping.update(thaw(spec.extra))
    settings = {field: spec._raw(field, None) for field in AGENTMEND_KEYS}
    settings = {key: value for key, value in settings.items() if value is not None}
    if settings.get("permission_profile") == "standard":
        del settings["permission_profile"]  # the default goes without saying
    if settings:
        mapping["agentmend"] = settings
    return render_document(mapping, spec.system_prompt)


def _parse(text: str, path: str | Path | None, *, load_docs: bool) -> tuple[AgentSpec, list[str]]:
    """The spec in ``text`` and its unknown top-level keys (the caller decides how to warn)."""
    try:
        document = split_document(text)
        front = parse_front(document.front)
    except FrontMatterError as exc:
        raise SpecError(path, exc.key or "front_matter", exc.problem) from None
    raw = front.mapping
    data: dict[str, Any] = {"extra": {}, "system_prompt": document.body}
    unknown: list[str] = []
    top_fields = {key: field for field, key in _TOP_KEYS.items()}
    for key, value in raw.items():
        if key in top_fields:
            data[top_fields[key]] = value
        elif key == "agentmend":
            data.update(_agentmend_settings(value, path))
        else:
            data["extra"][key] = value
            if key not in CLAUDE_CODE_KEYS:
                unknown.append(key)
    if path is not None:
        data["source_path"] = Path(path)
    spec = _validate(data, path)
    if load_docs and path is not None:
        docs = read_agent_docs(Path(path).parent, spec.name)
        spec = spec.model_copy(update={"docs": docs})
    spec._origin = _Origin(text, document, raw, _file_fields(spec), front.lenient)
    return spec, unknown


def _agentmend_settings(value: Any, path: str | Path | None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(path, "agentmend", "must be a mapping of agentmend settings")
    for key in value:
        if key not in AGENTMEND_KEYS:
            known = ", ".join(AGENTMEND_KEYS)
            raise SpecError(path, f"agentmend.{key}", f"unknown agentmend setting (known: {known})")
    return dict(value)


def _validate(data: dict[str, Any], path: str | Path | None) -> AgentSpec:
    try:
        return AgentSpec.model_validate(data)
    except ValidationError as exc:
        raise _spec_error(exc, path) from None


def _spec_error(exc: ValidationError, path: str | Path | None) -> SpecError:
    """The most specific of pydantic's errors, named by its key in the file."""
    best: tuple[str, str] | None = None
    for error in exc.errors():
        location = _location(error["loc"])
        if error["type"] == "missing":
            problem = "is required"
        else:
            shown = repr(error.get("input"))
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            problem = f"{error['msg']} (got {shown})"
        if best is None or len(location) > len(best[0]):
            best = (location, problem)
    location, problem = best if best is not None else ("", str(exc))
    return SpecError(path, location or None, problem)


def _location(loc: tuple[int | str, ...]) -> str:
    head = str(loc[0]) if loc else ""
    if head == "extra" and len(loc) > 1:
        return str(loc[1])
    name = _TOP_KEYS.get(head) or (f"agentmend.{head}" if head in AGENTMEND_KEYS else head)
    if head == "permission_profile" and PermissionProfile.__name__ in loc:
        tail = loc[loc.index(PermissionProfile.__name__) + 1 :]
        name = ".".join([name, *map(str, tail)])
    return name


def load_agent_specs(
    directory: str | Path, *, broken: dict[str, SpecError] | None = None
) -> dict[str, AgentSpec]:
    """Every ``*.md`` directly in ``directory`` (``README.md`` skipped), keyed by agent name.

    Args:
        directory: the folder of definitions.
        broken: when given, a definition that does not load is put here (by file stem) with
            a warning, and the others still load; else the first one raises.

    Raises:
        SpecError: the folder is missing, or (without ``broken``) a definition is broken.
    """
    root = Path(directory)
    if not root.is_dir():
        raise SpecError(root, None, "no such directory of agent definitions")
    specs: dict[str, AgentSpec] = {}
    for path in sorted(root.glob("*.md")):
        if path.name.lower() == "readme.md" or path.is_dir():
            continue
        try:
            spec = AgentSpec.from_file(path)
        except SpecError as exc:
            if broken is None:
                raise
            log.warning("agent_definition_broken", path=str(path), problem=exc.problem)
            broken[path.stem] = exc
            continue
        if spec.name in specs:
            first = specs[spec.name].source_path
            raise SpecError(path, "name", f"agent {spec.name!r} is also defined in {first}")
        specs[spec.name] = spec
    log.debug("loaded_agent_specs", directory=str(root), count=len(specs))
    return specs
