"""The OTLP/HTTP receiver: point one more exporter (or a Collector) at agentmend.

``POST /v1/traces`` takes an OTLP trace export as ``application/x-protobuf`` or OTLP/JSON
(``application/json``, ids as hex strings), gzip-compressed or not, and records the agent runs
its spans describe (``agentmend.infrastructure.telemetry``) through a ``PerformanceMonitor``'s
buffered path. ``GET /status`` answers the counts as JSON (spans received, executions recorded,
duplicates, own spans skipped, unmappable, orphans, rejected), so what was lost is visible; the
program also writes them to the store every few seconds and when it stops
(``agentmend.infrastructure.telemetry.receiver_counts``), where ``agentmend status`` shows them.

``POST /v1/logs`` takes OTLP log exports the same ways and under the same rules: Claude Code's
default telemetry, whose events become runs (``claude_code_events`` in this package).
``POST /v1/metrics`` is answered 200 and its data points counted, so an exporter configured for
every signal logs no failure.

Telemetry is an authenticated source: every request, ``/status`` included, carries
``Authorization: Bearer <token>``. Without a token given, one is generated (``token``); on an
address other than loopback a token must be given. The ``Host`` header must name the server
(``agentmend.infrastructure.local_http``: loopback names, the bound address, ``allowed_hosts``),
so a web page cannot reach it through DNS rebinding.

Answers: 200 with an ``ExportTraceServiceResponse`` (its ``partial_success`` says how many
spans were rejected and why); 400 with a reason for a body that does not decode (garbage,
truncated protobuf, bad gzip, a JSON body that is not a trace export or nests too deeply); 401
without the bearer token; 403 for a ``Host`` that is not the server's; 408 for a body that stops
coming; 411 without a length; 413 for a body over ``max_body_bytes`` or one that decompresses
to more than ``max_decompressed_bytes`` (a gzip bomb is stopped there, not inflated); 415 for
another content type; 503 once it is stopping. No input stops the server: an unexpected failure is a
500 for that request alone, logged. Each connection has its thread and a time limit on reads;
``close()`` stops taking requests and waits for those being answered (``drain_timeout_s``), so
every run answered 200 has reached the assembler before the program closes its monitor.

Several receivers behind one load balancer: each assembles the traces it is sent on its own, so
the balancer must send every span of a trace to the same receiver (route by trace id, as the
OpenTelemetry Collector's ``loadbalancing`` exporter does); a trace split between receivers is
recorded without the spans the other receiver got, which that one counts as orphans.

This module is the server alone: it reads no flag and no environment variable. ``agentmend otel
receive`` (``agentmend.faces.cli.otel``) starts it from the command line; other faces and the
checker start it in process. Needs the ``[otel]`` extra.
"""

from __future__ import annotations

import hmac
import http.server
import json
import secrets
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, cast

from agentmend.infrastructure.errors import AgentmendError, ConfigurationError
from agentmend.infrastructure.local_http import HostCheck, LocalHTTPServer, is_loopback
from agentmend.infrastructure.structured_logger import get_logger
from agentmend.infrastructure.telemetry.assembly import TelemetryCounts, TraceAssembler
from agentmend.infrastructure.telemetry.claude_code_events import LogAssembler
from agentmend.infrastructure.telemetry.otlp_decode import (
    DecodedBatch,
    OtlpDecodeError,
    decode_json,
    decode_protobuf,
)
from agentmend.infrastructure.telemetry.otlp_logs import (
    decode_logs_json,
    decode_logs_protobuf,
    logs_answer,
    metric_points_json,
    metric_points_protobuf,
    metrics_answer,
)

__all__ = [
    "LOGS_PATH",
    "METRICS_PATH",
    "TRACES_PATH",
    "Answer",
    "OtlpReceiver",
]

log = get_logger(__name__)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
TRACES_PATH = "/v1/traces"
LOGS_PATH = "/v1/logs"
METRICS_PATH = "/v1/metrics"
EXPORT_PATHS = (TRACES_PATH, LOGS_PATH, METRICS_PATH)


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP answer: status, content type, body."""

    status: int
    content_type: str
    body: bytes
    allow: str | None = None  # a 405's ``Allow`` header: the methods the path takes

    @classmethod
    def text(cls, status: int, reason: str) -> Answer:
        return cls(status, "text/plain; charset=utf-8", reason.encode())

    @classmethod
    def wrong_method(cls, path: str, allow: str) -> Answer:
        return cls(
            405, "text/plain; charset=utf-8", f"{path} takes {allow} only".encode(), allow=allow
        )


class OtlpReceiver:
    """Decodes OTLP trace exports and feeds an assembler; serves HTTP on a thread pool.

    Args:
        assembler: turns spans into recorded executions.
        host: the address to listen on (loopback by default).
        port: 0 picks a free port (see ``address``).
        token: requests must carry ``Authorization: Bearer <token>``; None (or empty) makes
            one (read it from ``token``), which only a loopback ``host`` may do.
        allowed_hosts: ``Host`` names answered besides loopback's and the bound address (a
            load balancer's); ``*`` answers any.
        request_timeout_s: the longest a read from a client may wait.
        drain_timeout_s: how long ``close()`` waits for the requests being answered.
        max_body_bytes: the largest request body read.
        max_decompressed_bytes: the largest a gzip body may inflate to.
        expire_every_s: how often idle traces are flushed as orphans.
        publish: given the span counts every ``publish_every_s`` and once more at ``close()``
            (the program writes them, with ``logs.counts()``, to the store); a failure is
            logged, never raised.
        publish_every_s: how often ``publish`` is called while serving.
        logs: turns ``/v1/logs`` events (Claude Code's) into recorded runs; None: log records
            are answered 200 and counted as received and ignored (metric points are counted
            either way).
    """

    def __init__(
        self,
        assembler: TraceAssembler,
        *,
        host: str = "127.0.0.1",
        port: int = 4318,
        token: str | None = None,
        allowed_hosts: tuple[str, ...] = (),
        request_timeout_s: float = 30.0,
        drain_timeout_s: float = 10.0,
        max_body_bytes: int = 16 * 1024 * 1024,
        max_decompressed_bytes: int = 64 * 1024 * 1024,
        expire_every_s: float = 1.0,
        publish: Callable[[TelemetryCounts], None] | None = None,
        publish_every_s: float = 5.0,
        logs: LogAssembler | None = None,
    ) -> None:
        self.assembler = assembler
        self.logs = logs if logs is not None else LogAssembler(None)
        self.publish = publish
        self.publish_every_s = publish_every_s
        self.max_body_bytes = max_body_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        token = (token or "").strip() or None  # blank is no token
        if token is None and not is_loopback(host):
            raise ConfigurationError(
                f"the receiver on {host}, not a loopback address, needs a token: any host that "
                "reaches it could record runs"
            )
        self.token = token or secrets.token_urlsafe(32)
        self.hosts = HostCheck(host, allowed_hosts)
        self.drain_timeout_s = drain_timeout_s
        self._stop = threading.Event()
        self._expire_every_s = expire_every_s
        self._server = LocalHTTPServer(
            (host, port), _handler_for(self), request_timeout_s=request_timeout_s
        )
        self._threads: list[threading.Thread] = []
        self._serving = False

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def endpoint(self) -> str:
        """The base URL an exporter's ``OTEL_EXPORTER_OTLP_ENDPOINT`` should be."""
        host, port = self.address
        return f"http://{host}:{port}"

    # ------------------------------------------------------------------ running

    # how often the serving loop looks for close(): what closing waits at most (the standard
    # library's 0.5 s made every close of an embedded receiver take half a second)
    _SHUTDOWN_POLL_S = 0.05

    def start(self) -> OtlpReceiver:
        """Serve on background threads (tests, embedding); ``close()`` stops them."""
        self._serving = True
        for target, name in (
            (self._serve, "agentmend-otlp-server"),
            (self._expire_loop, "agentmend-otlp-expiry"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def serve_forever(self) -> None:
        """Serve on this thread until ``close()`` (from another thread) or Ctrl-C."""
        expiry = threading.Thread(target=self._expire_loop, daemon=True)
        expiry.start()
        self._threads.append(expiry)
        self._serving = True
        self._serve()

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=self._SHUTDOWN_POLL_S)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        """Stop taking requests, wait for those being answered (``drain_timeout_s``), stop.

        Idempotent.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        if self._serving:  # shutdown() waits for serve_forever(), which must have started
            self._server.shutdown()
        if not self._server.drain(self.drain_timeout_s):
            log.error("otlp_requests_cut_off", waited_s=self.drain_timeout_s)
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self.logs.flush_all()  # every run answered 200 is recorded before the monitor closes
        self.publish_counts()

    def publish_counts(self) -> None:
        """Hand the counts to ``publish``; a store that cannot take them never stops serving."""
        if self.publish is None:
            return
        try:
            self.publish(self.assembler.counts())
        except AgentmendError as exc:
            log.error("otlp_counts_not_written", error=str(exc))

    def _expire_loop(self) -> None:
        published = time.monotonic()
        while not self._stop.wait(self._expire_every_s):
            self.assembler.flush_expired()
            self.logs.flush_quiet()
            if time.monotonic() - published >= self.publish_every_s:
                self.publish_counts()
                published = time.monotonic()

    # ------------------------------------------------------------------ one request

    def authorized(self, header: str | None) -> bool:
        return header is not None and hmac.compare_digest(
            header.encode(), f"Bearer {self.token}".encode()
        )

    def export(
        self, content_type: str, encoding: str, body: bytes, path: str = TRACES_PATH
    ) -> Answer:
        """Answer one ``POST`` of an export (``path``: traces, logs or metrics), its length
        already checked."""
        media = content_type.split(";", 1)[0].strip().lower()
        if media not in (PROTOBUF, JSON):
            return Answer.text(
                415, f"content type {media or 'none'!r} is not supported: send {PROTOBUF} or {JSON}"
            )
        encoding = encoding.strip().lower()
        if encoding == "gzip":
            inflated = self._gunzip(body)
            if isinstance(inflated, Answer):
                return inflated
            body = inflated
        elif encoding not in ("", "identity"):
            return Answer.text(415, f"content encoding {encoding!r} is not supported: use gzip")
        try:
            if path == LOGS_PATH:
                return self._logs(media, body)
            if path == METRICS_PATH:
                return self._metrics(media, body)
            batch = decode_protobuf(body) if media == PROTOBUF else decode_json(body)
        except OtlpDecodeError as exc:
            return Answer.text(400, exc.reason)
        self.assembler.add(batch.spans, rejected=batch.rejected)
        return _success(media, batch)

    def _logs(self, media: str, body: bytes) -> Answer:
        decoded = decode_logs_protobuf(body) if media == PROTOBUF else decode_logs_json(body)
        self.logs.add(decoded.events, rejected=decoded.rejected)
        return Answer(200, media, logs_answer(media == PROTOBUF, decoded))

    def _metrics(self, media: str, body: bytes) -> Answer:
        points = metric_points_protobuf(body) if media == PROTOBUF else metric_points_json(body)
        self.logs.add_metric_points(points)
        return Answer(200, media, metrics_answer(media == PROTOBUF))

    def _gunzip(self, body: bytes) -> bytes | Answer:
        inflater = zlib.decompressobj(wbits=31)
        try:
            inflated = inflater.decompress(body, self.max_decompressed_bytes)
        except zlib.error as exc:
            return Answer.text(400, f"the gzip body does not decompress ({exc})")
        if inflater.unconsumed_tail or (
            len(inflated) == self.max_decompressed_bytes and not inflater.eof
        ):
            return Answer.text(
                413, f"the body decompresses to more than {self.max_decompressed_bytes} bytes"
            )
        if not inflater.eof:
            return Answer.text(400, "the gzip body is truncated")
        return inflated

    def status(self) -> Answer:
        counts = {**asdict(self.assembler.counts()), **asdict(self.logs.counts())}
        return Answer(200, JSON, json.dumps(counts).encode())


def _success(media: str, batch: DecodedBatch) -> Answer:
    message = "; ".join(batch.reasons)
    if media == JSON:
        partial = (
            {"partialSuccess": {"rejectedSpans": str(batch.rejected), "errorMessage": message}}
            if batch.rejected
            else {}
        )
        return Answer(200, JSON, json.dumps(partial).encode())
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTracePartialSuccess,
        ExportTraceServiceResponse,
    )

    response = ExportTraceServiceResponse()
    if batch.rejected:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(rejected_spans=batch.rejected, error_message=message)
        )
    return Answer(200, PROTOBUF, response.SerializeToString())


def _handler_for(receiver: OtlpReceiver) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "agentmend-otlp"

        def log_message(self, format: str, *args: Any) -> None:
            return None  # the receiver logs through its own logger

        def do_POST(self) -> None:
            self._guarded(self._post)

        def do_GET(self) -> None:
            self._guarded(self._get)

        def _guarded(self, answer: Callable[[], Answer]) -> None:
            # counted before stopping is checked, so close() waits for it
            with cast(LocalHTTPServer, self.server).answering():
                try:
                    result = self._refused() or answer()
                except TimeoutError:
                    self.close_connection = True
                    result = Answer.text(408, "the body stopped coming")
                except Exception:  # one bad request must never take the server down
                    log.exception("otlp_request_failed", path=self.path)
                    result = Answer.text(500, "internal error while recording the spans")
                self._send(result)

        def _refused(self) -> Answer | None:
            """The answer to a request that is not taken at all (None: it is)."""
            if receiver.stopping:
                self.close_connection = True
                return Answer.text(503, "the receiver is stopping")
            if not receiver.hosts.allows(self.headers.get("Host")):
                self.close_connection = True
                return Answer.text(403, "the Host is not this receiver's (see --allow-host)")
            if not receiver.authorized(self.headers.get("Authorization")):
                self.close_connection = True
                return Answer.text(401, "a bearer token is required")
            return None

        def _get(self) -> Answer:
            path = self.path.split("?", 1)[0]
            if path == "/status":
                return receiver.status()
            if path in EXPORT_PATHS:  # exporters POST; a GET is the wrong method, not a lost path
                return Answer.wrong_method(path, "POST")
            return Answer.text(404, f"no such path {self.path!r}: POST {TRACES_PATH}")

        def _post(self) -> Answer:
            if self.path.split("?", 1)[0] == "/status":
                self.close_connection = True  # its body is not read
                return Answer.wrong_method("/status", "GET")
            path = self.path.split("?", 1)[0]
            if path not in EXPORT_PATHS:
                self.close_connection = True
                return Answer.text(404, f"no such path {self.path!r}: POST {TRACES_PATH}")
            length_header = self.headers.get("Content-Length")
            if length_header is None:
                self.close_connection = True
                return Answer.text(411, "a Content-Length is required")
            try:
                length = int(length_header)
            except ValueError:
                self.close_connection = True
                return Answer.text(400, "the Content-Length is not a number")
            if length < 0 or length > receiver.max_body_bytes:
                self.close_connection = True  # the unread body must not be taken for a request
                if 0 < length <= 4 * receiver.max_body_bytes:
                    # read and drop a moderately oversized body in small pieces, so a client
                    # still sending gets the 413 rather than a reset connection
                    left = length
                    while left > 0:
                        piece = self.rfile.read(min(left, 65_536))
                        if not piece:
                            break
                        left -= len(piece)
                return Answer.text(413, f"the body is larger than {receiver.max_body_bytes} bytes")
            body = self.rfile.read(length)
            if len(body) < length:
                self.close_connection = True
                return Answer.text(400, "the body ended before its Content-Length")
            return receiver.export(
                self.headers.get("Content-Type", ""),
                self.headers.get("Content-Encoding", ""),
                body,
                path,
            )

        def _send(self, answer: Answer) -> None:
            try:
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                if answer.allow is not None:
                    self.send_header("Allow", answer.allow)
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(answer.body)
            except OSError:  # the client went away: nothing left to tell it
                self.close_connection = True

    return Handler


# -- the program --------------------------------------------------------------------------------
