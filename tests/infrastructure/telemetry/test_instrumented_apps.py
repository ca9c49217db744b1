"""Real apps, built with the instrumentation packages users run, recorded exactly.

Each app in ``tests/instrumented_apps/`` runs as a child process with the python of the venv
``make instrumented-venv`` builds (the packages unmodified, at the versions the Makefile pins),
talks to the fake model API (Anthropic Messages, or OpenAI's Responses API for openai-agents)
and exports OTLP/HTTP to agentmend's real receiver. Every test scripts the model's answers and
asserts, per agent, the runs, the failures and the input and output tokens, exactly.

Found with these versions, and held here:

- the ``anthropic`` SDK traces itself (``anthropic.messages.create``, a ``chat`` span with
  ``gen_ai.usage.*`` and ``gen_ai.response.id``) through the global tracer provider: beneath
  pydantic-ai's and OpenInference's own model-call spans it describes the same call again, and
  beside OpenLLMetry's span (not made current) it is the root of a trace of its own;
- pydantic-ai's agent span carries the run's total as ``gen_ai.aggregated_usage.*``;
- OpenInference's ``@tracer.agent(name=...)`` names the agent by the span name only, and its
  openai-agents bridge wraps each run in an unnamed ``Agent workflow`` AGENT span;
- openai-agents itself exports no OpenTelemetry (only to OpenAI's servers), and the ``openai``
  SDK does not trace itself: their spans come from the bridges.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_run import ROOT
from fake_messages_api import FakeMessagesAPI, Reply
from otel_helpers import Recorder
from services import unavailable

from agentmend.infrastructure.llm.base import Usage
from agentmend.infrastructure.telemetry.assembly import TraceAssembler
from agentmend.infrastructure.telemetry.receiver import OtlpReceiver

pytestmark = pytest.mark.slow

APPS = ROOT / "tests" / "instrumented_apps"
VENV_PYTHON = ROOT / ".venv-apps" / "bin" / "python"

Counts = tuple[int, int, int, int]
"""(runs, failures, input tokens, output tokens) of one agent."""


def apps_python() -> Path:
    if not (VENV_PYTHON.parent.parent / ".installed").exists():
        unavailable("the instrumented apps' venv is missing (make instrumented-venv)")
    return VENV_PYTHON


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def receiver(recorder: Recorder) -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver(TraceAssembler(recorder), port=0).start()
    yield receiver
    receiver.close()


def run_app(app: str, *args: str, api: FakeMessagesAPI, receiver: OtlpReceiver, home: Path) -> None:
    """Run ``app`` to its end; it has flushed its spans by then (its provider's shutdown)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "FAKE_API_URL": api.base_url,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {receiver.token}",
    }
    done = subprocess.run(
        [str(apps_python()), str(APPS / app), *args],
        env=env, cwd=home, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]


def per_agent(recorder: Recorder) -> dict[str, Counts]:
    counts: dict[str, Counts] = {}
    for name, runs in recorder.by_agent().items():
        counts[name] = (
            len(runs),
            sum(not run.success for run in runs),
            sum(run.input_tokens for run in runs),
            sum(run.output_tokens for run in runs),
        )
    return counts


def tokens(input_tokens: int, output_tokens: int) -> Usage:
    return Usage(input_tokens=input_tokens, output_tokens=output_tokens)


def script_tool_runs(api: FakeMessagesAPI) -> None:
    """researcher: a tool call, then the answer; writer: a server error; researcher: an answer."""
    api.enqueue(
        Reply.tool_use("lookup", {"topic": "tides"}, usage=tokens(100, 10)),
        Reply.text("the tides turn", usage=tokens(120, 20)),
        Reply.server_error(),
        Reply.text("short", usage=tokens(50, 5)),
    )


TOOL_RUNS: dict[str, Counts] = {"researcher": (2, 0, 270, 35), "writer": (1, 1, 0, 0)}


@pytest.mark.parametrize("mode", ["otel", "logfire"])
def test_pydantic_ai_on_an_anthropic_model(
    mode: str, fake_api: FakeMessagesAPI, receiver: OtlpReceiver, recorder: Recorder,
    tmp_path: Path,
) -> None:  # fmt: skip
    script_tool_runs(fake_api)
    run_app(
        "pydantic_ai_app.py", mode, "researcher", "writer", "researcher",
        api=fake_api, receiver=receiver, home=tmp_path,
    )  # fmt: skip
    assert per_agent(recorder) == TOOL_RUNS
    assert len(fake_api.model_requests()) == 4


@pytest.mark.parametrize("bridge", ["openinference", "openllmetry"])
def test_openai_agents_on_the_responses_api(
    bridge: str, fake_api: FakeMessagesAPI, receiver: OtlpReceiver, recorder: Recorder,
    tmp_path: Path,
) -> None:  # fmt: skip
    script_tool_runs(fake_api)
    run_app(
        "openai_agents_app.py", bridge, "researcher", "writer", "researcher",
        api=fake_api, receiver=receiver, home=tmp_path,
    )  # fmt: skip
    assert per_agent(recorder) == TOOL_RUNS
    assert [r.path for r in fake_api.model_requests()] == ["/v1/responses"] * 4


def test_openinference_anthropic_under_tracer_agent(
    fake_api: FakeMessagesAPI, receiver: OtlpReceiver, recorder: Recorder, tmp_path: Path
) -> None:
    fake_api.enqueue(
        Reply.text("plan", usage=tokens(100, 10)),
        Reply.text("answer", usage=tokens(120, 20)),
        Reply.server_error(),  # the writer's first call: its run fails
        Reply.text("plan", usage=tokens(50, 5)),
        Reply.text("answer", usage=tokens(30, 3)),
    )
    run_app(
        "openinference_anthropic_app.py", "researcher", "writer", "researcher",
        api=fake_api, receiver=receiver, home=tmp_path,
    )  # fmt: skip
    assert per_agent(recorder) == {"researcher": (2, 0, 300, 38), "writer": (1, 1, 0, 0)}


def script_plain_calls(api: FakeMessagesAPI) -> None:
    api.enqueue(
        Reply.text("one", usage=tokens(11, 3)),
        Reply.server_error(),
        Reply.text("three", usage=tokens(7, 2)),
    )


@pytest.mark.parametrize(
    ("app", "service"),
    [("anthropic_sdk_app.py", "plain-app"), ("openllmetry_anthropic_app.py", "llmetry-app")],
)
def test_plain_anthropic_calls_are_one_run_each(
    app: str, service: str, fake_api: FakeMessagesAPI, receiver: OtlpReceiver,
    recorder: Recorder, tmp_path: Path,
) -> None:  # fmt: skip
    script_plain_calls(fake_api)
    run_app(app, "3", api=fake_api, receiver=receiver, home=tmp_path)
    assert per_agent(recorder) == {service: (3, 1, 18, 5)}


def test_parallel_failed_calls_stay_as_many_runs(
    fake_api: FakeMessagesAPI, receiver: OtlpReceiver, recorder: Recorder, tmp_path: Path
) -> None:
    # held together, so the three calls and their six spans overlap in time; failed, so no
    # response id tells them apart
    fake_api.enqueue(*[Reply.hang(0.3, then=Reply.server_error())] * 3)
    run_app(
        "openllmetry_anthropic_app.py", "3", "parallel",
        api=fake_api, receiver=receiver, home=tmp_path,
    )  # fmt: skip
    assert len(fake_api.model_requests()) == 3
    assert per_agent(recorder) == {"llmetry-app": (3, 3, 0, 0)}


def test_the_venv_holds_the_versions_the_makefile_pins() -> None:
    python = apps_python()
    makefile = (ROOT / "Makefile").read_text()
    block = makefile[makefile.index("APPS_PACKAGES :=") :].split("\n\n", 1)[0]
    pins = dict(re.findall(r"([a-z][a-z0-9-]*)(?:\[[a-z,]*\])?==([0-9][0-9.]*)", block))
    assert {"pydantic-ai-slim", "openai-agents", "anthropic"} <= set(pins)
    found = subprocess.run(
        [str(python), "-c",
         "import sys; from importlib.metadata import version as v; "
         "print('\\n'.join(f'{n}=={v(n)}' for n in sys.argv[1:]))", *pins],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    assert found == [f"{name}=={pin}" for name, pin in pins.items()]
