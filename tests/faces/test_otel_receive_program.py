"""``agentmend otel receive`` as a real child process: its token, its refusals, its SIGTERM.

The token is made on first start (kept readable by its owner only, printed that once) and
reused after; off loopback the program refuses to start without a token given, and an empty
``AGENTMEND_OTLP_TOKEN=`` is none. SIGTERM while exporters are sending stores every run the
receiver answered 200 for, and the program exits 0 within its deadline.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_run import ROOT
from otel_helpers import SpanFactory, post

TOKEN_FILE = "otlp-token"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(workspace: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentmend.faces.cli", "otel", "receive",
         "--workspace", str(workspace), *args],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=workspace.parent,
        env={**os.environ, "PYTHONPATH": str(ROOT / ".typing"), **env},
    )  # fmt: skip


def _lines_until(process: subprocess.Popen[str], needle: str, timeout_s: float = 60) -> list[str]:
    """stderr lines up to the one holding ``needle`` (bounded by ``timeout_s``)."""
    assert process.stderr is not None
    stream = process.stderr
    lines: queue.Queue[str] = queue.Queue()
    # a thread reads: select() on a buffered text pipe misses lines already buffered
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=deadline - time.monotonic())
        except queue.Empty:
            break
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
        threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    pytest.fail(f"no line with {needle!r} from the receiver: {seen}")


def _stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    return out, err


@pytest.mark.slow
def test_a_token_is_made_once_kept_for_its_owner_only_and_printed_that_once(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    port = _free_port()
    first = _start(workspace, "--port", str(port), AGENTMEND_OTLP_TOKEN="")
    try:
        lines = _lines_until(first, "a token was made")
        path = workspace / TOKEN_FILE
        token = path.read_text(encoding="utf-8").strip()
        assert path.stat().st_mode & 0o777 == 0o600
        assert f"Authorization=Bearer {token}" in lines[-1]
        spans = SpanFactory()
        spans.agent_run("writer")
        url = f"http://127.0.0.1:{port}/v1/traces"
        assert post(url, spans.body(), token=None)[0] == 401
        assert post(url, spans.body(), token=token)[0] == 200
        spans.close()
    finally:
        _out, err = _stop(first)
    assert first.returncode == 0, err
    again = _start(workspace, "--port", str(_free_port()))
    try:
        lines = _lines_until(again, "exporters send the token in")
    finally:
        _out, err = _stop(again)
    assert token not in "".join(lines) + err  # printed once: when it was made
    assert path.read_text(encoding="utf-8").strip() == token


def test_a_token_file_others_can_read_is_refused_in_one_line(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / TOKEN_FILE).write_text("t0ken-readable-by-all\n")
    (workspace / TOKEN_FILE).chmod(0o644)
    result = subprocess.run(
        [sys.executable, "-m", "agentmend.otel_receiver", "--port", "0",
         "--workspace", str(workspace)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / ".typing"), "AGENTMEND_OTLP_TOKEN": ""},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "can be read by others: chmod 600 it, or remove it for a new token"
    )
    assert "t0ken-readable-by-all" not in result.stderr


@pytest.mark.parametrize("token_env", [None, "", "   "])
def test_off_loopback_the_program_refuses_to_start_without_a_token(
    tmp_path: Path, token_env: str | None
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".typing")}
    env.pop("AGENTMEND_OTLP_TOKEN", None)
    if token_env is not None:
        env["AGENTMEND_OTLP_TOKEN"] = token_env
    workspace = tmp_path / "ws"
    result = subprocess.run(
        [sys.executable, "-m", "agentmend.otel_receiver", "--host", "0.0.0.0", "--port", "0",
         "--workspace", str(workspace)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        "agentmend: --host 0.0.0.0 is not a loopback address: give the token exporters must "
        "send (--token or AGENTMEND_OTLP_TOKEN)\n"
    )
    assert not workspace.exists()  # refused before anything was made


@pytest.mark.slow
def test_sigterm_while_exporters_send_stores_every_run_answered_200(tmp_path: Path) -> None:
    workspace, port = tmp_path / "ws", _free_port()
    receiver = _start(workspace, "--port", str(port), "--token", "t0ken")
    _lines_until(receiver, "receiving OTLP traces")
    url = f"http://127.0.0.1:{port}/v1/traces"
    answered: list[int] = []
    unanswered: list[int] = []  # cut off mid-request: stored or not, the exporter cannot know
    lock = threading.Lock()

    def export(worker: int) -> None:
        spans = SpanFactory()
        try:
            for _ in range(200):  # bounded; stops at the first answer that is not a 200
                spans.agent_run(f"writer-{worker}")
                try:
                    status = post(url, spans.body(), token="t0ken")[0]
                except OSError:  # the receiver stopped: this request's answer never came
                    with lock:
                        unanswered.append(worker)
                    return
                if status != 200:
                    return
                with lock:
                    answered.append(worker)
        finally:
            spans.close()

    threads = [threading.Thread(target=export, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while len(answered) < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    receiver.send_signal(signal.SIGTERM)  # exporters still sending
    for thread in threads:
        thread.join(timeout=60)
    _out, err = receiver.communicate(timeout=60)
    assert receiver.returncode == 0, err
    assert len(answered) >= 50
    with sqlite3.connect(workspace / "agentmend.db") as conn:
        stored = conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    # every run answered 200 is stored; a request the stop cut off may have been stored too
    assert len(answered) <= stored <= len(answered) + len(unanswered)
