"""One model call, however many spans describe it.

An instrumented app often describes one call twice: a framework's chat span (pydantic-ai's
``chat``, OpenInference's LLM span, OpenLLMetry's ``anthropic.chat``) and the client SDK's own
span of the same HTTP call (the ``anthropic`` SDK traces itself: ``anthropic.messages.create``).
Counting both doubles the tokens, or makes one call two runs. Spans describe the same call when,
in this order:

1. they share a ``gen_ai.response.id`` (the API's id of the answer);
2. one chat span is the parent of the other (the SDK's span made inside the framework's);
3. the SDK's own span lies, in time, inside a framework's chat span with the same parent (both
   roots, or siblings under one span: the framework did not make its span current), of the same
   model, neither having a response id the other lacks; each SDK span pairs with at most one
   framework span (the one fitting it most closely), so calls running in parallel stay as
   many calls as there were.

Spans are never merged merely because they overlap in time: two framework spans, or two SDK
spans, are always two calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentmend.infrastructure.telemetry.span import SpanData

__all__ = [
    "CALL_KEYS",
    "USAGE_KEYS",
    "ModelCall",
    "call_tokens",
    "closest",
    "fit",
    "is_sdk_call",
    "model",
    "model_calls",
    "number",
    "response_id",
    "same_call",
    "usage",
]

_NUMBERS = (int, float)  # a tuple: isinstance with ``int | float`` builds a union per call

_INPUT_KEYS = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "input_tokens",
    "llm.token_count.prompt",
)
_OUTPUT_KEYS = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "output_tokens",
    "llm.token_count.completion",
)
_MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "model", "llm.model_name")
_RESPONSE_ID = "gen_ai.response.id"
_HTTP_METHOD = "http.request.method"
USAGE_KEYS = frozenset((*_INPUT_KEYS, *_OUTPUT_KEYS))
"""The keys ``usage`` reads a span's own tokens by."""
CALL_KEYS = frozenset((*USAGE_KEYS, *_MODEL_KEYS, _RESPONSE_ID, _HTTP_METHOD))
"""The span attributes this module reads (``SpanData.known``)."""


def number(attributes: Mapping[str, Any], keys: Iterable[str]) -> int:
    """The first positive number among ``keys`` (0 when none is)."""
    for key in keys:
        value = attributes.get(key)
        if value is None or value is True or value is False:
            continue
        if isinstance(value, _NUMBERS) and value > 0:
            return int(value)
    return 0


def usage(span: SpanData) -> tuple[int, int]:
    """The span's own (input, output) tokens."""
    known = span.known
    return number(known, _INPUT_KEYS), number(known, _OUTPUT_KEYS)


def model(span: SpanData) -> str | None:
    known = span.known
    for key in _MODEL_KEYS:
        value = known.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def response_id(span: SpanData) -> str | None:
    value = span.known.get(_RESPONSE_ID)
    return value if isinstance(value, str) and value else None


def is_sdk_call(span: SpanData) -> bool:
    """The client SDK's own span of one API call: an HTTP client span with GenAI attributes."""
    return _HTTP_METHOD in span.known


class ModelCall:
    """The spans of one model call; ``span`` (a framework's, if any) stands for it.

    ``tokens`` (input, output) are each the largest any of its spans reports (a failed
    framework span may report none; the SDK's may lack a detail the framework adds).
    """

    __slots__ = ("response_ids", "sdk_only", "span", "spans", "tokens")

    def __init__(self, spans: tuple[SpanData, ...]) -> None:
        self.spans = spans
        self.span = spans[0]
        if len(spans) == 1:
            self.tokens = usage(self.span)
            answer = response_id(self.span)
            self.response_ids = frozenset((answer,)) if answer else frozenset()
            self.sdk_only = is_sdk_call(self.span)
            return
        counted = [usage(span) for span in spans]
        self.tokens = (max(c[0] for c in counted), max(c[1] for c in counted))
        self.response_ids = frozenset(r for r in map(response_id, spans) if r)
        self.sdk_only = all(is_sdk_call(span) for span in spans)

    @property
    def model(self) -> str | None:
        for span in self.spans:
            found = model(span)
            if found:
                return found
        return None


def same_call(sdk: ModelCall, framework: ModelCall) -> bool:
    """Rule 3: the SDK's span of a call, beside the framework's span of that same call."""
    if not sdk.sdk_only or framework.sdk_only:
        return False
    if sdk.response_ids != framework.response_ids:
        return False  # one knows the answer's id and the other does not: two calls
    inner, outer = sdk.span, framework.span
    if not (outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns):
        return False
    ours, theirs = sdk.model, framework.model
    return ours is None or theirs is None or ours == theirs


def fit(sdk: ModelCall, framework: ModelCall) -> int | None:
    """How loosely the framework's span wraps the SDK's (ns), or None: not the same call."""
    if not same_call(sdk, framework):
        return None
    inner, outer = sdk.span, framework.span
    return (inner.start_ns - outer.start_ns) + (outer.end_ns - inner.end_ns)


def closest(call: ModelCall, candidates: Iterable[ModelCall]) -> ModelCall | None:
    """The candidate that is ``call`` seen by its other side (SDK or framework), if any: of
    the calls that may be, the one whose span fits ``call``'s most closely."""
    best: ModelCall | None = None
    best_gap = 0
    for candidate in candidates:
        gap = fit(call, candidate) if call.sdk_only else fit(candidate, call)
        if gap is not None and (best is None or gap < best_gap):
            best, best_gap = candidate, gap
    return best


def call_tokens(chats: Sequence[SpanData]) -> tuple[int, int]:
    """The (input, output) tokens of ``chats``, each model call counted once."""
    if len(chats) < 2 or _all_distinct(chats):  # one span per call: no call objects needed
        input_tokens = output_tokens = 0
        for chat in chats:
            known = chat.known
            input_tokens += number(known, _INPUT_KEYS)
            output_tokens += number(known, _OUTPUT_KEYS)
        return input_tokens, output_tokens
    counted = [call.tokens for call in model_calls(chats)]
    return sum(c[0] for c in counted), sum(c[1] for c in counted)


def model_calls(chats: Sequence[SpanData]) -> list[ModelCall]:
    """``chats`` (the chat spans of one run, or of one trace) as distinct model calls."""
    if len(chats) < 2 or _all_distinct(chats):
        return [ModelCall((chat,)) for chat in chats]
    ids = {chat.span_id: index for index, chat in enumerate(chats)}
    parent = list(range(len(chats)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    def join(a: int, b: int) -> None:
        a, b = root(a), root(b)
        if a != b:
            parent[max(a, b)] = min(a, b)

    by_response: dict[str, int] = {}
    for index, chat in enumerate(chats):
        answer = response_id(chat)
        if answer is not None:  # rule 1
            if answer in by_response:
                join(by_response[answer], index)
            else:
                by_response[answer] = index
        above = ids.get(chat.parent_span_id)
        if above is not None:  # rule 2
            join(above, index)
    groups: dict[int, list[SpanData]] = {}
    for index, chat in enumerate(chats):
        groups.setdefault(root(index), []).append(chat)
    calls = _pair_sdk_spans([ModelCall(_ordered(spans)) for spans in groups.values()])
    # in the order the spans came (what the receiver records first stays first)
    return sorted(calls, key=lambda call: min(ids[span.span_id] for span in call.spans))


def _all_distinct(chats: Sequence[SpanData]) -> bool:
    """No rule can join two of ``chats`` (the common case: one span per call), checked fast."""
    ids: set[bytes] = set()
    answers: set[object] = set()
    sdk = False
    for chat in chats:
        ids.add(chat.span_id)
        known = chat.known
        answer = known.get(_RESPONSE_ID)
        if answer is not None:
            if answer in answers:
                return False
            answers.add(answer)
        sdk = sdk or _HTTP_METHOD in known
    if sdk:
        return False  # an SDK's span may pair with a framework's (rule 3)
    return not any(chat.parent_span_id in ids for chat in chats)


def _ordered(spans: list[SpanData]) -> tuple[SpanData, ...]:
    """A framework's span first (it knows the run's context), then the outermost."""
    return tuple(sorted(spans, key=lambda s: (is_sdk_call(s), s.start_ns, -s.end_ns)))


def _pair_sdk_spans(calls: list[ModelCall]) -> list[ModelCall]:
    """Rule 3 within one set of calls: each SDK-only call joins at most one framework call."""
    # only calls without a response id can pair (the same id has joined them already)
    frameworks = [call for call in calls if not call.sdk_only and not call.response_ids]
    if not frameworks:
        return calls
    pairable = {id(framework) for framework in frameworks}
    free = {id(framework): framework for framework in frameworks}
    merged: dict[int, ModelCall] = {}  # id of a framework call -> it with its SDK span
    kept: list[ModelCall] = []
    for call in calls:
        if id(call) in pairable:
            continue  # a framework call that may pair: kept below, with its SDK span if any
        if not call.sdk_only or call.response_ids:
            kept.append(call)
            continue
        siblings = (f for f in free.values() if f.span.parent_span_id == call.span.parent_span_id)
        match = closest(call, siblings)
        if match is None:
            kept.append(call)
        else:
            del free[id(match)]
            merged[id(match)] = ModelCall(match.spans + call.spans)
    kept.extend(merged.get(id(framework), framework) for framework in frameworks)
    return kept
