"""Record and replay: recorded through the real ``anthropic`` client against the fake Messages
API, replayed with the server stopped; bad cassettes, misses, redaction and a SIGKILLed recorder."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_messages_api import FakeMessagesAPI, Reply
from pydantic import BaseModel

from agentmend.infrastructure.definitions.spec import AgentSpec
from agentmend.infrastructure.llm.base import ToolSpec, Usage
from agentmend.infrastructure.llm.cassette import (
    CASSETTE_FORMAT,
    CASSETTE_VERSION,
    Cassette,
    CassetteError,
    CassetteMiss,
    RecordingRuntime,
    ReplayRuntime,
    request_fingerprint,
)
from agentmend.infrastructure.llm.tool_loop import (
    Message,
    ModelRequest,
    TextBlock,
    ToolDefinition,
)

KEY = "sk-ant-api03-TESTKEYdoNotLeak0123456789"
CHILD = Path(__file__).resolve().parents[2] / "recording_child.py"


def make_spec(**changes: Any) -> AgentSpec:
    fields: dict[str, Any] = {
        "name": "researcher",
        "description": "looks things up",
        "system_prompt": "You look things up.",
        "model": "haiku",
        "max_tokens": 512,
        "permission_profile": "open",  # the tool is made up for the test
    }
    fields.update(changes)
    return AgentSpec(**fields)


class LookupArgs(BaseModel):
    key: str


def lookup_tool(answer: str = "found") -> ToolSpec:
    async def lookup(arguments: dict[str, Any]) -> str:
        return f"{answer}: {arguments['key']}"

    return ToolSpec("lookup", "Look a key up.", lookup, input_model=LookupArgs)


async def record(api: FakeMessagesAPI, cassette: Path, *runs: tuple[AgentSpec, str]) -> list[Any]:
    runtime = RecordingRuntime(cassette, api_key=KEY, base_url=api.base_url)
    try:
        return [await runtime.run(spec, prompt, tools=[lookup_tool()]) for spec, prompt in runs]
    finally:
        await runtime.aclose()


async def test_a_recorded_conversation_replays_with_the_server_stopped(
    fake_api: FakeMessagesAPI, tmp_path: Path
) -> None:
    fake_api.enqueue(
        Reply.tool_use("lookup", {"key": "alpha"}, usage=Usage(100, 20)),
        Reply.text("alpha is found", usage=Usage(150, 10)),
    )
    cassette = tmp_path / "cassette.json"
    [recorded] = await record(fake_api, cassette, (make_spec(), "find alpha"))
    fake_api.close()  # nothing answers any more: the replay must not need it

    replayed = await ReplayRuntime(cassette).run(make_spec(), "find alpha", tools=[lookup_tool()])

    assert recorded.success, recorded.error
    assert replayed.success, replayed.error
    assert replayed.text == recorded.text == "alpha is found"
    assert [(c.name, c.input, c.output) for c in replayed.tool_calls] == [
        ("lookup", {"key": "alpha"}, "found: alpha")
    ]
    assert replayed.turns == 2
    assert replayed.usage == recorded.usage == Usage(250, 30)
    assert replayed.model == "claude-haiku-4-5"
    document = json.loads(cassette.read_text())
    assert (document["format"], document["version"]) == (CASSETTE_FORMAT, CASSETTE_VERSION)
    assert [(e["agent"], e["turn"]) for e in document["exchanges"]] == [
        ("researcher", 1),
        ("researcher", 2),
    ]
    assert document["exchanges"][0]["request"]["system"] == make_spec().full_system_prompt


async def test_no_key_or_auth_header_reaches_the_cassette(
    fake_api: FakeMessagesAPI, tmp_path: Path
) -> None:
    fake_api.set_fallback(Reply.text(f"the key you gave me is {KEY}"))
    cassette = tmp_path / "cassette.json"
    prompt = f"my key is {KEY}; also sk-ant-other-abcdef123"
    await record(fake_api, cassette, (make_spec(), prompt))

    headers = fake_api.message_requests()[0].headers
    assert KEY in headers.get("authorization", "") + headers.get("x-api-key", "")  # sent...
    text = cassette.read_text()
    assert KEY not in text  # ...and stored nowhere: not from the request, not from the answer
    assert "sk-ant-other-abcdef123" not in text
    assert "x-api-key" not in text
    assert "authorization" not in text.lower()
    assert text.count("***") == 3


async def test_a_request_not_recorded_names_the_agent_and_the_turn(
    fake_api: FakeMessagesAPI, tmp_path: Path
) -> None:
    fake_api.enqueue(Reply.tool_use("lookup", {"key": "alpha"}), Reply.text("done"))
    cassette = tmp_path / "cassette.json"
    await record(fake_api, cassette, (make_spec(), "find alpha"))
    replay = ReplayRuntime(cassette)

    with pytest.raises(CassetteMiss) as first_turn:
        await replay.run(make_spec(), "find beta", tools=[lookup_tool()])
    # the tool answers otherwise now: the second request differs from the recorded one
    with pytest.raises(CassetteMiss) as second_turn:
        await replay.run(make_spec(), "find alpha", tools=[lookup_tool("changed")])

    assert (first_turn.value.agent, first_turn.value.turn) == ("researcher", 1)
    assert (second_turn.value.agent, second_turn.value.turn) == ("researcher", 2)
    message = str(second_turn.value)
    assert "'researcher', turn 2" in message
    assert str(cassette) in message
    assert "--record" in message


async def test_the_same_question_asked_again_gets_its_answers_in_turn(
    fake_api: FakeMessagesAPI, tmp_path: Path
) -> None:
    fake_api.enqueue(Reply.text("one"), Reply.text("two"))
    cassette = tmp_path / "cassette.json"
    await record(fake_api, cassette, (make_spec(), "q"), (make_spec(), "q"))
    replay = ReplayRuntime(cassette)

    texts = [(await replay.run(make_spec(), "q", tools=[lookup_tool()])).text for _ in range(3)]

    assert texts == ["one", "two", "one"]
    assert len(Cassette.load(cassette)) == 1


async def test_recording_again_replaces_the_answers_and_keeps_the_rest(
    fake_api: FakeMessagesAPI, tmp_path: Path
) -> None:
    fake_api.enqueue(Reply.text("old a"), Reply.text("b"), Reply.text("new a"))
    cassette = tmp_path / "cassette.json"
    await record(fake_api, cassette, (make_spec(), "a"), (make_spec(), "b"))
    await record(fake_api, cassette, (make_spec(), "a"))
    replay = ReplayRuntime(cassette)

    assert (await replay.run(make_spec(), "a", tools=[lookup_tool()])).text == "new a"
    assert (await replay.run(make_spec(), "b", tools=[lookup_tool()])).text == "b"


def _request(**changes: Any) -> ModelRequest:
    fields: dict[str, Any] = {
        "agent_name": "a",
        "model": "m",
        "system": "s",
        "messages": (Message("user", (TextBlock("hi"),)),),
        "tools": (ToolDefinition("t", "d", {"type": "object"}),),
        "tool_choice": None,
        "max_tokens": 100,
        "temperature": None,
        "turn": 1,
    }
    fields.update(changes)
    return ModelRequest(**fields)


def test_the_fingerprint_covers_what_decides_the_answer_and_nothing_else() -> None:
    base = request_fingerprint(_request())
    assert request_fingerprint(_request()) == base
    # the agent's name and turn are labels, not part of what the model is asked
    assert request_fingerprint(_request(agent_name="b", turn=3)) == base
    for change in (
        {"model": "m2"},
        {"system": "s2"},
        {"messages": (Message("user", (TextBlock("hi!"),)),)},
        {"tools": ()},
        {"tool_choice": "t"},
        {"max_tokens": 101},
        {"temperature": 0.5},
    ):
        assert request_fingerprint(_request(**change)) != base, change


def _exchange(**changes: Any) -> dict[str, Any]:
    exchange: dict[str, Any] = {
        "fingerprint": "0" * 64,
        "agent": "a",
        "turn": 1,
        "request": {},
        "responses": [{"content": [{"type": "text", "text": "x"}], "stop_reason": "end_turn"}],
    }
    exchange.update(changes)
    return exchange


def _document(*exchanges: dict[str, Any], **changes: Any) -> str:
    document: dict[str, Any] = {
        "format": CASSETTE_FORMAT,
        "version": CASSETTE_VERSION,
        "exchanges": list(exchanges),
    }
    document.update(changes)
    return json.dumps(document)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"format": "agentmend-cassette", "version": 1, "exchan', "it is not JSON"),
        ("\xff\xfe", "it is not JSON"),
        ('{"exchanges": []}', "not an agentmend-cassette file"),
        (_document(version=2), "version 2 is not one this agentmend reads"),
        (_document(exchanges={}), "exchanges: not a list"),
        (_document(_exchange(fingerprint="abc")), "exchanges[0].fingerprint"),
        (_document(_exchange(responses=[])), "exchanges[0].responses: not a non-empty list"),
        (
            _document(_exchange(), _exchange(responses=[{"content": [{"type": "image"}]}])),
            "exchanges[1].responses[0].content[0]: not a text or tool_use block",
        ),
        (
            _document(_exchange(responses=[{"content": [], "usage": {"input_tokens": "9"}}])),
            "exchanges[0].responses[0].usage",
        ),
    ],
)
def test_a_bad_cassette_is_a_named_error_and_is_left_as_it_was(
    tmp_path: Path, content: str, problem: str
) -> None:
    cassette = tmp_path / "cassette.json"
    cassette.write_bytes(content.encode("utf-8", "surrogateescape"))
    before = cassette.read_bytes()

    with pytest.raises(CassetteError) as replaying:
        ReplayRuntime(cassette)
    with pytest.raises(CassetteError) as recording:
        Cassette.for_recording(cassette)

    for error in (replaying.value, recording.value):
        assert str(cassette) in str(error)
        assert problem in str(error), str(error)
    assert cassette.read_bytes() == before


def test_a_missing_cassette_or_folder_is_a_named_error(tmp_path: Path) -> None:
    with pytest.raises(CassetteError, match=r"does not exist .*--record"):
        ReplayRuntime(tmp_path / "none.json")
    with pytest.raises(CassetteError, match=r"the folder .* does not exist"):
        Cassette.for_recording(tmp_path / "no" / "such.json")
    with pytest.raises(CassetteError, match="it is a folder"):
        Cassette.for_recording(tmp_path)


def _kill_recorder_at_random(api: FakeMessagesAPI, cassette: Path, seed: int) -> set[int]:
    """Start a recorder, SIGKILL it at a random moment after a few exchanges; the ACKed ones."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), api.base_url, str(cassette)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    acked: set[int] = set()
    try:
        assert child.stdout is not None
        wanted = random.Random(seed).randint(2, 6)
        while len(acked) < wanted:
            line = child.stdout.readline()
            assert line, f"the recorder ended early: {child.stderr.read() if child.stderr else ''}"
            acked.add(int(line.split()[1]))
        time.sleep(random.Random(seed).uniform(0, 0.05))  # land anywhere, mid-write included
    finally:
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate(timeout=10)
    acked.update(int(line.split()[1]) for line in out.splitlines() if line.startswith("ACK"))
    assert child.returncode == -signal.SIGKILL
    return acked


@pytest.mark.slow
def test_a_recorder_killed_mid_recording_loses_no_acknowledged_exchange(
    fake_api: FakeMessagesAPI, tmp_path: Path
) -> None:
    sys.path.insert(0, str(CHILD.parent))
    from recording_child import SPEC, question

    # long answers: each rewrite of the file takes long enough for a kill to land inside one
    fake_api.set_fallback(Reply.text("an answer " * 4000))
    for trial in range(3):
        cassette = tmp_path / f"cassette-{trial}.json"
        acked = _kill_recorder_at_random(fake_api, cassette, seed=trial)

        replay = ReplayRuntime(cassette)  # loads whole: no half-written file
        for n in sorted(acked):
            result = asyncio.run(replay.run(SPEC, question(n)))
            assert result.text == "an answer " * 4000, (trial, n)
        assert len(replay.cassette) >= len(acked)


async def test_a_cassette_that_cannot_be_written_is_a_named_error(
    fake_api: FakeMessagesAPI, tmp_path: Path
) -> None:
    from user_project import make_unwritable, restore_writable

    folder = tmp_path / "cassettes"
    folder.mkdir()
    fake_api.set_fallback(Reply.text("an answer"))
    runtime = RecordingRuntime(folder / "cassette.json", api_key=KEY, base_url=fake_api.base_url)
    make_unwritable(folder)
    try:
        with pytest.raises(CassetteError, match="it cannot be written"):
            await runtime.run(make_spec(), "q")
    finally:
        restore_writable(folder)
        await runtime.aclose()
    assert list(folder.iterdir()) == []
