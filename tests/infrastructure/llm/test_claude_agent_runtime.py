"""ClaudeAgentRuntime through the real bundled Claude Code CLI against the fake Messages API.

Every CLI test asserts on what the fake server received (the CLI's own requests, its
``claude-cli`` user agent, the tool results it sent back), so none of them can pass without the
CLI actually running. Each run starts a CLI process (about half a second).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import claude_agent_sdk
import pytest
from fake_messages_api import FakeMessagesAPI, RecordedRequest, Reply
from pydantic import BaseModel, Field

from agentmend.infrastructure.definitions.spec import AgentSpec, PermissionProfile
from agentmend.infrastructure.errors import ConfigurationError, ErrorKind
from agentmend.infrastructure.llm.base import AgentResult, AgentRuntime, ToolError, ToolSpec
from agentmend.infrastructure.llm.claude.errors import error_from_result
from agentmend.infrastructure.llm.claude.runtime import ClaudeAgentRuntime

SONNET = "claude-sonnet-4-6"
BUNDLED_CLI = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
ASK = "mcp__agentmend__ask_agent"


class Question(BaseModel):
    agent: str
    question: str


class Verdict(BaseModel):
    cause: str
    confidence: float = Field(ge=0, le=1)


def make_spec(**fields: Any) -> AgentSpec:
    values: dict[str, Any] = {
        "name": "mediator",
        "description": "finds root causes",
        "system_prompt": "You are the mediator. Ask, then conclude.",
        "model": SONNET,
        "timeout_s": 30.0,
    }
    values.update(fields)
    return AgentSpec(**values)


class AskAgent:
    """A recording ``ask_agent`` tool."""

    def __init__(self, answer: str = "The writer dropped the summary section.") -> None:
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, arguments: dict[str, Any]) -> str:
        self.calls.append(arguments)
        return self.answer

    def spec(self) -> ToolSpec:
        return ToolSpec("ask_agent", "Ask another agent a question.", self, input_model=Question)


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def system_text(request: RecordedRequest) -> str:
    system = request.json.get("system") or []
    return " ".join(b.get("text", "") for b in system if isinstance(b, dict))


def cli_children() -> dict[int, str]:
    """This process's child processes that are Claude Code CLIs (zombies included): pid -> state."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        state, ppid = rest.split()[0], int(rest.split()[1])
        if ppid == os.getpid() and name == BUNDLED_CLI.name:
            found[int(entry)] = state
    return found


def process_exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def cli_home_kept(home: Path) -> bool:
    """The CLI wrote its config into the home it was given, and the home is still there."""
    return (home / ".claude.json").is_file() or (home / ".claude").is_dir()


@pytest.fixture
async def runtime(fake_api: FakeMessagesAPI) -> AsyncIterator[ClaudeAgentRuntime]:
    rt = ClaudeAgentRuntime(base_url=fake_api.base_url, api_key="sk-test-key", max_retries=0)
    yield rt
    await rt.aclose()


# --- through the CLI ---------------------------------------------------------------------------


async def test_tool_handler_answer_reaches_the_next_request(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI
) -> None:
    ask = AskAgent()
    fake_api.enqueue(
        Reply.tool_use(ASK, {"agent": "writer", "question": "Why no summary?"}),
        Reply.text("The writer dropped the summary."),
    )
    env_before = dict(os.environ)

    result: AgentResult[Any] = await runtime.run(
        make_spec(tools=("ask_agent",)), "Investigate.", tools=[ask.spec()]
    )

    assert result.success, result.error
    assert ask.calls == [{"agent": "writer", "question": "Why no summary?"}]
    assert result.text == "The writer dropped the summary."
    [call] = result.tool_calls
    assert (call.name, call.output, call.is_error) == ("ask_agent", ask.answer, False)
    first, second = fake_api.message_requests()
    assert first.headers["user-agent"].startswith("claude-cli/")
    assert first.headers["x-api-key"] == "sk-test-key"
    assert ASK in first.tool_names
    assert "You are the mediator." in system_text(first)
    [tool_result] = second.tool_results()
    assert ask.answer in result_text(tool_result)
    assert result.turns >= 2
    assert result.usage.input_tokens == 20
    assert result.cost_usd
    assert dict(os.environ) == env_before


async def test_tool_error_becomes_an_error_result_and_the_run_goes_on(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI
) -> None:
    async def broken(arguments: dict[str, Any]) -> str:
        raise ToolError("history store unavailable")

    tool = ToolSpec("history", "Query history.", broken, input_schema={"type": "object"})
    runtime.read_only_tools = ("history",)  # a made-up tool: standard grants it once listed
    fake_api.enqueue(Reply.tool_use("mcp__agentmend__history", {}), Reply.text("carried on"))

    result: AgentResult[Any] = await runtime.run(make_spec(tools=("history",)), "Go.", tools=[tool])

    assert result.success
    assert result.text == "carried on"
    assert result.tool_calls[0].is_error
    [tool_result] = fake_api.message_requests()[1].tool_results()
    assert tool_result.get("is_error") is True
    assert "history store unavailable" in result_text(tool_result)


async def test_structured_output_is_parsed_into_the_output_type(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI
) -> None:
    fake_api.enqueue(Reply.structured({"cause": "prompt lost a section", "confidence": 0.8}))

    result = await runtime.run(make_spec(), "Conclude.", output_type=Verdict)

    assert result.success, result.error
    assert result.output == Verdict(cause="prompt lost a section", confidence=0.8)
    [request] = fake_api.message_requests()
    offered = {t["name"]: t for t in request.json["tools"]}
    assert set(offered["StructuredOutput"]["input_schema"]["properties"]) == {"cause", "confidence"}


async def test_missing_structured_output_is_output_invalid(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI
) -> None:
    fake_api.enqueue(Reply.text("I think it was the prompt."), Reply.text("Still prose."))

    result = await runtime.run(make_spec(), "Conclude.", output_type=Verdict)

    assert result.error is not None
    assert result.error.kind is ErrorKind.OUTPUT_INVALID
    assert result.output is None
    assert len(fake_api.message_requests()) == 2  # the CLI asked once more for the tool


@pytest.mark.parametrize(
    ("spec_fields", "called"),
    [
        ({"tools": ("ask_agent",)}, "mcp__agentmend__drop_table"),  # standard: undeclared tool
        ({"tools": ("ask_agent",), "permission_profile": "locked"}, ASK),
        ({"permission_profile": PermissionProfile(allow=("*",), deny=("ask_agent",))}, ASK),
    ],
    ids=["standard-undeclared", "locked", "custom-deny"],
)
async def test_a_tool_outside_the_profile_is_denied_and_reported(
    runtime: ClaudeAgentRuntime,
    fake_api: FakeMessagesAPI,
    spec_fields: dict[str, Any],
    called: str,
) -> None:
    ask = AskAgent()
    dropped: list[dict[str, Any]] = []

    async def drop_table(arguments: dict[str, Any]) -> str:
        dropped.append(arguments)
        return "dropped"

    tools = [
        ask.spec(),
        ToolSpec("drop_table", "Drop.", drop_table, input_schema={"type": "object"}),
    ]
    fake_api.enqueue(
        Reply.tool_use(called, {"agent": "a", "question": "q"}), Reply.text("ok, without it")
    )

    result: AgentResult[Any] = await runtime.run(make_spec(**spec_fields), "Go.", tools=tools)

    assert result.success, result.error
    bare = called.removeprefix("mcp__agentmend__")
    assert result.permission_denials == (bare,)
    assert ask.calls == []
    assert dropped == []
    [tool_result] = fake_api.message_requests()[1].tool_results()
    assert tool_result.get("is_error") is True
    assert "Permission denied" in result_text(tool_result)
    assert bare in result_text(tool_result)


async def test_standard_profile_offers_declared_builtins_but_refuses_the_shell(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI, tmp_path: Path
) -> None:
    target = tmp_path / "created-by-bash"
    fake_api.enqueue(Reply.tool_use("Bash", {"command": f"touch {target}"}), Reply.text("fine"))

    result: AgentResult[Any] = await runtime.run(make_spec(tools=("Read", "Bash")), "Go.")

    first = fake_api.message_requests()[0]
    assert set(first.tool_names) == {"Read", "Bash"}
    assert result.permission_denials == ("Bash",)
    assert not target.exists()


SECRET = "TOPSECRET-42"


def builtin_call(tool: str, workdir: Path) -> dict[str, Any]:
    if tool == "Read":
        return {"file_path": str(workdir / "secret.txt")}
    return {"pattern": "*.txt", "path": str(workdir)}


@pytest.mark.parametrize(
    ("profile", "tool"),
    [("locked", "Read"), (PermissionProfile(allow=(), deny=("*",)), "Glob")],
    ids=["locked-Read", "deny-all-Glob"],
)
async def test_a_read_only_builtin_outside_the_profile_is_denied_and_reported(
    fake_api: FakeMessagesAPI, tmp_path: Path, profile: Any, tool: str
) -> None:
    # The CLI approves its read-only tools inside its cwd on its own, without asking
    # can_use_tool; the profile must still stop them and the denial must be reported.
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "secret.txt").write_text(SECRET + "\n")
    fake_api.enqueue(
        Reply.tool_use(tool, builtin_call(tool, workdir)), Reply.text("ok, without it")
    )
    spec = make_spec(tools=(tool,), permission_profile=profile)
    async with ClaudeAgentRuntime(
        base_url=fake_api.base_url, api_key="k", max_retries=0, home=tmp_path, cwd=workdir
    ) as rt:
        result: AgentResult[Any] = await rt.run(spec, "Go.")

    assert result.success, result.error
    first, second = fake_api.message_requests()
    assert tool in first.tool_names  # offered: only the profile stands between it and the file
    assert result.permission_denials == (tool,)
    [tool_result] = second.tool_results()
    assert tool_result.get("is_error") is True
    assert "Permission denied" in result_text(tool_result)
    assert tool in result_text(tool_result)
    assert SECRET not in result_text(tool_result)
    assert "secret.txt" not in result_text(tool_result)
    [call] = result.tool_calls
    assert call.is_error


async def test_a_read_only_builtin_the_profile_allows_still_runs(
    fake_api: FakeMessagesAPI, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "secret.txt").write_text(SECRET + "\n")
    fake_api.enqueue(Reply.tool_use("Read", builtin_call("Read", workdir)), Reply.text("read it"))
    async with ClaudeAgentRuntime(
        base_url=fake_api.base_url, api_key="k", max_retries=0, home=tmp_path, cwd=workdir
    ) as rt:
        result: AgentResult[Any] = await rt.run(make_spec(tools=("Read",)), "Go.")

    assert result.success, result.error
    assert result.permission_denials == ()
    [tool_result] = fake_api.message_requests()[1].tool_results()
    assert SECRET in result_text(tool_result)


@pytest.mark.parametrize(
    ("reply", "kind", "status"),
    [
        (Reply.server_error(500), ErrorKind.SERVER_ERROR, 500),
        (Reply.overloaded(), ErrorKind.OVERLOADED, 529),
        (Reply.error(401), ErrorKind.AUTHENTICATION, 401),
        (Reply.rate_limited(), ErrorKind.RATE_LIMIT, 429),
    ],
    ids=["500", "529", "401", "429"],
)
async def test_an_api_error_maps_to_its_kind(
    runtime: ClaudeAgentRuntime,
    fake_api: FakeMessagesAPI,
    reply: Reply,
    kind: ErrorKind,
    status: int,
) -> None:
    fake_api.set_fallback(reply)

    result: AgentResult[Any] = await runtime.run(make_spec(), "Go.")

    assert result.error is not None
    assert (result.error.kind, result.error.status_code) == (kind, status)
    assert len(fake_api.message_requests()) == 1  # CLAUDE_CODE_MAX_RETRIES=0 reached the CLI


async def test_an_unknown_model_is_model_not_found(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI
) -> None:
    fake_api.set_fallback(Reply.error(404, "not_found_error", "model: claude-nonexistent-9"))

    result: AgentResult[Any] = await runtime.run(make_spec(model="claude-nonexistent-9"), "Go.")

    assert result.error is not None
    assert (result.error.kind, result.error.status_code) == (ErrorKind.MODEL_NOT_FOUND, 404)
    assert {r.model for r in fake_api.message_requests()} == {"claude-nonexistent-9"}


async def test_an_unreachable_server_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    async with ClaudeAgentRuntime(
        base_url=f"http://127.0.0.1:{closed_port}", api_key="k", max_retries=0
    ) as rt:
        result: AgentResult[Any] = await rt.run(make_spec(), "Go.")
    assert result.error is not None
    assert result.error.kind is ErrorKind.CONNECTION


async def test_max_turns_ends_the_run_as_max_turns(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI
) -> None:
    ask = AskAgent()
    fake_api.set_fallback(Reply.tool_use(ASK, {"agent": "a", "question": "again?"}))

    result: AgentResult[Any] = await runtime.run(
        make_spec(tools=("ask_agent",), max_turns=2), "Go.", tools=[ask.spec()]
    )

    assert result.error is not None
    assert result.error.kind is ErrorKind.MAX_TURNS
    assert len(fake_api.message_requests()) == 2


async def test_spec_settings_reach_the_cli(fake_api: FakeMessagesAPI, tmp_path: Path) -> None:
    fake_api.enqueue(Reply.text("ok"))
    spec = make_spec(max_tokens=777, docs=(("style.md", "Write plainly."),))
    async with ClaudeAgentRuntime(
        base_url=fake_api.base_url,
        api_key="k",
        max_retries=0,
        home=tmp_path,
        extra_env={"ANTHROPIC_CUSTOM_HEADERS": "x-agentmend-probe: yes"},
    ) as rt:
        result: AgentResult[Any] = await rt.run(spec, "Go.")
    assert result.success, result.error
    [request] = fake_api.message_requests()
    assert request.json["max_tokens"] == 777
    assert request.model == SONNET
    assert "Write plainly." in system_text(request)
    assert "<agent_docs>" in system_text(request)
    assert request.headers["x-agentmend-probe"] == "yes"
    assert request.json["tools"] == []  # built-ins off, no agentmend tools given
    assert cli_home_kept(tmp_path)  # a home we were given is not ours to delete


async def test_private_home_is_removed_on_close(fake_api: FakeMessagesAPI) -> None:
    fake_api.enqueue(Reply.text("ok"))
    rt = ClaudeAgentRuntime(base_url=fake_api.base_url, api_key="k", max_retries=0)
    result: AgentResult[Any] = await rt.run(make_spec(), "Go.")
    home = rt.home
    assert result.success
    assert home.is_dir()
    await rt.aclose()
    assert not home.exists()
    with pytest.raises(ConfigurationError):
        await rt.run(make_spec(), "Go.")


@pytest.mark.slow
async def test_timeout_returns_timeout_and_leaves_no_cli_process(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI
) -> None:
    fake_api.enqueue(Reply.hang(30))
    before = set(cli_children())

    # long enough for the CLI to start and send its request on a busy machine
    result: AgentResult[Any] = await runtime.run(make_spec(timeout_s=6.0), "Go.")

    assert result.error is not None
    assert result.error.kind is ErrorKind.TIMEOUT
    assert len(fake_api.message_requests()) == 1  # the CLI was inside its request
    assert set(cli_children()) - before == set()


async def test_a_cancelled_run_leaves_no_cli_process(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI
) -> None:
    fake_api.enqueue(Reply.hang(30))
    before = set(cli_children())
    task: asyncio.Task[AgentResult[Any]] = asyncio.create_task(
        runtime.run(make_spec(timeout_s=None), "Go.")
    )
    await asyncio.to_thread(fake_api.wait_for_message_requests, 1, 20.0)
    started = set(cli_children()) - before
    assert len(started) == 1  # the CLI of this run, caught mid-request

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert set(cli_children()) & started == set()
    [pid] = started
    assert not process_exists(pid)


# --- configuration, no CLI ----------------------------------------------------------------------


def test_runtime_satisfies_the_protocol(fake_api: FakeMessagesAPI) -> None:
    assert isinstance(ClaudeAgentRuntime(base_url=fake_api.base_url), AgentRuntime)


def test_a_real_api_url_is_refused_under_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="loopback"):
        ClaudeAgentRuntime(base_url="https://api.anthropic.com")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError):
        ClaudeAgentRuntime()  # the default is the real API
    with pytest.raises(ConfigurationError):
        ClaudeAgentRuntime(extra_env={"ANTHROPIC_BASE_URL": "http://10.0.0.8:8080"})


def test_a_missing_cli_path_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cli_path"):
        ClaudeAgentRuntime(base_url="http://127.0.0.1:9", cli_path=tmp_path / "no-such-claude")


async def test_bad_tool_sets_are_refused_before_the_cli_starts(
    runtime: ClaudeAgentRuntime, fake_api: FakeMessagesAPI
) -> None:
    ask = AskAgent()
    with pytest.raises(ConfigurationError, match="two tools"):
        await runtime.run(make_spec(), "Go.", tools=[ask.spec(), ask.spec()])
    clash = ToolSpec("StructuredOutput", "x", ask, input_model=Question)
    with pytest.raises(ConfigurationError, match="StructuredOutput"):
        await runtime.run(make_spec(), "Go.", tools=[clash], output_type=Verdict)
    assert fake_api.message_requests() == []


@pytest.mark.parametrize(
    ("data", "assistant_error", "kind"),
    [
        ({"terminal_reason": "api_error", "api_error_status": 429}, None, ErrorKind.RATE_LIMIT),
        ({"terminal_reason": "api_error", "api_error_status": 529}, None, ErrorKind.OVERLOADED),
        (
            {"api_error_status": 500, "api_error_type": "overloaded_error"},
            None,
            ErrorKind.OVERLOADED,
        ),
        ({"api_error_status": 503}, None, ErrorKind.SERVER_ERROR),
        ({"api_error_status": 403}, None, ErrorKind.AUTHENTICATION),
        ({"api_error_status": 408}, None, ErrorKind.TIMEOUT),
        ({"api_error_status": 404}, "model_not_found", ErrorKind.MODEL_NOT_FOUND),
        ({"api_error_status": 404}, None, ErrorKind.BAD_REQUEST),
        ({"api_error_status": 413}, None, ErrorKind.BAD_REQUEST),
        ({"terminal_reason": "api_error", "api_error_status": None}, None, ErrorKind.CONNECTION),
        ({"subtype": "error_max_turns", "errors": ["Reached 2"]}, None, ErrorKind.MAX_TURNS),
        ({"subtype": "error_max_structured_output_retries"}, None, ErrorKind.OUTPUT_INVALID),
        ({"subtype": "success", "terminal_reason": "aborted_tools"}, None, ErrorKind.CANCELLED),
        ({"subtype": "error_during_execution"}, None, ErrorKind.RUNTIME),
    ],
)
def test_result_errors_map_from_structured_fields(
    data: dict[str, Any], assistant_error: str | None, kind: ErrorKind
) -> None:
    error = error_from_result(data, assistant_error=assistant_error)
    assert error.kind is kind
    assert error.status_code == data.get("api_error_status")
