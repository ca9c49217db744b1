"""A lean reading of OTLP trace exports: what the mapping needs parsed in C, the rest left as bytes.

``opentelemetry-proto``'s own ``ExportTraceServiceRequest`` parses every attribute value into
a message, and reading one from Python builds two more objects; reading them all costs about
ten times the parse. This module declares the same wire format with a smaller schema (built
here at import, in a pool of its own): a span's attributes (``repeated KeyValue``, field 9) are
declared as a ``map<string, bytes>``, which is the same bytes on the wire (a map entry is a
message of a key, field 1, and a value, field 2), so the parser indexes them by key and leaves
each ``AnyValue`` as its undecoded bytes. Fields the mapping never reads (links, kind, the
scope, trace state) are not declared: the parser skips them.

What differs from the full schema, by design: a value is decoded only when read, so a value
that is not valid UTF-8 or not an ``AnyValue`` fails nothing unless it is read, and then reads
as text with U+FFFD for the bad bytes, or as None; a malformed field the schema does not
declare is not noticed. Keys are still checked (a key that is not UTF-8 fails the parse, as
before), and the map keeps the last of two values of one key, as the full decoder did.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from typing import Any

from agentmend.infrastructure.telemetry.span import OtelExtraMissing

__all__ = ["DecodedValues", "RawAttributes", "any_value", "lean_request_type", "raw_size"]

_PACKAGE = "agentmend.otlp.lean"
_lean_request: Any = None


def lean_request_type() -> Any:
    """The lean ``ExportTraceServiceRequest`` message class (built once).

    Raises:
        OtelExtraMissing: protobuf (through opentelemetry-proto) is not installed.
    """
    global _lean_request
    if _lean_request is None:
        _lean_request = _build()
    return _lean_request


def _build() -> Any:
    try:
        from google.protobuf import (  # type: ignore[import-untyped]
            descriptor_pb2,
            descriptor_pool,
            message_factory,
        )
    except ImportError as exc:
        raise OtelExtraMissing("opentelemetry-proto") from exc
    field = descriptor_pb2.FieldDescriptorProto
    one, many = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    proto = descriptor_pb2.FileDescriptorProto(
        name="agentmend/otlp_lean_trace.proto", package=_PACKAGE, syntax="proto3"
    )

    def message(
        name: str, fields: list[tuple[str, int, int, int, str]], *, with_map: bool = False
    ) -> None:
        declared = proto.message_type.add(name=name)
        if with_map:  # map<string, bytes> attributes: a nested entry type marked map_entry
            entry = declared.nested_type.add(name="AttributesEntry")
            entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=one)
            entry.field.add(name="value", number=2, type=field.TYPE_BYTES, label=one)
            entry.options.map_entry = True
        for name_, number, kind, label, type_name in fields:
            added = declared.field.add(name=name_, number=number, type=kind, label=label)
            if type_name:
                added.type_name = f".{_PACKAGE}.{type_name}"

    message(
        "Status",
        [("message", 2, field.TYPE_STRING, one, ""), ("code", 3, field.TYPE_INT32, one, "")],
    )
    message(
        "Span",
        [
            ("trace_id", 1, field.TYPE_BYTES, one, ""),
            ("span_id", 2, field.TYPE_BYTES, one, ""),
            ("parent_span_id", 4, field.TYPE_BYTES, one, ""),
            ("name", 5, field.TYPE_STRING, one, ""),
            ("start_time_unix_nano", 7, field.TYPE_FIXED64, one, ""),
            ("end_time_unix_nano", 8, field.TYPE_FIXED64, one, ""),
            ("attributes", 9, field.TYPE_MESSAGE, many, "Span.AttributesEntry"),
            ("events", 11, field.TYPE_BYTES, many, ""),  # decoded with the full schema
            ("status", 15, field.TYPE_MESSAGE, one, "Status"),
            ("flags", 16, field.TYPE_FIXED32, one, ""),
        ],
        with_map=True,
    )
    message(
        "Resource",
        [("attributes", 1, field.TYPE_MESSAGE, many, "Resource.AttributesEntry")],
        with_map=True,
    )
    message("ScopeSpans", [("spans", 2, field.TYPE_MESSAGE, many, "Span")])
    message(
        "ResourceSpans",
        [
            ("resource", 1, field.TYPE_MESSAGE, one, "Resource"),
            ("scope_spans", 2, field.TYPE_MESSAGE, many, "ScopeSpans"),
        ],
    )
    message("Request", [("resource_spans", 1, field.TYPE_MESSAGE, many, "ResourceSpans")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.Request"))


# -- AnyValue, decoded by hand for the one-field shapes exporters send ---------------------------

_STRING, _BOOL, _INT, _DOUBLE, _BYTES = 0x0A, 0x10, 0x18, 0x21, 0x3A
_double = struct.Struct("<d").unpack_from


def any_value(raw: bytes) -> Any:
    """The value an ``AnyValue``'s bytes hold: str, bool, int, float, bytes, tuple or dict.

    A string that is not UTF-8 reads with U+FFFD for the bad bytes; bytes that are not an
    ``AnyValue`` read as None (a hostile value fails nothing).
    """
    if not raw:
        return None
    tag = raw[0]
    if tag == _STRING:
        size = raw[1] if len(raw) > 1 else 0x80
        if size < 0x80 and len(raw) == size + 2:
            return raw[2:].decode("utf-8", "replace")
    elif tag in (_INT, _BOOL):
        if len(raw) == 2 and raw[1] < 0x80:
            return raw[1] if tag == _INT else raw[1] != 0
    elif tag == _DOUBLE and len(raw) == 9:
        return _double(raw, 1)[0]
    return _decoded(raw)


def _decoded(raw: bytes) -> Any:
    """Every other shape (long strings and numbers, arrays, maps, repeated fields): the full
    schema's parser, then its value."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    try:
        value = AnyValue.FromString(raw)
    except Exception:  # protobuf's DecodeError, a string that is not UTF-8, garbage
        return _lenient_string(raw)
    return _value(value)


def _lenient_string(raw: bytes) -> Any:
    """A lone string field whose text is not UTF-8, with U+FFFD for the bad bytes; else None."""
    if raw[:1] != bytes((_STRING,)):
        return None
    size, at, shift = 0, 1, 0
    while at < len(raw) and shift < 35:
        byte = raw[at]
        size |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if byte < 0x80:
            break
    else:
        return None
    return raw[at:].decode("utf-8", "replace") if len(raw) - at == size else None


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return {pair.key: _value(pair.value) for pair in value.kvlist_value.values}
    return getattr(value, kind)


class DecodedValues(dict[bytes, Any]):
    """Raw ``AnyValue`` bytes -> the value, decoded on first sight: one request's spans repeat
    their values (an operation name, a model, a host), so each is decoded once. Lives as long
    as the request is being assembled."""

    def __missing__(self, raw: bytes) -> Any:
        value = any_value(raw)
        if not isinstance(value, dict | tuple):  # shared between spans: immutable values only
            self[raw] = value
        return value


class RawAttributes(Mapping[str, Any]):
    """A span's attributes as the export carried them: keys, and each value decoded when read.

    Holds the parser's map while its request is being assembled; ``detach`` copies the raw
    bytes out (a span left waiting in the buffer must not keep its whole request alive), all
    but those of the values the span has decoded already (``SpanData.known``), which it keeps.
    """

    __slots__ = ("_decoded", "_known", "_raw")

    def __init__(
        self, raw: Mapping[str, bytes], decoded: Mapping[bytes, Any] | None = None
    ) -> None:
        self._raw = raw
        self._decoded = decoded  # raw value -> value, shared by one request's spans
        self._known: Mapping[str, Any] | None = None  # once detached: the values decoded

    def _value(self, raw: bytes) -> Any:
        return any_value(raw) if self._decoded is None else self._decoded[raw]

    def __getitem__(self, key: str) -> Any:
        raw = self._raw.get(key)
        if raw is not None:
            return self._value(raw)
        if self._known is not None and key in self._known:
            return self._known[key]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return key in self._raw or (self._known is not None and key in self._known)

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw) if self._known is None else chain(self._raw, self._known)

    def __len__(self) -> int:
        return len(self._raw) + (0 if self._known is None else len(self._known))

    def sorted_items(self, first: int) -> Iterable[tuple[str, Any]]:
        """(key, value) in key order: the ``first`` decoded at once, the others as reached."""
        raw, decoded, known = self._raw, self._decoded, self._known
        if decoded is None:
            decoded = DecodedValues()
        if known is not None:  # detached: a plain dict, read through __getitem__
            keys = sorted(self)
            return ((key, self[key]) for key in keys)
        keys = sorted(raw)  # (the parser's map has no fast items())
        head = [(key, decoded[raw[key]]) for key in keys[:first]]
        if len(keys) <= first:
            return head
        return chain(head, ((key, decoded[raw[key]]) for key in keys[first:]))

    def detach(self, known: Mapping[str, Any]) -> None:
        """Keep a copy of the raw bytes of the values not in ``known`` (the span's decoded
        values, kept instead), not the parser's map (nor its request)."""
        if self._known is None:
            raw = self._raw
            self._raw = {key: raw[key] for key in raw if key not in known}
            self._known = known
            self._decoded = None

    def raw_size(self) -> int:
        """The bytes of its keys and undecoded values (not those of ``known``)."""
        return sum(len(key) + len(value) for key, value in self._raw.items())


def raw_size(attributes: Mapping[str, Any]) -> int | None:
    """``attributes``' raw size if it is a ``RawAttributes`` (None: a decoded mapping)."""
    return attributes.raw_size() if isinstance(attributes, RawAttributes) else None
