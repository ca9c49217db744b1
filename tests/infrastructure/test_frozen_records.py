"""Frozen records are immutable all the way down, hashable, and their JSON is unchanged.

A frozen pydantic model only refuses attribute assignment; a ``list`` or ``dict`` inside it could
still be changed in place, behind the store's back. Every frozen record of the package is found
by importing every module, built with a value in every field (collections non-empty, JSON values
nested), and each collection inside it is mutated every way a list, dict or set allows.
"""

from __future__ import annotations

import collections.abc
import enum
import json
import pickle
import types
import typing
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import pytest
from package_modules import all_subclasses
from pydantic import BaseModel
from pydantic_settings import BaseSettings

from agentmend.infrastructure.frozen import FrozenDict, freeze

_JSON_VALUE = {"nested": [1, {"deep": ["x", 2.5]}], "flag": True}

# Fields whose validators need a particular value, by record and field name.
_OVERRIDES: dict[str, dict[str, Any]] = {
    "EvalCheck": {"regex": None, "python": None, "contains": None},
    "EvalCase": {"check": {"json_schema": {"type": "object", "required": ["answer"]}}},
    "EvalSuite": {"cases": [{"id": "c1", "prompt": "p", "check": {"contains": ["x"]}}]},
}


def _sample(annotation: Any, owner: str) -> Any:
    """JSON data valid for ``annotation``: collections hold one item, JSON values are nested."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return _sample(args[0], owner)
    if annotation is Any:
        return _JSON_VALUE
    if origin in (typing.Union, types.UnionType):
        return _sample(next(a for a in args if a is not type(None)), owner)
    if origin is Literal:
        return args[0]
    if origin is tuple and Ellipsis not in args:
        return [_sample(arg, owner) for arg in args]
    if origin in (tuple, list, set, frozenset, collections.abc.Sequence):
        return [_sample(args[0], owner)]
    if origin in (dict, FrozenDict, collections.abc.Mapping):
        return {str(_sample(args[0], owner)): _sample(args[1], owner)}
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return next(iter(annotation)).value
        for kind, value in ((bool, True), (int, 1), (float, 0.5), (str, "x"), (Path, "/srv/x")):
            if issubclass(annotation, kind):
                return value
        if issubclass(annotation, datetime):
            return "2026-01-02T03:04:05Z"
        if issubclass(annotation, BaseModel):
            return _data(annotation)
    raise AssertionError(f"{owner}: no sample for {annotation!r}; extend _sample")


def _data(model: type[BaseModel]) -> dict[str, Any]:
    data = {
        info.alias or name: _sample(info.annotation, f"{model.__name__}.{name}")
        for name, info in model.model_fields.items()
    }
    data.update(_OVERRIDES.get(model.__name__, {}))
    return data


_RECORDS = [
    cls
    for cls in all_subclasses(BaseModel)
    if cls.model_config.get("frozen")
    and cls.model_fields
    and not cls.__name__.startswith("_")
    and not issubclass(cls, BaseSettings)  # configuration read from the environment
]


def _record(cls: type[BaseModel]) -> tuple[BaseModel, dict[str, Any]]:
    data = _data(cls)
    return cls.model_validate_json(json.dumps(data)), data


def _mutations(collection: object) -> list[tuple[str, Any]]:
    """Every in-place change a list, dict or set would allow, as callables on ``collection``."""
    value: Any = collection  # the methods are looked up at run time: that is the test
    if isinstance(collection, collections.abc.Mapping):
        key = next(iter(value), "k")
        return [
            ("d[k] = v", lambda: value.__setitem__("new", 1)),
            ("del d[k]", lambda: value.__delitem__(key)),
            ("d.update()", lambda: value.update({"new": 1})),
            ("d.pop()", lambda: value.pop(key)),
            ("d.popitem()", lambda: value.popitem()),
            ("d.clear()", lambda: value.clear()),
            ("d.setdefault()", lambda: value.setdefault("new", 1)),
            ("d |= {}", lambda: value.__ior__({"new": 1})),
        ]
    if isinstance(collection, collections.abc.Set):
        return [("s.add()", lambda: value.add(1)), ("s.clear()", lambda: value.clear())]
    return [
        ("l.append()", lambda: value.append(1)),
        ("l[0] = v", lambda: value.__setitem__(0, 1)),
        ("del l[0]", lambda: value.__delitem__(0)),
        ("l.extend()", lambda: value.extend([1])),
        ("l.clear()", lambda: value.clear()),
        ("l += []", lambda: value.__iadd__([1])),
    ]


def _collections(value: Any, path: str) -> list[tuple[str, Any]]:
    """Every collection inside ``value`` (records included), with where it sits."""
    found: list[tuple[str, Any]] = []
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            found += _collections(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, collections.abc.Mapping):
        found.append((path, value))
        for key, item in value.items():
            found += _collections(item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple | set | frozenset):
        found.append((path, value))
        for index, item in enumerate(value):
            found += _collections(item, f"{path}[{index}]")
    return found


def test_the_walk_finds_records_from_every_layer() -> None:
    names = {cls.__name__ for cls in _RECORDS}
    assert {"IssueReport", "ImprovementAction", "CycleResult", "MediatorReport"} <= names
    assert {"GateVerdict", "CodePlan", "EvalCheck", "VerificationVerdict", "AgentSpec"} <= names


@pytest.mark.parametrize("cls", _RECORDS, ids=lambda cls: cls.__qualname__)
def test_no_collection_inside_a_record_can_be_changed(cls: type[BaseModel]) -> None:
    record, _ = _record(cls)
    found = _collections(record, cls.__name__)
    for path, value in found:
        for what, mutate in _mutations(value):
            try:
                mutate()
            except (TypeError, AttributeError):
                continue
            pytest.fail(f"{path}: {what} changed a frozen record")
    assert _record(cls)[0] == record  # nothing changed


@pytest.mark.parametrize("cls", _RECORDS, ids=lambda cls: cls.__qualname__)
def test_a_record_hashes_and_round_trips_through_json_and_pickle(cls: type[BaseModel]) -> None:
    record, data = _record(cls)
    assert hash(record) == hash(_record(cls)[0])
    text = record.model_dump_json()
    again = cls.model_validate_json(text)
    assert again == record
    assert again.model_dump_json() == text
    assert pickle.loads(pickle.dumps(record)) == record
    # lists are still JSON arrays and dicts JSON objects: the JSON holds what was given
    dumped = json.loads(text)
    for key, value in data.items():
        if (
            isinstance(value, list | dict)
            and key in dumped
            and key not in _OVERRIDES.get(cls.__name__, {})
        ):
            assert dumped[key] == value, key


def test_the_reported_tampering_is_refused() -> None:
    from agentmend.infrastructure.models import ImprovementAction, IssueReport

    issue = IssueReport(agent_name="writer", error_type="timeout", error_logs=["boom"])
    with pytest.raises(AttributeError):
        issue.error_logs.append("tampered")  # type: ignore[attr-defined]
    assert issue.error_logs == ("boom",)
    assert hash(issue) == hash(issue.model_copy())
    action = ImprovementAction(
        target_agent="writer",
        action_type="tool_permission_change",
        new_value={"add": ["search"]},
        confidence_score=0.9,
    )
    with pytest.raises(TypeError):
        action.new_value["add"] = ["shell"]
    assert action.model_dump(mode="json")["new_value"] == {"add": ["search"]}


def test_freeze_leaves_frozen_values_equal_and_plain_values_unchanged() -> None:
    value = {"a": [1, {"b": {2, 3}}], "c": "text"}
    frozen = freeze(value)
    assert frozen == {"a": (1, {"b": frozenset({2, 3})}), "c": "text"}
    assert freeze(frozen) == frozen
    assert value == {"a": [1, {"b": {2, 3}}], "c": "text"}  # the input is not touched
    assert pickle.loads(pickle.dumps(frozen)) == frozen
    assert hash(pickle.loads(pickle.dumps(frozen))) == hash(frozen)
