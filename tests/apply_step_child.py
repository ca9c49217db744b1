"""A child that applies one group of file changes and SIGKILLs itself at a chosen step of it.

``python apply_step_child.py STEP STORE FILES_DIR ROOT`` opens the store (recovery runs first),
arranges for the process to kill itself with SIGKILL when the apply reaches ``STEP``, prints
``READY`` and applies :data:`GROUP` under ``ROOT``. It never gets to print ``ACK``: each step
below is reached by every apply of a group like this one.

The steps, in the order an apply takes them (``agentmend.infrastructure.changes.protocol.steps``):

- ``in_intent``: inside the intent's transaction, before it commits;
- ``after_intent``: the intent committed, before the first backup;
- ``after_backup``: the backups written, before the first new file;
- ``between_writes``: the first new file written, before the second;
- ``before_applied``: every file written, inside the transaction that marks them APPLIED;
- ``before_head``: APPLIED committed, before the audit head file names its rows.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agentmend.infrastructure.changes.audit import log as audit_log  # noqa: E402
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager  # noqa: E402
from agentmend.infrastructure.changes.protocol import apply as apply_steps  # noqa: E402
from agentmend.infrastructure.changes.protocol.change_log import ChangeLog  # noqa: E402
from agentmend.infrastructure.files import confined  # noqa: E402
from agentmend.infrastructure.models import ChangeType, ImprovementAction  # noqa: E402
from agentmend.infrastructure.store.api import Store  # noqa: E402

STEPS = (
    "in_intent",
    "after_intent",
    "after_backup",
    "between_writes",
    "before_applied",
    "before_head",
)
OLD = {"agents/a.md": b"old a\n", "agents/b.md": b"old b\n", "agents/c.md": None}
NEW = {"agents/a.md": b"new a\n", "agents/b.md": b"new b\n", "agents/c.md": b"new c\n"}
GROUP = tuple(NEW.items())


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_on_call(owner: Any, name: str, nth: int = 1) -> None:
    """Replace ``owner.name`` by a function that kills the process on its ``nth`` call."""
    original: Callable[..., Any] = getattr(owner, name)
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth:
            _die()
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def arm(step: str) -> None:
    if step == "in_intent":
        _kill_on_call(ChangeLog, "insert_file_of_new")
    elif step == "after_intent":
        _kill_on_call(apply_steps, "backup")
    elif step == "after_backup":
        _kill_on_call(confined, "write_or_delete")
    elif step == "between_writes":
        _kill_on_call(confined, "write_or_delete", nth=2)
    elif step == "before_applied":
        _kill_on_call(ChangeLog, "set_status")
    elif step == "before_head":
        _kill_on_call(audit_log, "write_head")
    else:
        raise SystemExit(f"unknown step {step!r}")


def main(step: str, store_url: str, files_dir: str, root: str) -> None:
    from crash_child import quiet_logs

    quiet_logs()
    manager = ImprovementManager(store=Store(store_url, files_dir=files_dir))
    arm(step)
    print("READY", flush=True)
    action = ImprovementAction(
        target_agent="writer", action_type=ChangeType.PROMPT_MODIFICATION, confidence_score=0.9
    )
    manager.apply_group([(action, path, data) for path, data in GROUP], root=root)
    print("ACK", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
