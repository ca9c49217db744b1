"""Claude Code's default telemetry, its OTLP log events, turned into agent runs.

Without the traces beta flag Claude Code exports events, not spans, each with ``session.id``,
``prompt.id`` and a per-session ``event.sequence``. What the CLI sends (2.1.330, captured in
``tests/otel_fixtures/claude_code_logs/``):

- ``user_prompt`` starts a prompt; ``api_request`` (``input_tokens``, ``output_tokens``,
  ``cost_usd``, ``model``) and ``api_error`` (``error``, ``status_code``) end each model call;
  ``tool_decision``/``tool_result`` frame each tool call. There is no event for a prompt's end.
- A subagent's calls carry the lead's ``prompt.id`` plus ``agent_id`` and ``agent.name`` (the
  CLI says ``custom`` for a user's own subagent unless ``OTEL_LOG_TOOL_DETAILS=1``);
  ``subagent_completed`` (``agent_type``, ``is_async``, ``duration_ms``) ends it when it ends
  well, a failed one has none.
- A background subagent's completion is told to the lead as a new ``user_prompt`` (a new
  ``prompt.id``) once it ends.

So one prompt is one run of the lead agent (named by ``service.name``, as the trace mapping does),
and each subagent in it one run of that subagent (``agent.name``, else ``agent_type``), its own
tokens and cost only. A run fails when its last model call was an ``api_error`` (a retried call
that then succeeded did not fail it); ``tool_result`` failures are noted, not failures; a prompt
that called no model and ran no subagent (a local command) is no run, only counted. A prompt
that starts while an earlier prompt of the session has a background subagent not yet told about
is that telling: it joins the earlier prompt's run. A subagent is in the background when its first
event comes while no ``Agent`` (or ``Task``) call of the lead is open, when the call returns well
before it completed, or when its completion says so.

**When a run is complete**: the CLI never says, and a background subagent or a long tool call can
keep a prompt going after the lead's last answer, so a session's runs are recorded once the
session has been quiet for ``quiet_s`` (more than the exporter's interval, 5 s by default, plus
the longest silent step: 120 s). Nothing waits longer than ``max_open_s`` from a session's first
event, and at most ``max_open_runs`` runs are open; past either bound the oldest session is
recorded early and counted (``log_runs_cut_short``). Events of a prompt already recorded are
counted as late and ignored (their keys are remembered, bounded, in two generations), as are
records seen before (an exporter's retry: ``session.id`` and ``event.sequence``). A session holds
small sums, never the events, and text is cut, so memory is bounded by the open runs.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentmend.infrastructure.models import ExecutionRecord
from agentmend.infrastructure.release_labels import (
    RELEASE_ATTRIBUTE,
    TEAM_ATTRIBUTE,
    unattributed,
)
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.telemetry.mapping import RELEASE_LABEL, RELEASE_TEAM
from agentmend.infrastructure.telemetry.otlp_logs import LogEvent
from agentmend.infrastructure.tracing import RECORDED_ATTRIBUTE

__all__ = ["LogAssembler", "LogCounts"]

log = get_logger(__name__)

Record = Callable[[ExecutionRecord], None]
Attribute = Callable[[object, object], Mapping[str, object]]

_AGENT_TOOLS = frozenset({"Agent", "Task"})
_TRUE = (True, "true")
_MAX_TEXT = 2000
_MAX_NAME = 200
_NO_RELEASE_LOG = "no release log to attribute it to (this receiver names no team)"


@dataclass(frozen=True, slots=True)
class LogCounts:
    """What came in over ``/v1/logs`` and ``/v1/metrics`` and what became of it."""

    log_records_received: int = 0
    log_runs_recorded: int = 0
    log_duplicates: int = 0
    """Records seen before (an exporter's retry): ignored."""
    log_records_ignored: int = 0
    """Records of no prompt (start-up, settings) or agentmend's own runs: nothing to record."""
    log_records_late: int = 0
    """Records of a prompt whose runs were already recorded: ignored."""
    log_unmappable: int = 0
    """Runs no agent could be named for (no ``service.name``)."""
    log_runs_cut_short: int = 0
    """Runs recorded before their session was quiet, past ``max_open_s`` or the runs bound."""
    log_rejected: int = 0
    """Records a receiver refused as malformed (reported in ``partial_success``)."""
    log_prompts_without_calls: int = 0
    """Prompts that called no model and ran no subagent (a local command): no run."""
    open_log_runs: int = 0
    metric_points_received: int = 0
    """Metric data points taken and counted (session aggregates: runs come from the events)."""


class _Run:
    """One agent's part of a prompt: sums and the last call's outcome, never the events."""

    __slots__ = (
        "agent_id",
        "api_errors",
        "cost_usd",
        "duration_ms",
        "first_ns",
        "input_tokens",
        "is_async",
        "last_error",
        "last_ns",
        "model",
        "name",
        "output_tokens",
        "requests",
        "settled",
        "status_code",
        "tool_failures",
    )

    def __init__(self, name: str | None, agent_id: str | None = None) -> None:
        self.name = name
        self.agent_id = agent_id
        self.input_tokens = self.output_tokens = self.requests = self.api_errors = 0
        self.tool_failures = 0
        self.cost_usd = 0.0
        self.last_error: str | None = None
        self.status_code: str | None = None
        self.model: str | None = None
        self.first_ns = self.last_ns = 0
        self.duration_ms: float | None = None
        self.is_async = False
        self.settled = False  # whether it is in the background is known

    def seen(self, time_ns: int) -> None:
        if time_ns:
            if not self.first_ns or time_ns < self.first_ns:
                self.first_ns = time_ns
            self.last_ns = max(self.last_ns, time_ns)


class _Prompt:
    __slots__ = ("agent_calls_open", "joined", "lead", "prompt_id", "subagents", "told")

    def __init__(self, prompt_id: str, lead_name: str | None) -> None:
        self.prompt_id = prompt_id
        self.lead = _Run(lead_name)
        self.subagents: dict[str, _Run] = {}
        self.agent_calls_open = 0  # the lead's Agent calls decided and not yet returned
        self.told = 0  # background subagents whose telling prompt has joined
        self.joined: list[str] = []

    def untold(self) -> bool:
        return sum(1 for s in self.subagents.values() if s.is_async) > self.told


class _Session:
    __slots__ = ("first_seen", "joins", "last_seen", "prompts", "release", "service", "team")

    def __init__(self, now: float, resource: Mapping[str, Any]) -> None:
        self.first_seen = self.last_seen = now
        self.prompts: dict[str, _Prompt] = {}
        self.joins: dict[str, str] = {}  # a telling prompt's id -> the prompt it joined
        service = resource.get("service.name")
        # the SDKs' placeholder when the app set no service name names no agent
        self.service = (
            _cut(service, _MAX_NAME)
            if isinstance(service, str) and service and not service.startswith("unknown_service")
            else None
        )
        self.release = resource.get(RELEASE_ATTRIBUTE)
        self.team = resource.get(TEAM_ATTRIBUTE)

    def runs(self) -> int:
        return sum(1 + len(p.subagents) for p in self.prompts.values())


class LogAssembler:
    """Turns Claude Code's log events into recorded runs (see the module docstring).

    Args:
        record: where runs go (``PerformanceMonitor.record``); None: events are counted as
            received and ignored, no run is made (a receiver given nowhere to record them).
        attribute: resolves a run's release label (``agentmend.release`` on the resource) to
            its release tags, as ``TraceAssembler`` does; None: recorded as unattributed.
        quiet_s: a session quiet this long has its runs recorded.
        max_open_s: the longest a session is held from its first event.
        max_open_runs: runs held at most; past it the oldest session is recorded early.
        remember: record keys (and recorded prompts) remembered to ignore retries and late events.
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(
        self,
        record: Record | None,
        *,
        attribute: Attribute | None = None,
        quiet_s: float = 120.0,
        max_open_s: float = 3600.0,
        max_open_runs: int = 100_000,
        remember: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._record = record
        self.attribute = attribute
        self.quiet_s = quiet_s
        self.max_open_s = max_open_s
        self._max_runs = max_open_runs
        self._half = max(remember // 2, 1)
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._open_runs = 0
        self._seen: set[bytes] = set()
        self._seen_before: set[bytes] = set()
        self._received = self._recorded = self._duplicates = self._ignored = 0
        self._late = self._unmappable = self._cut_short = self._rejected = 0
        self._metric_points = self._without_calls = 0

    # ------------------------------------------------------------------ intake

    def add(self, events: Iterable[LogEvent], *, rejected: int = 0) -> int:
        """Take one export's events; how many runs that recorded (bounds only: see the module)."""
        now = self._clock()
        records: list[ExecutionRecord] = []
        with self._lock:
            self._rejected += rejected
            batch = list(events)
            self._received += len(batch)
            if self._record is None:
                self._ignored += len(batch)
                return 0
            # in the CLI's own order within a session (a batch is, but a merged one may not be)
            batch.sort(key=lambda e: _integer(e.attributes.get("event.sequence")))
            for event in batch:
                self._take(event, now)
            self._expire(now, records)
            while self._open_runs > self._max_runs and self._sessions:
                self._close_oldest(records, cut_short=True)
        self._hand_over(records)
        return len(records)

    def add_metric_points(self, points: int) -> None:
        with self._lock:
            self._metric_points += points

    def flush_quiet(self) -> int:
        """Record the sessions quiet past ``quiet_s`` (or open past ``max_open_s``)."""
        records: list[ExecutionRecord] = []
        with self._lock:
            self._expire(self._clock(), records, held_too_long=True)
        self._hand_over(records)
        return len(records)

    def flush_all(self) -> int:
        """Record every open session now (the receiver is stopping: nothing answered is lost)."""
        records: list[ExecutionRecord] = []
        with self._lock:
            while self._sessions:
                self._close_oldest(records, cut_short=True)
        self._hand_over(records)
        return len(records)

    def counts(self) -> LogCounts:
        with self._lock:
            return LogCounts(
                log_records_received=self._received,
                log_runs_recorded=self._recorded,
                log_duplicates=self._duplicates,
                log_records_ignored=self._ignored,
                log_records_late=self._late,
                log_unmappable=self._unmappable,
                log_runs_cut_short=self._cut_short,
                log_rejected=self._rejected,
                log_prompts_without_calls=self._without_calls,
                open_log_runs=self._open_runs,
                metric_points_received=self._metric_points,
            )

    # ------------------------------------------------------------------ one event

    def _take(self, event: LogEvent, now: float) -> None:
        attributes = event.attributes
        session_id = attributes.get("session.id")
        prompt_id = attributes.get("prompt.id")
        if (
            not isinstance(session_id, str)
            or not isinstance(prompt_id, str)
            or not session_id
            or not prompt_id
            or attributes.get(RECORDED_ATTRIBUTE) in _TRUE
            or event.resource.get(RECORDED_ATTRIBUTE) in _TRUE  # a CLI agentmend ran itself
        ):
            self._ignored += 1
            return
        # ids are data from the network: cut, so no key or map holds more than _MAX_NAME of one
        session_id, prompt_id = _cut(session_id, _MAX_NAME), _cut(prompt_id, _MAX_NAME)
        sequence = attributes.get("event.sequence")
        if sequence is not None:
            key = _key("event", session_id, str(sequence)[:_MAX_NAME])
            if self._remembered(key):
                self._duplicates += 1
                return
            self._remember(key)
        if self._remembered(_key("prompt", session_id, prompt_id)):
            self._late += 1
            return
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session(now, event.resource)
        else:
            session.last_seen = now
            self._sessions.move_to_end(session_id)
        prompt = self._prompt(session, prompt_id, event.name)
        agent_id = attributes.get("agent_id")
        if isinstance(agent_id, str) and agent_id:
            agent_id = _cut(agent_id, _MAX_NAME)
            run = prompt.subagents.get(agent_id)
            if run is None:
                run = prompt.subagents[agent_id] = _Run(None, agent_id)
                # it runs on after the call that started it returned: in the background
                run.is_async = run.settled = prompt.agent_calls_open == 0
                self._open_runs += 1
            self._subagent_event(run, event)
        else:
            run = prompt.lead
            self._lead_event(prompt, event)
        run.seen(event.time_ns)
        self._model_call(run, event)

    def _prompt(self, session: _Session, prompt_id: str, name: str) -> _Prompt:
        joined = session.joins.get(prompt_id)
        if joined is not None:
            return session.prompts[joined]
        prompt = session.prompts.get(prompt_id)
        if prompt is not None:
            return prompt
        if name == "user_prompt":
            for earlier in reversed(session.prompts.values()):
                if earlier.untold():  # the lead is told a background subagent ended
                    earlier.told += 1
                    earlier.joined.append(prompt_id)
                    session.joins[prompt_id] = earlier.prompt_id
                    return earlier
        prompt = session.prompts[prompt_id] = _Prompt(prompt_id, session.service)
        self._open_runs += 1
        return prompt

    def _lead_event(self, prompt: _Prompt, event: LogEvent) -> None:
        attributes = event.attributes
        if attributes.get("tool_name") not in _AGENT_TOOLS:
            if event.name == "tool_result" and attributes.get("success") not in _TRUE:
                prompt.lead.tool_failures += 1
            return
        if event.name == "tool_decision" and attributes.get("decision") == "accept":
            prompt.agent_calls_open += 1
        elif event.name == "tool_result":
            prompt.agent_calls_open = max(0, prompt.agent_calls_open - 1)
            # An Agent call that returned well while its subagent has not completed launched it
            # in the background (its first event may come before or after this); one that
            # failed ended its subagent (a failed subagent sends no subagent_completed).
            launched = attributes.get("success") in _TRUE
            for run in prompt.subagents.values():
                if not run.settled:
                    run.is_async = launched
                    run.settled = True

    def _subagent_event(self, run: _Run, event: LogEvent) -> None:
        attributes = event.attributes
        if run.name is None:
            for key in ("agent.name", "agent_type"):
                value = attributes.get(key)
                if isinstance(value, str) and value:
                    run.name = _cut(value, _MAX_NAME)
                    break
        if event.name == "subagent_completed":
            is_async = attributes.get("is_async")
            if is_async is not None:
                run.is_async = is_async in _TRUE
                run.settled = True
            duration = _integer(attributes.get("duration_ms"))
            if duration > 0:
                run.duration_ms = float(duration)
        elif event.name == "tool_result" and attributes.get("success") not in _TRUE:
            run.tool_failures += 1

    def _model_call(self, run: _Run, event: LogEvent) -> None:
        attributes = event.attributes
        if event.name == "api_request":
            run.requests += 1
            run.input_tokens += _integer(attributes.get("input_tokens"))
            run.output_tokens += _integer(attributes.get("output_tokens"))
            run.cost_usd += _cost(attributes.get("cost_usd"))
            run.last_error = None
        elif event.name == "api_error":
            run.requests += 1
            run.api_errors += 1
            error = attributes.get("error")
            run.last_error = _cut(str(error), _MAX_TEXT) if error else "the model call failed"
            code = attributes.get("status_code")
            run.status_code = _cut(str(code), _MAX_NAME) if code is not None else None
        else:
            return
        model = attributes.get("model")
        if isinstance(model, str) and model:
            run.model = _cut(model, _MAX_NAME)

    # ------------------------------------------------------------------ closing

    def _remember(self, key: bytes) -> None:
        seen = self._seen
        seen.add(key)
        if len(seen) >= self._half:
            self._seen_before = seen
            self._seen = set()

    def _remembered(self, key: bytes) -> bool:
        return key in self._seen or key in self._seen_before

    def _expire(
        self, now: float, records: list[ExecutionRecord], *, held_too_long: bool = False
    ) -> None:
        quiet = now - self.quiet_s
        while self._sessions:  # oldest activity first: a quiet session is at the front
            oldest = next(iter(self._sessions.values()))
            if oldest.last_seen > quiet:
                break
            self._close_oldest(records)
        if held_too_long:  # a scan of every session: done by the periodic flush only
            opened = now - self.max_open_s
            for session_id in [k for k, s in self._sessions.items() if s.first_seen <= opened]:
                self._close(session_id, self._sessions.pop(session_id), records, cut_short=True)

    def _close_oldest(self, records: list[ExecutionRecord], *, cut_short: bool = False) -> None:
        session_id, session = self._sessions.popitem(last=False)
        self._close(session_id, session, records, cut_short=cut_short)

    def _close(
        self,
        session_id: str,
        session: _Session,
        records: list[ExecutionRecord],
        *,
        cut_short: bool = False,
    ) -> None:
        for prompt in session.prompts.values():
            self._remember(_key("prompt", session_id, prompt.prompt_id))
            for joined in prompt.joined:
                self._remember(_key("prompt", session_id, joined))
            for run in (prompt.lead, *prompt.subagents.values()):
                self._open_runs -= 1
                if not run.requests and run is prompt.lead and not prompt.subagents:
                    # a prompt that called no model (a local command): nothing an agent did
                    self._without_calls += 1
                    continue
                if cut_short:
                    self._cut_short += 1
                record = self._execution(session_id, session, prompt, run)
                if record is None:
                    self._unmappable += 1
                else:
                    self._recorded += 1
                    records.append(record)
        if cut_short and session.prompts:
            log.info("otel_log_session_recorded_early", session=session_id[:_MAX_NAME])

    def _execution(
        self, session_id: str, session: _Session, prompt: _Prompt, run: _Run
    ) -> ExecutionRecord | None:
        if run.name is None:
            return None
        extra: dict[str, Any] = {
            "source": "otel",
            "mapped_from": "claude_code.events",
            "session_id": session_id,
            "prompt_id": prompt.prompt_id,
            "model_requests": run.requests,
        }
        if run.agent_id is not None:
            extra["agent_id"] = run.agent_id
            extra["background"] = run.is_async
        elif prompt.joined:
            extra["joined_prompts"] = list(prompt.joined)
        if run.model:
            extra["model"] = run.model
        if session.service:
            extra["service"] = session.service
        if run.api_errors:
            extra["api_errors"] = run.api_errors
        if run.status_code is not None and run.last_error is not None:
            extra["status_code"] = run.status_code
        if run.tool_failures:
            extra["tool_failures"] = run.tool_failures
        if session.release is not None:
            extra[RELEASE_LABEL] = session.release
            if session.team is not None:
                extra[RELEASE_TEAM] = session.team
        duration = run.duration_ms
        if duration is None:
            duration = max(0.0, (run.last_ns - run.first_ns) / 1e6)
        return ExecutionRecord(
            agent_name=run.name,
            success=run.last_error is None,
            duration_ms=duration,
            error=run.last_error,
            input_tokens=run.input_tokens,
            output_tokens=run.output_tokens,
            cost_usd=run.cost_usd,
            timestamp=datetime.fromtimestamp(run.last_ns / 1e9, UTC)
            if run.last_ns
            else datetime.now(UTC),
            extra=extra,
        )

    def _hand_over(self, records: list[ExecutionRecord]) -> None:
        if self._record is None:
            return
        for record in records:  # outside the lock: attribution may read the store
            self._record(self._attributed(record))

    def _attributed(self, record: ExecutionRecord) -> ExecutionRecord:
        if RELEASE_LABEL not in record.extra:
            return record
        extra = dict(record.extra)
        label, team = extra.pop(RELEASE_LABEL), extra.pop(RELEASE_TEAM, None)
        if self.attribute is None:
            tags: Mapping[str, object] = unattributed(label, _NO_RELEASE_LOG)
        else:
            try:
                tags = self.attribute(label, team)
            except Exception as exc:  # a run is never lost to its label
                tags = unattributed(label, f"attribution failed: {exc!r}")
        extra.update(tags)
        return record.model_copy(update={"extra": extra})


def _key(kind: str, session_id: str, item: str) -> bytes:
    """A fixed-size key remembered for ``item`` of a session (an event or a recorded prompt)."""
    text = f"{kind}\x00{session_id}\x00{item}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit]


def _integer(value: Any) -> int:
    """An OTLP integer (the CLI sends them as strings, others may send a double); anything
    else, or negative, is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float):  # another producer's doubleValue
        return int(value) if 0 <= value < 1e18 else 0  # NaN and infinity fail the test
    if isinstance(value, str) and 0 < len(value) <= 20 and value.isdigit():
        return int(value)
    return 0


def _cost(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    cost = float(value)
    return cost if 0.0 <= cost < 1e9 else 0.0  # NaN and infinity fail both tests
