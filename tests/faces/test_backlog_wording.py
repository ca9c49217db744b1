"""Runs waiting for the writer are worded as lag; only a failed write is worded as a fault."""

from __future__ import annotations

from typing import Any

from agentmend.faces.mcp.results import status_text
from agentmend.faces.session.views import backlog_line


def test_the_session_words_lag_as_lag_and_a_failed_write_as_a_fault() -> None:
    assert backlog_line(0, None) is None
    lag = backlog_line(120, None)
    assert lag is not None
    assert lag.plain == "120 runs on their way to the store (the writer is catching up)"
    assert not lag.style
    fault = backlog_line(120, "OperationalError: disk I/O error")
    assert fault is not None
    assert fault.plain == (
        "120 runs not yet written to the store (kept, retried): OperationalError: disk I/O error"
    )


def test_the_mcp_status_words_them_alike() -> None:
    base: dict[str, Any] = {
        "workspace": "ws",
        "provider": "offline",
        "pendingPlans": [],
        "lastExecution": None,
    }
    lag = status_text({**base, "unwrittenRuns": 7, "storeWriteError": None}, [], None)
    assert "Runs on their way to the store: 7 (the writer is catching up)" in lag
    assert "not yet written" not in lag
    fault = status_text({**base, "unwrittenRuns": 7, "storeWriteError": "disk full"}, [], None)
    assert "Runs not yet written to the store: 7" in fault
    assert "last error: disk full" in fault
