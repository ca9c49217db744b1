"""The assembly buffer: spans in, one execution per agent span out, each span counted once.

Spans do not arrive as executions. A child ends (and is exported) before its parent, a trace can
be split across export requests, and exporters resend a batch they think failed. So spans are
buffered per trace; an agent span, when it arrives, takes the spans of its subtree that arrived
before it and becomes one execution; chat spans with no agent span above them become one
execution each once their trace's local root has arrived. A trace idle for ``orphan_timeout_s``
is flushed: what is left in it is counted as orphans (its agent span never came) and dropped.
A trace that comes whole in one request (a root agent span and the spans right below it, the
common case) becomes its run at once, without being buffered: the same run, the same counts.

``(trace_id, span_id)`` is the idempotency key: the keys of the last ``remember`` spans are kept
(two generations of sets, so memory is bounded and lookups O(1)), and a span seen again is
counted as a duplicate and ignored, so a retried batch records nothing twice.

Memory is bounded: the buffer holds at most ``max_open_traces`` traces and about
``max_open_bytes`` of spans waiting for their agent span or root (their attributes, names and
events, estimated when a span is left waiting, so spans assembled in the request that brought
them cost nothing). Past either bound the oldest traces are flushed as orphans and counted
(``orphans_over_bound``), so a trace that never completes cannot grow without limit. A span
left waiting holds plain values only: attributes still in their request's parser are copied
out (``RawAttributes.detach``), so a waiting span never keeps its whole request alive.

Assembly is linear in a trace's spans: each trace keeps its parent-to-children index as spans
arrive, and an agent claims its subtree by walking it once (spans already claimed are skipped,
never re-indexed), so an export of thousands of agent spans in one trace costs no more per span
than one of a few.

Each model call is recorded once however many spans describe it (``model_calls``). Within a
run or a trace the spans of one call are grouped there; a call with no agent span above it
can also be described in two traces (the ``anthropic`` SDK's own span is the root of a trace of
its own when an instrumentation does not make its span current), so the last calls recorded
without an agent are remembered (their response ids, and the unpaired ones without), and a
call arriving later that is the same call (``model_calls.same_call``) is not recorded again
(the last 100,000 response ids and 1,000 unpaired calls of each side: a few MB at most, outside
``max_open_bytes``).

Thread-safe: one lock around every call (the receiver serves requests on several threads).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agentmend.infrastructure.models import ExecutionRecord
from agentmend.infrastructure.release_labels import unattributed
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.telemetry.mapping import (
    RELEASE_LABEL,
    RELEASE_TEAM,
    RunRow,
    SpanMapping,
    is_agent_span,
    is_chat_span,
    is_recorded_by_agentmend,
    names_itself,
    run_record,
)
from agentmend.infrastructure.telemetry.model_calls import ModelCall, closest, model_calls
from agentmend.infrastructure.telemetry.otlp_lean import RawAttributes, raw_size
from agentmend.infrastructure.telemetry.span import SpanData

__all__ = [
    "DEFAULT_MAX_OPEN_BYTES",
    "RunSink",
    "TelemetryCounts",
    "TraceAssembler",
    "span_bytes",
]

log = get_logger(__name__)

Record = Callable[[ExecutionRecord], None]


class RunSink(Protocol):
    """Takes runs as plain values (``PerformanceMonitor`` is one): no model is built per run."""

    def record_observed(
        self,
        agent_name: str,
        success: bool,
        duration_ms: float,
        error: str | None,
        input_tokens: int,
        output_tokens: int,
        ended_at: float,
        extra: dict[str, Any],
    ) -> None: ...


Attribute = Callable[[object, object], Mapping[str, object]]
"""(release label, team or None) -> the tags of the run's record
(``ReleaseAttribution.tags``)."""

DEFAULT_MAX_OPEN_BYTES = 64 * 1024 * 1024
"""Spans waiting for their agent span or root, about: thousands of ordinary traces."""

NO_RELEASE_LOG = "no release log to attribute it to (this receiver or processor names no team)"


@dataclass(frozen=True, slots=True)
class TelemetryCounts:
    """What came in and what became of it; ``status`` shows these, so losses are visible."""

    spans_received: int = 0
    executions_recorded: int = 0
    duplicates: int = 0
    """Spans seen before (an exporter's retry): ignored."""
    own_spans: int = 0
    """agentmend's own spans (``agentmend.recorded``): recorded already, skipped."""
    unmappable: int = 0
    """Agent or chat spans no rule could name an agent for."""
    orphans: int = 0
    """Spans flushed from a trace that timed out or was evicted before its agent span came."""
    orphans_over_bound: int = 0
    """Of ``orphans``, spans flushed early because the buffer held more than its bound of
    traces or bytes (the oldest traces go first)."""
    open_bytes: int = 0
    """About how many bytes of spans the buffer holds now."""
    ignored: int = 0
    """Spans of a finished trace that were neither agent nor chat spans (HTTP, DB, ...)."""
    dropped_queue_full: int = 0
    """Spans a span processor dropped because its queue was full."""
    rejected: int = 0
    """Spans a receiver refused as malformed (reported in ``partial_success``)."""
    open_traces: int = 0


_NO_IDS: set[bytes] = set()  # shared and never added to: a trace's ``own`` until it has one


class _Trace:
    __slots__ = (
        "agent_parents",
        "agents",
        "bytes",
        "children",
        "claimed",
        "dropped",
        "last_seen",
        "new",
        "own",
        "own_new",
        "root_seen",
        "sizes",
        "spans",
    )

    def __init__(self, now: float) -> None:
        self.spans: dict[bytes, SpanData] = {}
        # parent span id -> ids of its children, kept as spans arrive; claimed ones are skipped,
        # not removed (ids, not spans: a claimed span must not outlive its request)
        self.children: dict[bytes, list[bytes]] = {}
        self.claimed = 0  # spans claimed since the index was last rebuilt (stale entries in it)
        self.agents: list[SpanData] = []
        # parents of the agent runs recorded: an unnamed agent span above them only wraps them
        self.agent_parents: set[bytes] = set()
        # ids of agentmend's own spans and those below them (a set of its own from the first)
        self.own: set[bytes] = _NO_IDS
        self.own_new: list[SpanData] = []
        self.new: list[SpanData] = []  # added by the current call, not sized yet
        self.sizes: dict[bytes, int] = {}  # estimated bytes of the spans left waiting
        self.bytes = 0
        self.dropped = False  # flushed as orphans: no longer in the buffer
        self.root_seen = False
        self.last_seen = now


class TraceAssembler:
    """Turns spans into recorded executions (see the module docstring).

    Args:
        record: where executions go: a ``RunSink`` such as a ``PerformanceMonitor`` takes
            them as plain values (the fast path); a callable (``monitor.record``, a test's
            recorder) is given an ``ExecutionRecord`` each.
        mapping: the mapping rules (agent naming).
        orphan_timeout_s: a trace idle this long is flushed as orphans.
        max_open_traces: traces buffered at most; the oldest is flushed past it.
        max_open_bytes: about the most bytes of spans buffered; the oldest traces are flushed
            past it.
        remember: span keys remembered for the idempotency check.
        clock: seconds, monotonic (injectable for tests).
        attribute: resolves a run's release label (``agentmend.release``) to its release,
            arm and rollout (``ReleaseAttribution.tags``); None: a labelled run is recorded
            as unattributed, saying there is no release log.
    """

    def __init__(
        self,
        record: Record | RunSink,
        mapping: SpanMapping | None = None,
        *,
        attribute: Attribute | None = None,
        orphan_timeout_s: float = 60.0,
        max_open_traces: int = 10_000,
        max_open_bytes: int = DEFAULT_MAX_OPEN_BYTES,
        remember: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sink: RunSink | None = None if callable(record) else record
        self._record: Record | None = record if callable(record) else None
        self.attribute = attribute
        self.mapping = mapping or SpanMapping()
        self.orphan_timeout_s = orphan_timeout_s
        self._max_open = max_open_traces
        self._max_bytes = max_open_bytes
        self._bytes = 0
        self._half = max(remember // 2, 1)
        self._clock = clock
        self._lock = threading.Lock()
        self._traces: OrderedDict[bytes, _Trace] = OrderedDict()
        self._seen: set[bytes] = set()
        self._seen_before: set[bytes] = set()
        self._received = self._recorded = self._duplicates = self._own = 0
        self._unmappable = self._orphans = self._ignored = self._over_bound = 0
        # calls recorded without an agent: their response ids, and those without one not
        # paired yet (oldest first, a bounded few: a pair's two spans end moments apart)
        self._answered: OrderedDict[str, None] = OrderedDict()
        # the SDK's spans and the frameworks' apart: each looks only among the other side's
        self._unpaired_sdk: OrderedDict[bytes, ModelCall] = OrderedDict()
        self._unpaired_framework: OrderedDict[bytes, ModelCall] = OrderedDict()
        self.dropped_queue_full = 0
        self.rejected = 0

    def add(self, spans: Iterable[SpanData], *, rejected: int = 0) -> int:
        """Buffer ``spans`` and record every execution they complete; how many were recorded.

        ``rejected`` counts the spans of the same request a decoder refused as malformed.
        """
        now = self._clock()
        records: list[RunRow] = []
        with self._lock:
            self.rejected += rejected
            arrived, in_order = self._new_spans(spans)
            whole = self._whole_runs(arrived)
            touched: dict[bytes, _Trace] = {}
            # in the order they came (opening a trace may evict another, which may come again)
            for span in in_order if len(whole) < len(arrived) else ():
                trace_id = span.trace_id
                if trace_id in whole:
                    continue
                trace = touched.get(trace_id)
                if trace is None or trace.dropped:
                    trace = touched[trace_id] = self._open(trace_id, now)
                self._buffer(trace, span)
            for trace_id in arrived:
                run = whole.get(trace_id)
                if run is not None:  # the whole trace came at once: its run, with no buffering
                    self._keep(self.mapping.execution(*run), records)
                    continue
                trace = touched[trace_id]
                if trace.dropped:
                    continue
                self._assemble(trace_id, trace, records)
                if trace.spans:
                    self._size_new(trace)
                trace.new.clear()
            self._expire(now)
            while self._bytes > self._max_bytes and self._traces:
                self._drop_oldest(over_bound=True)
        # outside the lock: attribution may read the store
        sink, record = self._sink, self._record
        for row in records:
            extra = row[7]
            if RELEASE_LABEL in extra:
                self._attribute(extra)
            if sink is not None:
                sink.record_observed(*row)
            elif record is not None:
                record(run_record(row))
        return len(records)

    def _new_spans(
        self, spans: Iterable[SpanData]
    ) -> tuple[dict[bytes, list[SpanData]], list[SpanData]]:
        """``spans`` not seen before, counted: by trace (in the order each trace first came),
        and in the order they came."""
        arrived: dict[bytes, list[SpanData]] = {}
        in_order: list[SpanData] = []
        keep = in_order.append
        seen = self._seen
        for span in spans:
            self._received += 1
            trace_id = span.trace_id
            key = trace_id + span.span_id
            if key in seen or key in self._seen_before:
                self._duplicates += 1
                continue
            seen.add(key)
            if len(seen) >= self._half:  # a new generation: the oldest keys are forgotten
                self._seen_before = seen
                seen = self._seen = set()
            keep(span)
            group = arrived.get(trace_id)
            if group is None:
                arrived[trace_id] = [span]
            else:
                group.append(span)
        return arrived, in_order

    def _whole_runs(
        self, arrived: dict[bytes, list[SpanData]]
    ) -> dict[bytes, tuple[SpanData, list[SpanData]]]:
        """The traces of ``arrived`` that are one whole agent run (the agent span and its
        chat spans, say): trace id -> (agent span, its chat spans, as ``_subtree`` lists
        them). Such a trace would be opened, assembled and closed within this call, so it is
        not buffered at all. Only when no trace can be evicted meanwhile (opening the others
        stays within ``max_open_traces``), so the buffer ends as it would have."""
        whole: dict[bytes, tuple[SpanData, list[SpanData]]] = {}
        traces = self._traces
        if len(traces) + len(arrived) > self._max_open:
            return whole
        for trace_id, group in arrived.items():
            if trace_id in traces:
                continue
            run = _whole_run(group)
            if run is not None:
                whole[trace_id] = run
        return whole

    def _buffer(self, trace: _Trace, span: SpanData) -> None:
        """Add ``span`` to its open ``trace``."""
        if is_recorded_by_agentmend(span) or (trace.own and span.parent_span_id in trace.own):
            # agentmend's own work and everything below it (a role's chat spans)
            self._own += 1
            if trace.own is _NO_IDS:
                trace.own = set()
            trace.own.add(span.span_id)
            trace.own_new.append(span)
            if not span.parent_span_id or span.parent_is_remote:
                trace.root_seen = True
            return
        span_id = span.span_id
        trace.spans[span_id] = span
        trace.new.append(span)
        parent = span.parent_span_id
        if parent:
            siblings = trace.children.get(parent)
            if siblings is None:
                trace.children[parent] = [span_id]
            else:
                siblings.append(span_id)
        if is_agent_span(span):
            trace.agents.append(span)
        if not parent or span.parent_is_remote:
            trace.root_seen = True

    def _attribute(self, extra: dict[str, Any]) -> None:
        """Resolve the release label in a run's ``extra`` to tags (never dropped for it)."""
        label, team = extra.pop(RELEASE_LABEL), extra.pop(RELEASE_TEAM, None)
        if self.attribute is None:
            tags: Mapping[str, object] = unattributed(label, NO_RELEASE_LOG)
        else:
            try:
                tags = self.attribute(label, team)
            except Exception as exc:  # a run is never lost to its label
                tags = unattributed(label, f"attribution failed: {exc!r}")
        extra.update(tags)

    def flush_expired(self) -> int:
        """Flush the traces idle longer than the timeout; how many spans became orphans."""
        with self._lock:
            before = self._orphans
            self._expire(self._clock())
            return self._orphans - before

    def flush_all(self) -> int:
        """Flush every open trace as orphans (at shutdown); how many spans that was."""
        with self._lock:
            before = self._orphans
            while self._traces:
                self._drop_oldest()
            return self._orphans - before

    def counts(self) -> TelemetryCounts:
        with self._lock:
            return TelemetryCounts(
                spans_received=self._received,
                executions_recorded=self._recorded,
                duplicates=self._duplicates,
                own_spans=self._own,
                unmappable=self._unmappable,
                orphans=self._orphans,
                orphans_over_bound=self._over_bound,
                open_bytes=self._bytes,
                ignored=self._ignored,
                dropped_queue_full=self.dropped_queue_full,
                rejected=self.rejected,
                open_traces=len(self._traces),
            )

    # ------------------------------------------------------------------ internals

    def _open(self, trace_id: bytes, now: float) -> _Trace:
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = _Trace(now)
            if len(self._traces) > self._max_open:
                self._drop_oldest(over_bound=True)
        else:
            trace.last_seen = now
            self._traces.move_to_end(trace_id)
        return trace

    def _assemble(self, trace_id: bytes, trace: _Trace, records: list[RunRow]) -> None:
        children = trace.children
        if trace.own_new:
            for own in trace.own_new:
                for span in _subtree(own, children, trace.spans, into_agents=True):
                    self._take(trace, span.span_id)
                    trace.own.add(span.span_id)
                    self._own += 1
            trace.own_new.clear()
            trace.agents = [a for a in trace.agents if a.span_id in trace.spans]
        agents = trace.agents
        if agents:
            spans = trace.spans
            if len(agents) > 1:
                # Innermost first: a nested agent run claims its own subtree before its parent,
                # whose walk then stops at the claimed (no longer buffered) spans.
                agents.sort(key=_end_ns)
            for agent in agents:
                subtree = _subtree(agent, children, spans)
                chats = [s for s in subtree if is_chat_span(s)]
                if not chats and not names_itself(agent) and _wraps(agent, subtree, trace):
                    self._ignored += 1 + len(subtree)  # a workflow around agent runs
                else:
                    self._keep(self.mapping.execution(agent, chats), records)
                    if agent.parent_span_id:
                        trace.agent_parents.add(agent.parent_span_id)
                for span in subtree:
                    self._take(trace, span.span_id)
                    children.pop(span.span_id, None)
                self._take(trace, agent.span_id)
                children.pop(agent.span_id, None)
            agents.clear()
        if trace.root_seen:
            if trace.spans:
                lone: list[SpanData] = []
                for span in trace.spans.values():
                    if is_chat_span(span):
                        lone.append(span)
                    else:
                        self._ignored += 1
                for call in model_calls(lone):
                    if self._first_time(call):
                        self._keep(self.mapping.chat_execution(call), records)
            trace.spans.clear()
            trace.children.clear()
            self._bytes -= trace.bytes
            trace.bytes = 0
            trace.sizes.clear()
        if not trace.spans and (trace.root_seen or not trace.agent_parents):
            # (a trace whose agent runs are recorded waits for its root, which may wrap them)
            if trace_id in self._traces:
                del self._traces[trace_id]
        elif trace.claimed > 2 * len(trace.spans) + 64:
            # claimed spans linger in their parents' lists: rebuilt from the waiting spans once
            # they outnumber them, so an open trace never holds what it has recorded
            trace.children = _children(trace.spans.values())
            trace.claimed = 0

    _REMEMBERED_ANSWERS = 100_000
    _REMEMBERED_UNPAIRED = 1_000

    def _first_time(self, call: ModelCall) -> bool:
        """False for a call recorded already through another of its spans (another trace)."""
        answers = call.response_ids
        if answers:
            if any(answer in self._answered for answer in answers):
                return False
            for answer in answers:
                self._answered[answer] = None
            while len(self._answered) > self._REMEMBERED_ANSWERS:
                self._answered.popitem(last=False)
            return True
        if call.sdk_only:
            mine, theirs = self._unpaired_sdk, self._unpaired_framework
        else:
            mine, theirs = self._unpaired_framework, self._unpaired_sdk
        if theirs:
            partner = closest(
                call,
                (
                    earlier
                    for earlier in theirs.values()
                    # within a trace the grouping has decided already
                    if earlier.span.trace_id != call.span.trace_id
                    and _same_resource(earlier.span, call.span)
                ),
            )
            if partner is not None:
                del theirs[partner.span.key]  # one partner each: parallel calls stay apart
                return False
        for span in call.spans:  # kept beyond its request: not the request's parser map
            _detach(span)
        mine[call.span.key] = call
        while len(mine) > self._REMEMBERED_UNPAIRED:
            mine.popitem(last=False)
        return True

    def _take(self, trace: _Trace, span_id: bytes) -> None:
        """Remove a claimed span from the buffer (and its bytes from the bound)."""
        trace.spans.pop(span_id, None)
        trace.claimed += 1
        if trace.sizes:  # (none while every span waiting came in the current request)
            size = trace.sizes.pop(span_id, 0)
            trace.bytes -= size
            self._bytes -= size

    def _size_new(self, trace: _Trace) -> None:
        """Count the bytes of the spans this call left waiting in ``trace``."""
        spans, sizes = trace.spans, trace.sizes
        added = 0
        for span in trace.new:
            if span.span_id in spans and span.span_id not in sizes:
                _detach(span)  # it waits beyond its request: not the request's parser map
                sizes[span.span_id] = size = span_bytes(span)
                added += size
        trace.bytes += added
        self._bytes += added

    def _keep(self, record: RunRow | None, records: list[RunRow]) -> None:
        if record is None:
            self._unmappable += 1
        else:
            self._recorded += 1
            records.append(record)

    def _expire(self, now: float) -> None:
        deadline = now - self.orphan_timeout_s
        while self._traces:
            oldest = next(iter(self._traces.values()))
            if oldest.last_seen > deadline:
                break
            self._drop_oldest()

    def _drop_oldest(self, *, over_bound: bool = False) -> None:
        trace_id, trace = self._traces.popitem(last=False)
        self._bytes -= trace.bytes
        if trace.spans:
            self._orphans += len(trace.spans)
            if over_bound:
                self._over_bound += len(trace.spans)
            log.info(
                "otel_orphans_flushed",
                trace_id=trace_id.hex(),
                spans=len(trace.spans),
                over_bound=over_bound,
            )
        # a trace dropped while the current call still holds it must not assemble anything
        trace.dropped = True
        trace.spans.clear()
        trace.children.clear()
        trace.agents.clear()
        trace.sizes.clear()
        trace.bytes = 0


def _whole_run(group: list[SpanData]) -> tuple[SpanData, list[SpanData]] | None:
    """(the agent span, its chat spans) if ``group`` is one whole run: a root agent span and
    spans right below it, none of them agentmend's own nor another agent's; else None. The
    chat spans are in the order ``_subtree`` finds them (the last to come first)."""
    agent: SpanData | None = None
    for span in group:
        if is_recorded_by_agentmend(span):
            return None
        if is_agent_span(span):
            if agent is not None or span.parent_span_id:
                return None
            agent = span
    if agent is None:
        return None
    agent_id = agent.span_id
    chats: list[SpanData] = []
    for span in reversed(group):
        if span is agent:
            continue
        if span.parent_span_id != agent_id:
            return None
        if is_chat_span(span):
            chats.append(span)
    return agent, chats


def _end_ns(span: SpanData) -> int:
    return span.end_ns


def _same_resource(a: SpanData, b: SpanData) -> bool:
    return a.resource is b.resource or a.resource == b.resource


def _wraps(agent: SpanData, subtree: list[SpanData], trace: _Trace) -> bool:
    """``agent`` (or a span below it) is the parent of an agent run recorded already."""
    parents = trace.agent_parents
    return agent.span_id in parents or any(span.span_id in parents for span in subtree)


def _children(spans: Iterable[SpanData]) -> dict[bytes, list[bytes]]:
    children: dict[bytes, list[bytes]] = {}
    for span in spans:
        if span.parent_span_id:
            children.setdefault(span.parent_span_id, []).append(span.span_id)
    return children


def _detach(span: SpanData) -> None:
    attributes = span.attributes
    if type(attributes) is RawAttributes:
        attributes.detach(span.known)


_SPAN_OVERHEAD = 400  # the SpanData, its dicts and ids, about
_ENTRY_OVERHEAD = 80  # one attribute's key and boxed value, about


def span_bytes(span: SpanData) -> int:
    """About how many bytes ``span`` holds in memory (its resource is shared, not counted)."""
    size = _SPAN_OVERHEAD + len(span.name) + len(span.status_message)
    raw = raw_size(span.attributes)
    if raw is None:
        size += _mapping_bytes(span.attributes)
    else:  # undecoded values: their bytes; and what the decoded ones in ``known`` hold
        size += raw + _ENTRY_OVERHEAD * (len(span.attributes) - len(span.known))
        size += _mapping_bytes(span.known)
    for event in span.events:
        size += _SPAN_OVERHEAD // 2 + len(event.name) + _mapping_bytes(event.attributes)
    return size


def _mapping_bytes(attributes: Mapping[str, object]) -> int:
    size = 0
    for key, value in attributes.items():
        size += _ENTRY_OVERHEAD + len(key) + _value_bytes(value)
    return size


def _value_bytes(value: object) -> int:
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, tuple | list):
        return sum(_ENTRY_OVERHEAD // 2 + _value_bytes(v) for v in value)
    if isinstance(value, Mapping):
        return _mapping_bytes(value)
    return 0


def _subtree(
    agent: SpanData,
    children: dict[bytes, list[bytes]],
    spans: dict[bytes, SpanData],
    *,
    into_agents: bool = False,
) -> list[SpanData]:
    """The spans below ``agent`` still buffered, not descending into nested agents unless told."""
    found: list[SpanData] = []
    stack = list(children.get(agent.span_id, ()))
    while stack:
        span = spans.get(stack.pop())
        if span is None or (not into_agents and is_agent_span(span)):
            continue
        found.append(span)
        stack.extend(children.get(span.span_id, ()))
    return found
