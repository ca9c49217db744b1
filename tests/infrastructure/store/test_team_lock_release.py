"""A team lock's unlock is sent as its block ends and its answer read later, by the next lock.

The lock is free for other sessions as soon as the block ends (the server releases it when the
message arrives), the holder's session goes back to the pool with the next lock taken, and a
holder whose session was ended meanwhile is dropped without an error.
"""

from __future__ import annotations

import psycopg
from round_trips import PgRoundTrips

from agentmend.infrastructure.store import postgres
from agentmend.infrastructure.store.api import Store

_TEAM = "team-1"


def _advisory_holders(other: psycopg.Connection) -> list[int]:
    rows = other.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchall()
    return [int(row[0]) for row in rows]


def test_a_team_lock_costs_one_round_trip_and_is_free_once_its_block_ends(
    pg_url: str, counter: PgRoundTrips
) -> None:
    key = postgres._lock_key("team:" + _TEAM)
    with Store(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as other:
        store.connection()  # the store's own session opened outside the window
        with counter.window() as seen, store.team_lock(_TEAM):
            pass
        assert seen.count == 1, seen.statements  # the lock; the unlock is not waited for
        other.execute("SET lock_timeout = '10s'")  # the unlock is on its way, not lost
        other.execute("SELECT pg_advisory_lock(%s)", (key,))
        assert other.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone() == (True,)


def test_the_next_lock_reads_the_unlock_and_takes_the_same_session_again(
    pg_url: str,
) -> None:
    with Store(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as other:
        pids = []
        for _ in range(3):
            with store.team_lock(_TEAM):
                pids.append(_advisory_holders(other))
        assert len(pids[0]) == 1
        assert pids == [pids[0]] * 3  # one session, taken again
    # closing the store read the last unlock's answer and closed the session
    with psycopg.connect(pg_url, autocommit=True) as after:
        assert _advisory_holders(after) == []


def test_a_holder_whose_session_was_ended_is_dropped_and_replaced(pg_url: str) -> None:
    with Store(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as other:
        with store.team_lock(_TEAM):
            (first,) = _advisory_holders(other)
            other.execute("SELECT pg_terminate_backend(%s)", (first,))
        # ended with its session: the lock is free, and the next one takes a new session
        with store.team_lock(_TEAM):
            (second,) = _advisory_holders(other)
        assert second != first
        with store.team_lock("team-2"):  # team 1's second lock was released too
            assert len(_advisory_holders(other)) == 1
