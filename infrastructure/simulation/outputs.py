"""What a simulated agent writes: reply text, and structured output filled from a model's fields.

The text is short but shaped like the real thing (a heading when in format, a chatty opener when
not, a cut-off sentence when truncated) and it names the prompt's topic, so eval checks on the
topic and on the heading behave as they would on a real answer. Structured output is built from
the fields' types and validated by pydantic; what cannot be filled is reported, never faked.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from agentmend.infrastructure.simulation.team import FORMAT_HEADING, AgentProfile

__all__ = ["CannotFill", "fill_output", "off_format_text", "reply_text", "topic_of"]

ModelT = TypeVar("ModelT", bound=BaseModel)

_SLUG = re.compile(r"[^a-z0-9]+")

_DETAILS: Mapping[str, tuple[str, ...]] = {
    "knowledge-builder": (
        "**Definition.** The precise statement, with the notation the vault uses.",
        "**Intuition.** Why the idea works, built from a picture the learner already knows.",
        "**Worked example.** One problem solved step by step; prerequisites linked as [[notes]].",
    ),
    "quality-agent": (
        "**Verdict:** PASS WITH EDITS.",
        "- The definition matches the standard one; one LaTeX expression does not render.",
        "- Every prerequisite link points to an existing note.",
    ),
    "research-agent": (
        "**Standard definition**, as stated in two textbooks (sources below).",
        "**History** and the main theorems, each with its source.",
        "**Common misconceptions** learners report, marked where only one source supports them.",
    ),
    "example-generator": (
        "1. A warm-up example with small integers, every step justified.",
        "2. A standard exercise, solution checked by substitution.",
        "3. A harder problem, plus two practice problems with short answers.",
    ),
    "dependency-mapper": (
        "Prerequisites in learning order (topologically sorted):",
        "1. [[numbers-and-operations]] 2. [[algebraic-expressions]] 3. [[equations]]",
        "No missing notes and no cycles found.",
    ),
    "socratic-planner": (
        "1. What do you already know that looks like this? (hint: start from an example)",
        "2. What changes if we vary one quantity and keep the others fixed?",
        "3. Can you state the idea in your own words? (closing question)",
    ),
}
_GENERIC_DETAILS = ("The question is answered below, step by step.", "Sources and checks follow.")


def topic_of(prompt: str) -> str:
    """The prompt's first non-blank line, clipped: what the reply is about."""
    for line in prompt.splitlines():
        if line.strip():
            text = " ".join(line.split())
            return text if len(text) <= 120 else text[:117] + "..."
    return "the request"


def _body(profile: AgentProfile, prompt: str) -> str:
    topic = topic_of(prompt)
    slug = _SLUG.sub("-", topic.casefold()).strip("-")[:60] or "request"
    details = "\n".join(_DETAILS.get(profile.name, _GENERIC_DETAILS))
    return (
        f"{profile.deliverable.capitalize()} for: {topic}\n\n{details}\n\n"
        f"Reference: `{slug}` ({profile.name})."
    )


def reply_text(profile: AgentProfile, prompt: str) -> str:
    """A complete reply in the required format."""
    return f"{FORMAT_HEADING}\n\n{_body(profile, prompt)}\n"


def off_format_text(profile: AgentProfile, prompt: str) -> str:
    """The same content as a reply that forgot the format (no heading)."""
    return f"Sure! Here is the {profile.deliverable} you asked for.\n\n{_body(profile, prompt)}\n"


class CannotFill(Exception):
    """The output type has a field the simulation cannot produce a valid value for."""


def fill_output(output_type: type[ModelT], text: str) -> ModelT:
    """A validated instance of ``output_type`` with plausible values for its required fields.

    Raises:
        CannotFill: a field's type or constraints cannot be met, or validation failed.
    """
    try:
        return output_type.model_validate(_fill_model(output_type, text, depth=0))
    except ValidationError as exc:
        raise CannotFill(f"{output_type.__name__}: {exc.error_count()} field(s) invalid") from exc


def _fill_model(model: type[BaseModel], text: str, depth: int) -> dict[str, Any]:
    if depth > 4:
        raise CannotFill(f"{model.__name__}: nested too deeply")
    data: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if info.is_required():
            key = info.alias if info.alias is not None else name
            data[key] = _value(info.annotation, info, text, depth, f"{model.__name__}.{name}")
    return data


def _bounds(metadata: Sequence[Any]) -> tuple[float | None, float | None, int | None, int | None]:
    low = high = None
    min_len = max_len = None
    for item in metadata:
        if isinstance(item, annotated_types.Ge | annotated_types.Gt):
            low = float(item.ge if isinstance(item, annotated_types.Ge) else item.gt)  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Le | annotated_types.Lt):
            high = float(item.le if isinstance(item, annotated_types.Le) else item.lt)  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.MinLen):
            min_len = item.min_length
        elif isinstance(item, annotated_types.MaxLen):
            max_len = item.max_length
    return low, high, min_len, max_len


def _number(low: float | None, high: float | None, *, integer: bool) -> float:
    if low is not None and high is not None:
        middle = (low + high) / 2
        return float(round(middle)) if integer and low <= round(middle) <= high else middle
    if low is not None:
        return low + 1
    if high is not None:
        return high - 1
    return 1.0


def _value(annotation: Any, info: FieldInfo | None, text: str, depth: int, where: str) -> Any:
    metadata: list[Any] = list(info.metadata) if info is not None else []
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extra = get_args(annotation)
        return _value(base, _with_metadata(metadata + extra), text, depth, where)
    low, high, min_len, max_len = _bounds(metadata)
    if origin in (Union, types.UnionType):
        options = get_args(annotation)
        if type(None) in options:
            return None
        return _value(options[0], info, text, depth, where)
    if origin is Literal:
        return get_args(annotation)[0]
    if origin in (list, tuple, set, frozenset, Sequence) or annotation in (list, tuple, set):
        args = [arg for arg in get_args(annotation) if arg is not Ellipsis]
        count = min_len or 0
        if origin is tuple and args and len(get_args(annotation)) == len(args):
            return [_value(arg, None, text, depth, where) for arg in args]
        return [_value(args[0] if args else str, None, text, depth, where) for _ in range(count)]
    if origin in (dict, Mapping) or annotation is dict:
        return {}
    if annotation is Any or annotation is object or annotation is str:
        value = text.strip() or "answer"
        if min_len is not None and len(value) < min_len:
            value = value.ljust(min_len, ".")
        return value[:max_len] if max_len is not None else value
    if annotation is bool:
        return True
    if annotation is int:
        return int(_number(low, high, integer=True))
    if annotation is float:
        return _number(low, high, integer=False)
    if annotation is dt.datetime:
        return dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    if annotation is dt.date:
        return dt.date(2025, 1, 1)
    if annotation is Path:
        return "."
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return next(iter(annotation)).value
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _fill_model(annotation, text, depth + 1)
    raise CannotFill(f"{where}: cannot produce a value of type {annotation!r}")


def _with_metadata(metadata: list[Any]) -> FieldInfo:
    info = FieldInfo()
    info.metadata = metadata
    return info
