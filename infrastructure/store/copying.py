"""Move a store's whole history to another store, on either backend (``agentmend store copy``).

Every component's tables are made on the target by the components' own migrations, then copied
row for row with their ids, in an order that keeps references valid. Text is copied as it is, so
audit rows keep their exact ids, hashes and timestamp text (a row's hash covers them). Each
generated-id sequence is then set past the source's (not past the largest id copied: rows cut
off the end of the audit log stay a visible gap), the target's audit head file is written for
its newest row, and the audit chain is verified on both sides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentmend.infrastructure.changes import cycle_requests, watch
from agentmend.infrastructure.changes.audit.head import write_head
from agentmend.infrastructure.changes.audit.log import _MIGRATIONS as AUDIT_MIGRATIONS
from agentmend.infrastructure.changes.audit.log import (
    AuditLog,
    ChainVerification,
    last_audit_id,
    note_audit_id,
)
from agentmend.infrastructure.changes.protocol import change_log, decisions, leases, team_registry
from agentmend.infrastructure.detection import checker_seat, issue_ledger, team_baseline
from agentmend.infrastructure.detection import series as detector_series
from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.files.atomic import locked_file
from agentmend.infrastructure.monitoring import (
    execution_rollup,
    execution_store,
    run_fold,
    run_series,
)
from agentmend.infrastructure.releases import attribution
from agentmend.infrastructure.releases import tables as release_tables
from agentmend.infrastructure.store import quarantine
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.sql import Backend, has_table, next_id, set_next_id
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.telemetry import receiver_counts

__all__ = ["COMPONENTS", "CopyReport", "copy_store"]

log = get_logger(__name__)

_CHUNK = 500

# (component, migrations) in the order the components make them
COMPONENTS: tuple[tuple[str, Sequence[str | Mapping[Backend, str]]], ...] = (
    ("teams", team_registry._MIGRATIONS),
    ("executions", execution_store._MIGRATIONS),
    (run_series.COMPONENT, run_series.MIGRATIONS),
    (execution_rollup.COMPONENT, execution_rollup.MIGRATIONS),
    (run_fold.COMPONENT, run_fold.MIGRATIONS),
    ("monitoring", issue_ledger._MIGRATIONS),
    (detector_series.COMPONENT, detector_series.MIGRATIONS),
    ("changes", change_log._CHANGE_MIGRATIONS),
    ("leases", leases._MIGRATIONS),
    ("plans", decisions._PLAN_MIGRATIONS),
    ("audit", AUDIT_MIGRATIONS),
    ("change_watches", watch._MIGRATIONS),
    (release_tables.COMPONENT, release_tables._MIGRATIONS),
    (receiver_counts.COMPONENT, receiver_counts.MIGRATIONS),
    (checker_seat.COMPONENT, checker_seat.MIGRATIONS),
    (cycle_requests.COMPONENT, cycle_requests.MIGRATIONS),
    (quarantine.COMPONENT, quarantine.MIGRATIONS),
    (team_baseline.COMPONENT, team_baseline.MIGRATIONS),
    (attribution.TRUST_COMPONENT, attribution.TRUST_MIGRATIONS),
)

# tables in an order that keeps references valid, with their generated id column (if any)
_TABLES: tuple[tuple[str, str | None], ...] = (
    ("teams", None),
    ("team_roots", None),
    ("executions", "id"),
    ("baseline_epochs", None),
    ("baseline_segments", None),
    ("run_series", None),
    ("run_totals", None),
    ("run_rollups", None),
    ("execution_totals", None),
    ("baseline_runs", None),
    ("monitoring_issues", None),
    ("monitoring_issue_claims", None),
    ("monitoring_detector_state", None),
    ("detector_series", None),
    ("changes", "seq"),
    ("change_files", None),
    ("leases", None),
    ("lease_changes", None),
    ("change_watches", None),
    ("release_blobs", None),
    ("releases", None),
    ("release_files", None),
    ("release_heads", None),
    ("rollouts", None),
    ("rollout_secrets", None),
    ("telemetry_receivers", None),
    ("fleet_checker", None),
    ("cycle_requests", None),
    ("quarantined_rows", "id"),
    ("detection_settings", None),
    ("trusted_receivers", None),
    ("plans", None),
    ("decisions", "id"),
    ("audit_log", "id"),
    ("audit_head_events", "id"),
)

# SQLite gives these ids from sqlite_sequence (AUTOINCREMENT); the others from max(id) + 1
_AUTOINCREMENT = frozenset({"changes", "decisions", "audit_log", "audit_head_events"})


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What was copied, and the audit chain as verified on each side afterwards."""

    rows: dict[str, int] = field(default_factory=dict)
    source_chain: ChainVerification | None = None
    target_chain: ChainVerification | None = None

    @property
    def ok(self) -> bool:
        return bool(self.source_chain) and bool(self.target_chain)


def copy_store(source: Store, target: Store, *, hmac_key: bytes | str | None = None) -> CopyReport:
    """Copy every table of ``source`` into the empty store ``target``; see the module docstring.

    Raises:
        StoreError: ``target`` already holds rows (nothing is copied then), or a statement
            failed (the table being copied is rolled back; the target is then partly filled
            and should be dropped).
    """
    for component, migrations in COMPONENTS:
        source.migrate(component, migrations)
        target.migrate(component, migrations)
    tconn = target.connection()
    for table, _ in _TABLES:
        if tconn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None:
            raise StoreError(f"{target.display} is not empty (table {table} has rows)")
    counts: dict[str, int] = {}
    sconn = source.connection()
    with source.snapshot():  # one state of the source for every table
        source.lift_timeouts()  # held open while the target is written, by design
        for table, id_column in _TABLES:
            if not has_table(sconn, table):
                continue
            counts[table] = _copy_table(sconn, target, table, id_column)
        # runs a PostgreSQL source has not folded into its rollups yet, in this snapshot:
        # the copied rollups plus these count every copied run (each copied run is rolled)
        tail = run_fold.unfolded(sconn) if "executions" in counts else []
        sequences = {
            table: last_audit_id(sconn)
            if table == "audit_log"
            else next_id(sconn, table, column) - 1
            for table, column in _TABLES
            if column is not None and table in counts
        }
    with target.transaction() as conn:
        run_fold.add_runs(conn, tail)
        for table, last in sequences.items():
            column = dict(_TABLES)[table] or "id"
            if target.backend == "sqlite" and table not in _AUTOINCREMENT:
                continue  # SQLite takes max(id) + 1 for these
            newest = conn.execute(f"SELECT COALESCE(MAX({column}), 0) FROM {table}").fetchone()
            set_next_id(conn, table, max(last, int(newest[0])), column)
            if table == "audit_log":
                note_audit_id(conn, max(last, int(newest[0])))
    _write_audit_head(target)
    report = CopyReport(
        counts,
        AuditLog(source, hmac_key=hmac_key).verify_chain(repair=False),
        AuditLog(target, hmac_key=hmac_key).verify_chain(repair=False),
    )
    log.info("store_copied", source=source.display, target=target.display, rows=counts)
    return report


def _copy_table(sconn: Any, target: Store, table: str, order: str | None) -> int:
    cursor = sconn.execute(f"SELECT * FROM {table} LIMIT 0")
    columns = [d[0] for d in cursor.description]
    cursor.fetchall()
    # a column one backend alone has (PostgreSQL's run positions) is the target's to fill
    into: Any = target.connection().execute(f"SELECT * FROM {table} LIMIT 0")
    held = {d[0] for d in into.description}
    into.fetchall()
    # and whether a run is rolled up is the target's too: every copied run is (see above)
    columns = [c for c in columns if c in held and c != "rolled"]
    names = ", ".join(columns)
    marks = ", ".join("?" * len(columns))
    insert = f"INSERT INTO {table} ({names}) VALUES ({marks})"
    rows = sconn.execute(
        f"SELECT {names} FROM {table}" + (f" ORDER BY {order}" if order else "")
    ).fetchall()
    with target.transaction() as conn:
        target.lift_timeouts()  # one table at a time, however large
        for start in range(0, len(rows), _CHUNK):
            conn.executemany(insert, [tuple(r) for r in rows[start : start + _CHUNK]])
    return len(rows)


def _write_audit_head(target: Store) -> None:
    newest = (
        target.connection()
        .execute("SELECT id, row_hash FROM audit_log ORDER BY id DESC LIMIT 1")
        .fetchone()
    )
    if newest is None:
        return
    head = target.local_file(".audit-head")
    with locked_file(head) as fd:
        write_head(fd, int(newest[0]), str(newest[1]))
