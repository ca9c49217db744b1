"""The receiver as an authenticated source, over real HTTP with hostile headers.

Every request needs the bearer token (one is generated when none is given), ``/status``
included; a ``Host`` that is not the receiver's (DNS rebinding) is refused; a client that stops
halfway blocks nobody; off loopback there is no receiver without a token given.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from otel_helpers import Recorder, SpanFactory, auth, post

from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.local_http import HostCheck, host_name, is_loopback
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.receiver import OtlpReceiver


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def receiver(recorder: Recorder) -> Iterator[OtlpReceiver]:
    made = OtlpReceiver(TraceAssembler(recorder), port=0, request_timeout_s=0.5).start()
    yield made
    made.close()


@pytest.fixture
def spans() -> Iterator[SpanFactory]:
    factory = SpanFactory()
    yield factory
    factory.close()


def _raw(receiver: OtlpReceiver, request: bytes) -> bytes:
    """Send ``request`` as it is; the status line answered."""
    host, port = receiver.address
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(request)
        return conn.recv(4096).split(b"\r\n", 1)[0]


def _export_request(receiver: OtlpReceiver, body: bytes, host: bytes | None) -> bytes:
    lines = [b"POST /v1/traces HTTP/1.1"]
    if host is not None:
        lines.append(b"Host: " + host)
    lines += [
        b"Authorization: Bearer " + receiver.token.encode(),
        b"Content-Type: application/x-protobuf",
        b"Content-Length: " + str(len(body)).encode(),
        b"Connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def test_without_a_token_given_one_is_generated_and_every_path_requires_it(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory
) -> None:
    assert len(receiver.token) >= 32
    spans.agent_run("writer")
    body = spans.body()
    target = receiver.endpoint + "/v1/traces"
    assert post(target, body, token=None)[0] == 401
    assert post(target, body, token="")[0] == 401
    assert post(target, body, token=receiver.token + "x")[0] == 401
    assert recorder.records == []
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(receiver.endpoint + "/status", timeout=5)
    assert refused.value.code == 401
    refused.value.close()
    assert post(target, body, token=receiver.token)[0] == 200
    status = urllib.request.Request(receiver.endpoint + "/status", headers=auth(receiver.token))
    with urllib.request.urlopen(status, timeout=5) as answer:
        assert b'"executions_recorded": 1' in answer.read()


def test_two_receivers_never_share_a_generated_token(recorder: Recorder) -> None:
    first = OtlpReceiver(TraceAssembler(recorder), port=0)
    second = OtlpReceiver(TraceAssembler(recorder), port=0)
    try:
        assert first.token != second.token
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize(
    "host",
    [b"evil.example", b"evil.example:4318", b"127.0.0.1.evil.example", b"localhost.evil.example"],
)
def test_a_host_that_is_not_the_receivers_is_refused_and_records_nothing(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory, host: bytes
) -> None:
    # what a page served from a rebound name sends: the token would not save a stolen one
    spans.agent_run("writer")
    status = _raw(receiver, _export_request(receiver, spans.body(), host))
    assert status == b"HTTP/1.1 403 Forbidden"
    assert recorder.records == []


def test_no_host_at_all_is_refused(receiver: OtlpReceiver, spans: SpanFactory) -> None:
    spans.agent_run("writer")
    assert _raw(receiver, _export_request(receiver, spans.body(), None)).startswith(b"HTTP/1.1 403")


@pytest.mark.parametrize("host", [b"127.0.0.1", b"localhost", b"LOCALHOST.", b"[::1]"])
def test_the_loopback_names_are_answered(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory, host: bytes
) -> None:
    spans.agent_run("writer")
    port = str(receiver.address[1]).encode()
    status = _raw(receiver, _export_request(receiver, spans.body(), host + b":" + port))
    assert status == b"HTTP/1.1 200 OK"
    assert len(recorder.records) == 1


def test_a_load_balancers_name_is_answered_once_allowed(
    recorder: Recorder, spans: SpanFactory
) -> None:
    receiver = OtlpReceiver(
        TraceAssembler(recorder), port=0, allowed_hosts=("otel.internal.example",)
    ).start()
    try:
        spans.agent_run("writer")
        body = spans.body()
        assert _raw(receiver, _export_request(receiver, body, b"otel.internal.example:443"))[
            9:12
        ] == (b"200")
        assert _raw(receiver, _export_request(receiver, body, b"evil.example"))[9:12] == b"403"
    finally:
        receiver.close()
    assert len(recorder.records) == 1


def test_a_client_that_stops_halfway_blocks_nobody_and_is_cut_off(
    receiver: OtlpReceiver, recorder: Recorder, spans: SpanFactory
) -> None:
    host, port = receiver.address
    with socket.create_connection((host, port), timeout=10) as stalled:
        stalled.sendall(b"POST /v1/tr")  # half a request line, then nothing
        spans.agent_run("writer")
        # answered while the stalled client still holds its connection
        assert post(receiver.endpoint + "/v1/traces", spans.body(), token=receiver.token)[0] == 200
        # and the server ends the stalled connection after its read timeout
        assert stalled.recv(1024) == b""
    with socket.create_connection((host, port), timeout=10) as slow_body:
        head = _export_request(receiver, b"x" * 100, b"127.0.0.1").split(b"\r\n\r\n")[0]
        slow_body.sendall(head + b"\r\n\r\n" + b"x" * 10)  # 10 of the 100 bytes promised
        assert slow_body.recv(1024).startswith(b"HTTP/1.1 408")
    assert len(recorder.records) == 1


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "otel.example"])
@pytest.mark.parametrize("token", [None, "", "  "])
def test_off_loopback_there_is_no_receiver_without_a_token(
    recorder: Recorder, host: str, token: str | None
) -> None:
    with pytest.raises(ConfigurationError, match="needs a token"):
        OtlpReceiver(TraceAssembler(recorder), host=host, port=0, token=token)


def test_the_host_check_answers_the_bound_names_and_ip_literals_on_every_address() -> None:
    bound_everywhere = HostCheck("0.0.0.0")
    assert bound_everywhere.allows("10.1.2.3:4318")  # an IP literal cannot be rebound
    assert bound_everywhere.allows("[fe80::1]:4318")
    assert not bound_everywhere.allows("evil.example:4318")
    one_address = HostCheck("192.0.2.7")
    assert one_address.allows("192.0.2.7:4318")
    assert one_address.allows("localhost")
    assert not one_address.allows("10.1.2.3")
    assert HostCheck("127.0.0.1", ["*"]).allows("anything.example")
    assert not HostCheck("127.0.0.1").allows("")
    assert host_name("[::1]:80") == "::1"
    assert host_name("Example.COM.:8080") == "example.com"
    assert (is_loopback("127.0.0.2"), is_loopback("::1"), is_loopback("0.0.0.0")) == (
        True,
        True,
        False,
    )
