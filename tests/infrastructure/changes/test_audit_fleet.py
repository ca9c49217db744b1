"""The audit chain of a fleet: several hosts append to one PostgreSQL store, each with its head.

Each "host" is a ``Store`` of the test server's database with a files folder of its own, so each
keeps its own audit head file, as hosts do. With the HMAC key (the documented configuration) a
host's head vouches for the chain up to its row, and rows other hosts appended are accepted
when they verify under the key and link; tampering done to the database alone (by a plain
connection, without the key) is still a break. Without the key a head behind the chain is a
break, as on one host.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from agentmend.infrastructure.changes.audit.head import read_head
from agentmend.infrastructure.changes.audit.log import AuditChainBroken, AuditEntry, AuditLog
from agentmend.infrastructure.files.atomic import locked_file
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.principal import Principal
from agentmend.infrastructure.releases.follower import ReleaseFollower
from agentmend.infrastructure.releases.log import ReleaseLog
from agentmend.infrastructure.releases.rollout import Rollouts
from agentmend.infrastructure.simulation import copy_team
from agentmend.infrastructure.store.api import Store

KEY = "kept-off-the-database-server"
Host = Callable[..., AuditLog]


@pytest.fixture
def host(pg_url: str, tmp_path: Path) -> Iterator[Host]:
    """``host(name, key=KEY)``: the audit log of one host (its own files folder) on the store."""
    with ExitStack() as stack:

        def make(name: str, key: str | None = KEY) -> AuditLog:
            store = stack.enter_context(Store(pg_url, files_dir=tmp_path / name))
            return AuditLog(store, hmac_key=key)

        yield make


@pytest.fixture
def sql(pg_url: str, tmp_path: Path) -> Callable[..., None]:
    """Run one statement as someone who can write the database but holds no key."""

    def run(statement: str, *params: object) -> None:
        with Store(pg_url, files_dir=tmp_path / "db-writer") as store, store.transaction() as c:
            c.execute(statement, params)

    return run


def _append(audit: AuditLog, n: int) -> AuditEntry:
    return audit.append(agent_name="writer", edit_type="prompt", old_value=n, new_value=n + 1,
                        user_id=f"user-{n}")  # fmt: skip


def _head(audit: AuditLog) -> tuple[int, str] | None:
    with locked_file(audit.head_path) as fd:
        return read_head(fd, audit.head_path)


def _count(audit: AuditLog) -> int:
    return int(audit.store.connection().execute("SELECT COUNT(*) FROM audit_log").fetchone()[0])


def _kinds(audit: AuditLog) -> list[str]:
    return [p.kind for p in audit.verify_chain().problems]


def test_two_hosts_append_in_turn_and_both_verify(host: Host) -> None:
    a, b = host("host-a"), host("host-b")
    assert a.head_path != b.head_path
    for n in range(3):
        mine, theirs = _append(a, 2 * n), _append(b, 2 * n + 1)
        assert _head(a) == (mine.id, mine.row_hash)
        assert _head(b) == (theirs.id, theirs.row_hash)
    assert [e.id for e in a.entries()] == [1, 2, 3, 4, 5, 6]
    found = a.verify_chain()
    assert found.ok, found
    assert any("1 row(s) appended since verify under the key, moved forward" in n
               for n in found.notes)  # fmt: skip
    assert b.verify_chain().ok
    assert _head(a) == _head(b) == (6, b.entries()[-1].row_hash)


def test_hosts_appending_at_once_make_one_chain_that_every_host_verifies(host: Host) -> None:
    import threading

    hosts = [host("host-a"), host("host-b"), host("host-c")]
    refused: list[BaseException] = []

    def work(audit: AuditLog, worker: int) -> None:
        try:
            for n in range(10):
                audit.ensure_appendable()  # reads while the other hosts append
                _append(audit, 100 * worker + n)
        except BaseException as exc:  # reported by the assertion below
            refused.append(exc)

    threads = [
        threading.Thread(target=work, args=(audit, 2 * k + t))
        for k, audit in enumerate(hosts)
        for t in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert refused == []
    assert [e.id for e in hosts[0].entries(limit=100)] == list(range(1, 61))
    for audit in hosts:
        found = audit.verify_chain()
        assert found.ok, found


def test_a_host_that_has_seen_nothing_joins_by_checking_every_row(host: Host) -> None:
    a = host("host-a")
    for n in range(3):
        _append(a, n)
    c = host("host-c")
    found = c.verify_chain(repair=False)
    assert found.ok, found
    assert any("joins the chain at row 3, not started" in n for n in found.notes)
    assert _head(c) is None  # without repair the head file stays unwritten
    c.ensure_appendable()  # checks every row from the first, then starts the head
    assert _head(c) == _head(a)
    assert _append(c, 9).id == 4


def test_a_head_file_that_was_emptied_is_a_break_not_a_join(host: Host) -> None:
    a, b = host("host-a"), host("host-b")
    _append(a, 1)
    _append(b, 2)
    b.head_path.write_bytes(b" " * 256)  # a blank record: a head was kept here and is gone
    with pytest.raises(AuditChainBroken, match="missing or empty"):
        _append(b, 3)
    assert "head_missing" in _kinds(b)
    assert _count(b) == 2


def test_without_the_key_a_head_behind_the_chain_is_a_break_as_on_one_host(host: Host) -> None:
    a, b = host("host-a", key=None), host("host-b", key=None)
    _append(a, 1)
    _append(a, 2)  # (one commit over an empty head would pass as the crash state)
    with pytest.raises(AuditChainBroken, match="missing or empty"):
        _append(b, 3)
    assert _count(a) == 2
    assert "head_missing" in _kinds(b)


def _forge_after_newest(sql: Callable[..., None], audit: AuditLog, key: bytes | None) -> None:
    """Append a row linked to the newest one, hashed the way the log does (the scheme is
    public) but with ``key`` (a guess) or none, and marked keyed or not accordingly."""
    last = audit.entries()[-1]
    fields = [last.id + 1, last.timestamp.isoformat(), "writer", "prompt", None, "planted",
              "admin", None, None, last.row_hash, last.id + 1]  # fmt: skip
    message = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    digest = (
        hmac.new(key, message, hashlib.sha256).hexdigest()
        if key
        else hashlib.sha256(message).hexdigest()
    )
    sql(
        "INSERT INTO audit_log (id, timestamp, agent_name, edit_type, old_value, new_value,"
        " user_id, user_name, change_id, prev_hash, row_hash, keyed, batch)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        *fields[:10],
        digest,
        int(key is not None),
        fields[10],
    )


@pytest.mark.parametrize("guess", [b"a-guessed-key", None], ids=["wrong_key", "no_key"])
def test_rows_forged_without_the_key_are_refused_by_every_host(
    host: Host, sql: Callable[..., None], guess: bytes | None
) -> None:
    a, b = host("host-a"), host("host-b")
    _append(a, 1)
    _append(b, 2)
    _forge_after_newest(sql, b, guess)
    for audit in (a, b):
        forged = r"row 3 .* does not match its hash under the key"
        with pytest.raises(AuditChainBroken, match=forged) as refused:
            _append(audit, 3)
        assert refused.value.found.startswith("row 3")
        kinds = _kinds(audit)
        assert "head_mismatch" in kinds
        assert ("edited" if guess else "unkeyed") in kinds
    assert _count(a) == 3  # nothing was appended over the forgery
    assert _head(a) == (1, a.entries()[0].row_hash)  # and a's head did not move onto it


def test_deleting_the_row_a_hosts_head_names_is_a_break(
    host: Host, sql: Callable[..., None]
) -> None:
    a, b = host("host-a"), host("host-b")
    _append(a, 1)
    _append(a, 2)
    _append(b, 3)
    sql("DELETE FROM audit_log WHERE id = 2")
    with pytest.raises(AuditChainBroken, match="the row the head names is gone"):
        _append(a, 4)
    kinds = _kinds(a)
    assert "head_mismatch" in kinds
    assert "broken_link" in kinds  # row 3 no longer links to the row before it


@pytest.mark.parametrize("row_id", [2, 3], ids=["the_heads_row", "a_row_after_the_head"])
def test_rewriting_a_rows_text_is_a_break(
    host: Host, sql: Callable[..., None], row_id: int
) -> None:
    a, b = host("host-a"), host("host-b")
    _append(a, 1)
    _append(a, 2)  # a's head names row 2
    _append(b, 3)
    sql("UPDATE audit_log SET new_value = 'rewritten' WHERE id = ?", row_id)
    with pytest.raises(AuditChainBroken):
        _append(a, 4)
    found = a.verify_chain()
    assert (row_id, "edited") in [(p.row_id, p.kind) for p in found.problems]
    assert _count(a) == 3


def test_cutting_rows_below_a_hosts_head_is_a_break_for_that_host(
    host: Host, sql: Callable[..., None]
) -> None:
    a, b = host("host-a"), host("host-b")
    _append(a, 1)
    _append(b, 2)
    _append(a, 3)  # a's head names row 3, b's row 2
    sql("DELETE FROM audit_log WHERE id >= 3")
    assert "cut_off" in _kinds(a)
    with pytest.raises(AuditChainBroken, match="row 3"):
        _append(a, 4)
    # The documented residual risk: b never saw row 3, so b accepts the shorter chain and
    # appends; the gap its row leaves in the ids and a's head both still show the cut.
    assert _append(b, 4).id == 4
    assert "missing_rows" in _kinds(b)
    assert "head_mismatch" in _kinds(a)


def _reorder_newest(sql: Callable[..., None]) -> None:
    sql("UPDATE audit_log SET id = -1 WHERE id = 3")
    sql("UPDATE audit_log SET id = 3 WHERE id = 4")
    sql("UPDATE audit_log SET id = 4 WHERE id = -1")


def _rehash_newest(sql: Callable[..., None], newest: AuditEntry) -> None:
    """Rewrite the newest row and recompute its hash the way the log does, without the key."""
    fields = [newest.id, newest.timestamp.isoformat(), newest.agent_name, newest.edit_type,
              newest.old_value, "rewritten", newest.user_id, newest.user_name, newest.change_id,
              newest.prev_hash, newest.batch]  # fmt: skip
    message = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    sql(
        "UPDATE audit_log SET new_value = 'rewritten', row_hash = ? WHERE id = ?",
        hashlib.sha256(message).hexdigest(),
        newest.id,
    )


# The tamperings of the one-host tests (tests/infrastructure/changes/test_audit_breaks.py), done to
# the newest rows of a chain that host A saw up to row 2 and host B appended rows 3 and 4 to. Only
# the cuts pass on A, whose head is below them: the documented residual risk.
FLEET_TAMPERINGS: dict[str, Callable[[Callable[..., None], AuditLog], None]] = {
    "edit": lambda sql, _: sql("UPDATE audit_log SET new_value = 'nothing' WHERE id = 4"),
    "delete": lambda sql, _: sql("DELETE FROM audit_log WHERE id = 4"),
    "insert": lambda sql, audit: _forge_after_newest(sql, audit, None),
    "reorder": lambda sql, _: _reorder_newest(sql),
    "truncate_tail": lambda sql, _: sql("DELETE FROM audit_log WHERE id >= 3"),
    "rehash_newest": lambda sql, audit: _rehash_newest(sql, audit.entries()[-1]),
}
CUTS = {"delete", "truncate_tail"}


@pytest.mark.parametrize("tamper", sorted(FLEET_TAMPERINGS))
def test_every_tampering_of_the_newest_rows_is_a_break_for_the_host_that_wrote_them(
    host: Host, sql: Callable[..., None], tamper: str
) -> None:
    a, b = host("host-a"), host("host-b")
    _append(a, 1)
    _append(a, 2)
    _append(b, 3)
    _append(b, 4)
    FLEET_TAMPERINGS[tamper](sql, b)
    rows = _count(b)
    with pytest.raises(AuditChainBroken) as refused:
        _append(b, 5)
    assert refused.value.expected.startswith("row 4")
    assert not b.verify_chain().ok
    if tamper in CUTS:
        a.ensure_appendable()  # a never saw rows 3 and 4: it cannot tell they were cut
    else:
        with pytest.raises(AuditChainBroken):
            a.ensure_appendable()
        assert not a.verify_chain().ok
    assert _count(b) == rows  # nothing was appended over the tampering


def test_a_promotion_settled_by_another_hosts_poll_keeps_every_host_appending(
    pg_url: str, tmp_path: Path, host: Host
) -> None:
    """Host A publishes and starts a rollout; host B's follower settles it (a promotion is an
    audited write, refused over a broken head); A then publishes again."""
    cycle = Principal("cycle", "improvement cycle")
    source = copy_team(tmp_path / "team")
    audit_a, audit_b = host("host-a"), host("host-b")
    log_a = ReleaseLog(audit_a.store, "team-1", audit=audit_a)
    log_a.publish_directory(source, by=cycle)
    agent_file = source / "research-agent.md"
    agent_file.write_text(agent_file.read_text().replace("max_tokens: 2048", "max_tokens: 3000"))
    canary = log_a.publish_directory(source, by=cycle).version
    rollout = Rollouts(log_a).start(canary, by=cycle, share=0.5)

    log_b = ReleaseLog(audit_b.store, "team-1", audit=audit_b)
    follower = ReleaseFollower(log_b, tmp_path / "worker-b")
    monitor = PerformanceMonitor(audit_b.store, flush_interval_s=60)
    try:
        for i in range(3000):
            release = canary if i % 2 else 1
            monitor.record("research-agent", success=True, duration_ms=100.0,
                           release=release, rollout=rollout.rollout_id)  # fmt: skip
        monitor.flush()
        for _ in range(5):
            follower.poll()
    finally:
        monitor.close()
    assert Rollouts(log_b).get(rollout.rollout_id).state == "promoted"
    assert log_a.heads().stable == canary
    promoted = audit_b.entries()[-1]
    assert promoted.edit_type == "rollout_promoted"
    assert _head(audit_b) == (promoted.id, promoted.row_hash)
    agent_file.write_text(agent_file.read_text().replace("max_tokens: 3000", "max_tokens: 2500"))
    assert log_a.publish_directory(source, by=cycle, stable=True).version == canary + 1
    for audit in (audit_a, audit_b):
        found = audit.verify_chain()
        assert found.ok, found
