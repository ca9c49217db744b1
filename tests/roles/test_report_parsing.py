"""Seed 003's text formats: the fallback parsers for reports and action plans."""

from __future__ import annotations

import pytest

from agentmend.infrastructure.models import ChangeType, IssueReport
from agentmend.roles.report_parsing import (
    ReportParseError,
    parse_analysis_report,
    parse_improvement_actions,
)

ISSUE = IssueReport(agent_name="research-agent", error_type="cusum_failure_rate")

SEED_REPORT = """ROOT CAUSE ANALYSIS REPORT
==========================
Issue: research briefs are cut off
Analyzed Agent: research-agent
Confidence Score: 0.85

Root Cause:
The agent's max_tokens of 2048 is too small for the
answers it now has to write.

Evidence:
- "3 runs stopped at my max_tokens limit of 2048"
- truncated: response stopped at max_tokens=2048

Recommendations:
1. Raise max_tokens to 4096
2. Keep answers shorter
"""


def test_seed_report_is_read_field_by_field() -> None:
    analysis = parse_analysis_report(SEED_REPORT, ISSUE)
    assert analysis.responsible_agent == "research-agent"
    assert analysis.confidence_score == pytest.approx(0.85)
    assert analysis.identified_cause == (
        "The agent's max_tokens of 2048 is too small for the answers it now has to write."
    )
    assert analysis.evidence == (
        "3 runs stopped at my max_tokens limit of 2048",
        "truncated: response stopped at max_tokens=2048",
    )
    assert analysis.recommendations == ("Raise max_tokens to 4096", "Keep answers shorter")
    assert analysis.cause_category is None
    assert analysis.full_report == SEED_REPORT
    assert analysis.issue == ISSUE


def test_responsible_agent_category_percent_and_markdown_decoration() -> None:
    text = (
        "**Analyzed Agent:** quality-agent\n"
        "**Responsible Agent:** research-agent\n"
        "**Cause Category:** Truncation\n"
        "**Confidence Score:** 70%\n"
        "## Root Cause:\nmax_tokens too small\n"
    )
    analysis = parse_analysis_report(text, ISSUE)
    assert analysis.responsible_agent == "research-agent"
    assert analysis.cause_category == "truncation"
    assert analysis.confidence_score == pytest.approx(0.7)


def test_unknown_category_becomes_unknown_and_missing_confidence_is_the_seeds_half() -> None:
    analysis = parse_analysis_report("Cause Category: cosmic rays\nRoot Cause: bad luck", ISSUE)
    assert analysis.cause_category == "unknown"
    assert analysis.confidence_score == 0.5
    assert analysis.responsible_agent == ISSUE.agent_name


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("I think it is the tokens.", "no 'Root Cause:' section"),
        ("", "no 'Root Cause:' section"),
        ("Root Cause: x\nConfidence Score: very high", "is not a number"),
        ("Root Cause: x\nConfidence Score: 250%", "not in [0, 1]"),
    ],
)
def test_unreadable_reports_raise_a_clear_error(text: str, problem: str) -> None:
    with pytest.raises(ReportParseError, match="cannot parse the analysis report") as caught:
        parse_analysis_report(text, ISSUE)
    assert problem in caught.value.problem
    assert caught.value.what == "analysis report"


SEED_ACTIONS = """Here is my plan.

ACTION: ADJUST_PARAMETER
TARGET: research-agent
CHANGE:
  Old: max_tokens: 2048
  New: max_tokens: 4096
RATIONALE: answers need about 3000 tokens
CONFIDENCE: 0.9

ACTION: ADD_TOOL
TARGET: socratic-planner
CHANGE:
  Old: Read, TodoWrite
  New: Grep, Glob
RATIONALE: it needs to search the vault
CONFIDENCE: 0.8

ACTION: MODIFY_PROMPT
TARGET: quality-agent
CHANGE:
  Old: (current prompt)
  New: You review notes.
  Format: start your reply with a '## Answer' heading.
RATIONALE: restate the format last
CONFIDENCE: 0.75
"""


def test_seed_action_blocks_become_proposed_actions() -> None:
    first, second, third = parse_improvement_actions(SEED_ACTIONS)
    assert first.action_type is ChangeType.PARAMETER_ADJUSTMENT
    assert (first.target_agent, first.target_field, first.new_value) == (
        "research-agent",
        "max_tokens",
        4096,
    )
    assert first.confidence == pytest.approx(0.9)
    assert first.rationale == "answers need about 3000 tokens"
    assert second.action_type is ChangeType.TOOL_PERMISSION_CHANGE
    assert (second.target_field, second.new_value) == ("tools", {"add": ("Grep", "Glob")})
    assert third.action_type is ChangeType.PROMPT_MODIFICATION
    assert third.target_field == "system_prompt"
    assert third.new_value == (
        "You review notes.\n  Format: start your reply with a '## Answer' heading."
    )


def test_field_line_and_json_values() -> None:
    text = (
        "ACTION: CHANGE_MODEL\nTARGET: research-agent\nCHANGE:\n  New: claude-haiku-4-5\n"
        "RATIONALE: sonnet is gone\nCONFIDENCE: 0.8\n\n"
        "ACTION: SET_PERMISSIONS\nTARGET: research-agent\n"
        'CHANGE:\n  New: {"allow": ["Read"], "deny": []}\nRATIONALE: narrow\nCONFIDENCE: 0.7\n\n'
        "ACTION: ADJUST_PARAMETER\nTARGET: research-agent\nFIELD: timeout_s\n"
        "CHANGE:\n  New: 240.5\nRATIONALE: slow\nCONFIDENCE: 0.7\n\n"
        "ACTION: EDIT_DOCS\nTARGET: research-agent\nFIELD: docs/style.md\n"
        "CHANGE:\n  New: Use SI units.\nRATIONALE: docs\nCONFIDENCE: 0.7\n"
    )
    model, profile, timeout, docs = parse_improvement_actions(text)
    assert (model.action_type, model.target_field, model.new_value) == (
        ChangeType.MODEL_CHANGE,
        "model",
        "claude-haiku-4-5",
    )
    assert profile.new_value == {"allow": ("Read",), "deny": ()}
    assert profile.target_field == "permission_profile"
    assert (timeout.target_field, timeout.new_value) == ("timeout_s", 240.5)
    assert (docs.action_type, docs.target_field, docs.new_value) == (
        ChangeType.DOCS_EDIT,
        "docs/style.md",
        "Use SI units.",
    )


@pytest.mark.parametrize("marker", ["ACTIONS: NONE - a transient outage", "No action needed."])
def test_an_explicit_none_is_an_empty_plan(marker: str) -> None:
    assert parse_improvement_actions(f"The rate limit passes by itself.\n{marker}") == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("I would raise the tokens.", "no 'ACTION:' block"),
        (
            "ACTION: REWRITE_EVERYTHING\nTARGET: x\nCONFIDENCE: 0.9",
            "unknown type 'REWRITE_EVERYTHING'",
        ),
        ("ACTION: MODIFY_PROMPT\nCHANGE:\n  New: hi\nCONFIDENCE: 0.9", "has no TARGET"),
        ("ACTION: MODIFY_PROMPT\nTARGET: a\nCHANGE:\n  New: hi", "has no CONFIDENCE"),
        (
            "ACTION: ADJUST_PARAMETER\nTARGET: a\nCHANGE:\n  New: 4096\nCONFIDENCE: 1",
            "which parameter",
        ),
        ("ACTION: EDIT_DOCS\nTARGET: a\nCHANGE:\n  New: x\nCONFIDENCE: 1", "FIELD: docs/<path>"),
    ],
)
def test_malformed_plans_raise_a_clear_error(text: str, problem: str) -> None:
    with pytest.raises(ReportParseError, match="cannot parse the action plan") as caught:
        parse_improvement_actions(text)
    assert problem in caught.value.problem
