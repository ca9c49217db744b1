"""Claude Code's default telemetry (OTLP log events, no spans) becomes runs: one per prompt for
the lead, one per subagent, a background subagent's telling prompt joined to its query. The
payloads are the real CLI's (``tests/otel_fixtures/claude_code_logs/``), sent as protobuf and as
OTLP/JSON; the completion rule and the bounds are driven by a clock of the test's."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import ParseDict  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from otel_helpers import TEST_TOKEN, Recorder, auth, post

from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.claude_code_events import LogAssembler
from agentmend.infrastructure.telemetry.otlp_logs import LogEvent
from agentmend.infrastructure.telemetry.receiver import OtlpReceiver

FIXTURES = Path(__file__).parents[2] / "otel_fixtures" / "claude_code_logs"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fixture(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return document


def protobuf(document: dict[str, Any]) -> bytes:
    return bytes(ParseDict(document, ExportLogsServiceRequest()).SerializeToString())


def metrics_protobuf(document: dict[str, Any]) -> bytes:
    return bytes(ParseDict(document, ExportMetricsServiceRequest()).SerializeToString())


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def receiver(recorder: Recorder, clock: Clock) -> Iterator[OtlpReceiver]:
    made = OtlpReceiver(
        TraceAssembler(Recorder()),
        port=0,
        token=TEST_TOKEN,
        max_body_bytes=1_000_000,
        max_decompressed_bytes=2_000_000,
        logs=LogAssembler(recorder, quiet_s=30, clock=clock),
    ).start()
    yield made
    made.close()


def records_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        record
        for resource in document["resourceLogs"]
        for scope in resource["scopeLogs"]
        for record in scope["logRecords"]
    ]


def rewrite(document: dict[str, Any], strings: dict[str, str], *, shift: int) -> None:
    """Set ``strings`` on every record and move its ``event.sequence`` on by ``shift``."""
    for record in records_of(document):
        for pair in record["attributes"]:
            if pair["key"] in strings:
                pair["value"] = {"stringValue": strings[pair["key"]]}
            elif pair["key"] == "event.sequence":
                pair["value"] = {"intValue": str(int(pair["value"]["intValue"]) + shift)}


def send(receiver: OtlpReceiver, name: str, *, as_json: bool = False) -> None:
    for document in fixture(name)["logs"]:
        if as_json:
            answer = post(
                receiver.endpoint + "/v1/logs",
                json.dumps(document).encode(),
                content_type="application/json",
            )
            assert answer == (200, b"{}")
        else:
            status, body = post(receiver.endpoint + "/v1/logs", protobuf(document))
            assert status == 200
            assert not ExportLogsServiceResponse.FromString(body).HasField("partial_success")


def quiet(receiver: OtlpReceiver, clock: Clock) -> None:
    """Let the sessions fall quiet (past the receiver's ``quiet_s``) and the expiry run."""
    clock.now += 31
    receiver.logs.flush_quiet()


def runs(recorder: Recorder) -> dict[str, list[tuple[bool, int, int]]]:
    return {
        name: [(r.success, r.input_tokens, r.output_tokens) for r in records]
        for name, records in sorted(recorder.by_agent().items())
    }


# -- what the real CLI sent ---------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True], ids=["protobuf", "json"])
def test_one_prompt_is_one_run_with_its_tokens_and_cost(
    receiver: OtlpReceiver, recorder: Recorder, clock: Clock, as_json: bool
) -> None:
    send(receiver, "one_prompt", as_json=as_json)
    assert recorder.records == []  # the CLI says no prompt's end: the session must fall quiet
    clock.now += 29
    receiver.logs.flush_quiet()
    assert recorder.records == []
    quiet(receiver, clock)
    (run,) = recorder.records
    assert (run.agent_name, run.success, run.error) == ("researcher", True, None)
    assert (run.input_tokens, run.output_tokens) == (321, 45)
    assert run.cost_usd == pytest.approx(0.001638)
    assert run.extra["model"] == "claude-sonnet-4-5"
    assert run.extra["mapped_from"] == "claude_code.events"
    assert 0 < run.duration_ms < 60_000
    counts = receiver.logs.counts()
    assert (counts.log_runs_recorded, counts.log_runs_cut_short, counts.open_log_runs) == (1, 0, 0)
    assert counts.log_records_received == 7
    assert counts.log_records_ignored == 1  # the start-up event belongs to no prompt


def test_an_api_error_fails_the_run_with_the_error_text(
    receiver: OtlpReceiver, recorder: Recorder, clock: Clock
) -> None:
    send(receiver, "api_error")
    quiet(receiver, clock)
    (run,) = recorder.records
    assert (run.agent_name, run.success) == ("researcher", False)
    assert run.error == "Internal server error"
    assert run.extra["status_code"] == "500"
    assert (run.input_tokens, run.output_tokens) == (0, 0)


def test_a_foreground_subagent_is_a_run_of_its_own_with_its_own_tokens(
    receiver: OtlpReceiver, recorder: Recorder, clock: Clock
) -> None:
    send(receiver, "foreground_subagent")
    quiet(receiver, clock)
    # the CLI names a user's own subagent "custom" unless OTEL_LOG_TOOL_DETAILS=1
    assert runs(recorder) == {"custom": [(True, 50, 5)], "researcher": [(True, 112, 15)]}
    (sub,) = recorder.by_agent()["custom"]
    assert sub.extra["background"] is False
    assert sub.duration_ms == 47  # subagent_completed's own duration
    lead = recorder.by_agent()["researcher"][0]
    assert sub.extra["prompt_id"] == lead.extra["prompt_id"]


@pytest.mark.parametrize("name", ["background_subagent", "background_subagent_tool_details"])
def test_a_background_subagents_telling_prompt_joins_its_query(
    receiver: OtlpReceiver, recorder: Recorder, clock: Clock, name: str
) -> None:
    send(receiver, name)
    quiet(receiver, clock)
    helper = "helper" if name.endswith("tool_details") else "custom"
    # three model calls of the lead over two prompt ids, one run
    assert runs(recorder) == {helper: [(True, 50, 5)], "researcher": [(True, 215, 25)]}
    (lead,) = recorder.by_agent()["researcher"]
    assert lead.extra["model_requests"] == 3
    assert len(lead.extra["joined_prompts"]) == 1
    assert recorder.by_agent()[helper][0].extra["background"] is True


def test_a_background_subagent_that_fails_fails_its_own_run_only(
    receiver: OtlpReceiver, recorder: Recorder, clock: Clock
) -> None:
    send(receiver, "background_subagent_failed")
    quiet(receiver, clock)
    assert runs(recorder) == {"custom": [(False, 0, 0)], "researcher": [(True, 215, 25)]}
    assert recorder.by_agent()["custom"][0].error == "Internal server error"


def test_a_failed_foreground_subagent_fails_its_run_and_the_next_prompt_is_not_joined(
    receiver: OtlpReceiver, recorder: Recorder, clock: Clock
) -> None:
    send(receiver, "foreground_subagent_failed")  # the failed subagent sends no completion
    (failed,) = fixture("foreground_subagent_failed")["logs"]
    session = records_of(failed)[0]["attributes"]
    session_id = next(p["value"]["stringValue"] for p in session if p["key"] == "session.id")
    (document,) = fixture("one_prompt")["logs"]
    rewrite(document, {"session.id": session_id}, shift=100)  # the user's next prompt
    assert post(receiver.endpoint + "/v1/logs", protobuf(document))[0] == 200
    quiet(receiver, clock)
    assert runs(recorder) == {
        "custom": [(False, 0, 0)],
        "researcher": [(True, 112, 15), (True, 321, 45)],
    }
    assert recorder.by_agent()["custom"][0].extra["background"] is False


def test_a_background_subagent_seen_before_its_launch_returned_is_still_background(
    recorder: Recorder,
) -> None:
    events = [
        _event("user_prompt", "s", "p", 1),
        _event("tool_decision", "s", "p", 2, tool_name="Agent", decision="accept"),
        _event("api_request", "s", "p", 3, agent_id="a1", input_tokens="7", output_tokens="1"),
        _event("assistant_response", "s", "p", 4, agent_id="a1", **{"agent.name": "helper"}),
        _event("tool_result", "s", "p", 5, tool_name="Agent", success="true"),
        _event("api_request", "s", "p", 6, input_tokens="20", output_tokens="2"),
        _event("user_prompt", "s", "telling", 7),  # the lead is told the helper ended
        _event("api_request", "s", "telling", 8, input_tokens="30", output_tokens="3"),
    ]
    assembler = LogAssembler(recorder)
    assembler.add(events)
    assembler.flush_all()
    assert runs(recorder) == {"helper": [(True, 7, 1)], "writer": [(True, 50, 5)]}


def test_a_retried_export_records_nothing_twice_and_late_events_make_no_run(
    receiver: OtlpReceiver, recorder: Recorder, clock: Clock
) -> None:
    send(receiver, "foreground_subagent")
    send(receiver, "foreground_subagent")  # the exporter thought the first failed
    quiet(receiver, clock)
    assert runs(recorder) == {"custom": [(True, 50, 5)], "researcher": [(True, 112, 15)]}
    assert receiver.logs.counts().log_duplicates == 12
    # the same session's events after its runs were recorded: late, no second run
    late = fixture("foreground_subagent")["logs"][0]
    rewrite(late, {}, shift=100)
    assert post(receiver.endpoint + "/v1/logs", protobuf(late))[0] == 200
    quiet(receiver, clock)
    assert len(recorder.records) == 2
    assert receiver.logs.counts().log_records_late == 12


def test_metrics_are_taken_and_counted(receiver: OtlpReceiver) -> None:
    (document,) = fixture("foreground_subagent")["metrics"]
    status, _ = post(receiver.endpoint + "/v1/metrics", metrics_protobuf(document))
    assert status == 200
    status, body = post(
        receiver.endpoint + "/v1/metrics",
        json.dumps(document).encode(),
        content_type="application/json",
    )
    assert (status, body) == (200, b"{}")
    # session.count 1, cost 2 (lead, subagent), tokens 8, active time 1
    assert receiver.logs.counts().metric_points_received == 2 * 12


def test_gzip_and_the_receivers_rules_apply_to_logs_and_metrics(
    receiver: OtlpReceiver, recorder: Recorder, clock: Clock
) -> None:
    (document,) = fixture("one_prompt")["logs"]
    body = protobuf(document)
    logs = receiver.endpoint + "/v1/logs"
    assert post(logs, body, token=None)[0] == 401
    assert post(receiver.endpoint + "/v1/metrics", b"", token="wrong")[0] == 401
    assert post(logs, body, headers={"Host": "evil.example"})[0] == 403
    assert post(logs, body, content_type="text/plain")[0] == 415
    assert post(logs, b"x" * 1_000_001)[0] == 413
    bomb = gzip.compress(b"\x00" * 50_000_000, compresslevel=9)
    assert post(logs, bomb, headers={"Content-Encoding": "gzip"})[0] == 413
    assert recorder.records == []
    assert post(logs, gzip.compress(body), headers={"Content-Encoding": "gzip"})[0] == 200
    quiet(receiver, clock)
    (run,) = recorder.records
    assert run.input_tokens == 321
    for path in ("/v1/logs", "/v1/metrics"):  # exporters POST: a GET is the wrong method
        request = urllib.request.Request(receiver.endpoint + path, headers=auth())
        with pytest.raises(urllib.error.HTTPError) as wrong:
            urllib.request.urlopen(request, timeout=5)
        assert (wrong.value.code, wrong.value.headers["Allow"]) == (405, "POST")
        wrong.value.close()
    request = urllib.request.Request(receiver.endpoint + "/status", headers=auth())
    with urllib.request.urlopen(request, timeout=5) as answer:
        status = json.loads(answer.read())
    assert (status["log_records_received"], status["log_runs_recorded"]) == (7, 1)
    assert status["spans_received"] == 0


def test_without_a_log_assembler_logs_are_answered_and_counted(recorder: Recorder) -> None:
    receiver = OtlpReceiver(TraceAssembler(recorder), port=0, token=TEST_TOKEN).start()
    try:
        (document,) = fixture("one_prompt")["logs"]
        assert post(receiver.endpoint + "/v1/logs", protobuf(document))[0] == 200
    finally:
        receiver.close()
    counts = receiver.logs.counts()
    assert (counts.log_records_received, counts.log_records_ignored) == (7, 7)
    assert counts.log_runs_recorded == 0
    assert recorder.records == []


# -- hostile input ------------------------------------------------------------------------------


def _record(attributes: dict[str, Any]) -> dict[str, Any]:
    def value(v: Any) -> dict[str, Any]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        if isinstance(v, dict):
            pairs = [{"key": k, "value": value(x)} for k, x in v.items()]
            return {"kvlistValue": {"values": pairs}}
        return {"stringValue": v}

    return {
        "timeUnixNano": "1795867817629000000",
        "attributes": [{"key": k, "value": value(v)} for k, v in attributes.items()],
    }


def _export(*records: Any, service: Any = "researcher") -> bytes:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]}
    document = {"resourceLogs": [{"resource": resource, "scopeLogs": [{"logRecords": records}]}]}
    return json.dumps(document).encode()


def test_hostile_log_records_never_stop_the_receiver(
    receiver: OtlpReceiver, recorder: Recorder, clock: Clock
) -> None:
    logs = receiver.endpoint + "/v1/logs"
    huge = "e" * 400_000
    forged = _export(
        _record({"event.name": "user_prompt", "session.id": "s\x00", "prompt.id": "p\x00"}),
        _record(
            {
                "event.name": "api_request",
                "session.id": "s\x00",
                "prompt.id": "p\x00",
                "input_tokens": "-5",
                "output_tokens": "99999999999999999999999999",
                "cost_usd": "inf",
                "event.sequence": {"nested": "map"},
            }
        ),
        _record(
            {
                "event.name": "api_error",
                "session.id": "s\x00",
                "prompt.id": "p\x00",
                "agent_id": "a\x00" * 1000,
                "agent.name": "n\x00" * 1000,
                "error": huge,
                "status_code": {"x": 1},
            }
        ),
        _record({"event.name": "api_request", "session.id": 7, "prompt.id": True}),
        {**_record({"session.id": "s2", "prompt.id": "p2"}), "body": 5, "eventName": 7},
        "not a record",
        _record({"event.name": "api_request", "session.id": "s2", "prompt.id": "p2"}),
    )
    status, body = post(logs, forged, content_type="application/json")
    assert status == 200
    assert json.loads(body)["partialSuccess"]["rejectedLogRecords"] == "1"
    metrics = receiver.endpoint + "/v1/metrics"
    for bad in (b"\x00\xff garbage", b'{"resourceLogs": 5}', b"[" * 100_000):
        assert post(logs, bad, content_type="application/json")[0] == 400
        assert post(logs, bad)[0] == 400
        assert post(metrics, bad)[0] == 400
        metrics_bad = bad.replace(b"resourceLogs", b"resourceMetrics")
        assert post(metrics, metrics_bad, content_type="application/json")[0] == 400
    not_an_object = b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"attributes": 5}]}]}]}'
    assert post(logs, not_an_object, content_type="application/json")[0] == 200
    bad_metric = b'{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"sum": 5}]}]}]}'
    assert post(metrics, bad_metric, content_type="application/json")[0] == 400
    nameless = _export(
        _record({"event.name": "api_request", "session.id": "s3", "prompt.id": "p3"}),
        service="unknown_service:node",
    )
    assert post(logs, nameless, content_type="application/json")[0] == 200
    send(receiver, "one_prompt")  # and the real CLI's export is still taken
    quiet(receiver, clock)
    by_agent = recorder.by_agent()
    assert sorted(by_agent) == ["n\x00" * 100, "researcher"]
    (sub,) = by_agent["n\x00" * 100]  # cut to 200 characters, NUL kept as data
    assert not sub.success
    assert sub.error is not None
    assert len(sub.error) == 2000
    lead = [r for r in by_agent["researcher"] if r.extra["session_id"] == "s\x00"]
    assert [(r.input_tokens, r.output_tokens, r.cost_usd) for r in lead] == [(0, 0, 0.0)]
    assert [r.input_tokens for r in by_agent["researcher"]] == [0, 0, 321]  # s, s2, the CLI's
    counts = receiver.logs.counts()
    assert counts.log_unmappable == 1  # the session whose service names no agent
    assert counts.log_rejected == 2  # "not a record", and attributes that are not a list
    assert counts.log_runs_recorded == 4  # s (lead and subagent), s2, the CLI's


def test_agentmends_own_cli_runs_are_skipped(recorder: Recorder) -> None:
    assembler = LogAssembler(recorder, quiet_s=0)
    own = {"service.name": "writer", "agentmend.recorded": "true"}
    assembler.add(
        [LogEvent("api_request", 1, {"session.id": "s", "prompt.id": "p"}, own)],
    )
    assembler.flush_all()
    assert recorder.records == []
    assert assembler.counts().log_records_ignored == 1


# -- when a run is complete, and the bounds ----------------------------------------------------


def _event(name: str, session: str, prompt: str, sequence: int, **more: Any) -> LogEvent:
    attributes = {"session.id": session, "prompt.id": prompt, "event.sequence": str(sequence)}
    return LogEvent(name, sequence, {**attributes, **more}, {"service.name": "writer"})


def test_a_prompt_that_called_no_model_is_no_run(recorder: Recorder) -> None:
    assembler = LogAssembler(recorder)
    assembler.add([_event("user_prompt", "s", "p", 1), _event("tool_decision", "s", "p", 2)])
    assembler.flush_all()
    assert recorder.records == []
    assert assembler.counts().log_prompts_without_calls == 1


def test_ids_of_any_size_are_kept_cut(recorder: Recorder) -> None:
    huge = "x" * 1_000_000
    assembler = LogAssembler(recorder)
    assembler.add(
        [
            _event("api_request", huge, huge, 1, agent_id=huge, **{"agent.name": "helper"}),
            _event("api_request", huge + "y", huge + "y", 1, agent_id=huge + "y"),
        ]
    )
    assembler.flush_all()
    # cut to 200 characters, the two are one session's one event: retried, not recorded twice
    (run,) = recorder.by_agent()["helper"]
    assert run.extra["session_id"] == run.extra["prompt_id"] == run.extra["agent_id"] == "x" * 200
    assert assembler.counts().log_duplicates == 1  # the same session's event 1


def test_a_retried_call_that_then_succeeds_does_not_fail_the_run(recorder: Recorder) -> None:
    assembler = LogAssembler(recorder)
    assembler.add(
        [
            _event("user_prompt", "s", "p", 1),
            _event("api_error", "s", "p", 2, error="Overloaded", status_code="529"),
            _event("api_request", "s", "p", 3, input_tokens="10", output_tokens="2"),
            _event("api_request", "s", "p", 4, input_tokens=5.0, output_tokens=float("nan")),
        ]
    )
    assembler.flush_all()
    (run,) = recorder.records
    assert (run.success, run.input_tokens, run.output_tokens) == (True, 15, 2)
    assert run.extra["api_errors"] == 1


def test_a_session_that_never_falls_quiet_is_recorded_after_max_open(
    recorder: Recorder, clock: Clock
) -> None:
    assembler = LogAssembler(recorder, quiet_s=30, max_open_s=100, clock=clock)
    for second in range(0, 101, 10):
        clock.now = 1000.0 + second
        assembler.add([_event("api_request", "s", "p", second, input_tokens="1")])
        assembler.flush_quiet()
    (run,) = recorder.records
    assert run.input_tokens == 11
    assert assembler.counts().log_runs_cut_short == 1
    assembler.add([_event("api_request", "s", "p", 999, input_tokens="1")])
    assert assembler.counts().log_records_late == 1


def test_open_runs_are_bounded_the_oldest_session_recorded_first(
    recorder: Recorder, clock: Clock
) -> None:
    assembler = LogAssembler(recorder, max_open_runs=50, remember=1000, clock=clock)
    for session in range(200):
        assembler.add([_event("api_request", f"s{session}", "p", 1)])
    counts = assembler.counts()
    assert counts.open_log_runs == 50
    assert counts.log_runs_recorded == counts.log_runs_cut_short == 150
    assert [r.extra["session_id"] for r in recorder.records[:3]] == ["s0", "s1", "s2"]
    assembler.flush_all()
    assert len(recorder.records) == 200
    assert assembler.counts().open_log_runs == 0


def test_memory_is_bounded_by_the_open_runs_not_by_what_is_sent() -> None:
    recorded: list[int] = []  # the runs handed on are the monitor's memory, not the assembler's
    assembler = LogAssembler(lambda run: recorded.append(1), max_open_runs=200, remember=4000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(2000):  # 20 MB of ids, 40 MB of errors: whole, they would cost that
            big = f"{n:06d}" + "i" * 10_000
            assembler.add([_event("api_request", big, big, 1, agent_id=big, error=big * 2)])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert assembler.counts().open_log_runs <= 200
    assert len(recorded) >= 1800
    assert held < 2_000_000, held
