"""The session's standard-input reader outliving its session, as in an app or a test that runs
a session and goes on."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from agentmend.faces.session.input import LineReader


def test_input_arriving_after_the_session_ended_is_dropped_without_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_end, write_end = os.pipe()
    stdin = os.fdopen(read_end, "r")
    monkeypatch.setattr("sys.stdin", stdin)
    errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", errors.append)

    loop = asyncio.new_event_loop()
    try:
        reader = LineReader(loop)
        os.write(write_end, b"first\n")
        assert loop.run_until_complete(asyncio.wait_for(reader.read(), 10)) == "first"
    finally:
        loop.close()  # the session is over; its reader still waits on standard input
    os.write(write_end, b"too late\n")
    os.close(write_end)
    reader._thread.join(timeout=10)
    stdin.close()

    assert not reader._thread.is_alive()
    assert errors == []
