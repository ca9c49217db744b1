"""Decode an OTLP trace export (protobuf or OTLP/JSON) into :class:`SpanData` values.

Protobuf is parsed with a lean schema (``otlp_lean``: the ``[otel]`` extra, imported on first
use) that leaves attribute values as bytes: only the attributes the dialects read
(``mapping.DIALECT_KEYS``) are decoded into ``SpanData.known``; the others are decoded when
something reads them (``SpanData.attributes`` is a ``RawAttributes``). Resources (one per
batch, read by naming rules) and events (few, read for error texts) are decoded whole.
OTLP/JSON differs from protobuf's own JSON mapping (ids are hex strings, not base64, and 64-bit
integers may be strings), so it is read by hand here. A body that is not a trace export at all
raises :class:`OtlpDecodeError`; a span with a malformed id is rejected on its own and counted,
as OTLP's ``partial_success`` reports it, so one bad span does not cost the rest of the batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentmend.infrastructure.errors import AgentmendError
from agentmend.infrastructure.telemetry.mapping import DIALECT_KEYS
from agentmend.infrastructure.telemetry.otlp_lean import (
    DecodedValues,
    RawAttributes,
    any_value,
    lean_request_type,
)
from agentmend.infrastructure.telemetry.span import OtelExtraMissing, SpanData, SpanEvent

__all__ = [
    "DecodedBatch",
    "OtlpDecodeError",
    "Rejections",
    "decode_attributes",
    "decode_json",
    "decode_json_attributes",
    "decode_protobuf",
    "require_proto",
]

_TRACE_ID_BYTES = 16
_SPAN_ID_BYTES = 8
_NO_TRACE_ID = bytes(_TRACE_ID_BYTES)  # all zeros: invalid (a comparison, not a scan by any())
_NO_SPAN_ID = bytes(_SPAN_ID_BYTES)
_MAX_REASONS = 5
_PARENT_IS_REMOTE = 0x300
"""OTLP span flags: bit 8 says whether bit 9 is known, bit 9 that the parent is remote."""
# a SpanData made from its fields in order, ``known`` last, without its __new__'s defaults
_new_span = tuple.__new__


class OtlpDecodeError(AgentmendError):
    """A request body that is not an OTLP trace export; ``reason`` says why, for the 400 answer."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass
class Rejections:
    """How many items of one export request were rejected, with a few distinct reasons."""

    rejected: int = 0
    reasons: list[str] = field(default_factory=list)

    def reject(self, reason: str) -> None:
        self.rejected += 1
        if len(self.reasons) < _MAX_REASONS and reason not in self.reasons:
            self.reasons.append(reason)


@dataclass
class DecodedBatch(Rejections):
    """The spans of one export request, and how many were rejected (with a few reasons)."""

    spans: list[SpanData] = field(default_factory=list)


def require_proto() -> None:
    """Fail now, in one line naming the extra, if opentelemetry-proto is missing.

    Raises:
        OtelExtraMissing: it is not installed.
    """
    _event_type()
    lean_request_type()


def _event_type() -> Any:
    try:
        from opentelemetry.proto.trace.v1.trace_pb2 import Span
    except ImportError as exc:
        raise OtelExtraMissing("opentelemetry-proto") from exc
    return Span.Event


# -- protobuf -----------------------------------------------------------------------------------


def decode_protobuf(body: bytes) -> DecodedBatch:
    """The spans of a protobuf ``ExportTraceServiceRequest``.

    Raises:
        OtlpDecodeError: the body does not parse (garbage, truncated).
        OtelExtraMissing: opentelemetry-proto is not installed.
    """
    request_type = lean_request_type()
    try:
        request = request_type.FromString(body)
    except Exception as exc:  # protobuf's DecodeError, and upb's RuntimeError on some garbage
        raise OtlpDecodeError(f"not an OTLP protobuf trace export ({exc})") from exc
    batch = DecodedBatch()
    spans = batch.spans
    append = spans.append
    wanted = DIALECT_KEYS.intersection
    decoded = DecodedValues()  # one request's spans repeat their values: each decoded once
    for resource_spans in request.resource_spans:
        resource = {key: any_value(raw) for key, raw in resource_spans.resource.attributes.items()}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                trace_id = span.trace_id
                span_id = span.span_id
                if len(trace_id) != _TRACE_ID_BYTES or trace_id == _NO_TRACE_ID:
                    batch.reject("a span has an invalid trace_id")
                    continue
                if len(span_id) != _SPAN_ID_BYTES or span_id == _NO_SPAN_ID:
                    batch.reject("a span has an invalid span_id")
                    continue
                raw = span.attributes
                events = span.events
                status = span.status
                append(
                    _new_span(
                        SpanData,
                        (
                            trace_id,
                            span_id,
                            span.parent_span_id,
                            span.name,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            status.code,
                            status.message,
                            RawAttributes(raw, decoded),
                            _events(events) if events else (),
                            resource,
                            span.flags & _PARENT_IS_REMOTE == _PARENT_IS_REMOTE,
                            {key: decoded[raw[key]] for key in wanted(raw)},
                        ),
                    )
                )
    return batch


def _events(raw_events: Any) -> tuple[SpanEvent, ...]:
    """A span's events, parsed with the full schema (a malformed one is left out)."""
    event_type = _event_type()
    events = []
    for raw in raw_events:
        try:
            event = event_type.FromString(raw)
        except Exception:  # protobuf's DecodeError: garbage in one event costs only that event
            continue
        events.append(SpanEvent(event.name, event.time_unix_nano, _attributes(event.attributes)))
    return tuple(events)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


# -- OTLP/JSON ----------------------------------------------------------------------------------


def decode_json(body: bytes) -> DecodedBatch:
    """The spans of an OTLP/JSON trace export (``resourceSpans``, hex ids).

    Raises:
        OtlpDecodeError: not JSON, or not shaped like a trace export.
    """
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OtlpDecodeError(f"not JSON ({exc})") from exc
    except RecursionError as exc:  # thousands of nested [ or {: no trace export nests so
        raise OtlpDecodeError("not an OTLP/JSON trace export (nested too deeply)") from exc
    if not isinstance(document, dict) or not isinstance(document.get("resourceSpans", []), list):
        raise OtlpDecodeError("not an OTLP/JSON trace export (no resourceSpans list)")
    batch = DecodedBatch()
    try:
        for resource_spans in document.get("resourceSpans", []):
            resource = _json_attributes((resource_spans.get("resource") or {}).get("attributes"))
            for scope_spans in resource_spans.get("scopeSpans") or []:
                for span in scope_spans.get("spans") or []:
                    _json_span(span, resource, batch)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        raise OtlpDecodeError(f"not an OTLP/JSON trace export ({exc})") from exc
    except RecursionError as exc:  # attribute values nested past the interpreter's stack
        raise OtlpDecodeError("not an OTLP/JSON trace export (nested too deeply)") from exc
    return batch


def _json_span(span: Mapping[str, Any], resource: dict[str, Any], batch: DecodedBatch) -> None:
    trace_id = _hex_id(span.get("traceId"), _TRACE_ID_BYTES)
    span_id = _hex_id(span.get("spanId"), _SPAN_ID_BYTES)
    if trace_id is None:
        batch.reject("a span has an invalid traceId")
        return
    if span_id is None:
        batch.reject("a span has an invalid spanId")
        return
    parent = span.get("parentSpanId") or ""
    parent_id = _hex_id(parent, _SPAN_ID_BYTES) if parent else b""
    status = span.get("status") or {}
    try:
        start = int(span.get("startTimeUnixNano") or 0)
        end = int(span.get("endTimeUnixNano") or 0)
        code = _status_code(status.get("code", 0))
        remote = int(span.get("flags") or 0) & _PARENT_IS_REMOTE == _PARENT_IS_REMOTE
    except (TypeError, ValueError):
        batch.reject("a span has a non-numeric time or status")
        return
    try:
        events = tuple(
            SpanEvent(
                str(event.get("name", "")),
                int(event.get("timeUnixNano") or 0),
                _json_attributes(event.get("attributes")),
            )
            for event in span.get("events") or []
        )
    except (TypeError, ValueError, KeyError):
        batch.reject("a span has a malformed event")
        return
    batch.spans.append(
        SpanData(
            trace_id,
            span_id,
            parent_id or b"",
            str(span.get("name", "")),
            start,
            end,
            code,
            str(status.get("message") or ""),
            _json_attributes(span.get("attributes")),
            events,
            resource,
            remote,
        )
    )


_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def _status_code(code: Any) -> int:
    if isinstance(code, str) and code in _STATUS_NAMES:
        return _STATUS_NAMES[code]
    return int(code)


def _hex_id(text: Any, size: int) -> bytes | None:
    if not isinstance(text, str) or len(text) != size * 2:
        return None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    return raw if any(raw) else None


def _json_attributes(pairs: Any) -> dict[str, Any]:
    if not pairs:
        return {}
    return {pair["key"]: _json_value(pair.get("value") or {}) for pair in pairs}


def _json_value(value: Mapping[str, Any]) -> Any:
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return tuple(_json_value(v) for v in value["arrayValue"].get("values") or [])
    if "kvlistValue" in value:
        return _json_attributes(value["kvlistValue"].get("values"))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


# the attribute readers, for the decoders of the other OTLP signals (logs, metrics)
decode_attributes = _attributes
decode_json_attributes = _json_attributes
