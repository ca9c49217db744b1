"""Each model call is counted once however many spans describe it, and never two calls as one.

Hand-built spans in the shapes the real packages emit (see test_instrumented_apps.py, which runs
the packages themselves): the ``anthropic`` SDK's own span (an HTTP client span), a framework's
chat span, OpenInference's AGENT spans; given to the real assembler, in one batch or in several.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from otel_helpers import Recorder

from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.model_calls import model_calls
from agentmend.infrastructure.telemetry.span import STATUS_ERROR, STATUS_UNSET, SpanData

RESOURCE: Mapping[str, Any] = {"service.name": "app"}
_ids = itertools.count(1)


def span(
    name: str,
    start: int,
    end: int,
    *,
    trace: int = 1,
    parent: bytes = b"",
    failed: bool = False,
    **attributes: Any,
) -> SpanData:
    return SpanData(
        trace_id=trace.to_bytes(16, "big"),
        span_id=next(_ids).to_bytes(8, "big"),
        parent_span_id=parent,
        name=name,
        start_ns=start,
        end_ns=end,
        status_code=STATUS_ERROR if failed else STATUS_UNSET,
        status_message="",
        attributes={k.replace("__", "."): v for k, v in attributes.items()},
        events=(),
        resource=RESOURCE,
    )


def sdk(start: int, end: int, **kw: Any) -> SpanData:
    """The anthropic SDK's own span of one call."""
    failed = bool(kw.pop("failed", False))
    if not failed:
        kw.setdefault("gen_ai__usage__input_tokens", 10)
    return span(
        "anthropic.messages.create", start, end, failed=failed,
        gen_ai__operation__name="chat", http__request__method="POST",
        gen_ai__request__model="m", **kw,
    )  # fmt: skip


def framework(start: int, end: int, **kw: Any) -> SpanData:
    """A framework's span of one call (OpenLLMetry's ``anthropic.chat``)."""
    return span("anthropic.chat", start, end, gen_ai__operation__name="chat",
                gen_ai__request__model="m", **kw)  # fmt: skip


def record(*batches: list[SpanData]) -> Recorder:
    recorder = Recorder()
    assembler = TraceAssembler(recorder)
    for batch in batches:
        assembler.add(batch)
    assert assembler.counts().open_traces == 0
    return recorder


def test_a_shared_response_id_is_one_call() -> None:
    outer = framework(0, 100, gen_ai__response__id="msg_1", gen_ai__usage__input_tokens=10)
    inner = sdk(10, 90, trace=1, parent=outer.span_id, gen_ai__response__id="msg_1")
    (call,) = model_calls([inner, outer])
    assert call.span is outer
    assert call.tokens == (10, 0)


def test_a_chat_span_inside_another_is_the_same_call_with_the_larger_usage() -> None:
    # OpenInference's LLM span over the SDK's span: no response id on the LLM span
    outer = span("messages.create", 0, 100, openinference__span__kind="LLM",
                 llm__token_count__completion=7)  # fmt: skip
    inner = sdk(10, 90, parent=outer.span_id)
    (call,) = model_calls([outer, inner])
    assert call.tokens == (10, 7)


def test_calls_overlapping_in_time_stay_apart() -> None:
    # two framework spans at once, two SDK spans at once: four spans, never fewer than 2 calls
    assert len(model_calls([framework(0, 100), framework(5, 105)])) == 2
    assert len(model_calls([sdk(0, 100, failed=True), sdk(5, 105, failed=True)])) == 2


def test_parallel_failed_calls_in_separate_traces_pair_one_to_one() -> None:
    # OpenLLMetry's spans are not current: each SDK span is the root of a trace of its own
    a, b, c = (framework(i, 1000 + i, trace=10 + i, failed=True) for i in range(3))
    a_sdk, b_sdk, c_sdk = (
        sdk(i + 1, 999 + i, trace=20 + i, failed=True, error__type="api_error") for i in range(3)
    )
    recorder = record([b_sdk, a_sdk], [c_sdk, a, c], [b])
    runs = recorder.records
    assert len(runs) == 3
    assert not any(run.success for run in runs)


def test_an_sdk_span_arriving_after_its_framework_span_is_not_a_second_run() -> None:
    outer = framework(0, 100, trace=1, gen_ai__response__id="msg_9",
                      gen_ai__usage__input_tokens=10)  # fmt: skip
    inner = sdk(10, 90, trace=2, gen_ai__response__id="msg_9")
    (run,) = record([outer], [inner]).records
    assert run.input_tokens == 10


def test_an_sdk_span_outside_the_framework_span_is_another_call() -> None:
    runs = record([framework(0, 100, trace=1, failed=True)],
                  [sdk(150, 200, trace=2, failed=True)]).records  # fmt: skip
    assert len(runs) == 2


def test_the_agent_span_total_is_preferred() -> None:
    agent = span("invoke_agent r", 0, 100, gen_ai__operation__name="invoke_agent",
                 gen_ai__agent__name="r", gen_ai__aggregated_usage__input_tokens=25,
                 gen_ai__aggregated_usage__output_tokens=4)  # fmt: skip
    chat = framework(10, 90, parent=agent.span_id, gen_ai__usage__input_tokens=99)
    (run,) = record([chat, agent]).records
    assert (run.agent_name, run.input_tokens, run.output_tokens) == ("r", 25, 4)


def test_an_openinference_agent_is_named_by_its_span_name() -> None:
    agent = span("researcher", 0, 100, openinference__span__kind="AGENT")
    chat = span("messages.create", 10, 90, parent=agent.span_id,
                openinference__span__kind="LLM", llm__token_count__prompt=3)  # fmt: skip
    (run,) = record([chat, agent]).records
    assert (run.agent_name, run.input_tokens) == ("researcher", 3)


def test_an_unnamed_workflow_around_agent_runs_is_not_a_run_even_arriving_later() -> None:
    workflow = span("Agent workflow", 0, 100, openinference__span__kind="AGENT")
    chain = span("Agent workflow", 1, 99, parent=workflow.span_id,
                 openinference__span__kind="CHAIN")  # fmt: skip
    named = span("x", 2, 98, parent=chain.span_id, openinference__span__kind="AGENT",
                 agent__name="researcher")  # fmt: skip
    runs = record([named], [chain], [workflow]).records
    assert [run.agent_name for run in runs] == ["researcher"]


def test_an_unnamed_agent_span_with_its_own_calls_is_a_run() -> None:
    agent = span("Agent workflow", 0, 100, openinference__span__kind="AGENT")
    chat = framework(10, 90, parent=agent.span_id, gen_ai__usage__input_tokens=5)
    (run,) = record([chat, agent]).records
    assert (run.agent_name, run.input_tokens) == ("Agent workflow", 5)


def test_under_an_agent_the_sdk_span_beside_the_framework_span_is_the_same_call() -> None:
    # OpenLLMetry's span is not current: under an agent span the SDK's span is its sibling
    agent = span("invoke_agent r", 0, 1000, gen_ai__operation__name="invoke_agent",
                 gen_ai__agent__name="r")  # fmt: skip
    ok = framework(10, 400, parent=agent.span_id, gen_ai__response__id="msg_a",
                   gen_ai__usage__input_tokens=10, gen_ai__usage__output_tokens=2)  # fmt: skip
    ok_sdk = sdk(20, 390, parent=agent.span_id, gen_ai__response__id="msg_a",
                 gen_ai__usage__output_tokens=2)  # fmt: skip
    failed = framework(500, 900, parent=agent.span_id, failed=True)
    failed_sdk = sdk(510, 890, parent=agent.span_id, failed=True)
    calls = model_calls([ok_sdk, ok, failed_sdk, failed])
    assert sorted(len(call.spans) for call in calls) == [2, 2]
    (run,) = record([ok_sdk, ok, failed_sdk, failed, agent]).records
    assert (run.input_tokens, run.output_tokens) == (10, 2)
