"""The store's PostgreSQL roles, enforced by the server: each test connects as a login role with
its password (SCRAM) to a server of its own, so what passes or is refused is the server's rule,
not a principal the client declares."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from cli_run import run_cli
from pg_server import PgServer, PgUnavailable
from services import unavailable

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.errors import InvalidArgument, SchemaBehind, StoreError
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.simulation import copy_team
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.roles import (
    TABLE_RIGHTS,
    grant_roles,
    has_roles,
    members_of,
    migrate_store,
)

pytestmark = pytest.mark.slow

SUPER_PASSWORD = "super-secret-pw"
LOGINS = {"fleet_worker": "worker-pw", "fleet_checker": "checker-pw", "fleet_admin": "admin-pw"}
# what each login believes of itself: the store must not take the client's word for it
CLAIMS_ADMIN = Principal("mallory", "claims to be an administrator", frozenset({ADMIN}))
OPS = Principal("ops", "Operator", frozenset({ADMIN}))


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    try:
        pg = PgServer(password=SUPER_PASSWORD)
    except PgUnavailable as exc:
        unavailable(str(exc))
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            for login, password in LOGINS.items():
                conn.execute(f"CREATE ROLE {login} LOGIN PASSWORD '{password}'")
        yield pg
    finally:
        pg.stop()


def _as(pg: PgServer, db_url: str, login: str) -> str:
    """``db_url``'s database, as ``login`` with its password."""
    dbname = db_url.rsplit("/", 1)[1]
    return f"postgresql://{login}:{LOGINS[login]}@127.0.0.1:{pg.port}/{dbname}"


@pytest.fixture
def granted(server: PgServer, tmp_path: Path) -> str:
    """A fresh store with the roles granted: worker, controller and admin logins."""
    url = server.create_database()
    with Store(url, files_dir=tmp_path / "files") as store:
        grant_roles(
            store,
            workers=["fleet_worker"],
            controllers=["fleet_checker"],
            admins=["fleet_admin"],
        )
    return url


def test_every_table_a_store_holds_has_its_rights_listed(server: PgServer, tmp_path: Path) -> None:
    with Store(server.create_database(), files_dir=tmp_path) as store:
        migrate_store(store)
        tables = {
            str(r[0])
            for r in store.connection()
            .execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            .fetchall()
        }
    assert tables == set(TABLE_RIGHTS)


def test_a_wrong_password_is_refused(server: PgServer, granted: str, tmp_path: Path) -> None:
    wrong = _as(server, granted, "fleet_worker").replace("worker-pw", "guessed")
    with pytest.raises(StoreError, match="password authentication failed") as refused:
        Store(wrong, files_dir=tmp_path)
    assert "guessed" not in str(refused.value)


def test_grant_makes_members_and_refuses_unknown_logins_changing_nothing(
    server: PgServer, granted: str, tmp_path: Path
) -> None:
    with Store(granted, files_dir=tmp_path) as store:
        assert has_roles(store)
        assert members_of(store) == {
            "worker": ["fleet_worker"],
            "controller": ["fleet_checker"],
            "admin": ["fleet_admin"],
        }
        with pytest.raises(InvalidArgument, match=r"does not exist.*nobody_here"):
            grant_roles(store, workers=["fleet_admin"], controllers=["nobody_here"])
        # all or nothing: the valid login named beside it did not join
        assert members_of(store)["worker"] == ["fleet_worker"]
        with pytest.raises(InvalidArgument, match="not a role name"):
            grant_roles(store, workers=['x"; DROP TABLE executions; --'])


def test_a_worker_records_runs_and_reads_releases_but_changes_nothing_else(
    server: PgServer, granted: str, tmp_path: Path
) -> None:
    team = copy_team(tmp_path / "team")
    with Store(granted, files_dir=tmp_path / "files") as store:
        ReleaseLog(store, "t1", audit=AuditLog(store)).publish_directory(team, by=OPS)
    from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor

    with Store(_as(server, granted, "fleet_worker"), files_dir=tmp_path / "files") as store:
        with PerformanceMonitor(store) as monitor:
            for i in range(5):
                monitor.record("research-agent", success=i % 2 == 0, duration_ms=10.0 + i)
        assert store.connection().execute("SELECT count(*) FROM executions").fetchone()[0] == 5
        log = ReleaseLog(store, "t1", audit=AuditLog(store))
        assert log.heads().stable == 1  # reads what to serve
        with pytest.raises(StoreError, match=r"permission denied.*store grant"):
            log.publish_directory(team, by=CLAIMS_ADMIN)
        with pytest.raises(StoreError, match="permission denied"):
            store.connection().execute("DELETE FROM audit_log")
        # a worker's workspace opens (the team's baseline is a controller's to record)
        from agentmend.faces.workspace import Workspace
        from agentmend.infrastructure.settings import Settings

        (tmp_path / "ws").mkdir()
        settings = Settings(store_url=_as(server, granted, "fleet_worker"))
        Workspace.open(tmp_path / "ws", settings=settings).close()
        # a component this store does not have yet: the worker may not make it
        with pytest.raises(SchemaBehind, match="agentmend store migrate") as behind:
            store.migrate("newer_component", ["CREATE TABLE newer_table (x INTEGER)"])
        assert "\n" not in str(behind.value)
        assert "worker-pw" not in str(behind.value)


def _canary(server: PgServer, url: str, tmp_path: Path) -> tuple[int, int]:
    """A stable release by the administrator, a canary published and started by the checker."""
    team = copy_team(tmp_path / "team")
    with Store(_as(server, url, "fleet_admin"), files_dir=tmp_path / "files") as store:
        stable = ReleaseLog(store, "t1", audit=AuditLog(store)).publish_directory(team, by=OPS)
    (team / "research-agent.md").write_text(
        (team / "research-agent.md").read_text() + "\nCite every source.\n"
    )
    checker = Principal.fleet_checker("t1")
    with Store(_as(server, url, "fleet_checker"), files_dir=tmp_path / "files") as store:
        log = ReleaseLog(store, "t1", audit=AuditLog(store))
        canary = log.publish_directory(team, by=checker)
        Rollouts(log).start(canary.version, by=checker)
    return stable.version, canary.version


def test_a_controller_settles_on_evidence_but_never_by_hand(
    server: PgServer, granted: str, tmp_path: Path
) -> None:
    stable, canary = _canary(server, granted, tmp_path)
    with Store(_as(server, granted, "fleet_checker"), files_dir=tmp_path / "files") as store:
        log = ReleaseLog(store, "t1", audit=AuditLog(store))
        rollouts = Rollouts(log)
        # the client says administrator; the server says controller
        for steer in (rollouts.promote, rollouts.abort):
            with pytest.raises(StoreError, match="only an agentmend administrator role"):
                steer(canary, by=CLAIMS_ADMIN)
        with pytest.raises(StoreError, match="only an agentmend administrator role"):
            rollouts.pause(canary, by=CLAIMS_ADMIN)
        # the heads by hand, bypassing agentmend: the server refuses it too
        with pytest.raises(StoreError, match="point the workers at releases by hand"):
            store.connection().execute(
                "UPDATE release_heads SET stable = ?, canary = NULL, rollout_id = NULL",
                (canary,),
            )
        assert (log.heads().stable, log.heads().canary) == (stable, canary)
        # whose telemetry counts is the administrator role's to say
        from agentmend.infrastructure.releases.attribution import set_trusted

        with pytest.raises(StoreError, match="permission denied for table trusted_receivers"):
            set_trusted(store, AuditLog(store), "my-gateway", by=CLAIMS_ADMIN)
        # settled on its evidence, as the checker does
        record = rollouts.active()
        assert record is not None
        rollouts._settle(record, "rolled_back", "worse", {}, by=None, decided_by="failure_guard")
        assert (log.heads().stable, log.heads().canary) == (stable, None)
        assert rollouts.get(record.rollout_id).state == "rolled_back"


def test_an_administrator_login_steers_by_hand(
    server: PgServer, granted: str, tmp_path: Path
) -> None:
    _, canary = _canary(server, granted, tmp_path)
    with Store(_as(server, granted, "fleet_admin"), files_dir=tmp_path / "files") as store:
        log = ReleaseLog(store, "t1", audit=AuditLog(store))
        Rollouts(log).promote(canary, by=OPS)
        assert log.heads().stable == canary


def test_each_audit_row_names_the_role_the_server_saw(
    server: PgServer, granted: str, tmp_path: Path
) -> None:
    _canary(server, granted, tmp_path)
    with Store(_as(server, granted, "fleet_checker"), files_dir=tmp_path / "files") as store:
        roles = {e.edit_type: e.db_role for e in AuditLog(store).entries(limit=20)}
    assert roles["release_published"] in {"fleet_admin", "fleet_checker"}
    assert roles["rollout_started"] == "fleet_checker"
    with psycopg.connect(_as(server, granted, "fleet_checker"), autocommit=True) as raw:
        forged = raw.execute(
            "INSERT INTO audit_log (timestamp, agent_name, edit_type, user_id, prev_hash,"
            " row_hash, keyed, batch, db_role) VALUES ('2026-01-01', 'x', 'note', 'u', 'p', 'h',"
            " 0, 0, 'fleet_admin') RETURNING db_role"
        ).fetchone()
        assert forged == ("fleet_checker",)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="test changes of a plan"):
            raw.execute(
                "INSERT INTO plans (plan_id, created, status, description, payload, updated)"
                " VALUES ('p1', 'now', 'planned', 'd', '{\"tests_approved_by\": \"me\"}', 'now')"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="audit row of kind"):
            raw.execute(
                "INSERT INTO audit_log (timestamp, agent_name, edit_type, user_id, prev_hash,"
                " row_hash, keyed, batch) VALUES ('2026-01-01', '(audit)',"
                " 'audit_break_acknowledged', 'u', 'q', 'h', 0, 0)"
            )


def test_store_grant_and_migrate_on_the_command_line(
    server: PgServer, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    url = server.create_database()
    code, out, err = run_cli(
        capsys, "store", "grant", url, "--worker", "fleet_worker",
        "--controller", "fleet_checker", "--admin", "fleet_admin", "--json",
    )  # fmt: skip
    assert code == 0, err
    answer = json.loads(out)
    assert answer["members"]["controller"] == ["fleet_checker"]
    assert SUPER_PASSWORD not in out + err
    # the administrator login migrates (nothing is behind: every component is current)
    code, out, err = run_cli(capsys, "store", "migrate", _as(server, url, "fleet_admin"))
    assert code == 0, err
    assert "admin-pw" not in out + err
    assert "up to date" in out
    # a worker may not grant, in one line, without its password
    code, out, err = run_cli(
        capsys, "store", "grant", _as(server, url, "fleet_worker"), "--worker", "fleet_worker"
    )
    assert code != 0
    assert "worker-pw" not in out + err
    assert len(err.strip().splitlines()) == 1, err


def test_a_follower_on_a_worker_role_serves_and_leaves_the_rollout_to_controllers(
    server: PgServer, granted: str, tmp_path: Path
) -> None:
    from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
    from agentmend.infrastructure.releases.follower import ReleaseFollower

    stable, canary = _canary(server, granted, tmp_path)
    with Store(_as(server, granted, "fleet_worker"), files_dir=tmp_path / "files") as store:
        log = ReleaseLog(store, "t1", audit=AuditLog(store))
        follower = ReleaseFollower(log, tmp_path / "worker")
        assert follower.poll().connected
        with PerformanceMonitor(store) as monitor:
            for i in range(40):
                monitor.record("research-agent", success=i % 3 > 0, duration_ms=20.0)
        status = follower.poll()  # the step is refused to this role: it keeps serving
        assert status.connected, status.problem
        assert not follower.advance_rollouts
        assert (log.heads().stable, log.heads().canary) == (stable, canary)
        assert (follower.team_dir / "research-agent.md").exists()


def test_the_fleet_checker_judges_on_a_controller_role_what_workers_record(
    server: PgServer, granted: str, tmp_path: Path
) -> None:
    import random

    from agentmend.infrastructure.detection.checker_seat import CheckerSeat
    from agentmend.infrastructure.detection.detector import IssueDetector
    from agentmend.infrastructure.detection.issue_ledger import IssueLedger
    from agentmend.infrastructure.models import IssueReport
    from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
    from agentmend.loop.fleet_checker import FleetChecker

    rng = random.Random(7)
    files = tmp_path / "files"
    with (
        Store(_as(server, granted, "fleet_worker"), files_dir=files) as worker_store,
        Store(_as(server, granted, "fleet_checker"), files_dir=files) as checker_store,
        PerformanceMonitor(worker_store, baseline_n=60) as worker,
        PerformanceMonitor(checker_store, baseline_n=60) as checker_monitor,
    ):
        seen: list[IssueReport] = []
        checker = FleetChecker(
            CheckerSeat(checker_store, "team", principal="checker", term_s=30),
            checker_monitor,
            lambda m: IssueDetector(baseline_n=60, monitor=m, ledger=IssueLedger(checker_store)),
            on_issue=seen.append,
            interval_s=1,
        )
        for _ in range(80):
            worker.record("writer", success=rng.random() < 0.97, duration_ms=100.0)
        worker.flush()
        assert checker.step().judging
        for _ in range(150):
            worker.record("writer", success=rng.random() < 0.5, duration_ms=100.0)
        worker.flush()
        checker.step()
        assert [(i.agent_name, i.error_type) for i in seen] == [("writer", "low_success_rate")]
        # a worker role may read the issue, not write one
        assert [i.issue_id for i in IssueLedger(worker_store).issues(active=True)] == [
            seen[0].issue_id
        ]
        with pytest.raises(StoreError, match="permission denied"):
            worker_store.connection().execute("DELETE FROM monitoring_issues")


def test_a_worker_on_an_older_schema_refuses_in_one_line_until_an_admin_migrates(
    server: PgServer,
    granted: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    restore_logging: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the store as an older agentmend left it: the audit's newest migration not yet run
    with psycopg.connect(granted, autocommit=True) as raw:
        raw.execute("ALTER TABLE audit_log DROP COLUMN db_role")
        raw.execute("UPDATE schema_versions SET version = version - 1 WHERE component = 'audit'")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("AGENTMEND_STORE_URL", _as(server, granted, "fleet_worker"))
    (tmp_path / "ws").mkdir()
    workspace = str(tmp_path / "ws")
    code, out, err = run_cli(capsys, "status", "--workspace", workspace)
    assert code == 3, out + err
    assert len(err.strip().splitlines()) == 1, err
    assert "agentmend store migrate" in err
    assert "worker-pw" not in out + err
    code, out, err = run_cli(capsys, "store", "migrate", _as(server, granted, "fleet_admin"))
    assert code == 0, err
    assert "audit: schema version" in out
    code, out, err = run_cli(capsys, "status", "--workspace", workspace)
    assert code == 0, out + err


async def test_a_controller_login_runs_a_whole_improvement_cycle_and_a_rollback(
    server: PgServer, granted: str, tmp_path: Path
) -> None:
    from loop_scenarios import faulty_issue

    from agentmend.infrastructure.models import ChangeStatus
    from agentmend.infrastructure.settings import Settings
    from agentmend.loop.meta_orchestrator import MetaOrchestrator

    settings = Settings(baseline_n=20, detection_mode="rules")
    with Store(_as(server, granted, "fleet_checker"), files_dir=tmp_path / "files") as store:
        orchestrator = MetaOrchestrator.offline_simulated(
            tmp_path / "team", seed=3, settings=settings, store=store
        )
        try:
            result = await orchestrator.run_improvement_cycle(await faulty_issue(orchestrator))
            assert result.status == "kept", result.summary()
            undone = orchestrator.rollback()
            assert undone is not None
            assert undone.status is ChangeStatus.ROLLED_BACK
            roles = {e.db_role for e in orchestrator.manager.audit.entries(limit=50)}
            assert roles == {"fleet_checker"}
        finally:
            orchestrator.close()
