"""A trace that comes whole in one request is recorded as if its spans had come one by one."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from otel_helpers import Recorder, SpanFactory

from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.otlp_decode import decode_protobuf


@pytest.fixture
def spans() -> Iterator[SpanFactory]:
    factory = SpanFactory("writer-service")
    yield factory
    factory.close()


def _runs(spans: SpanFactory) -> None:
    """Runs of every shape: plain, with chats of two models (the first found names it), with
    an agent span nested in another, with no chat, and a chat with no agent above it."""
    tracer = spans.tracer
    spans.agent_run("writer", chats=[(40, 4), (2, 2)], attributes={"app.tenant": "acme"})
    with tracer.start_as_current_span(
        "invoke_agent planner", attributes={"gen_ai.operation.name": "invoke_agent"}
    ):
        for model in ("model-a", "model-b"):
            with tracer.start_as_current_span(
                f"chat {model}",
                attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": model},
            ):
                pass
    with tracer.start_as_current_span(
        "invoke_agent outer",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "outer"},
    ):
        spans.agent_run("inner", chats=[(5, 1)])
    spans.agent_run("idle", chats=[], fail="no model answered")
    spans.chat(7, 3)


Row = tuple[str, bool, str | None, int, int, Mapping[str, Any]]


def _recorded(bodies: list[bytes]) -> tuple[list[Row], TraceAssembler]:
    recorder = Recorder()
    assembler = TraceAssembler(recorder)
    for body in bodies:
        batch = decode_protobuf(body)
        assembler.add(batch.spans, rejected=batch.rejected)
    rows: list[Row] = [
        (r.agent_name, r.success, r.error, r.input_tokens, r.output_tokens, r.extra)
        for r in recorder.records
    ]
    return rows, assembler


def test_whole_traces_in_one_request_record_what_spans_one_by_one_record(
    spans: SpanFactory,
) -> None:
    _runs(spans)
    finished = spans.take()
    whole, at_once = _recorded([spans.body(finished)])
    one_by_one, apart = _recorded([spans.body([span]) for span in finished])
    assert len(whole) == 6
    assert {row[0] for row in whole} == {"writer", "writer-service", "outer", "inner", "idle"}
    planner = next(row for row in whole if row[5]["span_name"] == "invoke_agent planner")
    assert planner[5]["model"] == "model-b"  # as the buffer finds them: the last chat first
    assert sorted(whole, key=repr) == sorted(one_by_one, key=repr)
    assert at_once.counts() == apart.counts()
    assert at_once.counts().open_traces == 0


def test_a_trace_already_open_is_assembled_in_the_buffer(spans: SpanFactory) -> None:
    spans.agent_run("writer", chats=[(40, 4), (2, 2)])
    chat_one, chat_two, agent = spans.take()
    spans.agent_run("editor")
    rows, assembler = _recorded(
        [spans.body([chat_one]), spans.body([chat_two, agent, *spans.take()])]
    )
    assert [(row[0], row[3], row[4]) for row in rows] == [("writer", 42, 6), ("editor", 10, 5)]
    assert assembler.counts().open_traces == 0


def test_past_the_bound_of_open_traces_whole_traces_are_buffered_as_before(
    spans: SpanFactory,
) -> None:
    for _ in range(4):
        spans.agent_run("writer")
    recorder = Recorder()
    assembler = TraceAssembler(recorder, max_open_traces=2)
    batch = decode_protobuf(spans.body())
    assembler.add(batch.spans)
    counts = assembler.counts()
    # opening four traces at once in a buffer of two evicts the first two before assembly
    assert (counts.executions_recorded, counts.orphans_over_bound) == (2, 4)
