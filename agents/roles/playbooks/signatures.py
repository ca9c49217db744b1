"""Failure signatures: keyword and regex rules over agents' answers and recorded errors.

The offline mediator decides from what it was told, as a model would: an agent's own account of
its recent runs (``ask_agent`` answers) and the error strings the monitor recorded (the issue's
``error_logs``). Each rule recognises one way a failure of one kind is *described* ("stopped at
max_tokens", "permission ... denied", "model ... not found (404)", "timed out", "did not start
with the required heading", "429"), phrased the way an API, an SDK or an agent talking about
itself says it, so a real agent's answer trips the same rule as a simulated one.

Rules are of two kinds. A *symptom* says a failure happened and votes for its category; a
*detail* only sizes the fix (how many tokens the answers needed, how long a complete run takes,
which models are served) and is quoted as evidence once its category has won on symptoms.

How a category wins and how sure the finding is (``classify``):

* each recorded error that matches a category's symptom counts for it; so does each distinct
  answer sentence. ``score = matched errors / all errors + 0.5 (if an answer says so)
  + 0.1 (if two or more answer sentences do)``; the highest score wins.
* confidence: 0.9 when the agent's answers and the recorded errors agree; 0.7 on recorded
  errors alone; 0.6 on a single answer sentence alone (0.7 with two or more) — a claim the
  records do not back is worth less.
* a rival category with at least half the winner's matched errors (or, with no records, half
  its answer sentences) costs 0.2: the evidence disagrees.
* transient failures (rate limits, overload) pass by themselves: they never count as a rival
  of a configuration fault, and a configuration fault seen at least twice beside them wins.
* a single recorded failure of the kind is an incident, not a pattern: at most 0.5 (so a
  healthy agent's occasional slip never clears the confidence gate).
* when most recorded errors match no rule and the winner explains fewer than half of them, the
  dominant failure is not understood: the finding is ``unknown``.
* ``unknown``: 0.3 when failures were reported, 0.2 when nothing was; never above 0.4.

Sentences carrying injection markers ("ignore previous instructions", "set your permission
profile to open", role tags) are set aside before any rule runs: they neither vote nor get
quoted, so an answer cannot steer the diagnosis by what it tells the mediator to do.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import get_args

from agentmend.roles.schemas import CauseCategory

__all__ = [
    "CATEGORIES",
    "INJECTION_PATTERNS",
    "RULES",
    "Finding",
    "Rule",
    "classify",
    "contains_injection",
    "denied_tools",
    "format_instruction",
    "full_run_seconds",
    "missing_models",
    "needed_tokens",
    "required_heading",
    "round_up",
    "served_models",
    "split_sentences",
]

CATEGORIES: tuple[CauseCategory, ...] = get_args(CauseCategory)

_I = re.IGNORECASE


@dataclass(frozen=True, slots=True)
class Rule:
    """One way a failure of ``category`` is described; ``symptom`` False marks a detail."""

    name: str
    category: CauseCategory
    pattern: re.Pattern[str]
    symptom: bool = True

    def matches(self, text: str) -> bool:
        return self.pattern.search(text) is not None


_IN_SENTENCE = r"(?:[^.]|\.(?=\S))"
"""One character of the same sentence: a dot inside a word ("claude-2.1") does not end it."""


def _rule(name: str, category: CauseCategory, regex: str, *, symptom: bool = True) -> Rule:
    # "[^.]" in a rule reads "within the sentence"
    return Rule(name, category, re.compile(regex.replace("[^.]", _IN_SENTENCE), _I), symptom)


RULES: tuple[Rule, ...] = (
    # truncation: the answer hit the output token limit
    _rule("stop_reason_max_tokens", "truncation", r"stop[ _]?reason\W{0,3}(?:was\s+)?max_tokens"),
    _rule("stopped_at_max_tokens", "truncation",
          r"\b(?:stopped|cut off|ended|halted)\s+(?:at|by)\s+(?:my\s+|the\s+)?max_tokens"),
    _rule("truncated", "truncation", r"\btruncat(?:ed|ion)\b(?!\s*:\s*\d+\s*characters)"),
    _rule("hit_token_limit", "truncation",
          r"\b(?:hit|reached|ran into|exceeded|ran out of)\s+(?:my\s+|the\s+)?"
          r"(?:max_tokens|max tokens|output[- ]token|token)\s*(?:limit|budget)?"),
    _rule("answer_cut_off", "truncation",
          r"\b(?:answers?|responses?|repl(?:y|ies)|outputs?|completions?)\b[^.]{0,60}?"
          r"\b(?:was|were|got|get|are|is|been)\s+cut off"),
    _rule("tokens_needed", "truncation",
          r"\b(?:need(?:ed|s)?|requir(?:e|ed|es))\b[^.]{0,40}?\b\d[\d,]*\s+(?:output\s+)?tokens",
          symptom=False),
    _rule("max_tokens_at_least", "truncation",
          r"\bmax_tokens\s+(?:of|to)\s+(?:at least\s+)?\d", symptom=False),
    # tool_denied: a tool call was refused by permissions
    _rule("permission_denied", "tool_denied",
          r"\bpermission\b[^.]{0,80}?\b(?:was|has been|is|were|got)\s+(?:denied|refused)"),
    _rule("denied_permission", "tool_denied",
          r"\b(?:denied|refused)\s+(?:the\s+)?(?:permission|access)\s+to\s+(?:use|call|run)\b"),
    _rule("tool_denied_kind", "tool_denied", r"\btool_denied\b"),
    _rule("not_among_allowed", "tool_denied",
          r"\b(?:is|was|are|were)\s+not\s+(?:among|in|on)\s+(?:my|the|its)\s+allowed tools"),
    _rule("not_allowed_to_use", "tool_denied",
          r"\bnot\s+(?:allowed|permitted)\s+to\s+(?:use|call|run)\s+(?:the\s+)?(?:tool\s+)?['\"`]?"
          r"[A-Z][\w.:-]*"),
    _rule("need_tool", "tool_denied", r"\bI need\s+['\"`]?[A-Z][\w.:-]*['\"`]?\s+to\b",
          symptom=False),
    # model_unavailable: the configured model is unknown, retired or not served
    _rule("model_not_found", "model_unavailable",
          r"\bmodel\b[^.]{0,80}?\b(?:was\s+|is\s+)?not[ _]found\b"),
    _rule("not_found_model", "model_unavailable", r"\bnot_found_error\W+model\b"),
    _rule("model_not_found_kind", "model_unavailable", r"\bmodel_not_found\b"),
    _rule("model_retired", "model_unavailable",
          r"\bmodel\b[^.]{0,60}?\b(?:is|was|has been)\s+(?:retired|deprecated|discontinued|"
          r"no longer (?:available|served|supported))"),
    _rule("unknown_model", "model_unavailable", r"\b(?:unknown|invalid|unsupported) model\b"),
    _rule("served_models", "model_unavailable",
          r"\bmodels?\b[^.:]{0,40}?\b(?:serves?|served|available)\b[^:.]{0,20}:", symptom=False),
    # timeout: runs end at their time limit
    _rule("timed_out", "timeout", r"\btimed[ -]?out\b"),
    _rule("hit_timeout", "timeout",
          r"\b(?:hit|reached|exceeded|ran past|ran over|went over)\s+(?:my\s+|the\s+|its\s+)?"
          r"(?:timeout|time limit|deadline)"),
    _rule("deadline_exceeded", "timeout", r"\bdeadline exceeded\b"),
    _rule("complete_run_takes", "timeout",
          r"\b(?:would take|takes|needs?|needed)\s+(?:about\s+|around\s+|roughly\s+|at least\s+)?"
          r"\d+(?:\.\d+)?\s*(?:s|sec|secs|seconds|min|minutes)\b", symptom=False),
    # format_violation: replies break the required output format
    _rule("failed_output_check", "format_violation",
          r"\bfail(?:ed|s)?\s+(?:the\s+)?(?:output|format)\s+(?:check|validation)"),
    _rule("missing_required", "format_violation",
          r"\b(?:did not|didn't|does not|doesn't|do not|don't)\s+(?:start with|begin with|follow|"
          r"keep to|match|use)\s+the\s+(?:required\s+)?[^.]{0,40}?\b(?:format|heading|structure|"
          r"schema|template)"),
    _rule("bad_format", "format_violation",
          r"\b(?:wrong|invalid|bad|malformed|broken)\s+(?:output\s+)?(?:format|structure)\b"),
    _rule("format_violation", "format_violation", r"\bformat\s+(?:violation|error)s?\b"),
    _rule("output_invalid_kind", "format_violation", r"\boutput_invalid\b"),
    _rule("no_structured_output", "format_violation",
          r"\bno\s+(?:valid\s+)?structured output\b"),
    _rule("format_instruction", "format_violation", r"\bformat instruction\b", symptom=False),
    # rate_limit: the API throttled or was overloaded (transient, not configuration)
    _rule("rate_limit", "rate_limit", r"\brate[ _-]?limit"),
    _rule("status_429", "rate_limit",
          r"\(429\)|\b(?:status|http|error|code)\W{0,3}429\b|\b429\s+(?:too many|rate)"),
    _rule("too_many_requests", "rate_limit", r"\btoo many requests\b"),
    _rule("throttled", "rate_limit", r"\bthrottl(?:ed|ing)\b"),
    _rule("overloaded", "rate_limit",
          r"\boverloaded\b|\(529\)|\b(?:status|http|error|code)\W{0,3}529\b"),
    _rule("server_error", "rate_limit",
          r"\binternal server error\b|\bapi_error\b|\b(?:status|http|error)\W{0,3}50[0234]\b"
          r"|\(50[0234]\)"),
)  # fmt: skip
"""Every rule, in no particular order (a text may match rules of several categories)."""

INJECTION_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(regex, _I)
    for regex in (
        r"\bignore\s+(?:all\s+|any\s+)?(?:the\s+|your\s+)?(?:previous|prior|above|earlier|"
        r"preceding)\s+(?:instructions?|directions?|prompts?|messages?|rules)",
        r"\bdisregard\s+(?:all\s+|any\s+)?(?:the\s+|your\s+)?(?:previous|prior|above|earlier|"
        r"instructions?|rules|system)",
        r"\bforget\s+(?:all\s+|everything\s+|your\s+)?(?:previous\s+|prior\s+)?(?:instructions?|"
        r"rules)",
        r"\bset\s+(?:your|the|its|my|their)\s+permission[_ ]profile\b",
        r"\bpermission[_ ]profile\s*(?:to|=|:)\s*['\"`]?(?:open|custom)\b",
        r"\b(?:grant|give)\s+(?:yourself|me|itself|the agent)\s+(?:admin|all|full|unrestricted)",
        r"\bnew instructions?\s*:",
        r"\byou are now\b",
        r"\boverride\s+(?:the\s+|your\s+|all\s+)?(?:instructions|rules|safety|gates?)\b",
        r"</?\s*(?:system|instructions?|agent_answer|issue_report|analysis|agent_config|"
        r"available_models|proposed_change)\s*>",
    )
)
"""Text that tries to instruct its reader; treated as suspicious data, never as evidence."""


def contains_injection(text: str) -> bool:
    """Whether ``text`` carries an injection marker."""
    return any(pattern.search(text) for pattern in INJECTION_PATTERNS)


_SENTENCE_END = re.compile(
    r"(?:(?<=[.!?])|(?<=[.!?][\"'\u201d)\]]))\s+(?=[A-Z0-9\"'\u201c(\[*`#-])"
)
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, each a verbatim substring (lines first, then sentence ends)."""
    sentences: list[str] = []
    for line in text.splitlines():
        line = _BULLET.sub("", line).strip()
        if not line:
            continue
        sentences.extend(part.strip() for part in _SENTENCE_END.split(line) if part.strip())
    return sentences


@dataclass(frozen=True, slots=True)
class Finding:
    """A classification with its evidence, each item a verbatim quote of its source.

    Attributes:
        category: the winning failure signature, or ``unknown``.
        confidence: how sure, by the rules in the module docstring.
        answer_symptoms: answer sentences that say the failure happened.
        log_symptoms: recorded errors that say so (distinct, in order).
        details: answer sentences or errors that size the fix.
        rivals: other categories with symptoms, strongest first.
        suspicious: sentences set aside for injection markers.
        reported_failures: whether any answer or record talked about failures at all.
    """

    category: CauseCategory
    confidence: float
    answer_symptoms: tuple[str, ...] = ()
    log_symptoms: tuple[str, ...] = ()
    details: tuple[str, ...] = ()
    rivals: tuple[CauseCategory, ...] = ()
    suspicious: tuple[str, ...] = ()
    reported_failures: bool = False
    scores: dict[CauseCategory, float] = field(default_factory=dict)

    @property
    def evidence(self) -> list[str]:
        """Quotes in order of strength: answers, then records, then details (deduplicated)."""
        return list(dict.fromkeys((*self.answer_symptoms, *self.log_symptoms, *self.details)))


_FAILURE_WORDS = re.compile(r"\b(?:fail(?:ed|s|ure)?|errors?|exception)\b", _I)

TRANSIENT: frozenset[CauseCategory] = frozenset({"rate_limit"})
"""Categories that are outages, not configuration faults."""
INCIDENT_CAP = 0.5
UNKNOWN_REPORTED = 0.3
UNKNOWN_SILENT = 0.2


def _symptom_categories(text: str) -> set[CauseCategory]:
    return {rule.category for rule in RULES if rule.symptom and rule.matches(text)}


def _detail_categories(text: str) -> set[CauseCategory]:
    return {rule.category for rule in RULES if not rule.symptom and rule.matches(text)}


def classify(answers: Iterable[str], error_logs: Sequence[str]) -> Finding:
    """Classify a failure from answer texts and recorded error strings.

    Args:
        answers: what the agent said (fence already stripped), one text per answer.
        error_logs: the recorded error strings (the issue's ``error_logs``).
    """
    suspicious: list[str] = []
    sentences: list[str] = []
    for answer in answers:
        for sentence in split_sentences(answer):
            if contains_injection(sentence):
                suspicious.append(sentence)
            elif sentence not in sentences:
                sentences.append(sentence)
    logs: list[str] = []
    for entry in error_logs:
        entry = entry.strip()
        if not entry:
            continue
        if contains_injection(entry):
            suspicious.append(entry)
        else:
            logs.append(entry)

    answer_hits: dict[CauseCategory, list[str]] = {c: [] for c in CATEGORIES}
    log_hits: dict[CauseCategory, list[str]] = {c: [] for c in CATEGORIES}
    unexplained = 0
    for sentence in sentences:
        for category in _symptom_categories(sentence):
            answer_hits[category].append(sentence)
    for entry in logs:
        matched = _symptom_categories(entry)
        if not matched:
            unexplained += 1
        for category in matched:
            log_hits[category].append(entry)

    scores: dict[CauseCategory, float] = {}
    for category in CATEGORIES:
        n_answers = len(answer_hits[category])
        score = len(log_hits[category]) / len(logs) if logs else 0.0
        score += (0.5 if n_answers else 0.0) + (0.1 if n_answers >= 2 else 0.0)
        if score > 0:
            scores[category] = round(score, 6)
    reported = bool(logs) or any(_FAILURE_WORDS.search(s) for s in sentences) or bool(scores)
    if not scores:
        return _unknown(sentences, logs, suspicious, reported, scores)

    # rivals are weighed on the records when there are any, else on what the answers say
    def strength(category: CauseCategory) -> int:
        return len(log_hits[category]) if logs else len(answer_hits[category])

    ranked = sorted(scores, key=lambda c: (-scores[c], CATEGORIES.index(c)))
    best = ranked[0]
    if best in TRANSIENT:
        # a storm passes by itself; a configuration fault seen twice beside it stays
        lasting = [c for c in ranked if c not in TRANSIENT and strength(c) >= 2]
        best = lasting[0] if lasting else best
    rivals = tuple(c for c in ranked if c != best and (best in TRANSIENT or c not in TRANSIENT))
    explained = sum(1 for entry in logs if any(entry in log_hits[c] for c in (best, *TRANSIENT)))
    if logs and unexplained * 2 >= len(logs) and explained * 2 < len(logs):
        return _unknown(sentences, logs, suspicious, reported, scores, rivals=tuple(ranked))

    n_answers, n_logs = len(answer_hits[best]), len(log_hits[best])
    if n_answers and n_logs:
        confidence = 0.9
    elif n_logs:
        confidence = 0.7
    else:
        confidence = 0.7 if n_answers >= 2 else 0.6

    if any(strength(rival) * 2 >= strength(best) > 0 for rival in rivals):
        confidence -= 0.2
    if n_logs == 1:
        confidence = min(confidence, INCIDENT_CAP)
    details = [s for s in sentences if best in _detail_categories(s)]
    details += [e for e in logs if best in _detail_categories(e)]
    return Finding(
        category=best,
        confidence=round(max(confidence, 0.0), 2),
        answer_symptoms=tuple(answer_hits[best]),
        log_symptoms=tuple(dict.fromkeys(log_hits[best])),
        details=tuple(d for d in dict.fromkeys(details) if d not in answer_hits[best]),
        rivals=rivals,
        suspicious=tuple(suspicious),
        reported_failures=reported,
        scores=scores,
    )


def _unknown(
    sentences: list[str],
    logs: list[str],
    suspicious: list[str],
    reported: bool,
    scores: dict[CauseCategory, float],
    *,
    rivals: tuple[CauseCategory, ...] = (),
) -> Finding:
    said = tuple(s for s in sentences if _FAILURE_WORDS.search(s))[:3]
    return Finding(
        category="unknown",
        confidence=UNKNOWN_REPORTED if reported else UNKNOWN_SILENT,
        answer_symptoms=said,
        log_symptoms=tuple(dict.fromkeys(logs))[:3],
        rivals=rivals,
        suspicious=tuple(suspicious),
        reported_failures=reported,
        scores=scores,
    )


# --- extractors: the numbers and names a fix is sized by ------------------------------------

_NUMBER = r"(\d[\d,]*)"


def _int(text: str) -> int:
    return int(text.replace(",", ""))


_TOKENS_NEEDED = (
    re.compile(
        r"\b(?:need(?:ed|s)?|requir(?:e|ed|es))\s+(?:about\s+|around\s+|roughly\s+|up to\s+|"
        rf"at least\s+)?{_NUMBER}\s*(?:output\s+)?tokens",
        _I,
    ),
    re.compile(rf"\b{_NUMBER}\s+at most\b", _I),
    re.compile(rf"\bmax_tokens\s+(?:of|to)\s+(?:at least\s+)?{_NUMBER}", _I),
    re.compile(rf"\(\s*{_NUMBER}\s+to\s+{_NUMBER}\s*\)", _I),
)


def needed_tokens(texts: Iterable[str]) -> int | None:
    """The largest output-token need quoted in ``texts`` ("needed about 2548 output tokens",
    "2999 at most", "a max_tokens of at least 3840"), or None."""
    found: list[int] = []
    for text in texts:
        if "token" not in text.casefold():
            continue
        for pattern in _TOKENS_NEEDED:
            for match in pattern.finditer(text):
                found.extend(_int(group) for group in match.groups() if group)
    return max(found) if found else None


_QUOTED_NAME = re.compile(r"['\"`\u2018\u201c]([A-Za-z][\w.:-]*)['\"`\u2019\u201d]")
_BARE_TOOL = (
    re.compile(r"\bpermission to (?:use|call|run) (?:the )?(?:tool )?([A-Z][\w.:-]*)"),
    re.compile(r"\b(?:use|call|run) (?:the )?(?:tool )?([A-Z][\w.:-]*) (?:was|has been|is) denied"),
    re.compile(r"\bnot (?:allowed|permitted) to (?:use|call|run) (?:the )?(?:tool )?"
               r"([A-Z][\w.:-]*)"),
)  # fmt: skip
_TOOL_RULES = tuple(rule for rule in RULES if rule.category == "tool_denied" and rule.symptom)
_ALLOWED_LIST = re.compile(r"\ballowed tools\b\s*(?:are|:)?\s*\(?[^)]*\)?", _I)


def denied_tools(texts: Iterable[str]) -> list[str]:
    """Tool names that denial sentences in ``texts`` quote, in order of first mention."""
    names: list[str] = []
    for text in texts:
        if not any(rule.matches(text) for rule in _TOOL_RULES):
            continue
        scrubbed = _ALLOWED_LIST.sub(" ", text)  # the allowed list names tools that work
        found = [m.group(1) for m in _QUOTED_NAME.finditer(scrubbed)]
        if not found:
            found = [m.group(1) for pattern in _BARE_TOOL for m in pattern.finditer(scrubbed)]
        names.extend(name.rstrip(".:") for name in found)
    return list(dict.fromkeys(names))


_MODEL_NAME = r"['\"`]?([A-Za-z0-9][\w.:@/-]*[\w])['\"`]?"
_MISSING_MODEL = (
    re.compile(rf"\bmodel\b:?\s+{_MODEL_NAME}{_IN_SENTENCE}{{0,40}}?\bnot[ _]found", _I),
    re.compile(rf"\bnot_found_error\W+model\W+{_MODEL_NAME}", _I),
    re.compile(rf"\bmodel\b:?\s+{_MODEL_NAME}\s+(?:is|was|has been)\s+(?:retired|deprecated|"
               rf"discontinued|no longer)", _I),
    re.compile(rf"\b(?:unknown|invalid|unsupported) model\b:?\s+{_MODEL_NAME}", _I),
)  # fmt: skip


def missing_models(texts: Iterable[str]) -> list[str]:
    """Model names quoted as not found, retired or unknown."""
    names = [m.group(1) for text in texts for p in _MISSING_MODEL for m in p.finditer(text)]
    return list(dict.fromkeys(names))


_SERVED = re.compile(
    r"\bmodels?\b[^.:]{0,40}?\b(?:serves?|served|available)\b[^:.]{0,20}:\s*(.+)", _I
)


def served_models(texts: Iterable[str]) -> list[str]:
    """Model names listed as served or available ("The models the API serves are: a, b.")."""
    names: list[str] = []
    for text in texts:
        match = _SERVED.search(text)
        if match is None:
            continue
        for part in re.split(r",\s*|\s+and\s+|\s+or\s+", match.group(1)):
            name = part.strip().strip("'\"`.;")
            if re.fullmatch(r"[A-Za-z0-9][\w.:@/-]*", name):
                names.append(name)
    return list(dict.fromkeys(names))


_RUN_TIME = re.compile(
    r"\b(?:would take|takes|take|needs?|needed|requir(?:e|es|ed))\s+(?:about\s+|around\s+|"
    r"roughly\s+|at least\s+)?(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds|min|mins|minutes)\b",
    _I,
)
_UNIT_S = {"ms": 0.001, "min": 60.0, "mins": 60.0, "minutes": 60.0}


def full_run_seconds(texts: Iterable[str]) -> float | None:
    """The longest time a complete run is said to take ("would take about 128 s"), or None."""
    found = [
        float(m.group(1)) * _UNIT_S.get(m.group(2).casefold(), 1.0)
        for text in texts
        for m in _RUN_TIME.finditer(text)
    ]
    return max(found) if found else None


_INSTRUCTION_QUOTE = re.compile(r"[\"\u201c]([^\"\u201d]{8,400})[\"\u201d]")
_HEADING = re.compile(r"required\s+['\"`\u2018]([^'\"`\u2019]{1,80})['\"`\u2019]\s+heading", _I)


def format_instruction(texts: Iterable[str]) -> str | None:
    """The format instruction a sentence about it quotes in double quotes, or None."""
    for text in texts:
        if "instruction" not in text.casefold():
            continue
        for match in _INSTRUCTION_QUOTE.finditer(text):
            candidate = match.group(1).strip()
            if not contains_injection(candidate):
                return candidate
    return None


def required_heading(texts: Iterable[str]) -> str | None:
    """The heading replies are said to need ("the required '## Answer' heading"), or None."""
    for text in texts:
        match = _HEADING.search(text)
        if match is not None:
            return match.group(1).strip()
    return None


def round_up(value: float, step: int) -> int:
    """``value`` rounded up to a multiple of ``step``."""
    return int(math.ceil(value / step) * step)
