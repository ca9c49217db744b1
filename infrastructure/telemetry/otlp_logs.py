"""Decode OTLP log and metric exports (protobuf or OTLP/JSON), and encode their answers.

Logs carry events (Claude Code's default telemetry: ``claude_code.api_request`` and the rest);
each log record becomes a :class:`LogEvent`. Metrics are only counted: their data points are
aggregates over a whole session (tokens, cost), which the events already give per prompt. A body
that is not an export of the signal raises ``OtlpDecodeError`` (a 400); a record that is not an
object is rejected on its own and counted, as OTLP's ``partial_success`` reports it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentmend.infrastructure.telemetry.otlp_decode import (
    OtlpDecodeError,
    Rejections,
    decode_attributes,
    decode_json_attributes,
)

__all__ = [
    "DecodedLogs",
    "LogEvent",
    "decode_logs_json",
    "decode_logs_protobuf",
    "logs_answer",
    "metric_points_json",
    "metric_points_protobuf",
    "metrics_answer",
]

_POINT_KINDS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")
_JSON_POINT_KINDS = ("gauge", "sum", "histogram", "exponentialHistogram", "summary")


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One log record: its event name (``event.name``, else the body), time and attributes."""

    name: str
    time_ns: int
    attributes: Mapping[str, Any]
    resource: Mapping[str, Any]


@dataclass
class DecodedLogs(Rejections):
    """The events of one export request, and how many records were rejected."""

    events: list[LogEvent] = field(default_factory=list)


def _event_name(attributes: Mapping[str, Any], record_name: str, body: Any) -> str:
    named = attributes.get("event.name")
    if isinstance(named, str) and named:
        return named
    if record_name:
        return record_name
    # Claude Code's body is the event's full name, ``claude_code.api_request``
    return body.rsplit(".", 1)[-1] if isinstance(body, str) else ""


# -- protobuf -----------------------------------------------------------------------------------


def decode_logs_protobuf(body: bytes) -> DecodedLogs:
    """The events of a protobuf ``ExportLogsServiceRequest``.

    Raises:
        OtlpDecodeError: the body does not parse.
        OtelExtraMissing: opentelemetry-proto is not installed.
    """
    from agentmend.infrastructure.telemetry.otlp_decode import require_proto

    require_proto()
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    try:
        request = ExportLogsServiceRequest.FromString(body)
    except Exception as exc:  # protobuf's DecodeError, and upb's RuntimeError on some garbage
        raise OtlpDecodeError(f"not an OTLP protobuf logs export ({exc})") from exc
    decoded = DecodedLogs()
    for resource_logs in request.resource_logs:
        resource = decode_attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                attributes = decode_attributes(record.attributes)
                text = record.body.HasField("string_value")
                body_value = record.body.string_value if text else ""
                decoded.events.append(
                    LogEvent(
                        _event_name(attributes, record.event_name, body_value),
                        record.time_unix_nano or record.observed_time_unix_nano,
                        attributes,
                        resource,
                    )
                )
    return decoded


def metric_points_protobuf(body: bytes) -> int:
    """How many data points a protobuf ``ExportMetricsServiceRequest`` holds.

    Raises:
        OtlpDecodeError: the body does not parse.
    """
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    try:
        request = ExportMetricsServiceRequest.FromString(body)
    except Exception as exc:
        raise OtlpDecodeError(f"not an OTLP protobuf metrics export ({exc})") from exc
    points = 0
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind in _POINT_KINDS:
                    points += len(getattr(metric, kind).data_points)
    return points


# -- OTLP/JSON ----------------------------------------------------------------------------------


def _json_document(body: bytes, key: str, signal: str) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OtlpDecodeError(f"not JSON ({exc})") from exc
    except RecursionError as exc:
        raise OtlpDecodeError(f"not an OTLP/JSON {signal} export (nested too deeply)") from exc
    if not isinstance(document, dict) or not isinstance(document.get(key, []), list):
        raise OtlpDecodeError(f"not an OTLP/JSON {signal} export (no {key} list)")
    return document


def decode_logs_json(body: bytes) -> DecodedLogs:
    """The events of an OTLP/JSON logs export (``resourceLogs``).

    Raises:
        OtlpDecodeError: not JSON, or not shaped like a logs export.
    """
    document = _json_document(body, "resourceLogs", "logs")
    decoded = DecodedLogs()
    try:
        for resource_logs in document.get("resourceLogs", []):
            resource = decode_json_attributes(
                (resource_logs.get("resource") or {}).get("attributes")
            )
            for scope_logs in resource_logs.get("scopeLogs") or []:
                for record in scope_logs.get("logRecords") or []:
                    _json_record(record, resource, decoded)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        raise OtlpDecodeError(f"not an OTLP/JSON logs export ({exc})") from exc
    except RecursionError as exc:  # attribute values nested past the interpreter's stack
        raise OtlpDecodeError("not an OTLP/JSON logs export (nested too deeply)") from exc
    return decoded


def _json_record(record: Any, resource: dict[str, Any], decoded: DecodedLogs) -> None:
    if not isinstance(record, dict):
        decoded.reject("a log record is not an object")
        return
    try:
        attributes = decode_json_attributes(record.get("attributes"))
        time_ns = int(record.get("timeUnixNano") or record.get("observedTimeUnixNano") or 0)
    except (TypeError, ValueError, KeyError, AttributeError):
        decoded.reject("a log record has malformed attributes or time")
        return
    body = record.get("body")
    body = body.get("stringValue", "") if isinstance(body, dict) else ""
    name = record.get("eventName")
    decoded.events.append(
        LogEvent(
            _event_name(attributes, name if isinstance(name, str) else "", body),
            time_ns,
            attributes,
            resource,
        )
    )


def metric_points_json(body: bytes) -> int:
    """How many data points an OTLP/JSON metrics export holds.

    Raises:
        OtlpDecodeError: not JSON, or not shaped like a metrics export.
    """
    document = _json_document(body, "resourceMetrics", "metrics")
    points = 0
    try:
        for resource_metrics in document.get("resourceMetrics", []):
            for scope_metrics in resource_metrics.get("scopeMetrics") or []:
                for metric in scope_metrics.get("metrics") or []:
                    for kind in _JSON_POINT_KINDS:
                        data = metric.get(kind)
                        if data is not None:
                            points += len(data.get("dataPoints") or [])
    except (AttributeError, TypeError) as exc:
        raise OtlpDecodeError(f"not an OTLP/JSON metrics export ({exc})") from exc
    return points


# -- answers ------------------------------------------------------------------------------------


def logs_answer(protobuf: bool, decoded: DecodedLogs) -> bytes:
    """The body of the 200 answer to a logs export (``partial_success`` if any was rejected)."""
    message = "; ".join(decoded.reasons)
    if not protobuf:
        partial = (
            {
                "partialSuccess": {
                    "rejectedLogRecords": str(decoded.rejected),
                    "errorMessage": message,
                }
            }
            if decoded.rejected
            else {}
        )
        return json.dumps(partial).encode()
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsPartialSuccess,
        ExportLogsServiceResponse,
    )

    response = ExportLogsServiceResponse()
    if decoded.rejected:
        response.partial_success.CopyFrom(
            ExportLogsPartialSuccess(rejected_log_records=decoded.rejected, error_message=message)
        )
    return bytes(response.SerializeToString())


def metrics_answer(protobuf: bool) -> bytes:
    """The body of the 200 answer to a metrics export (every point taken: they are counted)."""
    if not protobuf:
        return b"{}"
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceResponse,
    )

    return bytes(ExportMetricsServiceResponse().SerializeToString())
