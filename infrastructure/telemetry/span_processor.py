"""``AgentmendSpanProcessor``: add it to the TracerProvider an app already has.

OpenTelemetry allows one global TracerProvider, so agentmend never installs or replaces one: the
user adds this processor to theirs (``provider.add_span_processor(...)``). ``on_end`` runs on
the app's thread at the end of every span, so it only appends the span to a bounded deque (an
atomic, thread-safe append; no lock, no conversion); a worker thread converts the spans, assembles
them into executions (``assembly``) and records them through the monitor. When the queue is full
the span is dropped and counted, as OpenTelemetry's own batch processor does: spans are best
effort, and ``PerformanceMonitor.record()`` and the SDK hooks remain the lossless path.

Needs the ``[otel]`` extra (opentelemetry-sdk); importing this module without it raises
``OtelExtraMissing``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentmend.infrastructure.telemetry.assembly import TelemetryCounts, TraceAssembler
from agentmend.infrastructure.telemetry.mapping import SpanMapping
from agentmend.infrastructure.telemetry.span import OtelExtraMissing, SpanData, SpanEvent

try:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise OtelExtraMissing("opentelemetry-sdk") from exc

if TYPE_CHECKING:
    from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
    from agentmend.infrastructure.release_labels import ReleaseTagger

__all__ = ["AgentmendSpanProcessor", "span_data"]


class AgentmendSpanProcessor(SpanProcessor):
    """Records the agent runs an app's spans describe, through a ``PerformanceMonitor``.

    Args:
        monitor: where the executions are recorded.
        mapping: agent naming rules (``SpanMapping``).
        max_queue_size: spans waiting for the worker at most; more are dropped and counted.
        schedule_delay_s: how often the worker wakes when the queue is not filling up.
        orphan_timeout_s: a trace idle this long is flushed (its leftovers counted as orphans).
        max_open_traces: traces buffered at most.
        releases: attributes runs labelled ``agentmend.release`` to their release, arm and
            rollout (``ReleaseAttribution(ReleaseLog(store, team_id))``), so they count in
            the team's rollout; they are observed, not routed.
    """

    def __init__(
        self,
        monitor: PerformanceMonitor,
        *,
        mapping: SpanMapping | None = None,
        max_queue_size: int = 8192,
        schedule_delay_s: float = 0.2,
        orphan_timeout_s: float = 60.0,
        max_open_traces: int = 10_000,
        releases: ReleaseTagger | None = None,
    ) -> None:
        self.monitor = monitor
        self.assembler = TraceAssembler(
            monitor,
            mapping,
            orphan_timeout_s=orphan_timeout_s,
            max_open_traces=max_open_traces,
            attribute=releases.tags if releases is not None else None,
        )
        self._queue: deque[ReadableSpan] = deque()
        self._max = max_queue_size
        self._wake_at = max(max_queue_size // 2, 1)
        self._delay = schedule_delay_s
        self._wake = threading.Event()
        self._waking = False
        self._idle = threading.Condition()
        self._busy = False
        self._stopped = False
        self._drop_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._work, name="agentmend-span-processor", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ the app's thread

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        queue = self._queue
        if len(queue) >= self._max:
            with self._drop_lock:
                self.assembler.dropped_queue_full += 1
            return
        queue.append(span)
        if len(queue) >= self._wake_at and not self._waking:
            self._waking = True  # once per batch: Event.set() takes a lock
            self._wake.set()

    # ------------------------------------------------------------------ control

    def counts(self) -> TelemetryCounts:
        """What came in and what became of it (drops, orphans, unmappable spans included)."""
        return self.assembler.counts()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Process every queued span now; False if that took longer than the timeout."""
        with self._idle:
            self._wake.set()
            return self._idle.wait_for(
                lambda: not self._queue and not self._busy, timeout=timeout_millis / 1000
            )

    def shutdown(self) -> None:
        """Process what is queued, stop the worker. Open traces stay counted as open."""
        if self._stopped:
            return
        self.force_flush()
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ the worker

    def _work(self) -> None:
        while not self._stopped:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._waking = False
            self._drain()
            self.assembler.flush_expired()

    def _drain(self) -> None:
        queue = self._queue
        resources: dict[int, Mapping[str, Any]] = {}
        with self._idle:
            self._busy = True
        try:
            while queue:
                batch: list[SpanData] = []
                while queue and len(batch) < 4096:
                    batch.append(span_data(queue.popleft(), resources))
                self.assembler.add(batch)
        except Exception:  # never let one bad span stop the worker
            from agentmend.infrastructure.structured_logger import get_logger

            get_logger(__name__).exception("otel_span_processor_failed")
        finally:
            with self._idle:
                self._busy = False
                self._idle.notify_all()


def span_data(
    span: ReadableSpan, resources: dict[int, Mapping[str, Any]] | None = None
) -> SpanData:
    """A finished SDK span as a ``SpanData`` (``resources`` caches each resource's attributes)."""
    context = span.context
    parent = span.parent
    resource = span.resource
    if resources is None:
        resource_attributes: Mapping[str, Any] = dict(resource.attributes)
    else:
        cached = resources.get(id(resource))
        if cached is None:
            cached = resources[id(resource)] = dict(resource.attributes)
        resource_attributes = cached
    status = span.status
    return SpanData(
        context.trace_id.to_bytes(16, "big") if context else b"",
        context.span_id.to_bytes(8, "big") if context else b"",
        parent.span_id.to_bytes(8, "big") if parent else b"",
        span.name,
        span.start_time or 0,
        span.end_time or 0,
        status.status_code.value,
        status.description or "",
        dict(span.attributes or {}),
        tuple(
            SpanEvent(event.name, event.timestamp, dict(event.attributes or {}))
            for event in span.events
        ),
        resource_attributes,
        bool(parent and parent.is_remote),
    )
