"""The library logger: structlog comes in with the first event shown, and renders as before."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import io, sys
    from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
    from agentmend.infrastructure.structured_logger import configure_logging, get_logger

    log = get_logger("agentmend.tests")
    log.info("below_the_default_level", agent="a")
    print("after_import", "structlog" in sys.modules)
    out = io.StringIO()
    configure_logging("WARNING", stream=out)
    log.info("below_the_configured_level", agent="a")
    print("after_dropped_event", "structlog" in sys.modules, repr(out.getvalue()))
    log.warning("agent_failed", agent="research", runs_lost=5)
    print("after_shown_event", "structlog" in sys.modules)
    print("line", repr(out.getvalue()))
    """
)


def test_structlog_is_imported_by_the_first_event_shown_and_renders_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "after_import False"
    assert lines[1] == "after_dropped_event False ''"
    assert lines[2] == "after_shown_event True"
    shown = lines[3]
    assert re.search(r"\[warning\s*\] agent_failed\s+agent=research runs_lost=5\\n'$", shown)
    assert "below_the" not in shown
    # an event below the level reaches no handler, not even the last resort on stderr
    assert done.stderr == ""
