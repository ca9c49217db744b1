"""Only trusted telemetry moves a rollout: runs a receiver attributes by their release label count
in the guard and the promotion test only when that receiver is listed as trusted where the
rollout is judged; a label, or an attribute a client writes, never makes a run trusted.

Real SDK spans over real HTTP to the real receiver, on both backends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_run import run_cli
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from otel_helpers import SpanFactory, auth

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.definitions.team_id import team_id_for
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.releases.attribution import ReleaseAttribution
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.releases.rollout_evidence import trusted_receivers
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.receiver import OtlpReceiver

OPS = Principal("ops", "Operator")
TRUSTED = "otel-gateway"
FORGED = 300


def _send(
    store: Store, log: ReleaseLog, source: str | None, failing: str = "1", **span: Any
) -> None:
    """FORGED runs of the canary (release 2) and FORGED of stable (1) through a receiver named
    ``source``; the runs of release ``failing`` fail, the others succeed."""
    with PerformanceMonitor(store, flush_interval_s=60) as monitor:
        attribution = ReleaseAttribution(log, source=source)
        receiver = OtlpReceiver(TraceAssembler(monitor, attribute=attribution.tags), port=0)
        receiver.start()
        try:
            for label in ("2", "1"):
                fail = "forged failure" if label == failing else None
                factory = SpanFactory(service="tutor-app", **{"agentmend.release": label})
                exporter = OTLPSpanExporter(
                    endpoint=f"{receiver.endpoint}/v1/traces",
                    timeout=10,
                    headers=auth(receiver.token),
                )
                factory.provider.add_span_processor(BatchSpanProcessor(exporter))
                for _ in range(FORGED):
                    factory.agent_run("research-agent", fail=fail, attributes=span)
                assert factory.provider.force_flush(30_000)
                factory.close()
        finally:
            receiver.close()
        monitor.flush()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("failing", "settled", "trusted_by"),
    [("1", "promoted", "setting"), ("2", "rolled_back", "store")],
)
def test_forged_runs_move_no_rollout_unless_their_receiver_is_trusted(
    failing: str,
    settled: str,
    trusted_by: str,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    monkeypatch.setenv("AGENTMEND_STORE_URL", store_url)
    monkeypatch.delenv("AGENTMEND_TRUSTED_RECEIVERS", raising=False)
    workspace = tmp_path / "ws"
    Workspace.open(workspace).close()
    team = workspace / "agents"
    store = Store(store_url, files_dir=workspace)  # one host: the workspace's audit head
    try:
        log = ReleaseLog(store, team_id_for(team))
        log.publish_directory(team, by=OPS)
        agent = next(team.glob("*.md"))
        agent.write_text(agent.read_text() + "\nBe brief.\n")
        log.publish_directory(team, by=OPS)
        rollout = Rollouts(log).start(2, by=OPS).rollout_id
        judge = Rollouts(log)  # trusts what the environment and the store say, at every step

        # an untrusted receiver, whose clients also write the trusted name as span attributes
        forged = {"received_by": TRUSTED, "agentmend.received_by": TRUSTED}
        _send(store, log, "laptop-receiver", failing, **forged)
        _send(store, log, None, failing)  # a receiver with no name at all
        record = judge.advance()
        assert record is not None
        assert record.state == "canary"
        evidence = record.evidence
        assert (evidence.canary_runs, evidence.stable_runs) == (0, 0)
        assert evidence.not_counted == {
            "labelled run from receiver 'laptop-receiver', not trusted (release trust)": (
                2 * FORGED
            ),
            "labelled run with no receiver identity": 2 * FORGED,
        }
        shown_by = ("release", "show", "2", "--json", "--workspace", str(workspace))
        code, out, _ = run_cli(capsys, *shown_by)
        assert code == 0
        shown = json.loads(out)["rollout"]["evidence"]
        assert shown["not_counted"] == evidence.not_counted
        assert shown["canary"] == [0, 0]
        assert json.loads(out)["rollout"]["state"] == "canary"

        # an administrator trusts the gateway: in the judging process's environment, or in
        # the store (where only an administrator may write it, audited)
        trust = ("release", "trust", TRUSTED, "--workspace", str(workspace))
        code, _, err = run_cli(capsys, *trust)
        assert code == 2
        assert "administrator" in err
        if trusted_by == "setting":
            monkeypatch.setenv("AGENTMEND_TRUSTED_RECEIVERS", TRUSTED)
            judge = Rollouts(log)
        else:
            monkeypatch.setenv("AGENTMEND_PRINCIPAL_ADMIN", "true")
            code, out, err = run_cli(capsys, *trust, "--json")
            assert code == 0, err
            assert json.loads(out)["store"] == [TRUSTED]
            monkeypatch.delenv("AGENTMEND_PRINCIPAL_ADMIN")
        # the same runs from the trusted receiver count, and decide
        _send(store, log, TRUSTED, failing)
        record = judge.advance()
        assert record is not None
        counted = Rollouts(log).get(rollout).evidence
        assert counted.canary_runs + counted.stable_runs > 0
        assert record.state == settled
        assert counted.not_counted == evidence.not_counted  # the untrusted stay left out
    finally:
        store.close()


def test_trusted_receivers_come_from_the_setting_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTMEND_TRUSTED_RECEIVERS", raising=False)
    assert trusted_receivers() == frozenset()
    monkeypatch.setenv("AGENTMEND_TRUSTED_RECEIVERS", " gw-1, ,gw-2 ")
    assert trusted_receivers() == frozenset({"gw-1", "gw-2"})


def test_the_store_trusts_a_receiver_only_by_an_administrator_and_audits_it(
    store_url: str, tmp_path: Path
) -> None:
    from agentmend.infrastructure.changes.audit.log import AuditLog
    from agentmend.infrastructure.errors import InvalidArgument, PermissionRequired
    from agentmend.infrastructure.principal import ADMIN
    from agentmend.infrastructure.releases.attribution import read_trusted, set_trusted

    admin = Principal("ops", "Operator", frozenset({ADMIN}))
    with Store(store_url, files_dir=tmp_path) as store:
        audit = AuditLog(store)
        assert read_trusted(store) == frozenset()
        with pytest.raises(PermissionRequired, match="trust a telemetry receiver"):
            set_trusted(store, audit, "gw-1", by=OPS)
        for bad in ("", "a,b", "gw 1", "x" * 129, "gw\x00"):
            with pytest.raises(InvalidArgument, match="receiver name"):
                set_trusted(store, audit, bad, by=admin)
        assert read_trusted(store) == frozenset()
        assert set_trusted(store, audit, "gw-1", by=admin)
        assert not set_trusted(store, audit, "gw-1", by=admin)  # already so: no second row
        assert read_trusted(store) == frozenset({"gw-1"})
        assert set_trusted(store, audit, "gw-1", by=admin, trusted=False)
        assert read_trusted(store) == frozenset()
        rows = [(e.edit_type, e.new_value, e.user_id) for e in audit.entries(limit=10)]
        assert sorted(rows) == [
            ("receiver_distrusted", "gw-1", "ops"),
            ("receiver_trusted", "gw-1", "ops"),
        ]
        assert audit.verify_chain(repair=False)
