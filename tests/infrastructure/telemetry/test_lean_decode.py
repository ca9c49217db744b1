"""The receiver decodes only what the dialects read, and records exactly what a decoder that
reads every attribute records.

The reference here is the decoder the receiver had before: ``opentelemetry-proto``'s own
schema, every attribute of every span read into a dict. Random traces in every dialect's
shapes, values of every ``AnyValue`` kind among them, are encoded by the real protobuf encoder
and given to both; the runs recorded, the attributes and the decoded subset are compared.
Hostile values the lean decoder leaves as bytes until read fail nothing.
"""

from __future__ import annotations

import gc
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
from otel_helpers import Recorder

from agentmend.infrastructure.monitoring.performance_monitor import (
    InvalidExecution,
    PerformanceMonitor,
)
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.mapping import DIALECT_KEYS
from agentmend.infrastructure.telemetry.otlp_decode import OtlpDecodeError, decode_protobuf
from agentmend.infrastructure.telemetry.otlp_lean import lean_request_type
from agentmend.infrastructure.telemetry.span import SpanData, SpanEvent

# -- the reference: every attribute read with the full schema -----------------------------------


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return {pair.key: _value(pair.value) for pair in value.kvlist_value.values}
    return getattr(value, kind)


def _full(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def reference_spans(body: bytes) -> list[SpanData]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _full(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    SpanData(
                        span.trace_id,
                        span.span_id,
                        span.parent_span_id,
                        span.name,
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        span.status.code,
                        span.status.message,
                        _full(span.attributes),
                        tuple(
                            SpanEvent(e.name, e.time_unix_nano, _full(e.attributes))
                            for e in span.events
                        ),
                        resource,
                        span.flags & 0x300 == 0x300,
                    )
                )
    return spans


# -- random traces in the dialects' shapes ------------------------------------------------------


def _any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, tuple):
        return AnyValue(array_value=ArrayValue(values=[_any(v) for v in value]))
    if isinstance(value, dict):
        pairs = [KeyValue(key=k, value=_any(v)) for k, v in value.items()]
        return AnyValue(kvlist_value=KeyValueList(values=pairs))
    return AnyValue(string_value=value)


def _noise(rng: random.Random) -> Any:
    return rng.choice(
        [
            "plain",
            "é" * rng.randint(0, 300),  # past one length byte
            rng.randint(-(2**63), 2**63 - 1),
            rng.randint(0, 127),
            rng.random() * 1e6,
            rng.choice([True, False]),
            b"\x00\xff",
            ("a", 1, ("nested", 2.5)),
            {"k": "v", "n": {"deep": 1}},
        ]
    )


_AGENT_SHAPES: list[dict[str, Any]] = [
    {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher"},
    {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": "id-7"},
    {"openinference.span.kind": "AGENT"},  # named by its span name
    {"traceloop.span.kind": "agent", "traceloop.entity.name": "writer"},
    {"gen_ai.operation.name": "invoke_agent", "agentmend.release": "3", "agentmend.team": "t"},
    {"gen_ai.operation.name": "invoke_agent", "gen_ai.aggregated_usage.input_tokens": 40,
     "gen_ai.aggregated_usage.output_tokens": 9},
]  # fmt: skip
_CHAT_SHAPES: list[dict[str, Any]] = [
    {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1",
     "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 2},
    {"openinference.span.kind": "LLM", "llm.model_name": "m2", "llm.token_count.prompt": 5,
     "llm.token_count.completion": 1},
    {"llm.request.type": "chat", "gen_ai.response.model": "m3",
     "gen_ai.usage.prompt_tokens": 7, "gen_ai.usage.completion_tokens": 3},
    {"gen_ai.operation.name": "chat", "http.request.method": "POST", "gen_ai.request.model": "m1",
     "gen_ai.usage.input_tokens": 10},  # the SDK's own span of a call
    {"gen_ai.operation.name": "chat", "gen_ai.response.id": "msg_1", "model": "m4",
     "input_tokens": 3, "output_tokens": 1, "error.type": "overloaded"},
    {"gen_ai.operation.name": "text_completion", "agent.name": "sub", "success": False,
     "error": "boom"},
]  # fmt: skip


def _span(rng: random.Random, trace: int, span: int, parent: int, shape: dict[str, Any]) -> Span:
    attributes = dict(shape)
    for index in range(rng.randint(0, 14)):
        attributes[f"app.attr{index}"] = _noise(rng)
    if rng.random() < 0.1:
        attributes["agentmend.recorded"] = True
    pairs = [KeyValue(key=k, value=_any(v)) for k, v in attributes.items()]
    rng.shuffle(pairs)
    failed = rng.random() < 0.3
    events = []
    if failed and rng.random() < 0.5:
        events.append(
            Span.Event(
                name="exception",
                time_unix_nano=5,
                attributes=[
                    KeyValue(key="exception.type", value=_any("ValueError")),
                    KeyValue(key="exception.message", value=_any("bad")),
                ],
            )
        )
    start = rng.randint(1, 10**9)
    return Span(
        trace_id=trace.to_bytes(16, "big"),
        span_id=span.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=rng.choice(["invoke_agent researcher", "chat", "claude_code.llm_request", "s"]),
        start_time_unix_nano=start,
        end_time_unix_nano=start + rng.randint(0, 10**8),
        attributes=pairs,
        events=events,
        status=Status(
            code=Status.STATUS_CODE_ERROR if failed else Status.STATUS_CODE_UNSET,
            message=rng.choice(["", "it failed"]),
        ),
    )


def random_bodies(seed: int, traces: int) -> list[bytes]:
    rng = random.Random(seed)
    spans: list[Span] = []
    ids = iter(range(1, 10**9))
    for trace in range(1, traces + 1):
        root = next(ids)
        shape = rng.choice([*_AGENT_SHAPES, *_CHAT_SHAPES, {"http.route": "/x"}])
        spans.append(_span(rng, trace, root, 0, shape))
        for _ in range(rng.randint(0, 4)):
            parent = rng.choice([root, next(ids)])  # some parents never arrive
            shape = rng.choice([*_AGENT_SHAPES, *_CHAT_SHAPES, *_CHAT_SHAPES, {"db.system": "pg"}])
            spans.append(_span(rng, trace, next(ids), parent, shape))
    rng.shuffle(spans)  # traces split across requests, children before or after parents
    resource = Resource(
        attributes=[
            KeyValue(key="service.name", value=_any("svc")),
            KeyValue(key="x", value=_any(1)),
        ]
    )
    bodies = []
    for start in range(0, len(spans), 37):
        request = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    resource=resource, scope_spans=[ScopeSpans(spans=spans[start : start + 37])]
                )
            ]
        )
        bodies.append(request.SerializeToString())
    return bodies


def _runs(recorder: Recorder) -> list[tuple[Any, ...]]:
    return [
        (r.agent_name, r.success, r.duration_ms, r.error, r.input_tokens, r.output_tokens,
         r.timestamp, dict(r.extra))
        for r in recorder.records
    ]  # fmt: skip


def test_the_lean_decoder_records_what_reading_every_attribute_records() -> None:
    for seed in range(4):
        lean, full = Recorder(), Recorder()
        lean_assembler, full_assembler = TraceAssembler(lean), TraceAssembler(full)
        for body in random_bodies(seed, traces=150):
            decoded = decode_protobuf(body).spans
            expected = reference_spans(body)
            assert len(decoded) == len(expected)
            for ours, theirs in zip(decoded, expected, strict=True):
                assert dict(ours.attributes) == theirs.attributes
                assert ours.known == {
                    key: value for key, value in theirs.attributes.items() if key in DIALECT_KEYS
                }
                assert ours[:8] == theirs[:8]  # ids, name, times, status
                assert ours.events == theirs.events
                assert ours.parent_is_remote == theirs.parent_is_remote
                assert ours.resource == theirs.resource
            lean_assembler.add(decoded)
            full_assembler.add(expected)
            for ours, theirs in zip(decoded, expected, strict=True):  # spans left waiting too
                assert dict(ours.attributes) == theirs.attributes
                assert sorted(ours.attributes) == sorted(theirs.attributes)
        assert lean.records, "the random traces record runs"
        assert _runs(lean) == _runs(full)
        lean_counts, full_counts = lean_assembler.counts(), full_assembler.counts()
        # the bytes of the spans left waiting are estimated from what each holds: raw bytes
        # here, decoded values there
        assert replace(lean_counts, open_bytes=0) == replace(full_counts, open_bytes=0)
        assert full_counts.open_bytes / 2 < lean_counts.open_bytes < full_counts.open_bytes * 2


def _varint(number: int) -> bytes:
    out = bytearray()
    while number >= 0x80:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _lean_body(
    attributes: dict[str, bytes], name: str = "invoke_agent", events: tuple[bytes, ...] = ()
) -> bytes:
    """An export whose one span's attribute values and events are the raw bytes given."""
    request = lean_request_type()()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id = (1).to_bytes(16, "big")
    span.span_id = (2).to_bytes(8, "big")
    span.name = name
    span.end_time_unix_nano = 10
    for key, raw in attributes.items():
        span.attributes[key] = raw
    span.events.extend(events)
    return bytes(request.SerializeToString())


def test_hostile_values_left_as_bytes_fail_nothing_and_read_as_text_or_none() -> None:
    deep = _any("x").SerializeToString()
    for _ in range(200):  # arrays nested past the protobuf parser's limit, encoded by hand
        array = b"\x0a" + _varint(len(deep)) + deep  # ArrayValue.values
        deep = b"\x2a" + _varint(len(array)) + array  # AnyValue.array_value
    body = _lean_body(
        {
            "gen_ai.operation.name": _any("invoke_agent").SerializeToString(),
            "gen_ai.agent.name": b"\x0a\x04ab\xff\xfe",  # a string that is not UTF-8
            "garbage": b"\xff\xff\xff",
            "deep": deep,
        },
        events=(b"\xff\xff garbage", Span.Event(name="exception").SerializeToString()),
    )
    (span,) = decode_protobuf(body).spans
    assert span.known["gen_ai.agent.name"] == "ab\ufffd\ufffd"
    assert span.attributes["garbage"] is None
    assert span.attributes["deep"] is None  # the full schema refuses it too: nothing to read
    assert span.events == (SpanEvent("exception", 0, {}),)  # the garbage event left out
    recorder = Recorder()
    TraceAssembler(recorder).add([span])
    (run,) = recorder.records
    assert run.agent_name == "ab\ufffd\ufffd"
    assert run.extra["attributes"] == {  # the scalars; the garbage and the deep array read None
        "gen_ai.agent.name": "ab\ufffd\ufffd",
        "gen_ai.operation.name": "invoke_agent",
    }


def test_a_span_left_waiting_keeps_plain_values_not_its_request() -> None:
    chat = _any("chat").SerializeToString()
    body = _lean_body(
        {"gen_ai.operation.name": chat, "payload": _any("p" * 1000).SerializeToString()}
    )
    request = lean_request_type().FromString(body)
    request.resource_spans[0].scope_spans[0].spans[0].parent_span_id = (9).to_bytes(8, "big")
    assembler = TraceAssembler(Recorder())
    (span,) = decode_protobuf(request.SerializeToString()).spans
    assembler.add([span])
    assert assembler.counts().open_traces == 1  # waits for a parent that never comes
    reachable = [span.attributes, *gc.get_referents(span.attributes)]
    assert not [o for o in reachable if type(o).__module__.startswith("google")]
    assert span.attributes["payload"] == "p" * 1000
    assert assembler.counts().open_bytes >= 1000


def test_runs_reach_the_monitor_as_plain_values_stored_with_their_spans_end(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "agentmend.db")
    monitor = PerformanceMonitor(store, flush_interval_s=3600)
    try:
        body = _lean_body(
            {
                "gen_ai.operation.name": _any("invoke_agent").SerializeToString(),
                "gen_ai.agent.name": _any("planner").SerializeToString(),
                "app.tenant": _any("acme").SerializeToString(),
            }
        )
        TraceAssembler(monitor).add(decode_protobuf(body).spans)
        monitor.flush()
        with store.snapshot() as conn:
            row = conn.execute(
                "SELECT agent, success, duration_ms, ts, extra FROM executions"
            ).fetchone()
        assert tuple(row[:4]) == ("planner", 1, 10 / 1e6, 10 / 1e9)  # 10 ns long, ended at 10 ns
        extra = json.loads(row[4])
        assert extra["attributes"] == {
            "app.tenant": "acme",
            "gen_ai.agent.name": "planner",
            "gen_ai.operation.name": "invoke_agent",
        }
        with pytest.raises(InvalidExecution, match="duration_ms"):
            monitor.record_observed("planner", True, -1.0, None, 0, 0, 1.0, {})
    finally:
        monitor.close()
        store.close()


def test_a_key_that_is_not_utf8_still_fails_the_parse() -> None:
    def field(tag: int, payload: bytes) -> bytes:
        return bytes((tag,)) + _varint(len(payload)) + payload

    def body(key: bytes) -> bytes:
        entry = field(0x0A, key) + field(0x12, _any("x").SerializeToString())
        span = field(0x0A, (1).to_bytes(16, "big")) + field(0x12, (2).to_bytes(8, "big"))
        return field(0x0A, field(0x12, field(0x12, span + field(0x4A, entry))))

    assert dict(decode_protobuf(body(b"ok")).spans[0].attributes) == {"ok": "x"}
    with pytest.raises(OtlpDecodeError, match="UTF-8"):
        decode_protobuf(body(b"\xff\xfe"))
