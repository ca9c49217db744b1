"""The plain-text report formats, parsed: the fallback when a model gives prose, not structure.

The roles ask every runtime for structured output (``MediatorReport``, ``ImprovementPlan``); a
model that fails to give it may still have written the text report below, and that text is
parsed here rather than thrown away. The parsers are strict where a wrong guess would be
dangerous: an ``ACTION`` type they do not know is an error, never "probably a prompt change"
(a guess that would rewrite a prompt), and a text with neither an ``ACTION`` block nor an explicit
``ACTIONS: NONE`` is an error, not an empty plan.

The mediator's format, with two optional lines agentmend adds::

    ROOT CAUSE ANALYSIS REPORT
    ==========================
    Issue: [Brief description]
    Analyzed Agent: [Agent name]
    Responsible Agent: [agent whose configuration causes it]     (optional)
    Cause Category: [truncation | tool_denied | ...]              (optional)
    Confidence Score: [0.0-1.0]

    Root Cause:
    [Detailed explanation]

    Evidence:
    - [Quote from agent response]

    Recommendations:
    1. [Specific actionable fix]

The improver's format, with an optional ``FIELD`` line::

    ACTION: [MODIFY_PROMPT | ADJUST_PARAMETER | CREATE_AGENT | ADD_TOOL | REMOVE_TOOL |
             SET_PERMISSIONS | CHANGE_MODEL | EDIT_DOCS | DELETE_AGENT]
    TARGET: [agent name]
    FIELD: [max_tokens | timeout_s | ... | docs/<path>]          (optional)
    CHANGE:
      Old: [current value]
      New: [new value; JSON is parsed, e.g. 4096 or ["Read", "WebFetch"]]
    RATIONALE: [why this fixes the root cause]
    CONFIDENCE: [0.0-1.0]
"""

from __future__ import annotations

import json
import re
from typing import Any, get_args

from agentmend.infrastructure.errors import AgentmendError
from agentmend.infrastructure.models import ChangeType, IssueReport, RootCauseAnalysis
from agentmend.roles.schemas import CauseCategory, ProposedAction

__all__ = [
    "ACTION_TYPES",
    "PARAMETER_FIELDS",
    "ReportParseError",
    "parse_analysis_report",
    "parse_improvement_actions",
]

PARAMETER_FIELDS = ("temperature", "max_tokens", "timeout_s", "max_turns", "maxTurns")

ACTION_TYPES: dict[str, ChangeType] = {
    "MODIFY_PROMPT": ChangeType.PROMPT_MODIFICATION,
    "PROMPT_MODIFICATION": ChangeType.PROMPT_MODIFICATION,
    "ADJUST_PARAMETER": ChangeType.PARAMETER_ADJUSTMENT,
    "PARAMETER_ADJUSTMENT": ChangeType.PARAMETER_ADJUSTMENT,
    "CREATE_AGENT": ChangeType.AGENT_CREATION,
    "AGENT_CREATION": ChangeType.AGENT_CREATION,
    "DELETE_AGENT": ChangeType.AGENT_DELETION,
    "AGENT_DELETION": ChangeType.AGENT_DELETION,
    "ADD_TOOL": ChangeType.TOOL_PERMISSION_CHANGE,
    "REMOVE_TOOL": ChangeType.TOOL_PERMISSION_CHANGE,
    "SET_PERMISSIONS": ChangeType.TOOL_PERMISSION_CHANGE,
    "TOOL_PERMISSION_CHANGE": ChangeType.TOOL_PERMISSION_CHANGE,
    "CHANGE_MODEL": ChangeType.MODEL_CHANGE,
    "MODEL_CHANGE": ChangeType.MODEL_CHANGE,
    "EDIT_DOCS": ChangeType.DOCS_EDIT,
    "DOCS_EDIT": ChangeType.DOCS_EDIT,
    "CODE_PATCH": ChangeType.CODE_PATCH,
}
"""The action words of the improver's text format (and the ChangeType names) it accepts."""

_DEFAULT_FIELD = {
    "MODIFY_PROMPT": "system_prompt",
    "PROMPT_MODIFICATION": "system_prompt",
    "ADD_TOOL": "tools",
    "REMOVE_TOOL": "tools",
    "SET_PERMISSIONS": "permission_profile",
    "CHANGE_MODEL": "model",
    "MODEL_CHANGE": "model",
}
_CATEGORIES = frozenset(get_args(CauseCategory))
_MARKUP = re.compile(r"^[\s#>*_`]+|[*_`]+(?=\s*:)")
_NONE_MARKER = re.compile(
    r"^\s*(ACTIONS?\s*:\s*NONE|NO\s+ACTIONS?)\b", re.IGNORECASE | re.MULTILINE
)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*")


class ReportParseError(AgentmendError, ValueError):
    """A model's text could not be read as the report or plan it had to be.

    Attributes:
        what: ``"analysis report"`` or ``"action plan"``.
        problem: what is missing or wrong.
    """

    def __init__(self, what: str, problem: str, text: str = "") -> None:
        self.what = what
        self.problem = problem
        shown = " ".join(text.split())
        excerpt = f" (text begins: {shown[:120]!r})" if text.strip() else " (the text is empty)"
        super().__init__(f"cannot parse the {what}: {problem}{excerpt}")


def _sections(text: str, keys: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(KEY, content)`` in order: a line ``Key: value`` opens a section that runs to the next.

    Markdown decoration around a key (``**Root Cause:**``, ``## Evidence:``) is ignored.
    """
    pattern = re.compile(
        r"^(" + "|".join(re.escape(k) for k in keys) + r")\s*:\s*(.*)$", re.IGNORECASE
    )
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        bare = _MARKUP.sub("", line).replace("**", "")
        match = pattern.match(bare.strip())
        if match:
            key = match.group(1).upper()
            found.append((key, [match.group(2)] if match.group(2).strip() else []))
        elif found:
            found[-1][1].append(line)
    return [(key, "\n".join(lines).strip()) for key, lines in found]


def _items(block: str) -> list[str]:
    """The bullet or numbered items of a block (continuation lines joined to their item)."""
    items: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        if _BULLET.match(line):
            items.append(_BULLET.sub("", line).strip())
        elif items:
            items[-1] = f"{items[-1]} {line.strip()}"
        else:
            items.append(line.strip())
    return [_unquote(item) for item in items if item]


def _unquote(text: str) -> str:
    text = text.strip()
    for opening, closing in (('"', '"'), ("'", "'"), ("“", "”")):
        if len(text) >= 2 and text.startswith(opening) and text.endswith(closing):
            return text[1:-1].strip()
    return text


def _confidence(raw: str, what: str, text: str) -> float:
    match = re.search(r"(\d+(?:\.\d+)?)\s*(%?)", raw)
    if match is None:
        raise ReportParseError(what, f"confidence {raw.strip()!r} is not a number", text)
    value = float(match.group(1))
    if match.group(2) or value > 1.0:
        value /= 100.0
    if not 0.0 <= value <= 1.0:
        raise ReportParseError(what, f"confidence {raw.strip()!r} is not in [0, 1]", text)
    return value


_REPORT_KEYS = (
    "Issue",
    "Analyzed Agent",
    "Responsible Agent",
    "Cause Category",
    "Category",
    "Confidence Score",
    "Confidence",
    "Root Cause",
    "Evidence",
    "Recommendations",
)


def parse_analysis_report(text: str, issue: IssueReport) -> RootCauseAnalysis:
    """Read a ROOT CAUSE ANALYSIS REPORT into a ``RootCauseAnalysis``.

    The responsible agent is ``Responsible Agent`` when given, else ``Analyzed Agent``, else
    the issue's agent. A missing confidence is 0.5 (neither sure nor unsure; the mediator's evidence
    check lowers it when the evidence does not hold). An unknown cause category becomes
    ``unknown``.

    Raises:
        ReportParseError: no ``Root Cause:`` section (the one part that cannot be guessed), or a
            confidence that is not a number in [0, 1].
    """
    what = "analysis report"
    sections = dict(reversed(_sections(text, _REPORT_KEYS)))  # first occurrence wins
    cause = sections.get("ROOT CAUSE", "").strip()
    if not cause:
        raise ReportParseError(what, "it has no 'Root Cause:' section", text)
    raw_confidence = sections.get("CONFIDENCE SCORE", sections.get("CONFIDENCE"))
    confidence = 0.5 if raw_confidence is None else _confidence(raw_confidence, what, text)
    agent = sections.get("RESPONSIBLE AGENT") or sections.get("ANALYZED AGENT") or issue.agent_name
    agent = _unquote(agent.splitlines()[0]) if agent.strip() else issue.agent_name
    category_text = sections.get("CAUSE CATEGORY", sections.get("CATEGORY"))
    category: str | None = None
    if category_text is not None:
        word = category_text.strip().split()[0].strip("`*'\".,").lower() if category_text else ""
        category = word if word in _CATEGORIES else "unknown"
    return RootCauseAnalysis(
        issue=issue,
        identified_cause=" ".join(cause.split()),
        confidence_score=confidence,
        recommendations=_items(sections.get("RECOMMENDATIONS", "")),
        full_report=text,
        responsible_agent=agent,
        evidence=_items(sections.get("EVIDENCE", "")),
        cause_category=category,
    )


_ACTION_KEYS = ("ACTION", "TARGET", "FIELD", "CHANGE", "Old", "New", "RATIONALE", "CONFIDENCE")


def _value(raw: str) -> Any:
    """JSON when the text is JSON (numbers, lists, objects, null), else the text itself."""
    text = raw.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return _unquote(text) if "\n" not in text else text


def _names(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(item).strip() for item in value if str(item).strip()]
    return [part.strip() for part in str(value).split(",") if part.strip()]


def _blocks(text: str) -> list[list[tuple[str, str]]]:
    blocks: list[list[tuple[str, str]]] = []
    for key, content in _sections(text, _ACTION_KEYS):
        if key == "ACTION":
            blocks.append([])
        if blocks:
            blocks[-1].append((key, content))
    return blocks


def parse_improvement_actions(text: str) -> list[ProposedAction]:
    """Read the improver's ACTION blocks into ``ProposedAction``s.

    ``ADJUST_PARAMETER`` takes its field from ``FIELD:`` or from a ``New:`` written as
    ``max_tokens: 4096`` (or ``=``); ``ADD_TOOL``/``REMOVE_TOOL`` become a ``tools`` change of
    ``{"add": [...]}``/``{"remove": [...]}``; ``EDIT_DOCS`` needs ``FIELD: docs/<path>``.
    A text saying ``ACTIONS: NONE`` (or ``NO ACTION``) and holding no block is an empty plan.

    Raises:
        ReportParseError: no block and no none-marker, an unknown ACTION word, a block without
            TARGET or CONFIDENCE, or a parameter change that does not say which parameter.
    """
    what = "action plan"
    blocks = _blocks(text)
    if not blocks:
        if _NONE_MARKER.search(text):
            return []
        raise ReportParseError(what, "it has no 'ACTION:' block and no 'ACTIONS: NONE' line", text)
    actions: list[ProposedAction] = []
    for number, block in enumerate(blocks, start=1):
        fields = dict(reversed(block))
        word = fields.get("ACTION", "").strip().upper().replace(" ", "_").replace("-", "_")
        if word not in ACTION_TYPES:
            known = ", ".join(sorted(ACTION_TYPES))
            raise ReportParseError(
                what,
                f"ACTION {number} has unknown type {word or '(empty)'!r} (known: {known})",
                text,
            )
        target = _unquote(
            fields.get("TARGET", "").strip().splitlines()[0] if fields.get("TARGET") else ""
        )
        if not target:
            raise ReportParseError(what, f"ACTION {number} ({word}) has no TARGET agent", text)
        if "CONFIDENCE" not in fields:
            raise ReportParseError(what, f"ACTION {number} ({word}) has no CONFIDENCE", text)
        confidence = _confidence(fields["CONFIDENCE"], what, text)
        raw_new = fields.get("NEW", fields.get("CHANGE", ""))
        field = fields.get("FIELD", "").strip() or _DEFAULT_FIELD.get(word)
        new_value: Any = _value(raw_new)
        if word in ("ADJUST_PARAMETER", "PARAMETER_ADJUSTMENT") and not fields.get("FIELD"):
            match = re.match(r"^\s*([A-Za-z_]+)\s*[:=]\s*(.+)$", raw_new.strip(), re.DOTALL)
            if match is None or match.group(1) not in PARAMETER_FIELDS:
                raise ReportParseError(
                    what,
                    f"ACTION {number} ({word}) does not say which parameter it sets "
                    f"(give FIELD: one of {', '.join(PARAMETER_FIELDS)})",
                    text,
                )
            field, new_value = match.group(1), _value(match.group(2))
        if word == "ADD_TOOL":
            new_value = {"add": _names(new_value)}
        elif word == "REMOVE_TOOL":
            new_value = {"remove": _names(new_value)}
        elif word in ("MODIFY_PROMPT", "PROMPT_MODIFICATION", "CREATE_AGENT", "AGENT_CREATION"):
            new_value = raw_new.strip()  # prose and definitions are text, even if JSON-like
        if word in ("EDIT_DOCS", "DOCS_EDIT") and not (field or "").startswith("docs/"):
            raise ReportParseError(what, f"ACTION {number} ({word}) needs FIELD: docs/<path>", text)
        if word in ("CREATE_AGENT", "AGENT_CREATION", "DELETE_AGENT", "AGENT_DELETION"):
            field = None
        actions.append(
            ProposedAction(
                action_type=ACTION_TYPES[word],
                target_agent=target,
                target_field=field,
                new_value=new_value,
                rationale=" ".join(fields.get("RATIONALE", "").split()),
                confidence=confidence,
            )
        )
    return actions
