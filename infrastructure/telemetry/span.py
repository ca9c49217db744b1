"""The one shape a span takes inside agentmend, whatever it came from.

Spans reach agentmend three ways (OTLP protobuf, OTLP/JSON, the SDK's ``ReadableSpan`` in a
span processor); each is converted once into a :class:`SpanData` so the mapping and the
assembly buffer are written once. Ids are kept as bytes (16 for a trace, 8 for a span) because
that is what the protobuf and the SDK's integers turn into cheaply; hex is for display.

``attributes`` is every attribute of the span; ``known`` holds those the dialects read
(``DIALECT_KEYS``), already decoded. The mapping reads ``known`` only, so a decoder may leave
every other attribute undecoded until someone asks for it (a user's naming rule, the evidence
kept with a run): the protobuf decoder does. Spans built from a full mapping (the SDK's, OTLP/JSON,
tests) share one dict for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from agentmend.infrastructure.errors import ConfigurationError

__all__ = [
    "STATUS_ERROR",
    "STATUS_OK",
    "STATUS_UNSET",
    "OtelExtraMissing",
    "SpanData",
    "SpanEvent",
]


STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2


class OtelExtraMissing(ConfigurationError):
    """The ``[otel]`` extra (opentelemetry-sdk, opentelemetry-proto) is not installed."""

    def __init__(self, module: str) -> None:
        self.module = module
        super().__init__(
            f"{module} is not installed: install agentmend[otel] to take agent runs from "
            "OpenTelemetry spans"
        )


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """A timed event on a span (an exception, an evaluation result, ...)."""

    name: str
    time_ns: int
    attributes: Mapping[str, Any]


class _SpanFields(NamedTuple):
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    name: str
    start_ns: int
    end_ns: int
    status_code: int
    status_message: str
    attributes: Mapping[str, Any]
    events: tuple[SpanEvent, ...]
    resource: Mapping[str, Any]
    parent_is_remote: bool
    known: Mapping[str, Any]


class SpanData(_SpanFields):
    """One finished span with the attributes of the resource that emitted it (immutable).

    ``parent_span_id`` is ``b""`` for a root span. ``status_code`` is OTLP's (0 unset, 1 ok,
    2 error). ``resource`` is shared by every span of one resource (not copied per span).
    ``parent_is_remote``: the parent lives in another process, so this span is the local root
    of its trace. ``known``: the attributes the dialects read, decoded (``attributes`` itself
    when not given). A tuple rather than a frozen dataclass: a receiver makes one per span,
    and a frozen dataclass takes five times as long to make.
    """

    __slots__ = ()

    def __new__(
        cls,
        trace_id: bytes,
        span_id: bytes,
        parent_span_id: bytes,
        name: str,
        start_ns: int,
        end_ns: int,
        status_code: int,
        status_message: str,
        attributes: Mapping[str, Any],
        events: tuple[SpanEvent, ...],
        resource: Mapping[str, Any],
        parent_is_remote: bool = False,
        known: Mapping[str, Any] | None = None,
    ) -> SpanData:
        return tuple.__new__(
            cls,
            (
                trace_id,
                span_id,
                parent_span_id,
                name,
                start_ns,
                end_ns,
                status_code,
                status_message,
                attributes,
                events,
                resource,
                parent_is_remote,
                attributes if known is None else known,
            ),
        )

    @property
    def key(self) -> bytes:
        """``trace_id + span_id``: the idempotency key (an exporter's retry resends it)."""
        return self.trace_id + self.span_id

    @property
    def duration_ms(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e6

    def get(self, name: str) -> Any:
        """The span's attribute ``name``, else the resource's, else None."""
        value = self.attributes.get(name)
        return value if value is not None else self.resource.get(name)
