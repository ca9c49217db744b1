"""The store's own roles on PostgreSQL: who records, who steers on evidence, who administers.

``agentmend store grant`` makes three group roles (``NOLOGIN``) and makes login roles members:

- ``agentmend_worker`` records runs, reads releases and takes team locks: it reads every table
  and writes only the run tables (and their rollups, the receivers' counts, quarantined rows);
- ``agentmend_controller`` (the fleet checker, processes that apply changes or follow releases)
  is a worker that may also judge (issues, detector state), apply and record changes, publish
  canaries and settle rollouts on their evidence;
- ``agentmend_admin`` owns the tables: it alone promotes, pauses or aborts by hand, publishes a
  stable release, acknowledges audit breaks, approves test changes, changes the trusted
  receivers, migrates the schema (``agentmend store migrate``) and prunes by the retention
  policy.

The privileges are the server's: table rights by ``GRANT``, and where a controller may change a
table only in some ways (a rollout settled by its evidence, not by hand; the heads moved only as
a rollout says), triggers owned by the administrator role check each row the non-administrator
writes. The rules live on the tables rather than behind functions a controller calls, so every
statement, agentmend's or a hand-written one, passes through them, and the settlement code stays
one path on both backends. Each audit row records the role that wrote it, as the server knows it
(``session_user``), whatever the client sends.

Roles belong to the server, not to one database: two stores on one server share them (and
their administrators). Team isolation holds only between teams whose processes connect as
different login roles to different stores; one store's teams share its roles.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agentmend.infrastructure.errors import InvalidArgument, StoreError
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.copying import COMPONENTS
from agentmend.infrastructure.store.sql import StoreConnection
from agentmend.infrastructure.structured_logger import get_logger

__all__ = [
    "ADMIN_ROLE",
    "CONTROLLER_ROLE",
    "ROLES",
    "TABLE_RIGHTS",
    "WORKER_ROLE",
    "GrantReport",
    "grant_roles",
    "has_roles",
    "members_of",
    "migrate_store",
]

log = get_logger(__name__)

WORKER_ROLE = "agentmend_worker"
CONTROLLER_ROLE = "agentmend_controller"
ADMIN_ROLE = "agentmend_admin"
ROLES: Mapping[str, str] = {
    "worker": WORKER_ROLE,
    "controller": CONTROLLER_ROLE,
    "admin": ADMIN_ROLE,
}
"""The kinds ``store grant`` takes, and the group role each one joins."""

_RECORD = "INSERT, UPDATE"
_WRITE = "INSERT, UPDATE, DELETE"

# Every table of a store and what each role may write there beyond reading every table:
# (worker, controller). The controller is also a member of the worker role. A table missing
# here is refused by ``grant_roles`` (tests check that every migrated table is listed).
TABLE_RIGHTS: Mapping[str, tuple[str, str]] = {
    "schema_versions": ("", ""),
    # recording runs
    "executions": ("INSERT", ""),
    "baseline_epochs": (_RECORD, ""),
    "baseline_segments": (_RECORD, ""),
    "run_series": (_RECORD, ""),
    "run_totals": (_RECORD, ""),
    "run_rollups": (_RECORD, ""),
    "execution_totals": (_RECORD, ""),
    "baseline_runs": (_WRITE, ""),
    "run_fold": ("UPDATE", ""),  # the fold's cursor (taken FOR UPDATE, moved)
    "quarantined_rows": ("INSERT", ""),
    "telemetry_receivers": (_RECORD, ""),
    "teams": ("INSERT", "UPDATE"),
    "team_roots": ("INSERT", "UPDATE"),
    "decisions": ("INSERT", ""),
    # judging
    "monitoring_issues": ("", _WRITE),
    "monitoring_issue_claims": ("", _WRITE),
    "monitoring_detector_state": ("", _WRITE),
    "detector_series": ("", _WRITE),
    "detection_settings": ("", _RECORD),
    "fleet_checker": ("", _WRITE),
    "cycle_requests": ("", _RECORD),
    # changing agents
    "changes": ("", _RECORD),
    "change_files": ("", _RECORD),
    "leases": ("", _RECORD),
    "lease_changes": ("", _WRITE),
    "change_watches": ("", _WRITE),
    "plans": ("", _RECORD),  # a trigger keeps test approval to the administrator role
    # releases: content is immutable; heads and rollouts are guarded by triggers
    "release_blobs": ("", "INSERT"),
    "releases": ("", "INSERT"),
    "release_files": ("", "INSERT"),
    "release_heads": ("", _RECORD),
    "rollouts": ("", _RECORD),
    "rollout_secrets": ("", "INSERT"),
    "trusted_receivers": ("", ""),  # the administrator role's: whose labelled runs count
    # the audit: appended only (acknowledgements are the administrator role's, by trigger)
    "audit_log": ("", "INSERT"),
    "audit_head_events": ("", "INSERT"),
    "audit_counter": ("", "UPDATE"),
}

# the tests that settle a rollout on its evidence (``decided_by``); anything else is by hand
_EVIDENCE_TESTS = "'failure_guard', 'slowness_guard', 'two_sample', 'limits', 'evidence'"
# audit rows only an administrator role may append
_ADMIN_AUDIT_ROWS = (
    "'audit_break_acknowledged', 'code_plan_tests_approved', 'rollout_paused', 'rollout_resumed'"
)


def _refuse(what: str, *values: str) -> str:
    """A plpgsql statement refusing ``what`` (``%`` in it takes each of ``values``)."""
    arguments = "".join(", " + v for v in values)
    return (
        f"RAISE EXCEPTION 'only an agentmend administrator role may {what}'{arguments}"
        " USING ERRCODE = 'insufficient_privilege'"
    )


# Each a whole statement (plpgsql bodies hold semicolons, so they are not migration scripts).
_GUARDS: tuple[str, ...] = (
    f"""CREATE OR REPLACE FUNCTION agentmend_is_admin() RETURNS boolean
    LANGUAGE sql STABLE AS $$ SELECT pg_has_role(session_user, '{ADMIN_ROLE}', 'MEMBER') $$""",
    f"""CREATE OR REPLACE FUNCTION agentmend_guard_audit() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF agentmend_is_admin() THEN
            -- an administrator copying a store keeps each row's role
            NEW.db_role := coalesce(NEW.db_role, session_user);
            RETURN NEW;
        END IF;
        NEW.db_role := session_user;
        IF NEW.edit_type IN ({_ADMIN_AUDIT_ROWS}) THEN
            {_refuse("record an audit row of kind %", "NEW.edit_type")};
        END IF;
        RETURN NEW;
    END $$""",
    f"""CREATE OR REPLACE FUNCTION agentmend_guard_rollouts() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF agentmend_is_admin() THEN
            RETURN NEW;
        END IF;
        IF TG_OP = 'INSERT' THEN
            IF NEW.state <> 'canary' THEN
                {_refuse("start a rollout in any state but canary")};
            END IF;
            RETURN NEW;
        END IF;
        IF (NEW.rollout_id, NEW.team_id, NEW.canary, NEW.stable, NEW.share, NEW.claimed_fix,
            NEW.limits, NEW.started_at, NEW.lease_id)
           IS DISTINCT FROM (OLD.rollout_id, OLD.team_id, OLD.canary, OLD.stable, OLD.share,
            OLD.claimed_fix, OLD.limits, OLD.started_at, OLD.lease_id) THEN
            {_refuse("change the terms of a rollout")};
        END IF;
        IF OLD.state = 'canary' AND NEW.state = 'canary' THEN
            RETURN NEW;
        END IF;
        IF OLD.state = 'canary' AND NEW.state IN ('promoted', 'rolled_back')
           AND (NEW.evidence::jsonb ->> 'decided_by') IN ({_EVIDENCE_TESTS}) THEN
            RETURN NEW;
        END IF;
        {_refuse("promote, pause, resume or roll back a rollout by hand")};
    END $$""",
    f"""CREATE OR REPLACE FUNCTION agentmend_guard_heads() RETURNS trigger
    LANGUAGE plpgsql AS $$
    DECLARE
        started rollouts%ROWTYPE;
        ended rollouts%ROWTYPE;
    BEGIN
        IF agentmend_is_admin() THEN
            RETURN NEW;
        END IF;
        -- agentmend writes the heads with INSERT ... ON CONFLICT: the row a team has already
        -- is judged as an update (this trigger fires again then); a team's first heads name
        -- its first stable release, the administrator role's to publish
        IF TG_OP = 'INSERT' THEN
            IF EXISTS (SELECT 1 FROM release_heads WHERE team_id = NEW.team_id) THEN
                RETURN NEW;
            END IF;
            {_refuse("publish a stable release or point the workers at releases by hand")};
        END IF;
        -- a canary started: the heads name a rollout serving it, on the stable as it was
        IF NEW.rollout_id IS NOT NULL THEN
            SELECT * INTO started FROM rollouts WHERE rollout_id = NEW.rollout_id;
            IF FOUND AND started.state = 'canary' AND NEW.canary = started.canary
               AND NEW.share = started.share AND NEW.stable IS NOT DISTINCT FROM started.stable
               AND OLD.stable IS NOT DISTINCT FROM NEW.stable THEN
                RETURN NEW;
            END IF;
        -- a rollout settled on its evidence: its canary becomes stable, or the stable stays
        ELSIF OLD.rollout_id IS NOT NULL AND NEW.canary IS NULL THEN
            SELECT * INTO ended FROM rollouts WHERE rollout_id = OLD.rollout_id;
            IF FOUND AND ((ended.state = 'promoted' AND NEW.stable = ended.canary)
                          OR (ended.state = 'rolled_back' AND NEW.stable = OLD.stable)) THEN
                RETURN NEW;
            END IF;
        END IF;
        {_refuse("publish a stable release or point the workers at releases by hand")};
    END $$""",
    f"""CREATE OR REPLACE FUNCTION agentmend_guard_plans() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT agentmend_is_admin()
           AND (NEW.payload::jsonb ->> 'tests_approved_by') IS NOT NULL
           AND (TG_OP = 'INSERT' OR (NEW.payload::jsonb ->> 'tests_approved_by')
                IS DISTINCT FROM (OLD.payload::jsonb ->> 'tests_approved_by')) THEN
            {_refuse("approve the test changes of a plan")};
        END IF;
        RETURN NEW;
    END $$""",
)
# (trigger, table, events, function)
_TRIGGERS = (
    ("agentmend_guard_audit", "audit_log", "INSERT", "agentmend_guard_audit"),
    ("agentmend_guard_rollouts", "rollouts", "UPDATE OR INSERT", "agentmend_guard_rollouts"),
    ("agentmend_guard_heads", "release_heads", "UPDATE OR INSERT", "agentmend_guard_heads"),
    ("agentmend_guard_plans", "plans", "UPDATE OR INSERT", "agentmend_guard_plans"),
)
_FUNCTIONS = (
    "agentmend_is_admin()",
    "agentmend_guard_audit()",
    "agentmend_guard_rollouts()",
    "agentmend_guard_heads()",
    "agentmend_guard_plans()",
)

# a login role's name as ``store grant`` accepts it (quoted in every statement anyway)
_LOGIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,62}")


@dataclass(frozen=True, slots=True)
class GrantReport:
    """What ``grant_roles`` did: the group roles it made, the members it added, the tables."""

    created: tuple[str, ...]
    members: Mapping[str, tuple[str, ...]]
    tables: int
    migrated: tuple[tuple[str, int, int], ...]


def migrate_store(store: Store) -> tuple[tuple[str, int, int], ...]:
    """Bring every component's tables to this agentmend's schema: the administrator's step.

    On a store with agentmend's roles the new tables are then given to the administrator
    role and granted as the others are. Returns ``(component, from, to)`` for each component
    that moved.

    Raises:
        SchemaBehind: this connection may not change the schema (not an administrator role).
        StoreError: a migration failed (that component stays at its last whole version).
    """
    moved = []
    for component, migrations in COMPONENTS:
        before = store.schema_version(component)
        store.migrate(component, migrations)
        if before != len(migrations):
            moved.append((component, before, len(migrations)))
    if store.backend == "postgresql" and has_roles(store):
        with store.transaction() as conn:
            store.lift_timeouts()
            _apply_rights(conn)
    log.info("store_migrated", store=store.display, moved=len(moved))
    return tuple(moved)


def has_roles(store: Store) -> bool:
    """Whether ``store grant`` gave this store's tables to the administrator role."""
    if store.backend != "postgresql":
        return False
    row = (
        store.connection()
        .execute(
            "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass(?)",
            ("schema_versions",),
        )
        .fetchone()
    )
    return row is not None and row[0] == ADMIN_ROLE


def grant_roles(
    store: Store,
    *,
    workers: Iterable[str] = (),
    controllers: Iterable[str] = (),
    admins: Iterable[str] = (),
) -> GrantReport:
    """Make the store's roles, give them their rights and add the named login roles.

    Run by the database's owner (or a superuser) once, and again to add members: it migrates
    the schema first, creates the group roles that are missing, gives every table to
    ``agentmend_admin``, grants the others what :data:`TABLE_RIGHTS` lists, installs the
    guards, and makes the granting role an administrator too. All in one transaction: a
    failure leaves the server as it was.

    Raises:
        InvalidArgument: not a PostgreSQL store, or a login role that is not a valid name or
            does not exist on the server (create it first: ``CREATE ROLE name LOGIN PASSWORD
            ...``); nothing is changed.
        StoreError: the granting role may not create roles or change the tables' owner.
    """
    if store.backend != "postgresql":
        raise InvalidArgument(
            "store", store.display, "roles exist only on PostgreSQL (SQLite has none)"
        )
    wanted = {"worker": tuple(workers), "controller": tuple(controllers), "admin": tuple(admins)}
    for names in wanted.values():
        for name in names:
            if not _LOGIN_NAME.fullmatch(name):
                raise InvalidArgument("login role", name, "is not a role name agentmend accepts")
    migrated = migrate_store(store)
    with store.transaction() as conn:
        store.lift_timeouts()
        existing = {
            str(r[0])
            for r in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(?)", (list(ROLES.values()),)
            ).fetchall()
        }
        for kind, names in wanted.items():
            for name in names:
                row = conn.execute(
                    "SELECT rolcanlogin FROM pg_roles WHERE rolname = ?", (name,)
                ).fetchone()
                if row is None:
                    raise InvalidArgument(
                        f"{kind} login role",
                        name,
                        "does not exist on the server: create it first"
                        f" (CREATE ROLE {_quote(name)} LOGIN PASSWORD '...')",
                    )
        created = tuple(role for role in ROLES.values() if role not in existing)
        for role in created:
            conn.execute(f"CREATE ROLE {role} NOLOGIN")
        conn.execute(f"GRANT {WORKER_ROLE} TO {CONTROLLER_ROLE}")
        superuser = conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        if not (superuser and superuser[0]):
            conn.execute(f"GRANT {ADMIN_ROLE} TO CURRENT_USER")
        tables = _apply_rights(conn)
        for kind, names in wanted.items():
            for name in names:
                conn.execute(f"GRANT {ROLES[kind]} TO {_quote(name)}")
    log.info(
        "store_roles_granted",
        store=store.display,
        created=created,
        members={k: len(v) for k, v in wanted.items()},
    )
    return GrantReport(created, wanted, tables, migrated)


def _apply_rights(conn: StoreConnection) -> int:
    """Give every table to the administrator role, grant the others their rights, install the
    guards; inside the caller's transaction. Returns how many tables it covered."""
    execute = conn.execute
    schema = str(execute("SELECT current_schema()").fetchone()[0])
    present = [
        str(r[0])
        for r in execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    ]
    unknown = sorted(t for t in present if t not in TABLE_RIGHTS)
    if unknown:
        raise StoreError(
            f"the store holds tables agentmend has no rights for ({', '.join(unknown[:5])}): "
            "upgrade agentmend, or keep other tables in another schema"
        )
    for table in present:
        worker, controller = TABLE_RIGHTS[table]
        execute(f"ALTER TABLE {table} OWNER TO {ADMIN_ROLE}")
        execute(f"REVOKE ALL ON {table} FROM PUBLIC")
        execute(f"GRANT SELECT ON {table} TO {WORKER_ROLE}")
        if worker:
            execute(f"GRANT {worker} ON {table} TO {WORKER_ROLE}")
        if controller:
            execute(f"GRANT {controller} ON {table} TO {CONTROLLER_ROLE}")
    execute(f"REVOKE CREATE ON SCHEMA {_quote(schema)} FROM PUBLIC")
    execute(f"GRANT USAGE ON SCHEMA {_quote(schema)} TO {WORKER_ROLE}")
    execute(f"GRANT USAGE, CREATE ON SCHEMA {_quote(schema)} TO {ADMIN_ROLE}")
    execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {_quote(schema)} TO {WORKER_ROLE}")
    # the audit's ids are set past rows a killed writer took (``setval``)
    execute(f"GRANT UPDATE ON ALL SEQUENCES IN SCHEMA {_quote(schema)} TO {CONTROLLER_ROLE}")
    for statement in _GUARDS:
        execute(statement)
    for function in _FUNCTIONS:
        execute(f"ALTER FUNCTION {function} OWNER TO {ADMIN_ROLE}")
    for trigger, table, events, function in _TRIGGERS:
        execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
        execute(
            f"CREATE TRIGGER {trigger} BEFORE {events} ON {table}"
            f" FOR EACH ROW EXECUTE FUNCTION {function}()"
        )
    return len(present)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def members_of(store: Store) -> dict[str, list[str]]:
    """The login roles in each of the store's roles (for ``store grant``'s answer)."""
    found: dict[str, list[str]] = {kind: [] for kind in ROLES}
    rows = (
        store.connection()
        .execute(
            "SELECT g.rolname, m.rolname FROM pg_auth_members a"
            " JOIN pg_roles g ON g.oid = a.roleid JOIN pg_roles m ON m.oid = a.member"
            " WHERE g.rolname = ANY(?) AND m.rolcanlogin ORDER BY m.rolname",
            (list(ROLES.values()),),
        )
        .fetchall()
    )
    kinds = {role: kind for kind, role in ROLES.items()}
    for group, member in rows:
        found[kinds[str(group)]].append(str(member))
    return found
