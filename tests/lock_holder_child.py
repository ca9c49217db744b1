"""A process that takes a store lock and keeps it, for the lock-timeout fault tests.

    python tests/lock_holder_child.py MODE WORKSPACE

Opens the workspace (its store from ``AGENTMEND_STORE_URL`` or its own file), takes the lock
MODE names and prints ``HELD``, then waits inside it for a line (or the end) on stdin:

- ``transaction``: a store write transaction that has inserted the row
  ``schema_versions('frozen-holder')``, never committed while the test holds it stopped;
- ``audit``: an audited write transaction (the audit head's ``flock``, then the store's write
  lock) that has appended one audit row;
- ``team``: the team's guard (the team folder's ``flock``, then the store's team lock).

Then (the test resumed it with SIGCONT and wrote the line) it commits and prints ``RELEASED``,
or prints ``LOST`` and the error when the store refused (the server ended its session
meanwhile), and exits.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.protocol.team_registry import team_guard
from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.settings import load_settings


def main() -> None:
    mode, folder = sys.argv[1], Path(sys.argv[2])
    with Workspace.open(folder, settings=load_settings(), create=False) as workspace:
        try:
            if mode == "transaction":
                with workspace.store.transaction() as conn:
                    conn.execute(
                        "INSERT INTO schema_versions (component, version) VALUES (?, ?)",
                        ("frozen-holder", 1),
                    )
                    print("HELD", flush=True)
                    sys.stdin.readline()
            elif mode == "audit":
                with workspace.manager.audit.transaction() as txn:
                    txn.append(
                        agent_name="frozen-holder",
                        edit_type="note",
                        old_value=None,
                        new_value="never committed while stopped",
                        user_id="frozen-holder",
                    )
                    print("HELD", flush=True)
                    sys.stdin.readline()
            else:
                with team_guard(workspace.store, workspace.team_dir):
                    print("HELD", flush=True)
                    sys.stdin.readline()
        except StoreError as exc:
            print(f"LOST {exc}", flush=True)
            return
    print("RELEASED", flush=True)


if __name__ == "__main__":
    main()
