"""Every error of the package survives pickle and deepcopy with its fields, and is exported.

Errors cross process boundaries in users' apps (multiprocessing, task queues), and an
``AgentResult`` carries its ``AgentRunError`` as data. The classes are found by importing every
module of the package and walking the subclasses, so a new error is covered the day it is added.
"""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from package_modules import all_subclasses

import agentmend
from agentmend.infrastructure.changes.proposal import GateVerdict
from agentmend.infrastructure.errors import (
    AgentmendError,
    AgentRunError,
    ErrorKind,
    InvalidArgument,
    NotFound,
)
from agentmend.infrastructure.llm.base import AgentResult
from agentmend.infrastructure.models import IssueReport
from agentmend.loop.cycle import CycleResult

_PACKAGES = ("agentmend",)

# A value for each parameter annotation an error's __init__ uses. A new annotation fails the walk
# below with its name, so the table grows with the errors.
_SAMPLES: dict[str, Callable[[str], Any]] = {
    "str": lambda name: f"the {name}",
    "str | None": lambda name: f"the {name}",
    "Path": lambda name: Path(f"/work/{name}"),
    "str | Path": lambda name: f"/work/{name}",
    "str | Path | None": lambda name: f"/work/{name}",
    "OSError | None": lambda name: OSError(28, "No space left on device"),
    "int": lambda name: 3,
    "int | None": lambda name: 429,
    "float | None": lambda name: 1.5,
    "float": lambda name: 2.5,
    "object": lambda name: {"nested": [1, 2]},
    "ErrorKind": lambda name: ErrorKind.TIMEOUT,
    "tuple[str, ...]": lambda name: (f"{name}-1", f"{name}-2"),
    "Sequence[str]": lambda name: (f"{name}-1", f"{name}-2"),
    "GateVerdict": lambda name: GateVerdict(gate="scope", passed=False, reason="too wide"),
    "CycleResult": lambda name: CycleResult(
        cycle_id="c1",
        issue=IssueReport(agent_name="writer", error_type="timeout"),
        status="error",
        error="boom",
    ),
}


def _own_init(cls: type[BaseException]) -> Callable[..., None] | None:
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and klass.__module__.partition(".")[0] in _PACKAGES:
            init: Callable[..., None] = vars(klass)["__init__"]
            return init
    return None


def _instance(cls: type[BaseException]) -> BaseException:
    """``cls`` built with every parameter of its ``__init__`` given a distinct value."""
    init = _own_init(cls)
    if init is None:
        return cls(f"{cls.__name__} happened")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for parameter in list(inspect.signature(init).parameters.values())[1:]:
        annotation = str(parameter.annotation).strip("'")
        assert annotation in _SAMPLES, f"{cls.__name__}.{parameter.name}: add a {annotation} sample"
        value = _SAMPLES[annotation](parameter.name)
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[parameter.name] = value
        else:
            args.append(value)
    return cls(*args, **kwargs)


_ERRORS = all_subclasses(Exception)  # every exception class defined in the package


def test_the_walk_finds_errors_from_every_layer() -> None:
    names = {cls.__name__ for cls in _ERRORS}
    assert {"AgentRunError", "InvalidExecution", "UnknownAgent", "SelfEditNotKept"} <= names
    assert {"WorkspaceError", "ToolError", "CommandError", "NetworkRefusedError"} <= names
    assert all(issubclass(cls, AgentmendError) for cls in all_subclasses(AgentmendError))


@pytest.mark.parametrize("cls", _ERRORS, ids=lambda cls: cls.__qualname__)
@pytest.mark.parametrize("copier", ["pickle", "deepcopy", "copy"])
def test_every_error_round_trips_with_its_fields(cls: type[BaseException], copier: str) -> None:
    error = _instance(cls)
    error.__notes__ = ["a note"]
    clone: BaseException
    if copier == "pickle":
        clone = pickle.loads(pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL))
    elif copier == "deepcopy":
        clone = copy.deepcopy(error)
    else:
        clone = copy.copy(error)
    assert type(clone) is cls
    assert clone.args == error.args
    assert str(clone) == str(error)
    assert vars(clone) == vars(error)
    if _own_init(cls) is not None:  # an error with its own __init__ keeps fields beyond args
        assert set(vars(error)) - {"__notes__"}, f"{cls.__name__} sets no field"


def test_an_agent_run_error_keeps_every_field_through_pickle() -> None:
    error = AgentRunError(ErrorKind.RATE_LIMIT, "slow down", status_code=429, retry_after_s=2.5)
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.kind, clone.message, clone.status_code, clone.retry_after_s) == (
        ErrorKind.RATE_LIMIT,
        "slow down",
        429,
        2.5,
    )
    assert clone.kind.transient


def test_a_failed_result_deep_copies_and_pickles_with_its_error() -> None:
    result: AgentResult[Any] = AgentResult(
        agent_name="writer", error=AgentRunError(ErrorKind.TIMEOUT, "x", status_code=None)
    )
    for clone in (copy.deepcopy(result), pickle.loads(pickle.dumps(result))):
        assert clone.error is not None
        assert clone.error is not result.error
        assert (clone.error.kind, clone.error.message) == (ErrorKind.TIMEOUT, "x")
        assert not clone.success


def test_a_built_in_base_is_kept_through_pickle() -> None:
    invalid: InvalidArgument = pickle.loads(
        pickle.dumps(InvalidArgument("alpha", 2.0, "must be in (0, 1)"))
    )
    assert isinstance(invalid, ValueError)
    assert invalid.value == 2.0
    missing: NotFound = pickle.loads(pickle.dumps(NotFound("cycle", "c9", "in the store")))
    assert isinstance(missing, KeyError)
    assert str(missing) == "no cycle with id 'c9' in the store"


@pytest.mark.parametrize("cls", all_subclasses(AgentmendError), ids=lambda cls: cls.__qualname__)
def test_every_error_of_the_root_is_exported_from_agents(cls: type[AgentmendError]) -> None:
    assert cls.__name__ in agentmend.__all__
    assert getattr(agentmend, cls.__name__) is cls
