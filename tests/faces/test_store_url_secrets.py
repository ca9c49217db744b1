"""A store URL's password never leaves the process: every face's output is searched for it.

A password is planted in the store URL, valid (a real PostgreSQL server, which accepts any
password here) and malformed in the ways that used to print it (``%ZZ`` in the password, an
unclosed ``[``, an unescaped ``@``, an unknown scheme, a ``password=`` parameter). Then the
command's subcommands (their output, their one-line errors, ``--json``, the report's HTML),
the MCP tools (answers and errors), the receiver program and the MCP server process (their
logs on stderr) and ``repr`` are searched for every piece of it.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import ROOT, run_cli
from mcp.client import Client
from pg_server import PgServer

from agentmend.faces.mcp.server import build_server
from agentmend.faces.mcp.tools import AgentmendTools
from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.redaction import redact, redact_url
from agentmend.infrastructure.settings import Settings
from agentmend.infrastructure.store.api import Store
from agentmend.infrastructure.structured_logger import configure_logging, get_logger

pytestmark = pytest.mark.usefixtures("restore_logging")

# the two halves are searched for apart too: a parser may split the password at its "@"
HEAD, TAIL = "Pl4ntedHead", "S3cretTail"
PASSWORD = f"{HEAD}{TAIL}"
WORKING = ("valid", "query")  # the test server accepts any password


def _urls(database: str) -> dict[str, str]:
    """Store URLs holding the planted password: one valid, the rest malformed."""
    rest = database.removeprefix("postgresql://postgres@")
    return {
        "valid": f"postgresql://postgres:{PASSWORD}@{rest}",
        "query": f"postgresql://postgres@{rest}?password={PASSWORD}",
        "percent": f"postgresql://postgres:{PASSWORD}%ZZ@{rest}",
        "ipv6": f"postgresql://postgres:{PASSWORD}@[::1:5432/db",
        "at": f"postgresql://postgres:{HEAD}@{TAIL}@{rest}",
        "scheme": f"postgresql+psycopg://postgres:{PASSWORD}@{rest}",
    }


def _assert_secret_free(text: str, where: str) -> None:
    for piece in (PASSWORD, HEAD, TAIL):
        assert piece not in text, f"{where} shows the password: {text[:400]!r}"


@pytest.fixture(scope="module")
def store_urls(pg_server: PgServer) -> dict[str, str]:
    return _urls(pg_server.create_database())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["valid", "query", "percent", "ipv6", "at", "scheme"])
def test_no_subcommand_shows_the_store_password(
    kind: str, store_urls: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = store_urls[kind]
    workspace = tmp_path / "ws"
    workspace.mkdir()
    page = tmp_path / "report.html"
    common = ("--workspace", str(workspace), "--store", url)
    outcomes: list[int] = []
    for argv in (
        ("status", *common),
        ("status", "--json", *common),
        ("history", "--json", *common),
        ("audit", "verify", *common),
        ("store", "--json", *common),
        ("release", "list", *common),
        ("report", "--output", str(page), *common),
        ("store", "copy", url, str(tmp_path / "copy.db"), "--workspace", str(workspace)),
        ("status", "--workspace", str(workspace), "--store", url, "--no-such-flag"),
    ):
        code, out, err = run_cli(capsys, *argv)
        outcomes.append(code)
        _assert_secret_free(out + err, f"agentmend {' '.join(argv[:2])}")
        if page.exists():
            _assert_secret_free(page.read_text(encoding="utf-8"), "the report page")
    # the check above searched real answers: the valid stores worked, the others were refused
    if kind in WORKING:
        assert outcomes[0] == 0
        assert page.exists()
    else:
        assert outcomes[0] in (2, 3)
        assert not page.exists()


async def test_no_mcp_tool_answer_shows_the_store_password(
    store_urls: dict[str, str], tmp_path: Path
) -> None:
    for kind, url in store_urls.items():
        workspace = tmp_path / kind  # made by self_improve's first call, on a working store
        tools = AgentmendTools(workspace, project_root=tmp_path, settings=Settings(store_url=url))
        answered = 0
        try:
            async with Client(build_server(tools), read_timeout_seconds=60) as client:
                for tool, arguments in (
                    ("self_improve", {"action": "status"}),
                    ("status", {}),
                    ("memory", {"query": "config"}),
                    ("memory", {"query": "history"}),
                    ("memory", {"query": "audit"}),
                ):
                    result = await client.call_tool(tool, arguments)
                    answered += not result.is_error
                    shown = "".join(getattr(b, "text", "") for b in result.content)
                    _assert_secret_free(shown + repr(result.structured_content), f"{kind} {tool}")
        finally:
            await tools.aclose()
        # memory config answers with the settings themselves on the valid store
        assert answered == (5 if kind in WORKING else 0), kind


@pytest.mark.slow
def test_the_programs_logs_and_errors_never_show_the_store_password(
    store_urls: dict[str, str], tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".typing"), "NO_COLOR": "1"}
    env.pop("AGENTMEND_STORE_URL", None)  # the one under test is passed explicitly
    for kind in ("percent", "ipv6", "at", "scheme"):
        # refused at once: the one-line error is the whole output
        receiver = subprocess.run(
            [sys.executable, "-m", "agentmend.otel_receiver", "--port", "0",
             "--workspace", str(tmp_path / "otel"), "--store", store_urls[kind]],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert receiver.returncode in (2, 3), receiver.stderr
        _assert_secret_free(receiver.stdout + receiver.stderr, f"otel receive ({kind})")
        # the interactive session's program: one line, exit 2 or 3
        session = subprocess.run(
            [sys.executable, str(ROOT / "main.py"), "--demo",
             "--workspace", str(tmp_path / "session"), "--store", store_urls[kind]],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert session.returncode in (2, 3), session.stderr
        _assert_secret_free(session.stdout + session.stderr, f"main.py ({kind})")
    # the MCP server logs the store it cannot open on stderr (protocol on stdout)
    server = subprocess.Popen(
        [sys.executable, "-m", "agentmend.mcp_server", "--workspace", str(tmp_path / "mcp")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env={**env, "AGENTMEND_STORE_URL": store_urls["percent"]},
    )  # fmt: skip
    out, err = server.communicate(b"", timeout=60)
    assert b"workspace_unavailable" in err
    _assert_secret_free((out + err).decode(), "the MCP server's log")


@pytest.mark.slow
def test_the_receiver_program_on_a_valid_store_never_logs_its_password(
    store_urls: dict[str, str], tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".typing"), "NO_COLOR": "1"}
    receiver = subprocess.Popen(
        [sys.executable, "-m", "agentmend.otel_receiver", "--port", "0",
         "--workspace", str(tmp_path / "otel"), "--store", store_urls["valid"]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert receiver.stderr is not None
        started = receiver.stderr.readline()  # the first line says where it listens
        assert "receiving OTLP traces" in started, started
    finally:
        receiver.send_signal(signal.SIGTERM)
        out, err = receiver.communicate(timeout=60)
    assert receiver.returncode == 0, err
    _assert_secret_free(started + out + err, "otel receive (valid)")


def test_log_lines_and_tracebacks_are_redacted(store_urls: dict[str, str]) -> None:
    sink = io.StringIO()
    configure_logging("DEBUG", stream=sink)
    log = get_logger("agentmend.test")
    for url in store_urls.values():
        log.error("store_failed", url=url, error=f"cannot open {url}")
        try:
            raise StoreError(f"cannot open {url}")
        except StoreError:
            log.exception("store_failed_with_traceback")
    # stdlib's own records (a host application's handler) are redacted as well
    handler_sink = io.StringIO()
    handler = logging.StreamHandler(handler_sink)
    logging.getLogger("agentmend").addHandler(handler)
    try:
        log.warning("store_failed", url=store_urls["valid"])
        try:
            raise StoreError(f"cannot open {store_urls['valid']}")
        except StoreError:
            log.exception("store_failed_with_traceback")
    finally:
        logging.getLogger("agentmend").removeHandler(handler)
    logged = len(store_urls) + 1  # the last one with the host's handler beside ours
    assert sink.getvalue().count("[error    ] store_failed_with_traceback") == logged
    tracebacks = [
        line for line in sink.getvalue().splitlines() if line.startswith("agentmend.infrastructure")
    ]
    assert len(tracebacks) == logged  # each traceback shown whole, its last line redacted
    _assert_secret_free(sink.getvalue(), "the log")
    assert "StoreError: cannot open postgresql://postgres:***@" in handler_sink.getvalue()
    _assert_secret_free(handler_sink.getvalue(), "a host's log handler")


def test_repr_of_the_settings_and_the_store_never_shows_the_password(
    store_urls: dict[str, str], tmp_path: Path
) -> None:
    settings = Settings(store_url=store_urls["valid"])
    _assert_secret_free(repr(settings) + str(settings), "repr(Settings)")
    assert settings.store_url == store_urls["valid"]  # the value itself is intact for use
    with Store(store_urls["valid"], files_dir=tmp_path) as store:
        _assert_secret_free(repr(store) + store.display, "repr(Store)")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://u:pw-1234@h:5/db", "postgresql://u:***@h:5/db"),
        ("postgresql://u:pw%ZZ12@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:pw@x@h/db", "postgresql://u:***@h/db"),
        ("postgresql+psycopg://u:pw12@h/db", "postgresql+psycopg://u:***@h/db"),
        ("postgresql://h/db?sslmode=off&password=pw12&x=1", "postgresql://h/db?sslmode=off&password=***&x=1"),
        ("postgresql://u@h:5432/db", "postgresql://u@h:5432/db"),
        ("sqlite:///srv/a:b@c.db", "sqlite:///srv/a:b@c.db"),
        ("http://127.0.0.1:4318/v1/traces", "http://127.0.0.1:4318/v1/traces"),
    ],
)  # fmt: skip
def test_redact_url_masks_only_the_password(text: str, shown: str) -> None:
    assert redact_url(text) == shown


@pytest.mark.parametrize(
    "text",
    [
        "host=h password='pw 1234' user=u",
        "PGPASSWORD=pw-1234 psql",
        '{"password": "pw-1234"}',
        'invalid URI: "postgresql://u:pw-1234@[::1"',
    ],
)
def test_password_settings_in_free_text_are_masked(text: str) -> None:
    assert "pw" not in redact(text)
    assert "***" in redact(text)


def test_a_password_quoted_out_of_its_url_is_masked_once_the_store_was_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTMEND_STORE_URL", raising=False)
    fragment = 'invalid percent-encoded token: "Qu0tedAlone%ZZ"'
    assert "Qu0tedAlone" in redact(fragment)  # nothing says it is a secret yet
    with pytest.raises(StoreError) as raised:
        Store("postgresql://u:Qu0tedAlone%ZZ@127.0.0.1:1/db", files_dir=tmp_path)
    assert "Qu0tedAlone" not in str(raised.value)
    assert "Qu0tedAlone" not in redact(fragment)
