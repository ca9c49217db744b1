"""The store's bounds: from the settings, on every PostgreSQL session, lifted for migrations
and ``store copy``; a file lock taken with a deadline; a bound that runs out names its setting."""

from __future__ import annotations

import fcntl
import os
import pickle
import time
from pathlib import Path

import pytest

from agentmend.infrastructure.errors import LockTimeout, StoreError
from agentmend.infrastructure.files.atomic import locked_file
from agentmend.infrastructure.files.lock_wait import LockWait
from agentmend.infrastructure.settings import InvalidSetting, load_settings
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.store.timeouts import StoreTimeouts


def test_the_bounds_come_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTMEND_STORE_LOCK_TIMEOUT_S", "2.5")
    monkeypatch.setenv("AGENTMEND_TEAM_LOCK_TIMEOUT_S", "40")
    monkeypatch.setenv("AGENTMEND_STORE_STATEMENT_TIMEOUT_S", "7")
    monkeypatch.setenv("AGENTMEND_STORE_IDLE_TRANSACTION_TIMEOUT_S", "9")
    timeouts = StoreTimeouts.from_settings(load_settings())
    assert timeouts == StoreTimeouts(lock_s=2.5, team_lock_s=40, statement_s=7, idle_s=9)
    assert timeouts.for_bulk_work() == StoreTimeouts(
        lock_s=2.5, team_lock_s=40, statement_s=None, idle_s=None
    )
    monkeypatch.setenv("AGENTMEND_STORE_LOCK_TIMEOUT_S", "0")
    with pytest.raises(InvalidSetting, match="AGENTMEND_STORE_LOCK_TIMEOUT_S='0'"):
        load_settings()


def test_lock_timeout_names_the_lock_the_wait_and_the_setting_and_survives_pickle() -> None:
    error = LockTimeout("the store's write lock", "db", 1.5, "store_lock_timeout_s", cause="55P03")
    assert isinstance(error, StoreError)
    text = str(error)
    assert "the store's write lock on db after 1.5 s" in text
    assert "Settings.store_lock_timeout_s (AGENTMEND_STORE_LOCK_TIMEOUT_S)" in text
    again = pickle.loads(pickle.dumps(error))
    assert (again.lock, again.waited_s, again.setting, again.cause, str(again)) == (
        error.lock, 1.5, "store_lock_timeout_s", "55P03", text
    )  # fmt: skip


def test_a_file_lock_held_elsewhere_is_given_up_after_its_wait(tmp_path: Path) -> None:
    path = tmp_path / "head"
    other = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # another open file description
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        wait = LockWait(0.05, "the audit head's file lock", "store_lock_timeout_s")
        with (
            pytest.raises(LockTimeout, match=r"the audit head's file lock on .*after 0\.05 s"),
            locked_file(path, wait),
        ):
            pass
        fcntl.flock(other, fcntl.LOCK_UN)
        with locked_file(path, wait) as fd, locked_file(path, wait) as again:
            assert again == fd  # free: taken at once, and re-entrant as before
    finally:
        os.close(other)


def test_every_postgresql_session_carries_the_bounds(pg_url: str) -> None:
    timeouts = StoreTimeouts(lock_s=1.5, team_lock_s=4, statement_s=7, idle_s=9)
    with Store(pg_url, timeouts=timeouts) as store:
        conn = store.connection()
        shown = [conn.execute(f"SHOW {name}").fetchone()[0] for name in _BOUNDS]
        assert shown == ["1500ms", "7s", "9s"]


def test_the_urls_own_session_options_are_kept_beside_the_bounds(pg_url: str) -> None:
    url = pg_url + "?options=-c%20application_name%3Dfleet-7"
    with Store(url, timeouts=StoreTimeouts(lock_s=2)) as store:
        conn = store.connection()
        assert conn.execute("SHOW application_name").fetchone()[0] == "fleet-7"
        assert conn.execute("SHOW lock_timeout").fetchone()[0] == "2s"


def test_a_team_lock_held_elsewhere_is_given_up_after_its_own_wait(pg_url: str) -> None:
    # the write lock's bound is far shorter: the team lock waits by its own
    waiting = StoreTimeouts(lock_s=0.01, team_lock_s=0.3)
    with Store(pg_url) as holder, Store(pg_url, timeouts=waiting) as other:
        with holder.team_lock("t1"):
            with (
                pytest.raises(LockTimeout, match=r"team t1's lock .*after 0\.3 s") as caught,
                other.team_lock("t1"),
            ):
                pass
            assert (caught.value.setting, caught.value.cause) == ("team_lock_timeout_s", "55P03")
            with other.team_lock("t2"):  # another team's lock is free
                pass
        with other.team_lock("t1"):  # released: taken at once
            pass


def test_a_statement_past_its_bound_is_cancelled_naming_the_setting(pg_url: str) -> None:
    with Store(pg_url, timeouts=StoreTimeouts(statement_s=0.2)) as store:
        with pytest.raises(StoreError, match="AGENTMEND_STORE_STATEMENT_TIMEOUT_S") as caught:
            store.connection().execute("SELECT pg_sleep(2)")
        assert caught.value.cause == "57014"


def test_a_migration_runs_past_the_statement_bound_and_keeps_it_after(pg_url: str) -> None:
    with Store(pg_url, timeouts=StoreTimeouts(statement_s=0.2, idle_s=0.5)) as store:
        store.migrate("slow", ["CREATE TABLE slow (x INTEGER); SELECT pg_sleep(0.5)"])
        assert store.schema_version("slow") == 1
        conn = store.connection()
        assert [conn.execute(f"SHOW {name}").fetchone()[0] for name in _BOUNDS] == [
            "30s", "200ms", "500ms"
        ]  # fmt: skip


_BOUNDS = ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")


def test_a_transaction_left_idle_past_its_bound_is_ended_by_the_server(pg_url: str) -> None:
    def stalled_insert(store: Store) -> None:
        with store.transaction() as conn:
            conn.execute("INSERT INTO things (x) VALUES (1)")
            time.sleep(0.6)  # a process stopped here: the server ends its session
            conn.execute("INSERT INTO things (x) VALUES (2)")

    with Store(pg_url, timeouts=StoreTimeouts(idle_s=0.2)) as store:
        store.migrate("things", ["CREATE TABLE things (x INTEGER)"])
        bound = "AGENTMEND_STORE_IDLE_TRANSACTION_TIMEOUT_S"
        with pytest.raises(StoreError, match=bound) as caught:
            stalled_insert(store)
        assert caught.value.cause == "25P03"
        # rolled back whole, and the next statement opens a fresh session
        assert store.connection().execute("SELECT count(*) FROM things").fetchone() == (0,)


def test_long_work_lifts_the_bounds_for_its_own_transaction_only(pg_url: str) -> None:
    # what a whole-store copy does on both sides: the source's snapshot stays open while
    # the target is written, and a table goes in one transaction however large
    with Store(pg_url, timeouts=StoreTimeouts(statement_s=0.2, idle_s=0.2)) as store:
        conn = store.connection()
        with store.snapshot():
            store.lift_timeouts()
            time.sleep(0.4)  # idle past the bound, unharmed
            conn.execute("SELECT pg_sleep(0.3)")  # a statement past the bound, unharmed
            lifted = [conn.execute(f"SHOW {name}").fetchone()[0] for name in _BOUNDS]
        assert lifted == ["0", "0", "0"]
        after = [conn.execute(f"SHOW {name}").fetchone()[0] for name in _BOUNDS]
        assert after == ["30s", "200ms", "200ms"]
