"""How a failed Claude Code CLI run becomes an ``AgentRunError``, from structured fields only.

The kinds are the same as the Anthropic runtime's: ``api_error_status`` 429 -> RATE_LIMIT; 529
or ``api_error_type == "overloaded_error"`` -> OVERLOADED; other 5xx -> SERVER_ERROR; 401/403 ->
AUTHENTICATION; 408 -> TIMEOUT; 404 with the CLI's ``model_not_found`` assistant error ->
MODEL_NOT_FOUND; other 4xx -> BAD_REQUEST; an API error with no status -> CONNECTION;
``error_max_turns`` -> MAX_TURNS; structured output retries exhausted -> OUTPUT_INVALID; an
aborted turn -> CANCELLED; other SDK errors (process exit, connection to the CLI, unreadable
output) -> RUNTIME. The runtime adds the kinds only it can see (missing or invalid structured
output, its own ``timeout_s``); see :mod:`agentmend.infrastructure.llm.claude.runtime`.

A failed API call ends the run with a ``ResultMessage`` whose ``is_error`` is true, subtype
``success``, ``terminal_reason="api_error"`` and ``api_error_status`` (the HTTP status; the raw
frame also has ``api_error_type``, e.g. ``overloaded_error``), then the SDK raises
``ResultError`` carrying that frame. A connection failure has no status. ``claude_agent_sdk``
is imported only inside :func:`error_from_exception`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from agentmend.infrastructure.errors import AgentRunError, ErrorKind

__all__ = ["error_from_exception", "error_from_result", "result_fields"]


def error_from_result(
    data: Mapping[str, Any], *, assistant_error: str | None = None
) -> AgentRunError:
    """The ``AgentRunError`` for a failed result frame (``ResultError.data`` or the fields of a
    ``ResultMessage``), read from its structured fields.

    Args:
        data: the result payload: ``subtype``, ``terminal_reason``, ``api_error_status``,
            ``api_error_type``, ``errors``, ``result``.
        assistant_error: the ``error`` of the CLI's synthetic assistant message for the failed
            call (``model_not_found``, ``rate_limit``, ...), when one was seen.
    """
    subtype = data.get("subtype")
    reason = data.get("terminal_reason")
    status = data.get("api_error_status")
    error_type = data.get("api_error_type")
    message = _result_text(data)
    if isinstance(status, int):
        return AgentRunError(
            _kind_for_status(status, error_type, assistant_error), message, status_code=status
        )
    if reason == "api_error":
        # No HTTP status means no HTTP response: the server could not be reached.
        return AgentRunError(ErrorKind.CONNECTION, message)
    if subtype == "error_max_turns" or reason == "max_turns":
        return AgentRunError(ErrorKind.MAX_TURNS, message)
    if subtype == "error_max_structured_output_retries":
        return AgentRunError(ErrorKind.OUTPUT_INVALID, message)
    if isinstance(reason, str) and reason.startswith("aborted"):
        return AgentRunError(ErrorKind.CANCELLED, message)
    return AgentRunError(ErrorKind.RUNTIME, message)


def _kind_for_status(status: int, error_type: object, assistant_error: str | None) -> ErrorKind:
    if status == 429:
        return ErrorKind.RATE_LIMIT
    if status == 529 or error_type == "overloaded_error":
        return ErrorKind.OVERLOADED
    if status >= 500:
        return ErrorKind.SERVER_ERROR
    if status in (401, 403):
        return ErrorKind.AUTHENTICATION
    if status == 408:
        return ErrorKind.TIMEOUT
    if status == 404 and assistant_error == "model_not_found":
        return ErrorKind.MODEL_NOT_FOUND
    return ErrorKind.BAD_REQUEST


def _result_text(data: Mapping[str, Any]) -> str:
    errors = data.get("errors")
    if isinstance(errors, list):
        texts = [e.strip() for e in errors if isinstance(e, str) and e.strip()]
        if texts:
            return "; ".join(texts)
    result = data.get("result")
    if isinstance(result, str) and result.strip():
        return result.strip()
    subtype = data.get("subtype")
    return f"the CLI reported an error ({subtype})" if subtype else "the CLI reported an error"


def error_from_exception(
    exc: Exception, *, assistant_error: str | None, stderr: Collection[str]
) -> AgentRunError:
    """Map an SDK exception (``ResultError`` included) raised while reading the run.

    Args:
        exc: what the SDK raised.
        assistant_error: as for :func:`error_from_result`.
        stderr: the CLI's last stderr lines, quoted when the process failed.
    """
    from claude_agent_sdk import ProcessError, ResultError

    if isinstance(exc, ResultError):
        return error_from_result(exc.data, assistant_error=assistant_error)
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ProcessError) and stderr:
        detail += " | stderr: " + " / ".join(stderr)
    return AgentRunError(ErrorKind.RUNTIME, detail)


def result_fields(result: Any) -> dict[str, Any]:
    """The fields of a ``ResultMessage`` that :func:`error_from_result` reads."""
    return {
        "subtype": result.subtype,
        "terminal_reason": result.terminal_reason,
        "api_error_status": result.api_error_status,
        "errors": result.errors,
        "result": result.result,
    }
