"""Several receivers behind one load balancer record what one receiver records, as long as the
balancer routes by trace id (or by service); a trace split between receivers is not assembled,
and shows as orphans, not as silence.

Each receiver assembles the traces it is sent on its own: nothing is shared between receivers.
So every span of one trace must reach the same receiver (the OpenTelemetry Collector's
``loadbalancing`` exporter with ``routing_key: traceID`` does this; ``service`` too). Real SDK
spans, the real OTLP encoder, real HTTP on loopback.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from otel_helpers import TEST_TOKEN, Recorder, SpanFactory, post

from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.receiver import TRACES_PATH, OtlpReceiver

Counts = dict[str, tuple[int, int, int, int]]


@pytest.fixture
def receivers() -> Iterator[list[tuple[OtlpReceiver, Recorder]]]:
    made = []
    for _ in range(3):  # two behind the balancer, and one taking everything, to compare
        recorder = Recorder()
        made.append(
            (OtlpReceiver(TraceAssembler(recorder), port=0, token=TEST_TOKEN).start(), recorder)
        )
    yield made
    for receiver, _ in made:
        receiver.close()


def _per_agent(*recorders: Recorder) -> Counts:
    counts: Counts = {}
    for recorder in recorders:
        for record in recorder.records:
            runs, failures, tokens_in, tokens_out = counts.get(record.agent_name, (0, 0, 0, 0))
            counts[record.agent_name] = (
                runs + 1,
                failures + (not record.success),
                tokens_in + record.input_tokens,
                tokens_out + record.output_tokens,
            )
    return counts


def _send(receiver: OtlpReceiver, factory: SpanFactory, spans: Sequence[ReadableSpan]) -> None:
    if spans:
        assert post(receiver.endpoint + TRACES_PATH, factory.body(spans))[0] == 200


def _traffic(factory: SpanFactory, runs: int) -> list[ReadableSpan]:
    for index in range(runs):
        factory.agent_run(f"agent-{index % 3}", chats=[(index + 1, 1)] * (1 + index % 3))
        if index % 4 == 0:
            factory.chat(index, 2)  # a model call with no agent span: a run of the service's
        if index % 5 == 0:
            factory.agent_run("failing", fail="it broke")
    return list(factory.take())


def test_traces_routed_by_trace_id_are_recorded_as_one_receiver_records_them(
    receivers: list[tuple[OtlpReceiver, Recorder]],
) -> None:
    (first, first_runs), (second, second_runs), (alone, alone_runs) = receivers
    factory = SpanFactory("routed-app")
    try:
        spans = _traffic(factory, 40)
        # the exporter's batches cut traces anywhere; the balancer sends each span by its trace
        for start in range(0, len(spans), 7):
            batch = spans[start : start + 7]
            _send(alone, factory, batch)
            routes: list[list[ReadableSpan]] = [[], []]
            for span in batch:
                assert span.context is not None
                routes[span.context.trace_id % 2].append(span)
            _send(first, factory, routes[0])
            _send(second, factory, routes[1])
    finally:
        factory.close()
    expected = _per_agent(alone_runs)
    assert expected["failing"] == (8, 8, 80, 40)
    assert expected["routed-app"][0] == 10  # the calls with no agent span
    assert _per_agent(first_runs, second_runs) == expected
    assert first_runs.records  # both took a share
    assert second_runs.records
    for receiver in (first, second):
        counts = receiver.assembler.counts()
        assert (counts.open_traces, counts.orphans) == (0, 0)


def test_a_trace_split_between_receivers_is_not_assembled_and_shows_as_orphans(
    receivers: list[tuple[OtlpReceiver, Recorder]],
) -> None:
    (first, first_runs), (second, second_runs), _ = receivers
    factory = SpanFactory("split-app")
    try:
        factory.agent_run("researcher", chats=[(30, 3)])
        chat, agent = factory.take()  # a round-robin balancer: one span here, one there
        _send(first, factory, [chat])
        _send(second, factory, [agent])
    finally:
        factory.close()
    (run,) = second_runs.records
    assert (run.agent_name, run.input_tokens) == ("researcher", 0)  # its tokens went elsewhere
    assert first_runs.records == []
    assert first.assembler.flush_all() == 1  # the chat waited for its agent: an orphan, counted
    assert first.assembler.counts().orphans == 1
