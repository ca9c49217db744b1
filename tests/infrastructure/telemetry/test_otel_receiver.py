"""The OTLP/HTTP receiver on loopback: the real OTLP exporter, OTLP/JSON, and bad input."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from otel_helpers import TEST_TOKEN, Recorder, SpanFactory, auth, post

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.receiver import OtlpReceiver


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def recorder(monitor: PerformanceMonitor) -> Recorder:
    return Recorder(monitor.record)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def receiver(recorder: Recorder, clock: Clock) -> Iterator[OtlpReceiver]:
    assembler = TraceAssembler(recorder, orphan_timeout_s=30, clock=clock)
    receiver = OtlpReceiver(
        assembler,
        port=0,
        token=TEST_TOKEN,
        max_body_bytes=1_000_000,
        max_decompressed_bytes=2_000_000,
    ).start()
    yield receiver
    receiver.close()


@pytest.fixture
def spans() -> Iterator[SpanFactory]:
    factory = SpanFactory()
    yield factory
    factory.close()


def url(receiver: OtlpReceiver, path: str = "/v1/traces") -> str:
    return receiver.endpoint + path


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_the_real_otlp_exporter_records_agent_runs(
    receiver: OtlpReceiver,
    recorder: Recorder,
    monitor: PerformanceMonitor,
    compression: Compression,
) -> None:
    factory = SpanFactory(service="checkout")
    exporter = OTLPSpanExporter(
        endpoint=url(receiver), compression=compression, timeout=5, headers=auth()
    )
    factory.provider.add_span_processor(BatchSpanProcessor(exporter))
    factory.agent_run("writer", chats=[(100, 20), (30, 7)])
    factory.agent_run("writer", chats=[(5, 1)], fail="the writer ran out of budget")
    factory.agent_run("planner", chats=[(1, 1)])
    assert factory.provider.force_flush(10_000)
    factory.close()

    runs = recorder.by_agent()
    assert sorted(runs) == ["planner", "writer"]
    ok, failed = runs["writer"]
    assert ok.success
    assert (ok.input_tokens, ok.output_tokens) == (130, 27)
    assert ok.extra["model"] == "claude-sonnet-4-5"
    assert ok.extra["service"] == "checkout"
    assert not failed.success
    assert failed.error == "RuntimeError: the writer ran out of budget"
    assert 0 < ok.duration_ms < 5_000
    monitor.flush()
    metrics = monitor.get_metrics()
    assert metrics["writer"].executions == 2
    assert metrics["writer"].failures == 1
    counts = receiver.assembler.counts()
    assert counts.executions_recorded == 3
    assert counts.open_traces == 0
    assert counts.orphans == 0


def test_children_arriving_before_their_agent_span_in_another_request_are_assembled(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory
) -> None:
    spans.agent_run("writer", chats=[(40, 4), (2, 2)])
    chat_one, chat_two, agent = spans.take()
    assert post(url(receiver), spans.body([chat_one]))[0] == 200
    assert post(url(receiver), spans.body([chat_two]))[0] == 200
    assert recorder.records == []  # nothing yet: the agent span has not come
    assert post(url(receiver), spans.body([agent]))[0] == 200
    (run,) = recorder.records
    assert (run.agent_name, run.input_tokens, run.output_tokens) == ("writer", 42, 6)


def test_a_retried_batch_records_nothing_twice(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory
) -> None:
    spans.agent_run("writer")
    spans.agent_run("writer")
    body = spans.body()
    for _ in range(3):
        assert post(url(receiver), body)[0] == 200
    assert len(recorder.records) == 2
    assert receiver.assembler.counts().duplicates == 2 * 4


def test_a_failed_chat_inside_a_successful_agent_run_does_not_fail_it(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory
) -> None:
    with (
        spans.tracer.start_as_current_span(
            "invoke_agent writer",
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "writer"},
        ),
        spans.tracer.start_as_current_span(
            "chat", attributes={"gen_ai.operation.name": "chat", "error.type": "overloaded_error"}
        ),
    ):
        pass
    post(url(receiver), spans.body())
    (run,) = recorder.records
    assert run.success
    assert run.error is None


def test_error_type_alone_marks_a_failure(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory
) -> None:
    spans.agent_run("writer", attributes={"error.type": "timeout"})
    post(url(receiver), spans.body())
    (run,) = recorder.records
    assert not run.success
    assert run.error == "timeout"


def test_chat_spans_with_no_agent_span_are_one_execution_each_named_by_the_service(
    receiver: OtlpReceiver, recorder: Recorder
) -> None:
    factory = SpanFactory(service="support-bot")
    factory.chat(11, 4)
    factory.chat(3, 2)
    post(url(receiver), factory.body())
    factory.close()
    assert [(r.agent_name, r.input_tokens, r.output_tokens) for r in recorder.records] == [
        ("support-bot", 11, 4),
        ("support-bot", 3, 2),
    ]
    assert all(r.extra["mapped_from"] == "chat" for r in recorder.records)


def test_an_agent_span_nothing_names_is_counted_unmappable(recorder: Recorder) -> None:
    factory = SpanFactory(service="")
    factory.agent_run(None)
    assembler = TraceAssembler(recorder)
    from agentmend.infrastructure.telemetry.span_processor import span_data

    assembler.add([span_data(s) for s in factory.take()])
    factory.close()
    assert recorder.records == []
    assert assembler.counts().unmappable == 1


def test_a_trace_that_never_completes_is_flushed_as_orphans(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory, clock: Clock
) -> None:
    spans.agent_run("writer", chats=[(1, 1), (2, 2)])
    chat_one, chat_two, _agent_never_sent = spans.take()
    post(url(receiver), spans.body([chat_one, chat_two]))
    assert receiver.assembler.counts().open_traces == 1
    clock.now += 31
    assert receiver.assembler.flush_expired() == 2
    counts = receiver.assembler.counts()
    assert (counts.open_traces, counts.orphans, counts.executions_recorded) == (0, 2, 0)
    assert recorder.records == []


def test_agentmends_own_spans_are_skipped(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory
) -> None:
    spans.agent_run("socratic-mediator", attributes={"agentmend.recorded": True})
    post(url(receiver), spans.body())
    assert recorder.records == []
    assert receiver.assembler.counts().own_spans == 2  # the role's span, and its chat


def test_otlp_json_with_hex_ids_is_recorded_and_bad_spans_are_reported(
    receiver: OtlpReceiver, recorder: Recorder
) -> None:
    trace_id = "5b8efff798038103d269b633813fc60c"
    document = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]
                },
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": "eee19b7ec3c1b174",
                                "name": "invoke_agent researcher",
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000001500000000",
                                "status": {"code": 2, "message": "tool refused"},
                                "attributes": [
                                    {
                                        "key": "gen_ai.operation.name",
                                        "value": {"stringValue": "invoke_agent"},
                                    },
                                    {
                                        "key": "gen_ai.agent.name",
                                        "value": {"stringValue": "researcher"},
                                    },
                                    {
                                        "key": "gen_ai.usage.input_tokens",
                                        "value": {"intValue": "12"},
                                    },
                                ],
                            },
                            {"traceId": "zz", "spanId": "eee19b7ec3c1b175", "name": "bad"},
                        ]
                    }
                ],
            }
        ]
    }
    status, answer = post(
        url(receiver), json.dumps(document).encode(), content_type="application/json"
    )
    assert status == 200
    assert json.loads(answer)["partialSuccess"]["rejectedSpans"] == "1"
    (run,) = recorder.records
    assert (run.agent_name, run.success, run.error) == ("researcher", False, "tool refused")
    assert run.duration_ms == pytest.approx(1500.0)
    assert run.input_tokens == 12
    assert receiver.assembler.counts().rejected == 1


@pytest.mark.parametrize(("field", "size"), [("span_id", 8), ("trace_id", 16), ("trace_id", 15)])
def test_a_protobuf_span_with_a_bad_id_is_reported_in_partial_success(
    receiver: OtlpReceiver, spans: SpanFactory, field: str, size: int
) -> None:
    spans.agent_run("writer", chats=())
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest.FromString(spans.body())
    setattr(request.resource_spans[0].scope_spans[0].spans[0], field, b"\x00" * size)
    status, answer = post(url(receiver), request.SerializeToString())
    assert status == 200
    response = ExportTraceServiceResponse.FromString(answer)
    assert response.partial_success.rejected_spans == 1
    assert field in response.partial_success.error_message


def test_bad_bodies_are_answered_and_the_receiver_stays_up(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory
) -> None:
    spans.agent_run("writer", chats=[(1, 1)] * 5)
    good = spans.body()
    target = url(receiver)

    status, reason = post(target, b"\xff\x00 certainly not protobuf \x12\x99")
    assert status == 400
    assert b"not an OTLP protobuf" in reason
    assert post(target, good[: len(good) - 7])[0] == 400  # truncated inside a field
    assert post(target, good, content_type="text/plain")[0] == 415
    assert post(target, b"{nope", content_type="application/json")[0] == 400
    assert post(target, b"[1, 2]", content_type="application/json")[0] == 400
    assert post(target, b"x" * 1_000_001)[0] == 413
    bomb = gzip.compress(b"\x00" * 50_000_000, compresslevel=9)
    assert len(bomb) < 1_000_000
    status, reason = post(target, bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413
    assert b"decompresses to more than" in reason
    status, reason = post(target, gzip.compress(good)[:-20], headers={"Content-Encoding": "gzip"})
    assert status == 400
    assert post(target, good, headers={"Content-Encoding": "br"})[0] == 415
    assert post(receiver.endpoint + "/v1/profiles", good)[0] == 404

    # a client that sends half a body and hangs up
    host, port = receiver.address
    with socket.create_connection((host, port), timeout=5) as raw:
        raw.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + TEST_TOKEN.encode() + b"\r\n"
            b"Content-Type: application/x-protobuf\r\nContent-Length: 5000\r\n\r\n" + good[:100]
        )
    assert recorder.records == []

    assert post(target, good)[0] == 200
    (run,) = recorder.records
    assert run.input_tokens == 5
    status, _counts = post(receiver.endpoint + "/status", b"")
    assert status == 405  # status is a GET: the wrong method, not a lost path
    import urllib.request

    status_request = urllib.request.Request(receiver.endpoint + "/status", headers=auth())
    with urllib.request.urlopen(status_request, timeout=5) as answer:
        assert json.loads(answer.read())["executions_recorded"] == 1


def test_a_bearer_token_is_required_when_set(recorder: Recorder, spans: SpanFactory) -> None:
    receiver = OtlpReceiver(TraceAssembler(recorder), port=0, token="s3cret").start()
    try:
        spans.agent_run("writer")
        body = spans.body()
        assert post(url(receiver), body, token=None)[0] == 401
        assert post(url(receiver), body, token="nope")[0] == 401
        assert post(url(receiver), body, token="s3cret")[0] == 200
        assert len(recorder.records) == 1
    finally:
        receiver.close()


def test_the_command_serves_into_a_workspace_store(tmp_path: Path, spans: SpanFactory) -> None:
    workspace = tmp_path / "ws"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentmend.otel_receiver",
            "--port",
            str(port),
            "--workspace",
            str(workspace),
            "--token",
            TEST_TOKEN,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert f"http://127.0.0.1:{port}/v1/traces" in line
        spans.agent_run("writer", chats=[(9, 9)])
        assert post(f"http://127.0.0.1:{port}/v1/traces", spans.body())[0] == 200
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
    assert process.returncode == 0
    store = Store(workspace / "agentmend.db")
    with PerformanceMonitor(store) as monitor:
        assert monitor.get_metrics()["writer"].input_tokens == 9
    store.close()


def test_time_is_not_the_only_way_traces_finish(recorder: Recorder, spans: SpanFactory) -> None:
    # many open traces: the oldest are flushed as orphans past the bound, never unbounded
    assembler = TraceAssembler(recorder, max_open_traces=10)
    from agentmend.infrastructure.telemetry.span_processor import span_data

    for _ in range(25):
        spans.agent_run("writer", chats=[(1, 1)])
        chat, _agent = spans.take()
        assembler.add([span_data(chat)])
    counts = assembler.counts()
    assert counts.open_traces == 10
    assert counts.orphans == 15


def test_a_workspace_that_is_a_file_exits_3_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "ws"
    blocker.write_text("not a folder")
    command = [sys.executable, "-m", "agentmend.otel_receiver", "--port", "0"]
    result = subprocess.run(
        [*command, "--workspace", str(blocker)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("agentmend: cannot use the workspace")
    assert blocker.read_text() == "not a folder"


def test_a_wrong_method_is_405_naming_the_one_the_path_takes(receiver: OtlpReceiver) -> None:
    import urllib.error
    import urllib.request

    def answer(path: str, method: str) -> tuple[int, str | None, str]:
        body = b"x" if method == "POST" else None
        request = urllib.request.Request(url(receiver, path), data=body, method=method)
        for name, value in auth().items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status), response.headers.get("Allow"), ""
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.headers.get("Allow"), exc.read().decode()

    assert answer("/v1/traces", "GET") == (405, "POST", "/v1/traces takes POST only")
    assert answer("/status", "POST") == (405, "GET", "/status takes GET only")
    assert answer("/nowhere", "GET")[0] == 404
    assert answer("/status", "GET")[0] == 200
