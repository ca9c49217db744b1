"""Eval suites: the cases an agent is judged on before and after a change.

An agent may carry a suite in a YAML file beside its definition, ``<name>.evals.yaml``::

    repeats: 3            # runs per case; a case's outcome is the majority over them
    cases:
      - id: pythagoras    # optional; defaults to case-<index>
        prompt: "What is the Pythagorean theorem?"
        check: {contains: "a^2 + b^2"}

A check is exactly one of ``contains`` (a substring, or a list of substrings that must all
appear), ``regex`` (``re.search`` on the answer), ``json_schema`` (the answer, or the structured
output if the run produced one, parsed as JSON and validated) or ``python`` (``module:function``,
a callable ``(text, result) -> bool``). A run that failed (``result.error`` set) fails its case
without consulting the check: an error is never a passing answer.

The suite is loaded once and the same object judges both sides of a change, so a change can
never make its own exam easier; ``source_sha256`` lets the caller prove the file was not touched.
Everything a malformed file gets wrong is reported as a ``SpecError`` naming the file and the
field (``cases[2].check.regex``), before any agent runs.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentmend.infrastructure.errors import SpecError
from agentmend.infrastructure.files.atomic import sha256_bytes
from agentmend.infrastructure.frozen import FrozenDict, thaw
from agentmend.infrastructure.llm.base import AgentResult

if TYPE_CHECKING:
    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "CheckFunction",
    "CheckOutcome",
    "EvalCase",
    "EvalCheck",
    "EvalSuite",
    "find_eval_suite",
    "load_eval_suite",
    "parse_eval_suite",
    "resolve_check_function",
    "suite_path_for",
]

CheckFunction = Callable[[str, AgentResult[Any]], bool]
"""A ``python:`` check: the answer text and the whole result in, pass or fail out."""

SUITE_SUFFIX = ".evals.yaml"
_SUITE_KEYS = frozenset({"repeats", "cases", "description"})
_FENCE = re.compile(r"\A\s*```[A-Za-z0-9_-]*\s*\n(?P<body>.*?)\n\s*```\s*\Z", re.DOTALL)


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """Whether one run passed its case's check, and a short why for the per-case table."""

    passed: bool
    detail: str = ""


def resolve_check_function(reference: str) -> CheckFunction:
    """Import ``module:attr.path`` and return the callable it names.

    Raises:
        ValueError: the reference is malformed, the module does not import, the attribute is
            missing or not callable (pydantic turns this into a field error on load).
    """
    module_name, sep, attr_path = reference.partition(":")
    if not sep or not module_name.strip() or not attr_path.strip():
        raise ValueError(f"expected 'module:function', got {reference!r}")
    try:
        target: Any = importlib.import_module(module_name.strip())
    except Exception as exc:  # any import-time failure of user code is a bad reference
        raise ValueError(f"cannot import module {module_name!r}: {exc}") from exc
    for part in attr_path.strip().split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(target):
        raise ValueError(f"{reference!r} is not callable")
    function: CheckFunction = target
    return function


def _json_schema_module() -> Any:
    # imported lazily: only suites with json_schema checks pay for it
    import jsonschema  # type: ignore[import-untyped]

    return jsonschema


def _strip_fence(text: str) -> str:
    """The body of a single fenced block (models like to fence JSON), else the text as is."""
    match = _FENCE.match(text)
    return match.group("body") if match else text


class EvalCheck(BaseModel):
    """One check; exactly one of the four fields is set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    contains: tuple[str, ...] | None = None
    regex: str | None = None
    json_schema: FrozenDict[str, Any] | None = None
    python: str | None = None

    @field_validator("contains", mode="before")
    @classmethod
    def _one_string_is_a_list_of_one(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @field_validator("contains")
    @classmethod
    def _no_empty_substring(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        # an empty substring (or list) is in every answer: a check that cannot fail
        if value is not None and (not value or any(not item for item in value)):
            raise ValueError("must be a non-empty string or a non-empty list of them")
        return value

    @field_validator("regex")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value:
            raise ValueError("an empty pattern matches every answer")
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value

    @field_validator("json_schema")
    @classmethod
    def _schema_is_valid(cls, value: FrozenDict[str, Any] | None) -> FrozenDict[str, Any] | None:
        if value is None:
            return value
        jsonschema = _json_schema_module()
        schema = thaw(value)  # jsonschema takes only lists as JSON arrays
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.exceptions.SchemaError as exc:
            raise ValueError(f"not a valid JSON schema: {exc.message}") from None
        return value

    @field_validator("python")
    @classmethod
    def _function_resolves(cls, value: str | None) -> str | None:
        # resolved at load so a typo fails before any agent runs, not halfway through a cycle
        if value is not None:
            resolve_check_function(value)
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> EvalCheck:
        given = [name for name in ("contains", "regex", "json_schema", "python") if self._get(name)]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of contains, regex, json_schema, python"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self

    def _get(self, name: str) -> bool:
        return getattr(self, name) is not None

    @property
    def kind(self) -> str:
        for name in ("contains", "regex", "json_schema", "python"):
            if self._get(name):
                return name
        raise AssertionError("unreachable: validated to have exactly one check")

    def evaluate(self, result: AgentResult[Any]) -> CheckOutcome:
        """Judge one run. A failed run fails; a check that raises fails with its error shown."""
        if result.error is not None:
            return CheckOutcome(False, f"run failed: {result.error}")
        text = result.text
        if self.contains is not None:
            missing = [item for item in self.contains if item not in text]
            if missing:
                return CheckOutcome(False, f"missing {missing[0]!r}")
            return CheckOutcome(True, "contains all")
        if self.regex is not None:
            if re.search(self.regex, text):
                return CheckOutcome(True, "regex matched")
            return CheckOutcome(False, "regex did not match")
        if self.json_schema is not None:
            return self._check_json(result)
        assert self.python is not None
        return self._check_python(text, result)

    def _check_json(self, result: AgentResult[Any]) -> CheckOutcome:
        assert self.json_schema is not None
        if result.output is not None:
            data: Any = result.output.model_dump(mode="json")
        else:
            try:
                data = json.loads(_strip_fence(result.text))
            except ValueError as exc:
                return CheckOutcome(False, f"answer is not JSON: {exc}")
        jsonschema = _json_schema_module()
        schema = thaw(self.json_schema)  # jsonschema takes only lists as JSON arrays
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(data))
        if error is not None:
            return CheckOutcome(False, f"schema violated: {error.message}")
        return CheckOutcome(True, "schema valid")

    def _check_python(self, text: str, result: AgentResult[Any]) -> CheckOutcome:
        assert self.python is not None
        try:
            verdict: object = resolve_check_function(self.python)(text, result)
        except Exception as exc:  # a broken check fails its case; it must not abort the suite
            return CheckOutcome(False, f"check {self.python} raised {type(exc).__name__}: {exc}")
        if not isinstance(verdict, bool):
            return CheckOutcome(
                False, f"check {self.python} returned {type(verdict).__name__}, not bool"
            )
        return CheckOutcome(verdict, f"{self.python} -> {verdict}")


class EvalCase(BaseModel):
    """A prompt and the check its answer must pass."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    check: EvalCheck

    @field_validator("prompt")
    @classmethod
    def _prompt_has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


class EvalSuite(BaseModel):
    """An agent's eval cases and how many times each is run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cases: tuple[EvalCase, ...] = Field(min_length=1)
    repeats: int = Field(default=1, ge=1, strict=True)
    description: str = ""
    source_path: Path | None = None
    source_sha256: str | None = None

    @field_validator("cases")
    @classmethod
    def _ids_unique(cls, cases: tuple[EvalCase, ...]) -> tuple[EvalCase, ...]:
        seen: set[str] = set()
        for case in cases:
            if case.id in seen:
                raise ValueError(f"duplicate case id {case.id!r}")
            seen.add(case.id)
        return cases


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def parse_eval_suite(text: str, path: Path | None = None) -> EvalSuite:
    """Parse a suite from YAML text; ``path`` only names the file in errors and on the suite.

    Raises:
        SpecError: the YAML does not parse or a field is missing, unknown or invalid.
    """
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(path, None, f"not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError(path, None, "expected a mapping with 'cases' (and optionally 'repeats')")
    unknown = sorted(str(key) for key in raw if key not in _SUITE_KEYS)
    if unknown:
        raise SpecError(
            path, unknown[0], f"unknown key (allowed: {', '.join(sorted(_SUITE_KEYS))})"
        )
    if "cases" not in raw:
        raise SpecError(path, "cases", "missing")
    if not isinstance(raw["cases"], list):
        raise SpecError(path, "cases", "expected a list of cases")
    # ids default to their position so a table row can always be named
    cases = [
        {"id": f"case-{index}", **case} if isinstance(case, dict) and "id" not in case else case
        for index, case in enumerate(raw["cases"])
    ]
    seen: set[object] = set()
    for index, case in enumerate(cases):
        if isinstance(case, dict) and isinstance(case["id"], str):
            if case["id"] in seen:
                raise SpecError(path, f"cases[{index}].id", f"duplicate case id {case['id']!r}")
            seen.add(case["id"])
    data = {**raw, "cases": cases}
    try:
        suite = EvalSuite.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        problem = str(error["msg"]).removeprefix("Value error, ")
        raise SpecError(path, _field_path(tuple(error["loc"])) or None, problem) from None
    return suite.model_copy(
        update={"source_path": path, "source_sha256": sha256_bytes(text.encode("utf-8"))}
    )


def load_eval_suite(path: str | Path) -> EvalSuite:
    """Load ``<name>.evals.yaml``.

    Raises:
        SpecError: the file cannot be read or is malformed (the error names the field).
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(file, None, f"cannot read eval suite: {exc}") from None
    return parse_eval_suite(text, file)


def suite_path_for(spec: AgentSpec) -> Path | None:
    """Where the agent's suite lives.

    The definition's ``agentmend: evals:`` key (resolved against its directory) when given,
    otherwise ``<name>.evals.yaml`` beside the definition; None for a spec not read from a file
    and without the key.
    """
    if spec.evals_path is not None:
        return spec.evals_path
    if spec.source_path is None:
        return None
    return Path(spec.source_path).parent / f"{spec.path_name}{SUITE_SUFFIX}"


def find_eval_suite(spec: AgentSpec) -> EvalSuite | None:
    """The agent's suite, or None when it has none (the caller falls back to a weaker check).

    Raises:
        SpecError: the suite exists but is malformed, or the definition names one (``evals:``)
            that cannot be read. A broken suite is never silently skipped: the change would
            then be judged by the weaker check without anyone noticing.
    """
    path = suite_path_for(spec)
    if path is None:
        return None
    if spec.evals is None and not path.is_file():
        return None
    return load_eval_suite(path)
