"""Retention prunes old runs and decisions in bounded batches, never what the loop still needs.

A real store written through the real monitor, change log, issue ledger and audit log; the rows
are then aged (their timestamps moved 100 days back) so the policy has something to prune. The
pruning tests run on both backends (a SQLite file, a PostgreSQL database of the test server);
the ``agentmend store`` test here on SQLite (its sizes on both backends are tested in
``test_store_usage.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog

from agentmend.faces.cli.app import main
from agentmend.faces.cli.common import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.protocol.change_log import ChangeLog
from agentmend.infrastructure.changes.protocol.decisions import record_decision
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.models import ChangeStatus, ChangeType, ImprovementAction
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.settings import load_settings
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.retention import (
    KEEP_NEWEST,
    RetentionPolicy,
    RetentionSweeper,
    prune,
)
from agentmend.infrastructure.store.usage import store_usage

_DAY = 86_400.0
_AGE = 100 * _DAY
_BASELINE_N = 50


class Stores:
    """The test's stores on one backend: ``new()`` names a fresh one, ``open()`` opens it (again;
    every handle is closed after the test). A PostgreSQL store's files (its audit head) live in
    one folder of the test, as on one host."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, first: str) -> None:
        self.request = request
        self.tmp = tmp_path
        self.first: str | None = first
        self.opened: list[Store] = []
        self.count = 0

    def new(self) -> str:
        if self.first is not None:
            location, self.first = self.first, None
            return location
        self.count += 1
        if self.request.node.callspec.params["store_url"] == "sqlite":
            return str(self.tmp / f"s{self.count}.db")
        server = self.request.getfixturevalue("pg_server")
        return str(server.create_database())

    def open(self, location: str) -> Store:
        store = Store(location, files_dir=self.tmp / "files")
        self.opened.append(store)
        return store


@pytest.fixture
def stores(request: pytest.FixtureRequest, tmp_path: Path, store_url: str) -> Iterator[Stores]:
    made = Stores(request, tmp_path, store_url)
    yield made
    for store in made.opened:
        store.close()


def _ids(store: Store, agent: str) -> list[int]:
    return [
        int(i)
        for (i,) in store.connection().execute(
            "SELECT id FROM executions WHERE agent = ? ORDER BY id", (agent,)
        )
    ]


def _age(store: Store, seconds: float) -> None:
    with store.transaction() as conn:
        # a second apart in id order, on whole seconds: a change's creation time (kept to the
        # microsecond) then falls exactly on the run it is dated by
        base = float(int(time.time() - seconds) - 10_000)
        conn.execute("UPDATE executions SET ts = ? + id", (base,))
        stamp = (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat()
        conn.execute("UPDATE decisions SET timestamp = ?", (stamp,))


def _record(monitor: PerformanceMonitor, agent: str, runs: int) -> None:
    for i in range(runs):
        monitor.record(agent, success=i % 5 != 0, duration_ms=10.0 + i, error=None)


def _history(store: Store) -> dict[str, list[int]]:
    """Old runs of four agents: ``a`` plain, ``b`` with a kept change, ``c`` with an old open
    issue, ``d`` with an old change still under verification; then a few new runs each."""
    with PerformanceMonitor(store, baseline_n=_BASELINE_N) as monitor:
        for agent in "abcd":
            _record(monitor, agent, 400)
        monitor.flush()
        monitor.start_new_baseline("b", label="kept")
        _record(monitor, "b", 400)
        monitor.flush()
        for i in range(30):
            record_decision(store, kind="analyze", agent_name="a", payload={"i": i})
    _age(store, _AGE)
    ledger = IssueLedger(store)
    issue, _ = ledger.open("c", "success_rate", detector="cusum", context="{}", hold_runs=10)
    log = ChangeLog(store)
    action = ImprovementAction(
        target_agent="d",
        action_type=ChangeType.PARAMETER_ADJUSTMENT,
        confidence_score=0.9,
        target_field="temperature",
        old_value=0.7,
        new_value=0.2,
    )
    with store.transaction() as conn:
        # the issue and the change date from the middle of the old runs
        middle = {
            agent: float(
                conn.execute(
                    "SELECT ts FROM executions WHERE agent = ? ORDER BY id LIMIT 1 OFFSET 200",
                    (agent,),
                ).fetchone()[0]
            )
            for agent in "cd"
        }
        conn.execute(
            "UPDATE monitoring_issues SET opened_ts = ? WHERE issue_id = ?",
            (middle["c"], issue.issue_id),
        )
    with store.transaction() as conn:
        log.insert(
            conn,
            change_id="change-d",
            action=action,
            status=ChangeStatus.APPLIED,
            applied_by="tester",
            session_id="s",
            created=datetime.fromtimestamp(middle["d"], UTC),
        )
    AuditLog(store).append(
        agent_name="d", edit_type="parameter", old_value=0.7, new_value=0.2, user_id="tester"
    )
    with PerformanceMonitor(store, baseline_n=_BASELINE_N) as monitor:
        for agent in "abcd":
            _record(monitor, agent, 5)
    return {agent: _ids(store, agent) for agent in "abcd"}


def test_pruning_old_runs_keeps_baselines_evidence_and_the_newest(stores: Stores) -> None:
    db = stores.new()
    before = _history(stores.open(db))
    store = stores.open(db)
    with PerformanceMonitor(store, baseline_n=_BASELINE_N) as monitor:
        metrics_before = monitor.get_metrics()
        baselines_before = {a: monitor.baseline(a) for a in "abcd"}
    audit_before = AuditLog(store).verify_chain(repair=False)

    result = prune(store, RetentionPolicy(run_days=30, baseline_n=_BASELINE_N, batch=64))
    after = {agent: _ids(store, agent) for agent in "abcd"}

    assert result.complete
    assert result.runs_deleted == sum(len(before[a]) - len(after[a]) for a in "abcd") > 0
    # a: its baseline's sample (the first 50 runs) and the newest 100; the rest was old.
    assert after["a"] == before["a"][:_BASELINE_N] + before["a"][-KEEP_NEWEST:]
    # b: the sample of its active baseline (after the kept change) and of the one a rollback
    # would reinstate both stay.
    assert before["b"][:_BASELINE_N] == after["b"][:_BASELINE_N]
    assert set(before["b"][400 : 400 + _BASELINE_N]) <= set(after["b"])
    # c and d: every run since the open issue / the change under verification stays.
    for agent in "cd":
        assert after[agent] == before[agent][:_BASELINE_N] + before[agent][200:]
    # The audit chain is untouched and still verifies.
    audit_after = AuditLog(store).verify_chain(repair=False)
    assert audit_after.ok
    assert audit_after.rows_checked == audit_before.rows_checked == 1
    # Nothing more to do: a second prune deletes nothing.
    assert prune(store, RetentionPolicy(run_days=30, baseline_n=_BASELINE_N)).runs_deleted == 0
    # Lifetime totals and baselines read the same after the prune.
    with PerformanceMonitor(store, baseline_n=_BASELINE_N) as monitor:
        assert monitor.get_metrics() == metrics_before
        for agent in "abcd":
            now, then = monitor.baseline(agent), baselines_before[agent]
            assert now is not None
            assert then is not None
            assert (now.epoch, now.runs, now.n, now.avg_duration_ms) == (
                then.epoch,
                then.runs,
                then.n,
                then.avg_duration_ms,
            )
        # A rollback still reinstates the full previous baseline.
        restored = monitor.restore_baseline("b")
        assert restored is not None
        assert restored.n == _BASELINE_N


def test_keeping_the_newest_runs_per_agent_and_pruning_in_bounded_slices(stores: Stores) -> None:
    db = stores.new()
    before = _history(stores.open(db))
    store = stores.open(db)
    policy = RetentionPolicy(runs_per_agent=150, baseline_n=_BASELINE_N, batch=20)
    first = prune(store, policy, max_batches=1)
    assert not first.complete
    assert 0 < first.runs_deleted <= 20
    slices = 1
    while not prune(store, policy, max_batches=3).complete:
        slices += 1
        assert slices < 200
    after = _ids(store, "a")
    assert after == before["a"][:_BASELINE_N] + before["a"][-150:]


def test_old_decisions_go_and_young_ones_stay(stores: Stores) -> None:
    store = stores.open(stores.new())
    for i in range(10):
        record_decision(store, kind="analyze", agent_name="a", payload={"i": i})
    _age_decisions = (datetime.now(UTC) - timedelta(days=40)).isoformat()
    with store.transaction() as conn:
        conn.execute("UPDATE decisions SET timestamp = ? WHERE id <= 6", (_age_decisions,))
    result = prune(store, RetentionPolicy(decision_days=30, batch=4))
    assert (result.runs_deleted, result.decisions_deleted, result.complete) == (0, 6, True)
    with store.snapshot() as conn:
        assert [i for (i,) in conn.execute("SELECT id FROM decisions ORDER BY id")] == [
            7,
            8,
            9,
            10,
        ]


def test_a_sweeper_applies_the_policy_in_the_background(stores: Stores) -> None:
    db = stores.new()
    before = _history(stores.open(db))
    store = stores.open(db)
    sweeper = RetentionSweeper(
        store, RetentionPolicy(run_days=30, baseline_n=_BASELINE_N, batch=50), interval_s=0.05
    )
    deadline = time.monotonic() + 60
    while len(_ids(store, "a")) > _BASELINE_N + KEEP_NEWEST and time.monotonic() < deadline:
        time.sleep(0.05)
    sweeper.close()
    assert _ids(store, "a") == before["a"][:_BASELINE_N] + before["a"][-KEEP_NEWEST:]


@pytest.mark.parametrize(
    "options", [{"run_days": 0}, {"runs_per_agent": 0}, {"decision_days": -1.0}]
)
def test_a_bad_policy_is_a_named_configuration_error(options: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match=next(iter(options))):
        RetentionPolicy(**options)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- agentmend store


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_store_subcommand_shows_sizes_and_prunes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "ws"
    settings = load_settings(workspace=folder)
    with Workspace.open(folder, settings=settings, create=True) as workspace:
        db = workspace.store.path
    with Store(db) as store:
        before = _history(store)
    code, out, err = _run(capsys, "store", "--json", "--workspace", str(folder))
    assert code == EXIT_OK, err
    shown = json.loads(out)
    assert shown["kinds"]["runs"]["rows"] == sum(map(len, before.values()))
    assert shown["kinds"]["runs"]["bytes"] > 0
    assert shown["kinds"]["audit"]["rows"] == 1

    code, out, err = _run(capsys, "store", "--prune", "--workspace", str(folder))
    assert code == EXIT_USAGE
    assert err.startswith("agentmend: no retention policy")
    assert err.count("\n") == 1

    monkeypatch.setenv("AGENTMEND_RETENTION_RUN_DAYS", "30")
    monkeypatch.setenv("AGENTMEND_BASELINE_N", str(_BASELINE_N))  # as the history was made
    code, out, err = _run(capsys, "store", "--prune", "--json", "--workspace", str(folder))
    assert code == EXIT_OK, err
    pruned = json.loads(out)
    assert pruned["pruned"]["runs"] > 0
    kept = sum(map(len, before.values())) - pruned["pruned"]["runs"]
    assert pruned["kinds"]["runs"]["rows"] == kept
    with Store(db) as store:
        assert store_usage(store).runs == kept

    code, out, err = _run(capsys, "store", "--workspace", str(tmp_path / "missing"))
    assert code == EXIT_UNAVAILABLE
    assert err.startswith("agentmend: ")
    assert err.count("\n") == 1

    code, out, err = _run(
        capsys, "store", "--prune", "--run-days", "-1", "--workspace", str(folder)
    )
    assert code == EXIT_USAGE
    assert "run_days" in err
    assert err.count("\n") == 1


def test_with_both_limits_a_run_goes_when_either_says_so(stores: Stores) -> None:
    db = stores.new()
    before = _history(stores.open(db))
    store = stores.open(db)
    # keeping 10,000 per agent would keep everything; 30 days still prunes the old runs
    policy = RetentionPolicy(run_days=30, runs_per_agent=10_000, baseline_n=_BASELINE_N)
    assert prune(store, policy).runs_deleted > 0
    assert _ids(store, "a") == before["a"][:_BASELINE_N] + before["a"][-KEEP_NEWEST:]
    # and the newest 150 per agent, whatever their age, with no age limit
    other = stores.open(stores.new())
    before2 = _history(other)
    prune(other, RetentionPolicy(runs_per_agent=150, baseline_n=_BASELINE_N))
    assert _ids(other, "a") == before2["a"][:_BASELINE_N] + before2["a"][-150:]
