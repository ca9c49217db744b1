"""Immutable collections for frozen records: a read-only dict and a deep freeze for JSON values.

A frozen pydantic model only stops attribute assignment; a ``list`` or ``dict`` field can still be
changed in place, behind the store's back, and makes the record unhashable. Records therefore hold
tuples and ``FrozenDict``s. ``FrozenDict`` is a ``dict`` subclass so that JSON, ``isinstance``
checks and equality with plain dicts work as before; every method that would change it raises
``TypeError``, like assigning to a tuple item.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, NoReturn, TypeVar, get_args

from pydantic import AfterValidator, GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = ["FrozenDict", "FrozenJson", "freeze", "thaw"]

K = TypeVar("K")
V = TypeVar("V")


class FrozenDict(dict[K, V]):
    """A dict that cannot be changed after it is made, and so can be hashed."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(f"{type(self).__name__} cannot be changed; build a new one instead")

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        # dict's default reduce refills an empty instance item by item, which this refuses;
        # pickle, copy and deepcopy all rebuild it from a plain dict instead.
        return (type(self), (dict(self),))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        key, value = get_args(source) or (Any, Any)
        as_dict = handler.generate_schema(dict[key, value])  # type: ignore[valid-type]
        return core_schema.no_info_after_validator_function(
            freeze,
            as_dict,
            serialization=core_schema.wrap_serializer_function_ser_schema(
                lambda frozen, serialize: serialize(dict(frozen)), schema=as_dict
            ),
        )


def freeze(value: Any) -> Any:
    """``value`` with every list, dict and set inside it (at any depth) made immutable.

    Lists become tuples, dicts ``FrozenDict``s and sets frozensets; anything else is returned as
    it is (pydantic records and dataclasses are frozen by their own declaration).
    """
    if isinstance(value, Mapping):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(item) for item in value)
    if isinstance(value, set | frozenset):
        return frozenset(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable copy of a frozen JSON value: tuples as lists, mappings as dicts.

    For libraries that test ``type(x) is list`` or ``isinstance(x, list)`` (jsonschema does).
    """
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(item) for item in value]
    return value


FrozenJson = Annotated[Any, AfterValidator(freeze)]
"""A JSON-like value of any shape, held immutably (lists as tuples, objects as ``FrozenDict``)."""
