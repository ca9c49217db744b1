"""A fleet on one store: several real worker processes following releases, on both backends.

Each worker is ``tests/release_worker.py`` (a ``ReleaseFollower`` polling every 0.1 s, serving
the simulated research agent through ``AgentTeam``); the test process publishes and starts
rollouts, and reads what the workers report and record. Workers are stopped by pid. Every test
runs on a SQLite file and on a PostgreSQL database of the test server (the workers of one test
share one folder for the store's files, as the processes of one host do); a worker cut off
from its store is cut off by a detached volume on SQLite and by a stopped server (not the
run's shared one) on PostgreSQL, a rollout under way included. Workers are also SIGKILLed
mid-materialization and mid-rollout, and come back on whole releases.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from pg_server import PgServer
from release_followers import FollowingWorkers

from agentmend.infrastructure.changes.audit.log import AuditLog
from agentmend.infrastructure.files.atomic import sha256_bytes
from agentmend.infrastructure.monitoring.run_reader import runs_after
from agentmend.infrastructure.principal import ADMIN, Principal
from agentmend.infrastructure.releases.follower import ReleaseFollower
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.materialize import ReleaseDirectories
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.releases.rollout_evidence import RolloutLimits
from agentmend.infrastructure.simulation import copy_team
from agentmend.infrastructure.store.api import Store

CYCLE = Principal("cycle", "improvement cycle")
OPS = Principal("ops", "Operator", frozenset({ADMIN}))
# a rollout that stays undecided on a canary no different from stable (no margin to show "no
# worse" by, a boundary of a million, a guard that almost never fires) while a test acts on it
UNDECIDED = RolloutLimits(margin=0.0, alpha=1e-6, guard_alpha=1e-9)
AGENT = "research-agent"
TEAM = "team-fleet"


class Fleet(FollowingWorkers):
    """The store, the team's source files and the worker processes of one test."""

    def __init__(self, tmp_path: Path, url: str | None = None) -> None:
        self.source = copy_team(tmp_path / "team")
        self.store_path = tmp_path / "store" / "agentmend.db"  # its own folder: a volume
        files_dir = tmp_path / "files"  # a PostgreSQL store's files on this host
        super().__init__(url or str(self.store_path), TEAM, tmp_path, files_dir)
        self.store = Store(self.location, files_dir=self.files_dir)
        self.audit = AuditLog(self.store)
        self.log = ReleaseLog(self.store, TEAM, audit=self.audit)
        self.rollouts = Rollouts(self.log)

    def publish_edit(self, old: str, new: str, *, stable: bool = False) -> int:
        path = self.source / f"{AGENT}.md"
        path.write_text(path.read_text().replace(old, new, 1))
        return self.log.publish_directory(self.source, by=CYCLE, stable=stable).version

    def runs_by_release(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for (extra,) in self.store.connection().execute("SELECT extra FROM executions"):
            release = int(json.loads(extra)["release"])
            counts[release] = counts.get(release, 0) + 1
        return counts


@pytest.fixture
def fleet(tmp_path: Path, store_url: str) -> Iterator[Fleet]:
    made = Fleet(tmp_path, store_url if "://" in store_url else None)
    try:
        yield made
    finally:
        made.stop()
        made.store.close()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.slow
def test_a_publication_reaches_every_worker_within_a_second(fleet: Fleet) -> None:
    fleet.log.publish_directory(fleet.source, by=CYCLE)
    listening = fleet.store.backend == "postgresql"
    # on PostgreSQL the workers poll every 5 s: only the NOTIFY can bring them within a second
    workers = fleet.start(4, *(["--interval", "5"] if listening else []))
    wait_for(
        "every worker on 1",
        lambda: all(
            fleet.status(k).get("stable") == 1 and fleet.status(k).get("listening") == listening
            for k in workers
        ),
    )
    published = time.time()
    v2 = fleet.publish_edit("max_tokens: 2048", "max_tokens: 4096", stable=True)
    wait_for("every worker on 2", lambda: all(fleet.status(k).get("stable") == v2 for k in workers))
    delays = [fleet.status(k)["first_served"][str(v2)] - published for k in workers]
    assert max(delays) < 1.0, delays
    for k in workers:
        text = (fleet.root(k) / "agents" / f"{AGENT}.md").read_text()
        assert "max_tokens: 4096" in text


def test_a_harmful_canary_is_rolled_back_while_stable_serves_most_runs(fleet: Fleet) -> None:
    fleet.log.publish_directory(fleet.source, by=CYCLE)
    workers = fleet.start(3, "--serve")
    wait_for("workers serving", lambda: all(fleet.status(k).get("runs", 0) > 0 for k in workers))
    harmful = fleet.publish_edit("max_tokens: 2048", "max_tokens: 950")
    record = fleet.rollouts.start(harmful, by=CYCLE)
    wait_for("canary served", lambda: fleet.runs_by_release().get(harmful, 0) > 20)
    fleet.kill(workers[0])  # a worker crashes mid-rollout: the others carry it on
    wait_for(
        "the rollout to settle",
        lambda: fleet.rollouts.get(record.rollout_id).state != "canary",
        timeout=180,
    )
    settled = fleet.rollouts.get(record.rollout_id)
    assert settled.state == "rolled_back"
    assert settled.reason == "worse"
    assert fleet.log.heads().stable == 1
    wait_for(
        "workers off the canary",
        lambda: all(fleet.status(k).get("canary") is None for k in workers[1:]),
    )
    counts = fleet.runs_by_release()
    assert counts[1] > 4 * counts[harmful], counts
    # three workers stepped the rollout at once: every tagged run up to its cursor was
    # counted exactly once
    tagged = [
        json.loads(str(r.extra))
        for r in runs_after(fleet.store.connection(), 0, 1_000_000)
        if r.id <= settled.cursor and r.extra
    ]
    mine = [t for t in tagged if t.get("rollout") == record.rollout_id]
    assert settled.evidence.canary_runs == sum(t["release"] == harmful for t in mine)
    assert settled.evidence.stable_runs == sum(t["release"] == 1 for t in mine)
    # the guard settled it (a worker's poll, not a person), and the record and the audit row
    # both name that test, with its statistic beside its boundary
    assert settled.evidence.decided_by == "failure_guard"
    row = fleet.audit.entries()[-1]
    assert row.edit_type == "rollout_rolled_back"
    assert row.user_id == "agentmend"
    found = json.loads(str(row.new_value))
    assert (found["rollout"], found["reason"], found["decided_by"]) == (
        record.rollout_id,
        "worse",
        "failure_guard",
    )
    guard = found["evidence"]["guard"]
    assert guard["failures"] >= guard["failure_boundary"]
    assert fleet.audit.verify_chain().ok


def test_a_good_canary_is_promoted_and_every_worker_follows(fleet: Fleet) -> None:
    fleet.log.publish_directory(fleet.source, by=CYCLE)
    workers = fleet.start(3, "--serve", "--fault-tokens", "2.6")
    wait_for("workers serving", lambda: all(fleet.status(k).get("runs", 0) > 0 for k in workers))
    fixed = fleet.publish_edit("max_tokens: 2048", "max_tokens: 4096")
    # promotion and following are what this test is about: a guard that almost never fires
    # (the fix completes answers the fault cut short, so its runs are also slower)
    quiet_guard = RolloutLimits(guard_alpha=1e-6)
    record = fleet.rollouts.start(fixed, by=CYCLE, claimed_fix=True, limits=quiet_guard)
    wait_for(
        "the rollout to settle",
        lambda: fleet.rollouts.get(record.rollout_id).state != "canary",
        timeout=180,
    )
    settled = fleet.rollouts.get(record.rollout_id)
    assert settled.state == "promoted"
    assert settled.reason == "better"
    wait_for(
        "every worker on the fix", lambda: all(fleet.status(k)["stable"] == fixed for k in workers)
    )


def _whole_release(fleet: Fleet, root: Path) -> int:
    """The version the team link serves, after checking every file against the store."""
    served = ReleaseDirectories(root).linked()
    assert served is not None
    release = fleet.log.get(served.version)
    on_disk = {
        p.relative_to(served.directory).as_posix(): sha256_bytes(p.read_bytes())
        for p in served.directory.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }
    assert on_disk == dict(release.files)
    assert os.readlink(root / "agents") == f".releases/{served.directory.name}"
    return served.version


@pytest.mark.slow
def test_a_worker_killed_mid_materialization_comes_back_on_a_whole_release(
    fleet: Fleet,
) -> None:
    current = fleet.log.publish_directory(fleet.source, by=CYCLE).version
    rng = random.Random(18)
    k = 100  # one worker folder, the worker killed and restarted in it again and again
    staging = fleet.root(k) / ".releases"
    for trial in range(4):
        fleet.start(1, first=k)
        wait_for("the worker on the stable", lambda: fleet.status(k).get("stable") == current)  # noqa: B023
        # a large release (400 docs files): materializing it takes a while to kill into
        docs = fleet.source / AGENT / "docs"
        docs.mkdir(parents=True, exist_ok=True)
        for i in range(400):
            (docs / f"ref-{i:03}.md").write_text(f"reference {trial}.{i}\n" * 200)
        version = fleet.log.publish_directory(fleet.source, by=CYCLE, stable=True).version
        wait_for(
            "materialization to start",
            lambda: any(n.name.startswith(".staging") for n in staging.iterdir()),
            timeout=30,
        )
        time.sleep(rng.uniform(0.0, 0.2))
        fleet.kill(k)
        before = _whole_release(fleet, fleet.root(k))
        assert before in (current, version)
        follower = ReleaseFollower(fleet.log, fleet.root(k))  # the worker comes back
        assert follower.status().stable == before  # serving its whole last release at once
        assert not any(n.name.startswith(".staging") for n in staging.iterdir())
        follower.poll()
        assert _whole_release(fleet, fleet.root(k)) == version
        current = version


def test_a_worker_cut_off_from_the_store_keeps_its_release(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    try:
        _cut_off_by_a_detached_volume(fleet)
    finally:
        fleet.stop()
        fleet.store.close()


def _cut_off_by_a_detached_volume(fleet: Fleet) -> None:
    fleet.log.publish_directory(fleet.source, by=CYCLE)
    (k,) = fleet.start(1, "--serve")
    wait_for("the worker serving", lambda: fleet.status(k).get("runs", 0) > 0)
    volume = fleet.store_path.parent
    away = volume.with_name("detached")
    volume.rename(away)  # the store's volume is detached under the worker (database, WAL, head)
    try:
        wait_for("the worker to notice", lambda: fleet.status(k).get("connected") is False)
        runs = fleet.status(k)["runs"]
        wait_for("runs to go on", lambda: fleet.status(k)["runs"] > runs + 50)
        status = fleet.status(k)
        assert status["stable"] == 1
        assert "unreachable" in str(status["problem"]), json.dumps(status)
    finally:
        away.rename(volume)
    wait_for("the worker to reconnect", lambda: fleet.status(k).get("connected") is True)


@pytest.mark.slow
def test_a_worker_cut_off_from_a_stopped_server_keeps_its_release(
    restartable_pg_server: PgServer, tmp_path: Path
) -> None:
    fleet = Fleet(tmp_path, restartable_pg_server.create_database())
    try:
        _cut_off_by_a_stopped_server(fleet, restartable_pg_server)
    finally:
        fleet.stop()
        fleet.store.close()
        if restartable_pg_server.pid is None:
            restartable_pg_server.start()  # for the next test that uses it


def _cut_off_by_a_stopped_server(fleet: Fleet, server: PgServer) -> None:
    fleet.log.publish_directory(fleet.source, by=CYCLE)
    (k,) = fleet.start(1, "--serve")
    wait_for("the worker serving", lambda: fleet.status(k).get("runs", 0) > 0)
    wait_for("the worker listening", lambda: fleet.status(k).get("listening") is True)
    fleet.store.close()  # the test's own connections would only break
    server.shut_down()  # every session ends
    wait_for("the worker to notice", lambda: fleet.status(k).get("connected") is False)
    runs = fleet.status(k)["runs"]
    wait_for("runs to go on", lambda: fleet.status(k)["runs"] > runs + 50)
    status = fleet.status(k)
    assert status["stable"] == 1
    assert status["listening"] is False
    assert "unreachable" in str(status["problem"]), json.dumps(status)
    server.start()
    wait_for("the worker to reconnect", lambda: fleet.status(k).get("connected") is True)
    v2 = fleet.publish_edit("max_tokens: 2048", "max_tokens: 4096", stable=True)
    wait_for("the worker on 2", lambda: fleet.status(k).get("stable") == v2)
    wait_for("the worker listening again", lambda: fleet.status(k).get("listening") is True)
    assert fleet.runs_by_release()[1] > 0  # runs served while cut off reached the store later


def _add_docs(fleet: Fleet, tag: str, count: int = 400) -> None:
    """A large release (``count`` docs files): materializing it takes a while to kill into."""
    docs = fleet.source / AGENT / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (docs / f"ref-{i:03}.md").write_text(f"reference {tag}.{i}\n" * 200)


def _whole(fleet: Fleet, directory: Path, version: int) -> None:
    """Every file of release ``version`` in ``directory`` is as published, and nothing else."""
    on_disk = {
        p.relative_to(directory).as_posix(): sha256_bytes(p.read_bytes())
        for p in directory.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }
    assert on_disk == dict(fleet.log.get(version).files)


def _no_staging(fleet: Fleet, k: int) -> bool:
    return not any(n.name.startswith(".staging") for n in (fleet.root(k) / ".releases").iterdir())


@pytest.mark.slow
def test_a_worker_killed_mid_rollout_comes_back_on_whole_releases_and_follows_the_promotion(
    fleet: Fleet,
) -> None:
    fleet.log.publish_directory(fleet.source, by=CYCLE)
    workers = fleet.start(2, "--serve", "--run-pause", "0.2")
    wait_for("workers serving", lambda: all(fleet.status(k).get("runs", 0) > 0 for k in workers))
    _add_docs(fleet, "canary")
    canary = fleet.log.publish_directory(fleet.source, by=CYCLE).version
    record = fleet.rollouts.start(canary, by=CYCLE, share=0.5, limits=UNDECIDED)
    victim = workers[0]
    wait_for(
        "the canary's materialization to start",
        lambda: not _no_staging(fleet, victim) or fleet.status(victim).get("canary") == canary,
        timeout=30,
    )
    time.sleep(random.Random(30).uniform(0.0, 0.1))
    fleet.kill(victim)  # SIGKILL, mid-rollout (and, most often, mid-materialization)
    assert _whole_release(fleet, fleet.root(victim)) == 1  # the link never left stable
    fleet.start(1, "--serve", "--run-pause", "0.2", first=victim)  # it comes back
    wait_for(
        "both workers serving stable and canary",
        lambda: all(
            fleet.status(k).get("stable") == 1 and fleet.status(k).get("canary") == canary
            for k in workers
        ),
    )
    wait_for("canary runs recorded", lambda: fleet.runs_by_release().get(canary, 0) >= 10)
    for k in workers:
        assert _no_staging(fleet, k)  # what the kill left is gone
        directories = ReleaseDirectories(fleet.root(k))
        _whole(fleet, directories.materialize(fleet.log, canary).directory, canary)
    assert fleet.rollouts.get(record.rollout_id).state == "canary"
    fleet.rollouts.promote(canary, by=OPS)
    wait_for(
        "every worker on the promoted canary",
        lambda: all(
            fleet.status(k).get("stable") == canary and fleet.status(k).get("canary") is None
            for k in workers
        ),
    )
    for k in workers:
        assert _whole_release(fleet, fleet.root(k)) == canary
    settled = fleet.rollouts.get(record.rollout_id)
    assert (settled.state, settled.reason) == ("promoted", "by_hand")
    steps = [e.edit_type for e in fleet.audit.entries()]
    assert steps.count("rollout_started") == 1
    assert steps.count("rollout_promoted") == 1
    assert fleet.audit.verify_chain().ok


@contextmanager
def _server_down(fleet: Fleet, server: PgServer) -> Iterator[None]:
    """The store's server stopped (fast shutdown: every session ends), then started again."""
    server.shut_down()
    try:
        yield
    finally:
        server.start()


@contextmanager
def _volume_detached(fleet: Fleet) -> Iterator[None]:
    """The store's volume (database, WAL, audit head) gone from under the workers, then back."""
    volume = fleet.store_path.parent
    away = volume.with_name("detached")
    volume.rename(away)
    try:
        yield
    finally:
        away.rename(volume)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_store_outage_mid_rollout_loses_nothing_and_the_fleet_follows_after(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "postgresql":
        server: PgServer = request.getfixturevalue("restartable_pg_server")
        fleet = Fleet(tmp_path, server.create_database())
        outage: AbstractContextManager[None] = _server_down(fleet, server)
    else:
        fleet = Fleet(tmp_path)
        outage = _volume_detached(fleet)
    try:
        _outage_mid_rollout(fleet, outage)
    finally:
        fleet.stop()
        fleet.store.close()


def _outage_mid_rollout(fleet: Fleet, outage: AbstractContextManager[None]) -> None:
    listening = fleet.store.backend == "postgresql"
    fleet.log.publish_directory(fleet.source, by=CYCLE)
    workers = fleet.start(2, "--serve", "--run-pause", "0.2")
    wait_for("workers serving", lambda: all(fleet.status(k).get("runs", 0) > 0 for k in workers))
    canary = fleet.publish_edit("max_tokens: 2048", "max_tokens: 2100")
    record = fleet.rollouts.start(canary, by=CYCLE, share=0.5, limits=UNDECIDED)
    wait_for(
        "both arms served",
        lambda: (
            all(fleet.status(k).get("canary") == canary for k in workers)
            and fleet.runs_by_release().get(canary, 0) > 0
        ),
    )
    with outage:
        wait_for(
            "the workers to notice",
            lambda: all(fleet.status(k).get("connected") is False for k in workers),
        )
        runs = {k: fleet.status(k)["runs"] for k in workers}
        wait_for(
            "runs to go on while cut off",
            lambda: all(fleet.status(k)["runs"] >= runs[k] + 30 for k in workers),
        )
        for k in workers:
            status = fleet.status(k)
            assert (status["stable"], status["canary"]) == (1, canary), json.dumps(status)
            assert "unreachable" in str(status["problem"]), json.dumps(status)
            served = ReleaseDirectories(fleet.root(k)).linked()  # the disk alone: no store
            assert served is not None
            assert served.version == 1
            assert ReleaseDirectories(fleet.root(k)).check(served, full=True) is None
    wait_for(
        "the workers to reconnect",
        lambda: all(
            fleet.status(k).get("connected") is True
            and fleet.status(k).get("listening") is listening
            for k in workers
        ),
    )
    # the test's own store reconnects too: the rollout is where the outage found it
    assert fleet.rollouts.get(record.rollout_id).state == "canary"
    heads = fleet.log.heads()
    assert (heads.stable, heads.canary) == (1, canary)
    fleet.rollouts.promote(canary, by=OPS)
    wait_for(
        "every worker on the promoted canary",
        lambda: all(
            fleet.status(k).get("stable") == canary and fleet.status(k).get("canary") is None
            for k in workers
        ),
    )
    latest = fleet.publish_edit("max_tokens: 2100", "max_tokens: 4096", stable=True)
    wait_for(
        "every worker on the next publication",
        lambda: all(fleet.status(k).get("stable") == latest for k in workers),
    )
    fleet.stop()  # a clean stop: each worker writes what it still holds, then says so
    final = {k: fleet.status(k) for k in workers}
    assert all(s.get("stopped") is True and s.get("unwritten") == 0 for s in final.values())
    counts = fleet.runs_by_release()
    # nothing lost, nothing twice: every run a worker served is one row
    assert sum(counts.values()) == sum(s["runs"] for s in final.values()), (counts, final)
    assert set(counts) <= {1, canary, latest}
    for k in workers:
        assert _whole_release(fleet, fleet.root(k)) == latest
        assert _no_staging(fleet, k)
    settled = fleet.rollouts.get(record.rollout_id)
    assert (settled.state, settled.reason) == ("promoted", "by_hand")
    mine = [
        json.loads(str(r.extra))
        for r in runs_after(fleet.store.connection(), 0, 1_000_000)
        if r.id <= settled.cursor and r.extra
    ]
    mine = [t for t in mine if t.get("rollout") == record.rollout_id]
    # the runs served while cut off were counted once the store was back, each once
    assert settled.evidence.canary_runs == sum(t["release"] == canary for t in mine)
    assert settled.evidence.stable_runs == sum(t["release"] == 1 for t in mine)
    steps = [e.edit_type for e in fleet.audit.entries()]
    assert steps.count("rollout_started") == 1
    assert steps.count("rollout_promoted") == 1
    assert fleet.audit.verify_chain().ok
