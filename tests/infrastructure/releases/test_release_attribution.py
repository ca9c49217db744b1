"""Runs agentmend did not route, attributed by their ``agentmend.release`` label.

OpenTelemetry: real SDK spans sent by the real OTLP/HTTP exporter to the receiver, recorded by a
real monitor into the store a rollout reads. The hooks: the callbacks fired as the SDK fires
them, with the label read from a release a follower materialized. A labelled run is attributed
to its release and arm and counts in the rollout; an unlabelled one is not attributed; a label
naming no release is recorded as unattributed with the reason, never dropped.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from claude_agent_sdk import HookMatcher
from claude_agent_sdk.types import HookEvent
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from otel_helpers import TEST_TOKEN, SpanFactory, auth, post

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.definitions.team_id import team_id_for
from agentmend.infrastructure.llm.claude.hooks import claude_sdk_hooks
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.releases.attribution import ReleaseAttribution, linked_release_label
from agentmend.infrastructure.releases.follower import ReleaseFollower
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.simulation import copy_team
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.receiver import OtlpReceiver

OPS = Principal("ops", "Operator")
AGENT = "research-agent"


class Team:
    """Releases 1 (stable) and 2 (canary at 10 %) of a team, in one store, with a monitor."""

    def __init__(self, tmp_path: Path) -> None:
        self.source = copy_team(tmp_path / "team")
        self.store = Store(tmp_path / "agentmend.db")
        self.log = ReleaseLog(self.store, "team-obs", audit=AuditLog(self.store))
        self.log.publish_directory(self.source, by=OPS)
        path = self.source / f"{AGENT}.md"
        path.write_text(path.read_text().replace("max_tokens: 2048", "max_tokens: 3000", 1))
        self.canary = self.log.publish_directory(self.source, by=OPS)
        self.rollout = Rollouts(self.log).start(2, by=OPS).rollout_id
        self.monitor = PerformanceMonitor(self.store, flush_interval_s=60)
        self.attribution = ReleaseAttribution(self.log, source="gateway")

    def extras(self) -> list[dict[str, Any]]:
        self.monitor.flush()
        rows = self.store.connection().execute("SELECT extra FROM executions ORDER BY id")
        return [json.loads(extra) for (extra,) in rows]

    def close(self) -> None:
        self.monitor.close()
        self.store.close()


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    made = Team(tmp_path)
    yield made
    made.close()


def _export(receiver: OtlpReceiver, release: str | None, runs: int, **span: Any) -> None:
    """``runs`` agent runs from an app whose resource carries ``release`` (None: no label)."""
    resource = {"agentmend.release": release} if release is not None else {}
    factory = SpanFactory(service="tutor-app", **resource)
    factory.provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(
                endpoint=f"{receiver.endpoint}/v1/traces", timeout=5, headers=auth(receiver.token)
            )
        )
    )
    for _ in range(runs):
        factory.agent_run(AGENT, attributes=span)
    assert factory.provider.force_flush(10_000)
    factory.close()


def test_otel_runs_are_attributed_by_their_label_and_count_in_the_rollout(team: Team) -> None:
    assembler = TraceAssembler(team.monitor.record, attribute=team.attribution.tags)
    receiver = OtlpReceiver(assembler, port=0).start()
    try:
        _export(receiver, "1", 4)  # the stable release, by version
        _export(receiver, "v2", 2)  # the canary, by version
        _export(receiver, team.canary.content_hash[:12], 1)  # the canary, by content hash
        _export(receiver, None, 3)  # unlabelled
        _export(receiver, "99", 2)  # no such release
        _export(receiver, None, 1, **{"agentmend.release": 2})  # on the span, as an int
    finally:
        receiver.close()
    extras = team.extras()
    assert len(extras) == 13  # every run recorded, whatever its label
    tagged = [(e.get("release"), e.get("arm"), e.get("rollout")) for e in extras]
    assert tagged.count((1, "stable", team.rollout)) == 4
    assert tagged.count((2, "canary", team.rollout)) == 4
    unlabelled = [e for e in extras if "release" not in e and "release_label" not in e]
    assert len(unlabelled) == 3
    unknown = [e for e in extras if "release_unattributed" in e]
    assert len(unknown) == 2
    assert unknown[0]["release_label"] == "99"
    assert unknown[0]["release_unattributed"] == "team team-obs has no release '99'"
    assert "release" not in unknown[0]
    assert all(e["source"] == "otel" for e in extras)

    assert all(e["received_by"] == "gateway" for e in extras if "release" in e)
    # the rollout reads them as live runs of its arms where their receiver is trusted
    record = Rollouts(team.log, trusted=frozenset({"gateway"})).advance()
    assert record is not None
    evidence = Rollouts(team.log).get(team.rollout).evidence
    assert (evidence.canary_runs, evidence.stable_runs) == (4, 4)


def test_a_receiver_without_a_release_log_records_labelled_runs_as_unattributed(
    team: Team,
) -> None:
    receiver = OtlpReceiver(TraceAssembler(team.monitor.record), port=0).start()
    try:
        _export(receiver, "2", 1)
    finally:
        receiver.close()
    [extra] = team.extras()
    assert extra["release_label"] == "2"
    assert extra["release_unattributed"].startswith("no release log to attribute it to")


class _Fire:
    """Calls the hook callbacks the way the SDK does."""

    def __init__(self, hooks: dict[HookEvent, list[HookMatcher]]) -> None:
        self.hooks = hooks

    async def __call__(self, event: str, **fields: Any) -> None:
        data = {"session_id": "s", "transcript_path": "/t", "cwd": "/", "hook_event_name": event}
        data.update(fields)
        for matcher in self.hooks.get(cast(HookEvent, event), []):
            for callback in matcher.hooks:
                await callback(cast(Any, data), None, {"signal": None})

    async def run(self, agent_id: str) -> None:
        await self("SubagentStart", agent_id=agent_id, agent_type=AGENT)
        await self("SubagentStop", agent_id=agent_id, agent_type=AGENT)


async def test_hook_runs_are_attributed_to_the_release_the_link_points_at(
    team: Team, tmp_path: Path
) -> None:
    follower = ReleaseFollower(team.log, tmp_path / "app", link=".claude/agents")
    follower.poll()  # the app's Claude Code reads .claude/agents, a link to release 1
    label = linked_release_label(follower.team_dir)
    assert label == "1"
    fire = _Fire(
        claude_sdk_hooks(
            team.monitor,
            release=lambda: linked_release_label(follower.team_dir),
            releases=team.attribution,
        )
    )
    await fire.run("a1")
    await fire(  # a tool call is its own series, never one of the team's runs
        "PostToolUse", agent_id="a2", agent_type=AGENT, tool_name="Read", tool_input={},
        tool_response="ok", tool_use_id="t1", duration_ms=3,
    )  # fmt: skip
    await _Fire(claude_sdk_hooks(team.monitor, release="v7", releases=team.attribution)).run("b")
    await _Fire(claude_sdk_hooks(team.monitor, releases=team.attribution)).run("c")
    await _Fire(claude_sdk_hooks(team.monitor, release=2)).run("d")
    follower.stop()

    runs = [e for e in team.extras() if e.get("recorded_by") == "claude_sdk_hooks"]
    by_id = {e["agent_id"]: e for e in runs}
    assert (by_id["a1"]["release"], by_id["a1"]["arm"], by_id["a1"]["rollout"]) == (
        1,
        "stable",
        team.rollout,
    )
    assert by_id["b"]["release_unattributed"] == "team team-obs has no release 'v7'"
    assert "release" not in by_id["b"]
    assert not any(k.startswith("release") for k in by_id["c"])  # unlabelled
    assert by_id["d"]["release_unattributed"].startswith("no release log")
    tool = [e for e in team.extras() if e.get("tool_use_id") == "t1"]
    assert len(tool) == 1
    assert "release" not in tool[0]


def test_labels_name_a_release_by_version_or_hash_and_odd_labels_say_why(team: Team) -> None:
    tags = team.attribution.tags
    assert tags(2) == {
        "release": 2,
        "attributed_by": "label",
        "received_by": "gateway",
        "arm": "canary",
        "rollout": team.rollout,
    }
    assert tags(None) == {}
    assert tags("1", "team-other")["release_unattributed"] == (
        "the run names team 'team-other', not team-obs"
    )
    for odd in (True, 1.5, "abc", "v0", ["1"]):
        assert "not a release version or content hash" in str(tags(odd)["release_unattributed"])
    Rollouts(team.log).promote(2, by=Principal("ops", "Ops", frozenset({"admin"})))
    fresh = ReleaseAttribution(team.log)  # heads are reused for heads_ttl_s: a new reader
    assert fresh.tags(1) == {"release": 1, "attributed_by": "label"}  # attributed, in no arm
    assert fresh.tags(2) == {"release": 2, "attributed_by": "label", "arm": "stable"}
    # a rollback republishes release 1's content as release 3: the hash names the served one
    team.log.publish_rollback(2, by=Principal("ops", "Ops", frozenset({"admin"})))
    again = ReleaseAttribution(team.log)
    assert again.tags(team.log.get(1).content_hash[:10])["release"] == 3


def test_the_receiver_command_attributes_to_its_workspace_team(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    Workspace.open(workspace).close()  # the simulated team
    store = Store(workspace / "agentmend.db")
    log = ReleaseLog(store, team_id_for(workspace / "agents"))
    log.publish_directory(workspace / "agents", by=OPS)
    store.close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "agentmend.otel_receiver", "--port", str(port),
         "--workspace", str(workspace), "--token", TEST_TOKEN, "--name", "gw-1"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    spans = SpanFactory(service="tutor-app", **{"agentmend.release": "1"})
    try:
        assert process.stderr is not None
        assert "/v1/traces" in process.stderr.readline()
        spans.agent_run(AGENT)
        assert post(f"http://127.0.0.1:{port}/v1/traces", spans.body())[0] == 200
    finally:
        spans.close()
        process.terminate()
        process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
    assert process.returncode == 0
    store = Store(workspace / "agentmend.db")
    try:
        [(extra,)] = store.connection().execute("SELECT extra FROM executions").fetchall()
    finally:
        store.close()
    tags = json.loads(extra)
    assert (tags["release"], tags["arm"]) == (1, "stable")
    assert tags["received_by"] == "gw-1"  # the receiver's own name, not the client's
