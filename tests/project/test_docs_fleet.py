"""The fleet set-up of ``docs/fleet/postgresql.md`` (kind ``fleet-setup``), run as printed.

Two hosts are two folders, each the ``HOME`` (so ``~/.pgpass`` is its own) and working directory
of its commands, each with its own workspace ``.agentmend``, on one real PostgreSQL server that
asks for passwords (SCRAM over TCP), with agentmend installed from a wheel of this tree
(``user_venv``). The first host runs the first host's lines, the other the every-other-host
line; both export the key the first printed. Only ``SUBSTITUTIONS`` change the text. Then the
page's next block, the fleet checker, runs on both hosts, and each host sees the runs, changes,
audit rows and checkers of the other. Then ``docs/fleet/opentelemetry.md``'s receiver runs on each
host in turn, sent real spans by the real SDK's OTLP/HTTP exporter with the token it made, and
each host sees the runs both receivers recorded. No password appears in any output or workspace
file.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from doc_blocks import Block, of_kind
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from otel_helpers import SpanFactory
from pg_server import PgServer, PgUnavailable
from services import unavailable
from test_docs_examples import _wait_for_output
from user_project import UserVenv, user_venv

__all__ = ["user_venv"]  # the session fixture, used here by name

pytestmark = pytest.mark.slow

LOGIN, PASSWORD, DATABASE = "agentmend", "secret", "agentmend"  # as the page's ~/.pgpass line
SUPERUSER_PASSWORD = "Sup3rUserOnlyForTheTest"
PRINTED_KEY = "AGENTMEND_AUDIT_HMAC_KEY=..."

RUNS_FROM_THE_SECOND_HOST = 5
RECORD_RUNS = f"""\
from agentmend import Workspace

with Workspace.open(".agentmend") as ws:
    print(ws.monitor.get_metrics()["research-agent"].executions)  # the runs already recorded
    for _ in range({RUNS_FROM_THE_SECOND_HOST}):
        ws.monitor.record("research-agent", success=True, duration_ms=120.0)
"""


def _substitutions(port: int, key: str) -> list[tuple[str, str, str]]:
    """(as printed, as run, why): the only changes made to the block, applied in this order."""
    here = f"127.0.0.1:{port}"
    return [
        (
            "pip install '.[postgres]'   # psycopg 3 and psycopg_pool, from agentmend's checkout\n",
            "",
            "the install lines, this extra included, run from a checkout in "
            "test_docs_examples.py's install test; the user venv has agentmend and psycopg",
        ),
        ("db.internal:5432", here, "the test's server listens on loopback at a free port"),
        ("db.internal", here, "the same server, in the URL"),
        (
            PRINTED_KEY,
            f"AGENTMEND_AUDIT_HMAC_KEY={key}",
            "the key the first host's `store init` printed, where a secrets manager holds it",
        ),
    ]


RUNS_OVER_OTLP = {"otel-agent-of-host-1": 3, "otel-agent-of-host-2": 4}  # sent to each receiver
PRINTED_RECEIVER_PORT = "--port 4318"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _receiver_as_run(block: Block) -> tuple[str, int]:
    """The receiver's command line, and the port it listens on: the only change made to it."""
    (command,) = [line for line in block.text.splitlines() if line.startswith("agentmend ")]
    assert PRINTED_RECEIVER_PORT in command, f"stale substitution: {block}"
    # 4318 is OpenTelemetry's usual port, so others on the machine may hold it, and
    # test_docs_examples.py's server test binds it as printed, perhaps at the same time (-n 2)
    port = _free_port()
    return command.replace(PRINTED_RECEIVER_PORT, f"--port {port}"), port


def _receive_over_otlp(host: Host, block: Block, agent: str, runs: int) -> None:
    """The page's receiver on ``host``, sent ``runs`` runs of ``agent`` as an app exports them,
    then stopped as a service manager stops it (SIGTERM stores every run answered)."""
    command, port = _receiver_as_run(block)
    process = subprocess.Popen(
        ["bash", "-e", "-c", f"{host.exported}exec {command}"],
        cwd=host.home,
        env=host.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        line = _wait_for_output(process, 60).decode(errors="replace")
        assert process.poll() is None, f"{block} ended: {line}"
        assert f"127.0.0.1:{port}/v1/traces" in line, line
        # the token it made on first start, as the page's header reads it
        token = (host.home / ".agentmend" / "otlp-token").read_text().strip()
        spans = SpanFactory(service="instrumented-app")
        exporter = OTLPSpanExporter(
            endpoint=f"http://127.0.0.1:{port}/v1/traces",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        spans.provider.add_span_processor(BatchSpanProcessor(exporter))
        for _ in range(runs):
            spans.agent_run(agent, chats=[(40, 8)])
        assert spans.provider.force_flush(20_000)
        spans.close()
    finally:
        code, rest = _stop(process)
    host.outputs.append(line + rest)
    assert code == 0, f"{block}: exit {code}\n{line}{rest}"
    assert "Traceback" not in line + rest, rest


def _as_run(block: Block, port: int, key: str) -> str:
    text = block.text
    for printed, used, why in _substitutions(port, key):
        assert printed in text, f"stale substitution ({why}): {printed!r} is not in {block}"
        text = text.replace(printed, used)
    return text


@dataclass
class Host:
    """One host: a folder that is its HOME and working directory, and the lines it exported."""

    home: Path
    venv: UserVenv
    exported: str = ""
    outputs: list[str] = field(default_factory=list)  # everything it printed

    def env(self) -> dict[str, str]:
        env = self.venv.env(HOME=str(self.home), NO_COLOR="1")
        for name in ("PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE", "PGHOST", "PGPORT", "PGUSER"):
            env.pop(name, None)
        return env

    def run(self, script: str) -> str:
        """``script`` with bash (``-e``), after this host's exported lines; its stdout."""
        done = subprocess.run(
            ["bash", "-e", "-c", self.exported + script],
            cwd=self.home,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, f"{script}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stdout + done.stderr, script
        return done.stdout

    def json(self, command: str) -> Any:
        return json.loads(self.run(command))

    def team_id(self) -> str:
        return (self.home / ".agentmend" / "agents" / ".agent" / "team-id").read_text().strip()


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    """A server of this module's own on which every TCP login gives its password; the page's
    login owns the page's database."""
    import psycopg

    try:
        pg = PgServer(password=SUPERUSER_PASSWORD)
    except PgUnavailable as exc:
        unavailable(str(exc))
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {LOGIN} LOGIN PASSWORD '{PASSWORD}'")
            conn.execute(f"CREATE DATABASE {DATABASE} OWNER {LOGIN}")
        yield pg
    finally:
        pg.stop()


def _lines_for_each_host(text: str) -> tuple[list[str], list[str]]:
    """(the first host's lines up to its key, every other host's lines), by what each does."""
    lines = text.splitlines(keepends=True)
    (first,) = [i for i, line in enumerate(lines) if "--new-audit-key" in line]
    (others,) = [
        i
        for i, line in enumerate(lines)
        if line.startswith("agentmend store init") and "--new-audit-key" not in line
    ]
    (export,) = [i for i, line in enumerate(lines) if line.startswith("export ")]
    assert first < export < others  # the key is made, then exported, then other hosts join
    return lines[: first + 1], [line for i, line in enumerate(lines) if i != first]


def _start_watch(host: Host, block: Block) -> subprocess.Popen[bytes]:
    (command,) = [line for line in block.text.splitlines() if line.startswith("agentmend ")]
    # exec: the checker is the process the test signals, as a service manager would
    return subprocess.Popen(
        ["bash", "-e", "-c", f"{host.exported}exec {command}"],
        cwd=host.home,
        env=host.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _stop(process: subprocess.Popen[bytes]) -> tuple[int | None, str]:
    """SIGTERM, then its exit code (None: it had to be killed) and all it printed."""
    process.send_signal(signal.SIGTERM)
    code: int | None
    try:
        code = process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        code = None
    assert process.stdout is not None
    rest = process.stdout.read().decode(errors="replace")
    process.stdout.close()
    return code, rest


def _runs(status: dict[str, Any]) -> dict[str, int]:
    return {agent["agent"]: agent["runs"] for agent in status["agents"]}


def test_the_fleet_set_up_runs_as_printed_on_two_hosts_sharing_one_server(
    server: PgServer, user_venv: UserVenv, tmp_path: Path
) -> None:
    (block,) = of_kind("fleet-setup")
    (watch,) = [
        b for b in of_kind("server") if b.page == block.page and "agentmend watch" in b.text
    ]
    first, second = Host(tmp_path / "host-1", user_venv), Host(tmp_path / "host-2", user_venv)
    for host in (first, second):
        host.home.mkdir()

    # the first host: the password file, the store recorded, the fleet's key printed once
    # (its lines hold no key: the one substituted here is never run)
    first_lines, _ = _lines_for_each_host(_as_run(block, server.port, key="not-yet-printed"))
    printed = first.run("".join(first_lines))
    found = re.search(r"^AGENTMEND_AUDIT_HMAC_KEY=([0-9a-f]{64})$", printed, flags=re.M)
    assert found is not None, printed
    key = found.group(1)
    _, other_lines = _lines_for_each_host(_as_run(block, server.port, key=key))
    (export,) = [line for line in other_lines if line.startswith("export ")]
    first.exported = export  # every later process on the first host has the key
    # the first host's changes and audit rows, made with the key
    first.run("agentmend demo --workspace .agentmend")

    # another host: its own password file and workspace, the key exported, the same store
    printed = second.run("".join(other_lines))
    second.exported = export
    # the store holds keyed rows by now: without the key this would ask for it
    assert "note:" not in printed, printed
    for host in (first, second):
        recorded = (host.home / ".agentmend" / "store-url").read_text().strip()
        assert recorded == f"postgresql://{LOGIN}@127.0.0.1:{server.port}/{DATABASE}"

    # runs recorded on the second host, which first sees the first host's
    (second.home / "record_runs.py").write_text(RECORD_RUNS)
    seen_before = int(second.run("python record_runs.py"))
    assert seen_before > 0  # the demo's runs, recorded on the first host

    # the page's next block: the fleet checker, started on both hosts as printed
    checkers = [_start_watch(host, watch) for host in (first, second)]
    try:
        started = [_wait_for_output(process, 60).decode(errors="replace") for process in checkers]
        for process, line in zip(checkers, started, strict=True):
            assert process.poll() is None, f"{watch} ended: {line}"
            assert "checking team" in line or "standing by" in line, line
        seen = [
            host.json("agentmend status --json --workspace .agentmend") for host in (first, second)
        ]
    finally:
        stopped = [_stop(process) for process in checkers]
    for host, (code, rest), line in zip((first, second), stopped, started, strict=True):
        host.outputs.append(line + rest)
        assert code == 0, f"{watch}: exit {code}\n{line}{rest}"

    # both hosts see the same runs, the runs of each, and the same verified audit rows
    assert _runs(seen[0]) == _runs(seen[1])
    assert _runs(seen[0])["research-agent"] == seen_before + RUNS_FROM_THE_SECOND_HOST
    for status in seen:  # the second host verifies the first's rows under the key
        assert status["audit"]["ok"] is True, status["audit"]
        assert status["audit"]["rows_checked"] >= 2
    # the same checkers, ours, one for each host's team (status names them)
    listed = [
        sorted((c["team_id"], c["holder"], c["pid"]) for c in status["checkers"]) for status in seen
    ]
    assert listed[0] == listed[1]
    assert {pid for _, _, pid in listed[0]} <= {process.pid for process in checkers}
    assert {team for team, _, _ in listed[0]} == {first.team_id(), second.team_id()}
    # and the first host's changes, from either host
    histories = [
        host.json("agentmend history --json --workspace .agentmend") for host in (first, second)
    ]
    assert histories[0] == histories[1]
    assert {"kept", "rolled_back"} <= {change["status"] for change in histories[1]["changes"]}

    # the OpenTelemetry page's receiver, on each host in turn, each sent its own agent's runs
    (receive,) = [b for b in of_kind("server") if "agentmend otel receive" in b.text]
    for host, (agent, runs) in zip((first, second), RUNS_OVER_OTLP.items(), strict=True):
        _receive_over_otlp(host, receive, agent, runs)
    received = [
        host.json("agentmend status --json --workspace .agentmend") for host in (first, second)
    ]
    for status in received:  # both receivers' runs, exactly, from either host
        assert {a: n for a, n in _runs(status).items() if a in RUNS_OVER_OTLP} == RUNS_OVER_OTLP
        assert _runs(status) == {**_runs(seen[0]), **RUNS_OVER_OTLP}
        assert status["audit"]["ok"] is True, status["audit"]

    # the key is what makes the second host trust the first's rows: without it, no verdict
    unkeyed = subprocess.run(
        ["bash", "-c", "agentmend audit verify --json --workspace .agentmend"],
        cwd=second.home,
        env=second.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert unkeyed.returncode == 1, unkeyed.stdout + unkeyed.stderr
    assert json.loads(unkeyed.stdout)["verified"] is False
    second.outputs.append(unkeyed.stdout + unkeyed.stderr)

    # the password only ever in the password files, which libpq reads
    for host in (first, second):
        for output in host.outputs:
            assert not re.search(rf"\b{PASSWORD}\b", output), output
            assert SUPERUSER_PASSWORD not in output
        for path in (host.home / ".agentmend").rglob("*"):
            if path.is_file():
                assert not re.search(rb"\b%s\b" % PASSWORD.encode(), path.read_bytes()), path
        passfile = host.home / ".pgpass"
        assert passfile.read_text().strip().endswith(f":{DATABASE}:{LOGIN}:{PASSWORD}")
        assert passfile.stat().st_mode & 0o777 == 0o600
