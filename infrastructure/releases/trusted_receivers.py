"""The receivers a store trusts: whose release-labelled runs may move a rollout.

Each OTLP receiver writes its own name into the runs it attributes to a release
(``received_by``); a rollout counts such a run only when that name is trusted. The trusted
names are the union of ``AGENTMEND_TRUSTED_RECEIVERS`` in the environment of the process that
judges (a worker, the fleet checker) and this table, which an administrator keeps with
``agentmend release trust NAME`` (``--remove``). The table is the store's, so every judging
process of the fleet reads the same list however it was started; each change is an audit row,
and on a PostgreSQL store with roles only the administrator role may write it.
"""

from __future__ import annotations

import re
import time

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.errors import InvalidArgument, PermissionRequired
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.releases.settlement import RELEASE_AGENT
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import has_table

__all__ = ["COMPONENT", "MIGRATIONS", "read_trusted", "set_trusted"]

COMPONENT = "trusted_receivers"
MIGRATIONS = [
    """
    CREATE TABLE trusted_receivers (
        name TEXT PRIMARY KEY,
        added_by TEXT NOT NULL,
        added_at REAL NOT NULL
    )
    """
]

# a receiver's name as `otel receive --name` takes it: printable, no spaces or commas (the
# environment's list is comma-separated), bounded
_NAME = re.compile(r"[A-Za-z0-9_.@:/+-]{1,128}")


def read_trusted(store: Store) -> frozenset[str]:
    """The names the store trusts (empty before any was added); a plain read, no lock."""
    conn = store.connection()
    if not has_table(conn, "trusted_receivers"):
        return frozenset()
    return frozenset(str(r[0]) for r in conn.execute("SELECT name FROM trusted_receivers"))


def set_trusted(
    store: Store, audit: AuditLog, name: str, *, by: Principal, trusted: bool = True
) -> bool:
    """Trust receiver ``name`` (or, ``trusted=False``, stop trusting it), audited.

    Returns False when nothing changed (already so).

    Raises:
        PermissionRequired: ``by`` is not an administrator; nothing is written.
        InvalidArgument: ``name`` is not a receiver name.
    """
    if not by.is_admin:
        verb = "trust" if trusted else "stop trusting"
        raise PermissionRequired(by.user_id, ADMIN, f"{verb} a telemetry receiver")
    if not _NAME.fullmatch(name):
        raise InvalidArgument(
            "receiver name", name, "must be 1-128 letters, digits or . _ @ : / + -"
        )
    store.migrate(COMPONENT, MIGRATIONS)
    with audit.transaction() as txn:
        if trusted:
            changed = txn.conn.execute(
                "INSERT INTO trusted_receivers (name, added_by, added_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (name, by.user_id, time.time()),
            ).rowcount
        else:
            changed = txn.conn.execute(
                "DELETE FROM trusted_receivers WHERE name = ?", (name,)
            ).rowcount
        if changed:
            txn.append(
                agent_name=RELEASE_AGENT,
                edit_type="receiver_trusted" if trusted else "receiver_distrusted",
                old_value=None,
                new_value=name,
                user_id=by.user_id,
                user_name=by.name,
            )
    return bool(changed)
