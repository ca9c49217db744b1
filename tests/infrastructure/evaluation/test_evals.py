"""Eval suite files: the format, every way a file can be malformed, and the four checks."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.errors import AgentRunError, ErrorKind, SpecError
from agentmend.infrastructure.evaluation.evals import (
    EvalCheck,
    find_eval_suite,
    load_eval_suite,
    parse_eval_suite,
    suite_path_for,
)
from agentmend.infrastructure.files.atomic import sha256_bytes
from agentmend.infrastructure.llm.base import AgentResult

_module_ids = itertools.count()


def write_check_module(directory: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """A fresh importable module holding check functions; returns its name."""
    name = f"agentmend_eval_checks_{next(_module_ids)}"
    (directory / f"{name}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    monkeypatch.syspath_prepend(str(directory))
    return name


def answer(text: str = "", **fields: Any) -> AgentResult[Any]:
    return AgentResult(agent_name="solver", text=text, **fields)


def check(**fields: Any) -> EvalCheck:
    return EvalCheck.model_validate(fields)


SUITE = """\
description: maths answers
repeats: 3
cases:
  - id: pythagoras
    prompt: "What is the Pythagorean theorem?"
    check: {contains: "a^2 + b^2"}
  - prompt: "Give the area of a unit circle"
    check: {regex: "(?i)\\\\bpi\\\\b"}
  - prompt: "Answer in JSON"
    check:
      json_schema: {type: object, required: [answer]}
  - prompt: "Two facts"
    check: {contains: [first, second]}
"""


def test_a_suite_parses_with_defaults_ids_and_a_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "solver.evals.yaml"
    path.write_text(SUITE, encoding="utf-8")
    suite = load_eval_suite(path)
    assert suite.repeats == 3
    assert suite.description == "maths answers"
    assert [case.id for case in suite.cases] == ["pythagoras", "case-1", "case-2", "case-3"]
    assert [case.check.kind for case in suite.cases] == [
        "contains",
        "regex",
        "json_schema",
        "contains",
    ]
    assert suite.cases[0].check.contains == ("a^2 + b^2",)
    assert suite.cases[3].check.contains == ("first", "second")
    assert suite.source_path == path
    assert suite.source_sha256 == sha256_bytes(SUITE.encode())


def test_repeats_default_to_one() -> None:
    suite = parse_eval_suite("cases: [{prompt: hi, check: {contains: hello}}]")
    assert suite.repeats == 1
    assert suite.source_path is None


def test_the_suite_is_found_beside_the_definition(tmp_path: Path) -> None:
    definition = tmp_path / "solver.md"
    spec = AgentSpec(name="solver", description="d", system_prompt="p", source_path=definition)
    assert suite_path_for(spec) == tmp_path / "solver.evals.yaml"
    assert find_eval_suite(spec) is None
    (tmp_path / "solver.evals.yaml").write_text(SUITE, encoding="utf-8")
    found = find_eval_suite(spec)
    assert found is not None
    assert found.source_path == tmp_path / "solver.evals.yaml"


def test_the_definition_can_name_its_suite(tmp_path: Path) -> None:
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "maths.yaml").write_text(SUITE, encoding="utf-8")
    (tmp_path / "solver.evals.yaml").write_text("cases: [{prompt: x, check: {regex: y}}]")
    spec = AgentSpec(
        name="solver",
        description="d",
        system_prompt="p",
        evals="suites/maths.yaml",
        source_path=tmp_path / "solver.md",
    )
    found = find_eval_suite(spec)
    assert found is not None
    assert found.source_path == tmp_path / "suites" / "maths.yaml"
    assert len(found.cases) == 4


def test_a_named_suite_that_is_missing_is_an_error(tmp_path: Path) -> None:
    spec = AgentSpec(
        name="solver",
        description="d",
        system_prompt="p",
        evals="solver.yaml",
        source_path=tmp_path / "solver.md",
    )
    with pytest.raises(SpecError) as caught:
        find_eval_suite(spec)
    assert caught.value.path == str(tmp_path / "solver.yaml")


def test_an_agent_without_a_file_has_no_suite() -> None:
    spec = AgentSpec(name="solver", description="d", system_prompt="p")
    assert suite_path_for(spec) is None
    assert find_eval_suite(spec) is None


def test_a_malformed_suite_beside_the_definition_is_an_error_not_skipped(tmp_path: Path) -> None:
    spec = AgentSpec(
        name="solver", description="d", system_prompt="p", source_path=tmp_path / "solver.md"
    )
    (tmp_path / "solver.evals.yaml").write_text("cases: []", encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        find_eval_suite(spec)
    assert caught.value.field == "cases"


def test_a_missing_file_is_a_spec_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.evals.yaml"
    with pytest.raises(SpecError) as caught:
        load_eval_suite(path)
    assert caught.value.path == str(path)
    assert "cannot read" in caught.value.problem


CASE = "{prompt: hi, check: {contains: hello}}"

MALFORMED = [
    ("cases: [", None, "not valid YAML"),
    ("- just a list", None, "expected a mapping"),
    ("", None, "expected a mapping"),
    (f"repeat: 3\ncases: [{CASE}]", "repeat", "unknown key"),
    ("repeats: 2", "cases", "missing"),
    ("cases: []", "cases", "at least 1"),
    ("cases: {prompt: hi}", "cases", "expected a list"),
    ("cases: [hello]", "cases[0]", "valid dictionary"),
    ("cases: [{check: {contains: x}}]", "cases[0].prompt", "required"),
    ("cases: [{prompt: '   ', check: {contains: x}}]", "cases[0].prompt", "blank"),
    ("cases: [{prompt: 7, check: {contains: x}}]", "cases[0].prompt", "valid string"),
    ("cases: [{prompt: hi}]", "cases[0].check", "required"),
    ("cases: [{prompt: hi, check: {}}]", "cases[0].check", "exactly one"),
    ("cases: [{prompt: hi, check: {contains: a, regex: b}}]", "cases[0].check", "exactly one"),
    ("cases: [{prompt: hi, check: {contain: a}}]", "cases[0].check.contain", "not permitted"),
    ("cases: [{prompt: hi, check: {contains: ''}}]", "cases[0].check.contains", "non-empty"),
    ("cases: [{prompt: hi, check: {contains: []}}]", "cases[0].check.contains", "non-empty"),
    ("cases: [{prompt: hi, check: {contains: 5}}]", "cases[0].check.contains", "valid tuple"),
    ("cases: [{prompt: hi, check: {regex: '(unclosed'}}]", "cases[0].check.regex", "regular"),
    ("cases: [{prompt: hi, check: {regex: ''}}]", "cases[0].check.regex", "every answer"),
    (
        "cases: [{prompt: hi, check: {json_schema: {type: nonsense}}}]",
        "cases[0].check.json_schema",
        "not a valid JSON schema",
    ),
    (
        "cases: [{prompt: hi, check: {json_schema: [1]}}]",
        "cases[0].check.json_schema",
        "valid dictionary",
    ),
    ("cases: [{prompt: hi, check: {python: no_colon}}]", "cases[0].check.python", "module:func"),
    (
        "cases: [{prompt: hi, check: {python: 'agentmend_no_such_module:f'}}]",
        "cases[0].check.python",
        "cannot import module",
    ),
    ("cases: [{prompt: hi, check: {python: 'json:no_such'}}]", "cases[0].check.python", "no attr"),
    ("cases: [{prompt: hi, check: {python: 'math:pi'}}]", "cases[0].check.python", "not callable"),
    (f"cases: [{CASE}, {{id: x, prompt: p, hint: h, check: {{regex: a}}}}]", "cases[1].hint", ""),
    (
        "cases: [{id: a, prompt: p, check: {regex: a}}, {id: a, prompt: q, check: {regex: b}}]",
        "cases[1].id",
        "duplicate case id 'a'",
    ),
    ("cases: [{id: '', prompt: p, check: {regex: a}}]", "cases[0].id", "at least 1"),
    (f"repeats: 0\ncases: [{CASE}]", "repeats", "greater than or equal to 1"),
    (f"repeats: three\ncases: [{CASE}]", "repeats", "valid integer"),
    (f"repeats: true\ncases: [{CASE}]", "repeats", "valid integer"),
    (f"repeats: 2.5\ncases: [{CASE}]", "repeats", "valid integer"),
]


@pytest.mark.parametrize(("text", "field", "problem"), MALFORMED)
def test_a_malformed_suite_names_the_file_and_the_field(
    tmp_path: Path, text: str, field: str | None, problem: str
) -> None:
    path = tmp_path / "solver.evals.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_eval_suite(path)
    assert caught.value.path == str(path)
    assert caught.value.field == field
    assert problem in caught.value.problem
    assert str(path) in str(caught.value)


def test_contains_needs_every_substring() -> None:
    both = check(contains=["first", "second"])
    assert both.evaluate(answer("the first and the second")).passed
    outcome = both.evaluate(answer("only the first"))
    assert not outcome.passed
    assert "second" in outcome.detail


def test_regex_searches_the_answer() -> None:
    pattern = check(regex=r"\b4\b")
    assert pattern.evaluate(answer("2 + 2 = 4.")).passed
    assert not pattern.evaluate(answer("2 + 2 = 44")).passed


SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
}


class Answer(BaseModel):
    answer: int


def test_json_schema_validates_the_answer_text() -> None:
    schema = check(json_schema=SCHEMA)
    assert schema.evaluate(answer('{"answer": 4}')).passed
    assert schema.evaluate(answer('```json\n{"answer": 4}\n```')).passed
    wrong_type = schema.evaluate(answer('{"answer": "four"}'))
    assert not wrong_type.passed
    assert "schema violated" in wrong_type.detail
    assert not schema.evaluate(answer("{}")).passed
    not_json = schema.evaluate(answer("The answer is 4."))
    assert not not_json.passed
    assert "not JSON" in not_json.detail


def test_json_schema_prefers_the_structured_output() -> None:
    schema = check(json_schema=SCHEMA)
    assert schema.evaluate(answer("prose around it", output=Answer(answer=4))).passed
    strict = check(json_schema={**SCHEMA, "properties": {"answer": {"const": 5}}})
    assert not strict.evaluate(answer('{"answer": 5}', output=Answer(answer=4))).passed


def test_python_check_gets_the_text_and_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = write_check_module(
        tmp_path,
        monkeypatch,
        """
        seen = []

        def short_and_cheap(text, result):
            seen.append((text, result.turns))
            return len(text) < 10 and result.turns <= 2

        class Checks:
            @staticmethod
            def shouts(text, result):
                return text.isupper()
        """,
    )
    suite = parse_eval_suite(
        f"cases:\n"
        f"  - {{prompt: a, check: {{python: '{module}:short_and_cheap'}}}}\n"
        f"  - {{prompt: b, check: {{python: '{module}:Checks.shouts'}}}}\n"
    )
    cheap, shouts = (case.check for case in suite.cases)
    assert cheap.evaluate(answer("tiny", turns=1)).passed
    assert not cheap.evaluate(answer("tiny", turns=3)).passed
    assert not cheap.evaluate(answer("far too long an answer", turns=1)).passed
    assert shouts.evaluate(answer("YES")).passed
    assert not shouts.evaluate(answer("yes")).passed
    import importlib

    assert importlib.import_module(module).seen == [
        ("tiny", 1),
        ("tiny", 3),
        ("far too long an answer", 1),
    ]


def test_a_python_check_that_raises_or_returns_a_non_bool_fails_its_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = write_check_module(
        tmp_path,
        monkeypatch,
        """
        def explodes(text, result):
            raise KeyError("answer")

        def maybe(text, result):
            return "yes"
        """,
    )
    explodes = check(python=f"{module}:explodes").evaluate(answer("x"))
    assert not explodes.passed
    assert "KeyError" in explodes.detail
    maybe = check(python=f"{module}:maybe").evaluate(answer("x"))
    assert not maybe.passed
    assert "not bool" in maybe.detail


def test_a_failed_run_fails_every_kind_of_check_without_consulting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = write_check_module(
        tmp_path,
        monkeypatch,
        """
        calls = []

        def always(text, result):
            calls.append(text)
            return True
        """,
    )
    failed = answer(
        '{"answer": 4} contains a^2 + b^2',
        error=AgentRunError(ErrorKind.TIMEOUT, "took too long"),
    )
    for kind in (
        check(contains="a^2 + b^2"),
        check(regex="a"),
        check(json_schema={"type": "string"}),
        check(python=f"{module}:always"),
    ):
        outcome = kind.evaluate(failed)
        assert not outcome.passed
        assert "timeout" in outcome.detail
    import importlib

    assert importlib.import_module(module).calls == []


def test_a_check_is_immutable_and_needs_exactly_one_kind() -> None:
    contains = check(contains="x")
    with pytest.raises(ValidationError):
        contains.regex = "y"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="exactly one"):
        check()
