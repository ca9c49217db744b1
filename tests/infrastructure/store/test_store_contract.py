"""Every component's public behaviour, once on SQLite and once on a real PostgreSQL server.

The whole loop (record, detect, mediate, apply, verify, keep, roll back, audit) runs through the
demo against each backend, and the ``agentmend`` command reads the result back through
``--store``; the components with their own SQL (executions and baselines, issues, plans and
decisions, the change log, the audit chain and its tamper checks) are then driven one by one.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from agentmend.faces.cli.app import main as agentmend
from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.decisions import (
    get_plan,
    list_decisions,
    list_plans,
    record_decision,
    save_plan,
    update_plan,
)
from agentmend.infrastructure.detection.issue_ledger import IssueLedger
from agentmend.infrastructure.errors import InvalidArgument, StoreError
from agentmend.infrastructure.models import ChangeStatus, ChangeType, ImprovementAction, utc_now
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.principal import ChangeAuthor
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.store.api import Store
from agentmend.loop.cycle import cycle_events

MAIN = str(Path(__file__).resolve().parents[3] / "main.py")


@pytest.mark.slow
def test_the_whole_loop_runs_on_the_store_and_the_command_reads_it(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    done = subprocess.run(
        [sys.executable, MAIN, "--demo", "--workspace", str(workspace), "--store", store_url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "demo finished as designed" in done.stdout
    assert "audit chain: verified" in done.stdout
    common = ["--workspace", str(workspace), "--store", store_url, "--json"]
    assert agentmend(["audit", "verify", *common]) == 0
    verified = json.loads(capsys.readouterr().out)
    assert verified["verified"] is True
    assert agentmend(["history", *common]) == 0
    statuses = {change["status"] for change in json.loads(capsys.readouterr().out)["changes"]}
    assert {"kept", "rolled_back"} <= statuses
    assert agentmend(["status", *common]) == 0
    agents = {a["agent"] for a in json.loads(capsys.readouterr().out)["agents"]}
    assert {"research-agent", "quality-agent"} <= agents


def _action(agent: str = "writer") -> ImprovementAction:
    return ImprovementAction(
        target_agent=agent,
        action_type=ChangeType.PROMPT_MODIFICATION,
        old_value="Be thorough.",
        new_value="Be brief.",
        rationale="tighten the prompt",
        confidence_score=0.9,
    )


def test_runs_from_every_writer_are_seen_and_survive_a_reopen(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        first = PerformanceMonitor(store, baseline_n=10)
        second = PerformanceMonitor(store, baseline_n=10)
        try:
            for i in range(30):
                first.record("writer", success=i % 3 != 0, duration_ms=10.0 + i)
                second.record("writer", success=True, duration_ms=5.0)
            first.flush()
            second.flush()
            first.refresh()
            second.refresh()
            # each sees the other's runs: one store, one fleet-wide view of an agent
            assert first.get_metrics()["writer"].executions == 60
            assert second.get_metrics()["writer"].executions == 60
        finally:
            first.close()
            second.close()
    with Store(store_url, files_dir=tmp_path) as store:
        reopened = PerformanceMonitor(store, baseline_n=10)
        try:
            metrics = reopened.get_metrics()["writer"]
            assert metrics.executions == 60
            assert metrics.success_rate == pytest.approx(50 / 60)
        finally:
            reopened.close()


def test_one_open_issue_per_agent_and_kind_whoever_raises_it(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        a, b = IssueLedger(store), IssueLedger(store)
        first, opened = a.open(
            "writer", "low_success_rate", detector="cusum", context="{}", hold_runs=100
        )
        again, opened_again = b.open(
            "writer", "low_success_rate", detector="cusum", context="{}", hold_runs=100
        )
        assert opened
        assert not opened_again
        assert again.issue_id == first.issue_id
        assert [i.issue_id for i in b.issues(active=True)] == [first.issue_id]


def test_plans_decisions_and_cycle_events(store_url: str, tmp_path: Path) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        plan_a = save_plan(store, description="first", payload={"kind": "code", "root": "/r"})
        save_plan(store, description="second", payload={"kind": "code", "root": "/other"})
        assert [p.plan_id for p in list_plans(store, payload={"root": "/r"})] == [plan_a.plan_id]
        assert len(list_plans(store, limit=None)) == 2
        one = record_decision(store, "cycle.started", payload={"cycle_id": "c-1"})
        two = record_decision(store, "cycle.finished", payload={"cycle_id": "c-1"})
        record_decision(store, "cycle.started", payload={"cycle_id": "c-2"})
        assert two.id == one.id + 1
        assert [d.kind for d in list_decisions(store, kind="cycle.started")] == [
            "cycle.started",
            "cycle.started",
        ]
        assert len(list_decisions(store, limit=10)) == 3
        assert cycle_events(store, "c-nothing") == []


def test_a_payload_no_json_reader_takes_raw_never_breaks_the_queries_over_the_others(
    store_url: str, tmp_path: Path
) -> None:
    hostile = {
        "root": "/hostile",
        "score": math.nan,
        "bounds": [math.inf, -math.inf, 1.5],
        "text": "a\x00b\ud800c \U0001f600",
        "long": "x" * 100_000,
    }
    with Store(store_url, files_dir=tmp_path) as store:
        bad = save_plan(store, description="hostile", payload=hostile)
        good = save_plan(store, description="plain", payload={"root": "/r"})
        record_decision(store, "cycle.started", payload={"cycle_id": "c-2", **hostile})
        assert [p.plan_id for p in list_plans(store, payload={"root": "/r"})] == [good.plan_id]
        assert [p.plan_id for p in list_plans(store, payload={"root": "/hostile"})] == [bad.plan_id]
        assert cycle_events(store, "c-1") == []  # read each cycle event's payload as JSON
        stored = get_plan(store, bad.plan_id)
    assert stored is not None
    assert stored.payload == {
        "root": "/hostile",
        "score": None,
        "bounds": [None, None, 1.5],
        "text": "a\\x00b\\ud800c \U0001f600",
        "long": "x" * 100_000,  # a payload is kept whole
    }


def test_a_payload_no_json_can_hold_is_refused_by_name_and_nothing_changes(
    store_url: str, tmp_path: Path
) -> None:
    cyclic: dict[str, object] = {"root": "/r"}
    cyclic["self"] = cyclic
    deep: list[object] = []
    for _ in range(sys.getrecursionlimit() * 2):
        deep = [deep]
    with Store(store_url, files_dir=tmp_path) as store:
        plan = save_plan(store, description="plain", payload={"root": "/r"})
        for payload in (cyclic, {"deep": deep}):
            with pytest.raises(InvalidArgument, match="payload no JSON can hold it"):
                save_plan(store, description="bad", payload=payload)
            with pytest.raises(InvalidArgument, match="payload no JSON can hold it"):
                update_plan(store, plan.plan_id, status="done", payload=payload)
            with pytest.raises(InvalidArgument, match="payload no JSON can hold it"):
                record_decision(store, "cycle.started", payload=payload)
        assert [p.plan_id for p in list_plans(store)] == [plan.plan_id]
        assert get_plan(store, plan.plan_id) == plan  # its status not changed either
        assert list_decisions(store, limit=10) == []


def test_changes_apply_and_roll_back_with_their_audit_rows(store_url: str, tmp_path: Path) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        manager = ImprovementManager(store=store)
        try:
            change_id = manager.log_change(_action(), author=ChangeAuthor(via="person"))
            manager.mark_kept(change_id)
            other = manager.log_change(_action("critic"))
            history = manager.get_history(limit=10)
            assert {r.change_id for r in history} == {change_id, other}
            assert manager.get_change(change_id).status is ChangeStatus.KEPT  # type: ignore[union-attr]
            chain = manager.verify_audit_chain()
            assert chain.ok, chain
        finally:
            manager.close()


def test_the_audit_chain_catches_an_edited_row_and_a_cut_tail(
    store_url: str, tmp_path: Path
) -> None:
    with Store(store_url, files_dir=tmp_path) as store:
        audit = AuditLog(store, hmac_key="k" * 32)
        for n in range(4):
            with audit.transaction() as txn:
                txn.append(
                    agent_name="writer",
                    edit_type="prompt",
                    old_value=n,
                    new_value=n + 1,
                    user_id="u",
                    timestamp=utc_now(),
                )
        assert audit.verify_chain().ok
        with store.transaction() as conn:
            conn.execute("UPDATE audit_log SET new_value = 'forged' WHERE id = 2")
        broken = audit.verify_chain()
        assert not broken.ok
        assert any(p.row_id == 2 for p in broken.problems)
    with Store(store_url, files_dir=tmp_path) as store:
        audit = AuditLog(store, hmac_key="k" * 32)
        with store.transaction() as conn:
            conn.execute("UPDATE audit_log SET new_value = '2' WHERE id = 2")
            conn.execute("DELETE FROM audit_log WHERE id = 4")
        cut = audit.verify_chain()
        assert not cut.ok  # the head file beside the store names row 4, which is gone


def test_a_workspace_on_a_store_url_keeps_its_files_in_the_folder(
    store_url: str, tmp_path: Path
) -> None:
    settings = Settings(store_url=store_url)
    with Workspace.open(tmp_path / "ws", settings=settings) as ws:
        assert ws.store.backend == ("sqlite" if "://" not in store_url else "postgresql")
        ws.manager.log_change(_action(), author=ChangeAuthor(via="person"))
        head = ws.store.local_file(".audit-head")
        assert head.is_file()
        if ws.store.backend == "postgresql":
            assert head.parent == (tmp_path / "ws").absolute()


def test_a_batch_sent_again_after_its_commit_landed_is_not_counted_twice(
    store_url: str, tmp_path: Path
) -> None:
    from agentmend.infrastructure.monitoring.agent_window import Row
    from agentmend.infrastructure.monitoring.execution_store import ExecutionStore

    with Store(store_url, files_dir=tmp_path) as store:
        table = ExecutionStore(store, "a1b2c3")
        rows: list[Row] = [
            ("writer", "run", True, 5.0, None, 0, 0, 0.0, 1_700_000_000.0 + i, None)
            for i in range(150)
        ]
        table.insert(rows[:120])
        # as if that commit's answer had been lost: the same row objects come again, first,
        # with new ones behind them
        table._numbered = {id(row): n + 1 for n, row in enumerate(rows[:120])}
        table.insert(rows)
        table.fold()  # PostgreSQL folds a small batch (the 30 new runs) into the rollups later
        conn = store.connection()
        assert conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0] == 150
        assert conn.execute("SELECT runs FROM run_totals").fetchone()[0] == 150


def test_concurrent_appends_make_one_chain(store_url: str, tmp_path: Path) -> None:
    import threading

    with Store(store_url, files_dir=tmp_path) as store:
        audit = AuditLog(store, hmac_key="k" * 32)

        def append(worker: int) -> None:
            for n in range(10):
                with audit.transaction() as txn:
                    txn.append(
                        agent_name="writer",
                        edit_type="prompt",
                        old_value=n,
                        new_value=n + 1,
                        user_id=f"w{worker}",
                    )

        threads = [threading.Thread(target=append, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        rows = store.connection().execute("SELECT id, prev_hash FROM audit_log ORDER BY id")
        ids, predecessors = zip(*rows, strict=True)
        assert ids == tuple(range(1, 41))
        assert len(set(predecessors)) == 40  # no fork: every row has its own predecessor
        assert audit.verify_chain().ok


def test_a_second_successor_is_refused_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    with Store(pg_url, files_dir=tmp_path) as store:
        audit = AuditLog(store)
        with audit.transaction() as txn:
            txn.append(agent_name="w", edit_type="e", old_value=1, new_value=2, user_id="u")
        with pytest.raises(StoreError), store.transaction() as conn:
            conn.execute(
                "INSERT INTO audit_log (id, timestamp, agent_name, edit_type, user_id,"
                " prev_hash, row_hash, keyed, batch)"
                " SELECT 2, timestamp, agent_name, edit_type, user_id, prev_hash, 'x', 0, 2"
                " FROM audit_log WHERE id = 1"
            )
