"""The receiver's memory is bounded and its cost linear, whatever a client sends: orphan spans
bounded in bytes and in traces (the oldest dropped, counted), one trace of thousands of agent
spans assembled right, and a body nested past any real export answered 400. Real HTTP on
loopback; memory measured with ``tracemalloc``."""

from __future__ import annotations

import gc
import tracemalloc
import warnings
from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from otel_helpers import TEST_TOKEN, Recorder, post

from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.receiver import JSON, TRACES_PATH, OtlpReceiver

_ABSENT = (1).to_bytes(8, "big")


def _kv(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _body(spans: list[Span]) -> bytes:
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])]
    )
    return bytes(request.SerializeToString())


def _span(
    trace: int, span: int, parent: bytes, attributes: dict[str, str | int], end: int = 2
) -> Span:
    return Span(
        trace_id=trace.to_bytes(16, "big"),
        span_id=span.to_bytes(8, "big"),
        parent_span_id=parent,
        name="s",
        start_time_unix_nano=1,
        end_time_unix_nano=end,
        attributes=[_kv(k, v) for k, v in attributes.items()],
    )


def _chat(tokens: int) -> dict[str, str | int]:
    return {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": tokens}


def _agent(name: str) -> dict[str, str | int]:
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}


@pytest.fixture(autouse=True)
def _collected_first() -> None:
    """Collect what earlier tests left to the collector (a client's socket) before these tests
    allocate enough to run it: its warning would be taken for theirs, and it would count in
    the memory they measure."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def _receiver(assembler: TraceAssembler) -> OtlpReceiver:
    return OtlpReceiver(assembler, port=0, max_body_bytes=4_000_000, token=TEST_TOKEN).start()


@pytest.fixture
def bounded(recorder: Recorder) -> Iterator[OtlpReceiver]:
    receiver = _receiver(TraceAssembler(recorder, max_open_bytes=5_000_000, max_open_traces=3))
    yield receiver
    receiver.close()


def test_orphans_of_a_rootless_trace_are_bounded_in_bytes(bounded: OtlpReceiver) -> None:
    target = bounded.endpoint + TRACES_PATH
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(30):  # 30 MB posted into one trace whose root never comes
            payload = chr(ord("a") + i % 26) * 1_000_000
            assert post(target, _body([_span(7, 100 + i, _ABSENT, {"payload": payload})]))[0] == 200
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    counts = bounded.assembler.counts()
    assert counts.open_bytes <= 5_000_000
    assert counts.orphans_over_bound >= 25
    assert counts.orphans == counts.orphans_over_bound
    assert held < 12_000_000  # the bound and one request in flight, not the 30 MB posted


def test_past_the_bound_of_traces_the_oldest_are_dropped_and_counted(
    bounded: OtlpReceiver,
) -> None:
    target = bounded.endpoint + TRACES_PATH
    for trace in range(1, 6):
        body = _body([_span(trace, 10, _ABSENT, {}), _span(trace, 11, _ABSENT, {})])
        assert post(target, body)[0] == 200
    counts = bounded.assembler.counts()
    assert counts.open_traces == 3
    assert (counts.orphans, counts.orphans_over_bound) == (4, 4)
    # the two oldest went: a span of the first trace again waits alone, evicting the third
    assert post(target, _body([_span(1, 12, _ABSENT, {})]))[0] == 200
    assert bounded.assembler.counts().orphans_over_bound == 6


def test_thousands_of_agent_spans_in_one_trace_are_each_recorded_with_their_own_chats(
    recorder: Recorder,
) -> None:
    receiver = _receiver(TraceAssembler(recorder))
    spans = []
    for i in range(5_000):  # siblings under a parent not yet arrived, each with one chat
        agent = 1_000 + 2 * i
        spans.append(_span(9, agent + 1, agent.to_bytes(8, "big"), _chat(i)))
        spans.append(_span(9, agent, _ABSENT, _agent(f"a{i}")))
    parent = _ABSENT  # and 300 agents nested in one another, each with one chat of its own
    for depth in range(300):
        agent = 100_000 + 2 * depth
        spans.append(_span(9, agent + 1, agent.to_bytes(8, "big"), _chat(depth)))
        spans.append(_span(9, agent, parent, _agent(f"n{depth}"), end=10_000 - depth))
        parent = agent.to_bytes(8, "big")
    try:
        assert post(receiver.endpoint + TRACES_PATH, _body(spans))[0] == 200
    finally:
        receiver.close()
    runs = {r.agent_name: r.input_tokens for r in recorder.records}
    assert len(recorder.records) == 5_300
    assert all(runs[f"a{i}"] == i for i in range(5_000))
    assert all(runs[f"n{d}"] == d for d in range(300))
    assert receiver.assembler.counts().open_bytes == 0


def test_a_body_nested_past_any_export_is_answered_400(recorder: Recorder) -> None:
    receiver = _receiver(TraceAssembler(recorder))
    target = receiver.endpoint + TRACES_PATH
    try:
        status, reason = post(target, b"[" * 200_000, content_type=JSON)
        assert status == 400
        assert b"nested too deeply" in reason
        # a well-formed export whose one attribute nests arrays 5,000 deep
        deep = '{"arrayValue": {"values": [' * 5_000 + '{"stringValue": "x"}' + "]}}" * 5_000
        body = (
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "' + "1" * 32 + '", '
            '"spanId": "' + "2" * 16 + '", "name": "s", "attributes": [{"key": "deep", '
            '"value": ' + deep + "}]}]}]}]}"
        )
        status, reason = post(target, body.encode(), content_type=JSON)
        assert status == 400, reason
        assert post(target, b'{"resourceSpans": []}', content_type=JSON)[0] == 200
    finally:
        receiver.close()


def test_an_open_trace_does_not_keep_the_runs_it_recorded() -> None:
    recorded: list[int] = []  # counted, not kept: only the buffer's memory is measured
    receiver = _receiver(TraceAssembler(lambda record: recorded.append(1)))
    target = receiver.endpoint + TRACES_PATH
    try:
        # one span that keeps the trace open (its parent never comes)
        assert post(target, _body([_span(5, 2, _ABSENT, {"payload": "w"})]))[0] == 200
        gc.collect()
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            for request in range(30):  # 3,000 complete runs of 10 kB spans: 30 MB posted
                spans = []
                for i in range(100):
                    agent = 1_000 + 200 * request + 2 * i
                    run = {**_agent("a"), "payload": "c" * 10_000}
                    spans.append(_span(5, agent + 1, agent.to_bytes(8, "big"), _chat(1)))
                    spans.append(_span(5, agent, _ABSENT, run))
                assert post(target, _body(spans))[0] == 200
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - start
        finally:
            tracemalloc.stop()
    finally:
        receiver.close()
    assert len(recorded) == 3_000
    assert receiver.assembler.counts().open_traces == 1
    assert held < 5_000_000, held  # not the 30 MB of spans it recorded
