"""How the MCP tools answer: ``ToolOutput`` and the text and data of each kind of result.

``agentmend.faces.mcp.tools`` decides what a tool does; this module only shapes what it found into
text a model reads and the same facts as structured data (camelCase keys for the code-plan results,
as existing MCP clients expect). Nothing here reads or writes the workspace, except
``last_cycle``, which replays the latest cycle from the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from agentmend.infrastructure.code_update.plans import (
    CodePlan,
    ExecutionResult,
    RollbackResult,
    UpdateStatus,
)
from agentmend.infrastructure.llm.base import AgentResult
from agentmend.infrastructure.models import IssueReport, RootCauseAnalysis
from agentmend.infrastructure.store.api import Store
from agentmend.loop.cycle import list_cycle_ids, replay_cycle
from agentmend.roles.code_review import CodeAnalysis, CodeProposal
from agentmend.roles.outcomes import QuestionAnswer

__all__ = [
    "MAX_TEXT_CHARS",
    "ToolOutput",
    "agent_analysis_output",
    "code_smell_output",
    "code_status_output",
    "core_update_output",
    "execution_output",
    "json_text",
    "last_cycle",
    "plan_approved_output",
    "plan_created_output",
    "rollback_output",
    "run_output",
    "status_text",
]

MAX_TEXT_CHARS = 20_000
MAX_ANSWER_CHARS = 4_000
"""An agent's answer is cut to this many characters in the ``run`` tool's answer."""


class ToolOutput(BaseModel):
    """A tool's answer: text for the model to read, and the same facts as structured data."""

    text: str
    data: dict[str, Any]


def json_text(data: Any) -> str:
    """``data`` as indented JSON, cut at ``MAX_TEXT_CHARS`` (the structured data keeps it all)."""
    text = json.dumps(data, indent=2, default=str)
    if len(text) > MAX_TEXT_CHARS:
        return text[:MAX_TEXT_CHARS] + "\n... (truncated; the structured content has it all)"
    return text


# -- code plans (self_improve) ---------------------------------------------------------------


def plan_created_output(plan: CodePlan) -> ToolOutput:
    text = (
        "Improvement plan created:\n"
        f"- Plan ID: {plan.plan_id}\n"
        f"- Description: {plan.description}\n"
        f"- Files affected: {len(plan.files)}\n"
        f"- Status: {plan.status}\n\n"
        f'Use {{ action: "approve", planId: "{plan.plan_id}" }} to approve, then '
        f'{{ action: "execute", planId: "{plan.plan_id}" }} to apply changes.\n\n'
        f"{_test_files_note(plan)}"
        f"Diff:\n{plan.diff}"
    )
    data = {
        "planId": plan.plan_id,
        "testFiles": list(plan.test_files),
        "description": plan.description,
        "files": [{"path": f.path, "operation": f.operation} for f in plan.files],
        "status": plan.status,
        "diff": plan.diff,
    }
    return ToolOutput(text=text, data=data)


def _test_files_note(plan: CodePlan) -> str:
    """Why a plan that touches its tests will not execute on this channel's approval alone."""
    if not plan.test_files or plan.tests_approved_by is not None:
        return ""
    return (
        f"Flagged: it changes what configures or selects the tests "
        f"({', '.join(plan.test_files)}). It executes only after a person approves that on a "
        f"terminal: agentmend code approve-tests {plan.plan_id}\n\n"
    )


def plan_approved_output(plan: CodePlan) -> ToolOutput:
    text = (
        f"Plan {plan.plan_id} approved for execution.\n"
        f"{_test_files_note(plan)}"
        f'Use {{ action: "execute", planId: "{plan.plan_id}" }} to apply changes.'
    )
    data = {"planId": plan.plan_id, "status": plan.status, "approvedBy": plan.approved_by}
    return ToolOutput(text=text, data=data)


def execution_output(result: ExecutionResult) -> ToolOutput:
    return ToolOutput(text=_format_execution(result), data=_execution_data(result))


def code_status_output(status: UpdateStatus) -> ToolOutput:
    last = status.last_execution
    active = status.active_improvement
    last_text = "None"
    if last is not None:
        outcome = last.result.get("reason", "") if last.result is not None else ""
        last_text = f"{last.plan_id} ({last.status}, {last.updated.isoformat()}): {outcome}"
    text = (
        "Self-improvement status:\n"
        f"- Pending plans: {len(status.pending_plans)}\n"
        + "".join(f"  - {p.plan_id} ({p.status}): {p.description}\n" for p in status.pending_plans)
        + f"- Last execution: {last_text}\n"
        f"- Active improvement: {active.plan_id if active is not None else 'None'}"
    )
    data = {
        "pendingPlans": [_plan_summary(p) for p in status.pending_plans],
        "lastExecution": _plan_summary(last) if last is not None else None,
        "activeImprovement": _plan_summary(active) if active is not None else None,
    }
    return ToolOutput(text=text, data=data)


def rollback_output(result: RollbackResult) -> ToolOutput:
    text = (
        f"Rollback {'completed' if result.success else 'failed'}:\n"
        f"- Plan ID: {result.plan_id}\n"
        f"- Reason: {result.reason}\n"
        f"- Files restored: {result.files_restored}"
    )
    data = {
        "success": result.success,
        "planId": result.plan_id,
        "reason": result.reason,
        "filesRestored": result.files_restored,
        "paths": list(result.paths),
    }
    return ToolOutput(text=text, data=data)


def _plan_summary(plan: CodePlan) -> dict[str, Any]:
    result: Mapping[str, Any] = plan.result or {}
    return {
        "planId": plan.plan_id,
        "description": plan.description,
        "status": plan.status,
        "files": [f.path for f in plan.files],
        "updated": plan.updated.isoformat(),
        "reason": result.get("reason"),
        "rollbackPerformed": result.get("rollback_performed", False),
    }


def _execution_data(result: ExecutionResult) -> dict[str, Any]:
    validation = result.validation
    return {
        "planId": result.plan_id,
        "success": result.success,
        "status": result.status,
        "reason": result.reason,
        "filesModified": result.files_modified,
        "validationPassed": result.validation_passed,
        "testsPassed": result.tests_passed,
        "rollbackPerformed": result.rollback_performed,
        "restoredIdentical": result.restored_identical,
        "changeIds": list(result.change_ids),
        "gates": [v.model_dump(mode="json") for v in result.verdicts],
        "validation": validation.model_dump(mode="json") if validation is not None else None,
    }


def _format_execution(result: ExecutionResult) -> str:
    tests = {True: "PASSED", False: "FAILED", None: "NOT RUN"}[result.tests_passed]
    lines = [
        f"Improvement execution {'succeeded' if result.success else 'failed'}:",
        f"- Plan ID: {result.plan_id}",
        f"- Files modified: {result.files_modified}",
        f"- Validation: {'PASSED' if result.validation_passed else 'FAILED'}",
        f"- Tests: {tests}",
    ]
    if result.rollback_performed:
        lines.append("- ROLLBACK PERFORMED due to validation failure")
        if result.restored_identical is not None:
            same = "byte-identical" if result.restored_identical else "NOT identical"
            lines.append(f"- Files restored: {same} to before")
    elif result.status == "rolled_back":
        lines.append("- NOT APPLIED: validation failed in a copy; the project was never changed")
    validation = result.validation
    if validation is not None and validation.sandbox:
        where = {"namespace": "a copy, everything else read-only", "copy": "a copy"}
        lines.append(f"- Validated in: {where.get(validation.sandbox, validation.sandbox)}")
    lines.append(f"- Status: {result.status}: {result.reason}")
    if validation is not None:
        for error in validation.compile_errors:
            lines.append(f"- Compile error: {error}")
        if validation.tests_run and not validation.tests_passed and validation.output_tail:
            tail = validation.output_tail[-1500:]
            lines.append(f"- Test output (tail):\n{tail}")
    return "\n".join(lines)


# -- analyze -----------------------------------------------------------------------------------


def agent_analysis_output(
    name: str,
    issue: IssueReport,
    analysis: RootCauseAnalysis,
    questions: list[QuestionAnswer],
    *,
    detected: bool,
    reproduced: bool,
) -> ToolOutput:
    data = {
        "agent": name,
        "detected": detected,
        "issue": issue.model_dump(mode="json"),
        "analysis": analysis.model_dump(mode="json"),
        "questions": [q.model_dump(mode="json") for q in questions],
        "reproduced": reproduced,
        "applied": False,
    }
    found = "detected" if detected else "no open issue detected; analysed on request"
    text = (
        f"Analysis of {name} ({found}; nothing was applied):\n"
        f"- Issue: {issue.error_type}: {issue.context or '(no context)'}\n"
        f"- Responsible agent: {analysis.agent_name}\n"
        f"- Cause ({analysis.cause_category or 'unknown'}, confidence "
        f"{analysis.confidence_score:.2f}): {analysis.identified_cause}\n"
        + "".join(f"- Evidence: {e}\n" for e in analysis.evidence)
        + "".join(f"- Recommendation: {r}\n" for r in analysis.recommendations)
        + f"- Questions asked: {len(questions)}"
    )
    return ToolOutput(text=text, data=data)


def core_update_output(proposal: CodeProposal) -> ToolOutput:
    body = proposal.proposal
    applies = "applies" if proposal.diff_applies else f"does NOT apply: {proposal.diff_error}"
    text = (
        f"Proposed update for {proposal.path} (not applied; the diff {applies}):\n"
        f"{body.summary}\n\nRationale: {body.rationale}\n"
        + "".join(f"- Test: {t}\n" for t in body.test_plan)
        + f"\n{body.diff}\n"
        'Use { action: "plan", description, diff } of self_improve to apply it safely.'
    )
    return ToolOutput(text=text, data=proposal.model_dump(mode="json"))


def code_smell_output(analysis: CodeAnalysis) -> ToolOutput:
    report = analysis.report
    text = f"Code analysis of {analysis.path}: {report.summary}\n" + "".join(
        f"- [{f.severity}] {f.category}, line {f.line or '?'}: {f.description} -> "
        f"{f.recommendation}\n"
        for f in report.findings
    )
    return ToolOutput(text=text, data=analysis.model_dump(mode="json"))


# -- status ------------------------------------------------------------------------------------


def run_output(
    results: Mapping[str, AgentResult[Any]],
    issues: list[IssueReport],
    *,
    release: Mapping[str, object] | None,
    routing_key: str | None,
    store_notice: str | None = None,
    checker: Mapping[str, Any] | None = None,
) -> ToolOutput:
    """The ``run`` tool's answer: each agent's outcome and text, the release that served it,
    (``store_notice``) the steps skipped because the store was out of reach, and (``checker``)
    the fleet checker the issues are left to."""
    runs = [
        {
            "agent": name,
            "success": result.success,
            "text": result.text[:MAX_ANSWER_CHARS],
            "error": str(result.error) if result.error is not None else None,
            "durationMs": round(result.duration_ms, 1),
        }
        for name, result in sorted(results.items())
    ]
    data: dict[str, Any] = {
        "routingKey": routing_key,
        "release": dict(release) if release is not None else None,
        "runs": runs,
        "issues": [{"agent": i.agent_name, "kind": i.error_type} for i in issues],
        "storeNotice": store_notice,
        "fleetChecker": dict(checker) if checker is not None else None,
    }
    served = (
        f"release v{release['release']} ({release['arm']})"
        if release is not None
        else "the team folder"
    )
    ok = sum(result.success for result in results.values())
    lines = [f"Served by {served}; {ok} of {len(runs)} run(s) ok"]
    if store_notice is not None:
        lines.append(store_notice)
    for run in runs:
        outcome = "ok" if run["success"] else f"FAILED: {run['error']}"
        lines.append(f"### {run['agent']} ({outcome})\n{run['text']}")
    for issue in data["issues"]:
        lines.append(f"Issue detected in {issue['agent']}: {issue['kind']}")
    if checker is not None and issues:
        lines.append(
            f"The issues are left to the team's fleet checker ({checker['principal']} on "
            f"{checker['host']} pid {checker['pid']})"
        )
    return ToolOutput(text="\n\n".join(lines)[:MAX_TEXT_CHARS], data=data)


def status_text(
    data: dict[str, Any], agents: list[dict[str, Any]], cycle: dict[str, Any] | None
) -> str:
    """The ``status`` tool's text, from its data (workspace, provider, plans) and the agents."""
    lines = [f"agentmend workspace {data['workspace']} ({data['provider']})"]
    if data.get("releases") is not None:
        lines.append(f"Releases: {data['releases']['text']}")
    for change in data.get("releaseChanges") or ():
        lines.append(f"Since the last status: {change}")
    lines.append("Agents:")
    for a in agents:
        if a["executions"]:
            lines.append(
                f"- {a['name']}: {a['executions']} runs, success {a['success_rate']:.0%}, "
                f"p95 {a['p95_duration_ms']:.0f} ms, {a['consecutive_failures']} failing now"
            )
        elif a.get("broken"):
            lines.append(f"- {a['name']}: definition broken: {a['broken']}")
        else:
            lines.append(f"- {a['name']}: no runs recorded")
    if data.get("unwrittenRuns") and data.get("storeWriteError"):
        lines.append(
            f"Runs not yet written to the store: {data['unwrittenRuns']} (kept in memory, "
            f"retried; last error: {data['storeWriteError']})"
        )
    elif data.get("unwrittenRuns"):  # the writer's normal lag after a burst, not a fault
        lines.append(
            f"Runs on their way to the store: {data['unwrittenRuns']} (the writer is catching up)"
        )
    if data.get("refusedRuns"):
        lines.append(
            f"Runs refused because the record backlog was full: {data['refusedRuns']} "
            "(record() outran the store; see max_record_backlog)"
        )
    if data.get("storeUnreachable"):
        lines.append(
            f"Store unreachable: {data['storeUnreachable']} (runs above are this process's; "
            "plans, cycles, changes and the audit chain are shown once it is back)"
        )
        return "\n".join(lines)
    lines.append(f"Pending plans: {len(data['pendingPlans'])}")
    last = data["lastExecution"]
    lines.append(
        f"Last execution: {last['planId']} ({last['status']})" if last else "Last execution: None"
    )
    lines.append(f"Last cycle: {cycle['summary']}" if cycle is not None else "Last cycle: None")
    held = data.get("fleetChecker")
    if held is not None:
        lines.append(
            f"Fleet checker: {held['principal']} on {held['host']} pid {held['pid']} holds the "
            "team; its issues are left to it"
        )
        for q in data.get("checkerQuestions", []):
            lines.append(
                f"- it asks: a cycle for issue {q['issue_id']} of {q['agent']} ({q['kind']})? "
                "(issue tool: approve or decline)"
            )
    audit = data.get("audit")
    if audit is not None:
        problems = audit["problems"]
        lines.append(
            f"Audit chain: verified ({audit['rows_checked']} rows)"
            if audit["ok"]
            else f"Audit chain: DOES NOT VERIFY ({len(problems)} problem(s)): "
            + "; ".join(problems)
        )
    return "\n".join(lines)


def last_cycle(store: Store) -> dict[str, Any] | None:
    """A summary of the most recent cycle in ``store`` (None when none ran)."""
    ids = list_cycle_ids(store, limit=1)
    if not ids:
        return None
    try:
        cycle = replay_cycle(store, ids[-1])
    except (KeyError, ValueError) as exc:
        return {"cycle_id": ids[-1], "summary": f"cannot be replayed: {exc}"}
    return {
        "cycle_id": cycle.cycle_id,
        "status": cycle.status,
        "agent": cycle.analysis.agent_name if cycle.analysis else cycle.issue.agent_name,
        "summary": cycle.summary(),
        "change_ids": list(cycle.change_ids),
        "rolled_back": cycle.rolled_back,
        "rollback_blocked": list(cycle.rollback_blocked),
        "started_at": cycle.started_at.isoformat() if cycle.started_at else None,
        "finished_at": cycle.finished_at.isoformat() if cycle.finished_at else None,
    }
