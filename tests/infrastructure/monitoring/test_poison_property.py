"""Property: whatever text, bytes, numbers or sizes a run carries, through whichever path it
arrives (``record()``, the span processor, real HTTP to the OTLP receiver), the monitor's writer
never stops, every later run is stored, and a query reading the stored extras as JSON (as the
release attribution does) still runs, on SQLite and on real PostgreSQL."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otel_helpers import TEST_TOKEN, SpanFactory, post

from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import json_text
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.receiver import JSON, TRACES_PATH, OtlpReceiver
from agentmend.infrastructure.telemetry.span_processor import AgentmendSpanProcessor

_POISON = st.sampled_from(["\x00", "\ud800", "\udfff", "\x1b", "\u202e", "\x9b", "a", "é"])
hostile_number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.integers(-(2**70), 2**70),
)
hostile_text = st.one_of(
    st.text(),
    st.lists(_POISON, max_size=40).map("".join),
    st.binary(max_size=64).map(lambda raw: raw.decode("latin-1")),
    st.binary(max_size=64).map(lambda raw: raw.decode("utf-8", "surrogateescape")),
    st.builds(lambda n, c: c * n, st.integers(0, 300_000), _POISON),
)


def _json_number(value: float) -> dict[str, object]:
    """An OTLP/JSON number as exporters write it: a non-finite double as a string."""
    if isinstance(value, int):
        return {"intValue": str(value)}
    return {"doubleValue": value if math.isfinite(value) else str(value)}


def _json_span(index: int, name: str, error: str, value: str, number: float) -> bytes:
    span = {
        "traceId": f"{index + 1:032x}",
        "spanId": f"{index + 1:016x}",
        "name": "invoke_agent",
        "startTimeUnixNano": "1000000",
        "endTimeUnixNano": "3000000",
        "status": {"code": 2, "message": error},
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
            {"key": "gen_ai.agent.name", "value": {"stringValue": name}},
            {"key": "hostile", "value": {"stringValue": value}},
            {"key": "hostile.number", "value": _json_number(number)},
        ],
    }
    document = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    # ensure_ascii: NUL and lone surrogates travel as \u escapes, as a hostile client sends them
    return json.dumps(document).encode()


def _stored(store: Store, agent: str) -> int:
    with store.snapshot() as conn:
        row = conn.execute("SELECT COUNT(*) FROM executions WHERE agent = ?", (agent,)).fetchone()
    return int(row[0])


def _read_as_json(store: Store) -> int:
    """Runs whose extra names a release, read as JSON: one stored extra the server cannot
    parse fails the whole query."""
    with store.snapshot() as conn:
        release = json_text(conn, "extra", "release")
        row = conn.execute(f"SELECT COUNT(*) FROM executions WHERE {release} = '1'").fetchone()
    return int(row[0])


def test_hostile_values_never_stop_the_writer(store_url: str, tmp_path: Path) -> None:
    store = Store(store_url, files_dir=tmp_path)
    monitor = PerformanceMonitor(store, flush_interval_s=3600)
    receiver = OtlpReceiver(TraceAssembler(monitor), port=0, token=TEST_TOKEN).start()
    spans = SpanFactory()
    processor = AgentmendSpanProcessor(monitor, schedule_delay_s=3600)
    spans.provider.add_span_processor(processor)
    url = receiver.endpoint + TRACES_PATH
    counter = iter(range(10**9))

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(name=hostile_text, error=hostile_text, value=hostile_text, number=hostile_number)
    def one_example(name: str, error: str, value: str, number: float) -> None:
        index = next(counter)
        monitor.record(
            name or "-", success=False, duration_ms=1.0, error=error, hostile=value, n=number
        )
        spans.agent_run(name, fail=error, attributes={"hostile": value, "n": float(number)})
        body = _json_span(index, name, error, value, number)
        status, answer = post(url, body, content_type=JSON)
        assert status == 200, answer
        assert processor.force_flush()
        later = f"later-{index}"
        monitor.record(later, success=True, duration_ms=1.0, release="1")
        monitor.flush()
        assert monitor.write_backlog() == (0, None)
        assert _stored(store, later) == 1
        assert _read_as_json(store) == index + 1

    try:
        one_example()
    finally:
        processor.shutdown()
        spans.close()
        receiver.close()
        monitor.close()
        store.close()
