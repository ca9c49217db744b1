"""Oversized and absurdly nested JSON-RPC over real stdio: an error answer, the server stays up."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mcp_wire import McpProcess, deep_request, large_request
from tiny_project import make_project

from agentmend.faces.mcp.stdin import (
    INVALID_REQUEST,
    PARSE_ERROR,
    nesting_exceeds,
    not_a_message,
    request_id,
)


def test_the_depth_check_counts_brackets_outside_strings_only() -> None:
    assert not nesting_exceeds(b'{"a": [[1, 2], {"b": "[[[[[[[[[[["}]}', 3)
    assert nesting_exceeds(b'{"a": [[[1]]]}', 3)
    assert not nesting_exceeds(b'{"a": [[[1]]]}', 4)
    # too few brackets to nest too deep, paired or not: the JSON parser says what is wrong
    assert not nesting_exceeds(b'{"a": [}', 4)
    assert nesting_exceeds(b"[" * 65 + b"}", 64)  # more than the bound and unpaired: not parsed
    assert nesting_exceeds(deep_request(1, 200_000), 64)
    assert not nesting_exceeds(deep_request(1, 10), 64)


def test_a_line_that_is_no_json_rpc_message_is_named_by_its_kind() -> None:
    assert not_a_message(b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}') is None
    assert not_a_message(b"\n") is None
    assert not_a_message(b"hello there")[0] == PARSE_ERROR  # type: ignore[index]
    assert not_a_message(b'{"a": [}')[0] == PARSE_ERROR  # type: ignore[index]
    assert not_a_message(b'{"id": 3, "hello": 1}')[0] == INVALID_REQUEST  # type: ignore[index]
    assert not_a_message(b"42")[0] == INVALID_REQUEST  # type: ignore[index]


def test_the_request_id_is_found_at_the_top_level_only() -> None:
    assert request_id(b'{"params": {"id": 5}, "id": 9, "jsonrpc": "2.0"}') == 9
    assert request_id(b'{"jsonrpc": "2.0", "id": "abc"}') == "abc"
    assert request_id(b'{"jsonrpc": "2.0", "method": "x"}') is None


@pytest.fixture
def server(tmp_path: Path) -> McpProcess:
    project = make_project(tmp_path / "proj")
    return McpProcess(project / ".agentmend", project, AGENTMEND_MAX_REQUEST_BYTES="1000000")


def test_oversized_and_deep_requests_get_an_error_and_the_server_stays_up(
    server: McpProcess,
) -> None:
    try:
        assert server.initialize()["id"] == 0
        started = time.monotonic()
        server.send(large_request(7, 3_000_000))  # three times the limit set above
        big = server.receive(10.0)
        assert big["id"] == 7
        assert big["error"]["code"] == INVALID_REQUEST
        assert "over the limit of 1000000 bytes" in big["error"]["message"]
        server.send(deep_request(8, 200_000))
        deep = server.receive(10.0)
        assert time.monotonic() - started < 10.0
        assert deep["id"] == 8
        assert "nested deeper than 64 levels" in deep["error"]["message"]
        server.request(9, "tools/list")
        listed = server.receive(30.0)
        assert listed["id"] == 9
        assert {tool["name"] for tool in listed["result"]["tools"]} >= {"status", "memory"}
        server.send(large_request(10, 900_000))  # under the limit: passed on and answered
        within = server.receive(60.0)
        assert within["id"] == 10
        assert "error" not in within
    finally:
        server.close()


def test_every_line_gets_an_answer_and_the_server_stays_up(server: McpProcess) -> None:
    """Plain text, unpaired brackets and JSON that is no message: each answered by its kind."""
    try:
        assert server.initialize()["id"] == 0
        server.send(b"hello, is anyone there?")
        plain = server.receive(10.0)
        assert plain["id"] is None
        assert plain["error"]["code"] == PARSE_ERROR
        server.send(b'{"jsonrpc": "2.0", "id": 4, "method": [}')
        unpaired = server.receive(10.0)
        assert unpaired["error"]["code"] == PARSE_ERROR
        assert "nested deeper" not in unpaired["error"]["message"]
        server.send(b'{"id": 5, "what": "no method"}')
        shapeless = server.receive(10.0)
        assert (shapeless["id"], shapeless["error"]["code"]) == (5, INVALID_REQUEST)
        server.request(6, "tools/list")
        assert server.receive(30.0)["id"] == 6
    finally:
        server.close()
