"""Record and replay: run on the Messages API once, then serve its answers with no key.

``RecordingRuntime`` is the Anthropic runtime that also stores every exchange (the request's
fingerprint and the model's response) in a cassette file; ``ReplayRuntime`` serves a cassette's
responses through the same turn loop, with no key, no client and no network. Both go through
``run_agent_loop``, so tools, structured output and truncation behave on replay as they did when
recorded, and a replayed run's requests are the recorded ones, turn for turn.

The cassette is one JSON document, ``format`` ``agentmend-cassette``, ``version`` 1::

    {
      "format": "agentmend-cassette",
      "version": 1,
      "exchanges": [
        {
          "fingerprint": "<sha256 of the request's canonical JSON>",
          "agent": "assistant",
          "turn": 1,
          "request": {"model": "...", "system": "...", "messages": [...], "tools": [...],
                      "tool_choice": null, "max_tokens": 1024, "temperature": null},
          "responses": [
            {"content": [{"type": "text", "text": "..."}], "stop_reason": "end_turn",
             "usage": {"input_tokens": 12, "output_tokens": 3, "cache_read_tokens": 0,
                       "cache_creation_tokens": 0},
             "model": "claude-haiku-4-5"}
          ]
        }
      ]
    }

The fingerprint covers what decides the model's answer: model, system prompt, messages, tools,
forced tool, ``max_tokens`` and ``temperature`` (the agent's name and turn are kept beside it to
name a request in errors, not hashed). Content blocks are the Messages API's own shapes.

- **Same request, several answers.** An eval suite asks the same question several times; each
  answer is kept, in order, and replay serves them in turn (after the last, from the first).
- **Redaction.** Only request bodies and responses are stored, never headers, so no API key or
  ``authorization`` header can reach the file; text that holds the key in use, an Anthropic
  key-shaped token (``sk-ant-...``) or a store password is masked as ``***`` in the stored
  request and response (the fingerprint is taken before).
- **Crash safety.** Each new exchange rewrites the file atomically (a temp file, fsync, rename),
  so a recorder killed at any point leaves the cassette as it was after its last complete
  exchange, never a half-written one. Recording again into an existing cassette keeps its other
  exchanges and replaces the answers of the requests asked again. One recorder per cassette.
- **Errors.** A missing file, bad JSON, another format or version, or a malformed exchange is a
  ``CassetteError`` naming the file and what is wrong, raised before any agent runs; a request
  not in the cassette is a ``CassetteMiss`` naming the agent, the turn and the file (it is not
  a failed run: the replay cannot go on, and it says to record again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmend.infrastructure.errors import AgentmendError, ConfigurationError
from agentmend.infrastructure.llm.anthropic_runtime import (
    AnthropicRuntime,
    estimate_cost_usd,
    resolve_model,
)
from agentmend.infrastructure.llm.base import AgentResult, OutputT, RuntimeBase, ToolSpec, Usage
from agentmend.infrastructure.llm.tool_loop import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TURNS,
    Message,
    ModelRequest,
    ModelResponse,
    TextBlock,
    ToolUseBlock,
    run_agent_loop,
)
from agentmend.infrastructure.redaction import MASK, redact

if TYPE_CHECKING:
    import anthropic

    from agentmend.infrastructure.definitions.spec import AgentSpec

__all__ = [
    "CASSETTE_FORMAT",
    "CASSETTE_VERSION",
    "Cassette",
    "CassetteError",
    "CassetteMiss",
    "RecordingRuntime",
    "ReplayRuntime",
    "request_fingerprint",
]

CASSETTE_FORMAT = "agentmend-cassette"
CASSETTE_VERSION = 1

_KEY_SHAPED = re.compile(r"sk-ant-[A-Za-z0-9_-]{8,}")


class CassetteError(ConfigurationError):
    """A cassette that cannot be used: missing, not JSON, another format or malformed."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"cassette {self.path} cannot be used: {problem}")


class CassetteMiss(AgentmendError):
    """A replayed run asked the model something the cassette did not record."""

    def __init__(self, path: str | Path, agent: str, turn: int, fingerprint: str) -> None:
        self.path = str(path)
        self.agent = agent
        self.turn = turn
        self.fingerprint = fingerprint
        super().__init__(
            f"cassette {self.path} has no recorded answer for agent {agent!r}, turn {turn} "
            f"(request {fingerprint[:12]}): the agent, its eval suite or the prompt changed "
            "since it was recorded; record it again with --record"
        )


def request_json(request: ModelRequest) -> dict[str, Any]:
    """The request as the Messages API body it stands for (what the fingerprint hashes)."""
    return {
        "model": request.model,
        "system": request.system,
        "messages": [_message_json(m) for m in request.messages],
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in request.tools
        ],
        "tool_choice": request.tool_choice,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
    }


def request_fingerprint(request: ModelRequest) -> str:
    """A stable hash of what decides the answer: the same request always hashes the same."""
    canonical = json.dumps(
        request_json(request), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _message_json(message: Message) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            content.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            content.append(
                {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
            )
        else:
            content.append(
                {
                    "type": "tool_result",
                    "tool_use_id": block.tool_use_id,
                    "content": block.content,
                    "is_error": block.is_error,
                }
            )
    return {"role": message.role, "content": content}


def _response_json(response: ModelResponse) -> dict[str, Any]:
    return {
        "content": [
            {"type": "text", "text": b.text}
            if isinstance(b, TextBlock)
            else {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input}
            for b in response.content
        ],
        "stop_reason": response.stop_reason,
        "usage": {
            "input_tokens": response.usage.input_tokens,
            "output_tokens": response.usage.output_tokens,
            "cache_read_tokens": response.usage.cache_read_tokens,
            "cache_creation_tokens": response.usage.cache_creation_tokens,
        },
        "model": response.model,
    }


def _response_from_json(data: Any, where: str) -> ModelResponse:
    """A stored response back as a ``ModelResponse``; ``ValueError`` naming ``where`` if bad."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise ValueError(f"{where}: a response needs a content list")
    content: list[TextBlock | ToolUseBlock] = []
    for index, block in enumerate(data["content"]):
        if not isinstance(block, dict):
            raise ValueError(f"{where}.content[{index}]: not an object")
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            content.append(TextBlock(block["text"]))
        elif (
            kind == "tool_use"
            and isinstance(block.get("id"), str)
            and isinstance(block.get("name"), str)
            and isinstance(block.get("input"), dict)
        ):
            content.append(ToolUseBlock(block["id"], block["name"], dict(block["input"])))
        else:
            raise ValueError(f"{where}.content[{index}]: not a text or tool_use block")
    usage = data.get("usage") or {}
    stop_reason = data.get("stop_reason")
    model = data.get("model")
    if not isinstance(usage, dict) or not all(
        isinstance(usage.get(name, 0), int) for name in _USAGE_FIELDS
    ):
        raise ValueError(f"{where}.usage: token counts must be whole numbers")
    if stop_reason is not None and not isinstance(stop_reason, str):
        raise ValueError(f"{where}.stop_reason: not a string")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"{where}.model: not a string")
    return ModelResponse(
        content=tuple(content),
        stop_reason=stop_reason,
        usage=Usage(**{name: usage.get(name, 0) for name in _USAGE_FIELDS}),
        model=model,
    )


_USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens")


def _masked(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` with every string's secrets masked (the key in use, key-shaped tokens, ...)."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, MASK)
        return redact(_KEY_SHAPED.sub(MASK, value))
    if isinstance(value, Mapping):
        return {k: _masked(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v, secrets) for v in value]
    return value


class Cassette:
    """The exchanges of one cassette file, in memory; ``load`` or ``for_recording`` it.

    ``answer`` serves a request (replay), ``add`` stores one and rewrites the file (record).
    """

    def __init__(self, path: Path, exchanges: list[dict[str, Any]]) -> None:
        self.path = path
        self._exchanges: dict[str, dict[str, Any]] = {e["fingerprint"]: e for e in exchanges}
        self._served: dict[str, int] = {}
        self._rerecorded: set[str] = set()
        self._secrets: tuple[str, ...] = ()
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path) -> Cassette:
        """The cassette at ``path``, checked whole.

        Raises:
            CassetteError: the file is missing or unreadable, not JSON, another format or
                version, or an exchange is malformed (named by its index).
        """
        path = Path(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise CassetteError(path, "the file does not exist (record it with --record)") from None
        except OSError as exc:
            raise CassetteError(path, f"it cannot be read: {exc.strerror or exc}") from None
        return cls(path, _parse(path, raw))

    @classmethod
    def for_recording(cls, path: str | Path, *, secrets: Sequence[str] = ()) -> Cassette:
        """A cassette to record into: the file's exchanges if it exists, else none.

        ``secrets`` (the API key in use) are masked wherever they appear in what is stored.

        Raises:
            CassetteError: the file exists but is no cassette (it is not overwritten), or its
                folder does not exist.
        """
        path = Path(path)
        if path.is_dir():
            raise CassetteError(path, "it is a folder: give a file name")
        if not path.parent.is_dir():
            raise CassetteError(path, f"the folder {path.parent} does not exist")
        cassette = cls.load(path) if path.exists() else cls(path, [])
        cassette._secrets = tuple(s for s in secrets if len(s) >= 8)
        return cassette

    def __len__(self) -> int:
        return len(self._exchanges)

    def answer(self, request: ModelRequest) -> ModelResponse:
        """The recorded response to ``request`` (its answers served in turn).

        Raises:
            CassetteMiss: the request was not recorded.
        """
        fingerprint = request_fingerprint(request)
        with self._lock:
            exchange = self._exchanges.get(fingerprint)
            if exchange is None:
                raise CassetteMiss(self.path, request.agent_name, request.turn, fingerprint)
            served = self._served.get(fingerprint, 0)
            self._served[fingerprint] = served + 1
            responses = exchange["responses"]
            return _response_from_json(responses[served % len(responses)], "response")

    def add(self, request: ModelRequest, response: ModelResponse) -> None:
        """Store ``response`` as an answer to ``request`` and write the file atomically.

        The first answer recorded for a request in this process replaces what the file held
        for it; later ones are added after it (the same question asked again).
        """
        from agentmend.infrastructure.files.atomic import atomic_write

        fingerprint = request_fingerprint(request)
        stored = _masked(_response_json(response), self._secrets)
        with self._lock:
            exchange = self._exchanges.get(fingerprint)
            if exchange is None or fingerprint not in self._rerecorded:
                exchange = {
                    "fingerprint": fingerprint,
                    "agent": request.agent_name,
                    "turn": request.turn,
                    "request": _masked(request_json(request), self._secrets),
                    "responses": [],
                }
                self._exchanges[fingerprint] = exchange
                self._rerecorded.add(fingerprint)
            exchange["responses"].append(stored)
            document = {
                "format": CASSETTE_FORMAT,
                "version": CASSETTE_VERSION,
                "exchanges": list(self._exchanges.values()),
            }
            data = json.dumps(document, indent=1, ensure_ascii=False) + "\n"
            try:
                atomic_write(self.path, data.encode("utf-8"))
            except (OSError, AgentmendError) as exc:
                raise CassetteError(self.path, f"it cannot be written: {exc}") from exc


def _parse(path: Path, raw: bytes) -> list[dict[str, Any]]:
    """The exchanges of a cassette file's bytes; ``CassetteError`` for anything malformed."""
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CassetteError(path, f"it is not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != CASSETTE_FORMAT:
        raise CassetteError(path, f"it is not an {CASSETTE_FORMAT} file (no such format field)")
    version = document.get("version")
    if version != CASSETTE_VERSION:
        raise CassetteError(
            path, f"version {version!r} is not one this agentmend reads ({CASSETTE_VERSION})"
        )
    exchanges = document.get("exchanges")
    if not isinstance(exchanges, list):
        raise CassetteError(path, "exchanges: not a list")
    for index, exchange in enumerate(exchanges):
        where = f"exchanges[{index}]"
        if not isinstance(exchange, dict):
            raise CassetteError(path, f"{where}: not an object")
        fingerprint = exchange.get("fingerprint")
        if not isinstance(fingerprint, str) or not re.fullmatch(r"[0-9a-f]{64}", fingerprint):
            raise CassetteError(path, f"{where}.fingerprint: not a sha256 hex digest")
        responses = exchange.get("responses")
        if not isinstance(responses, list) or not responses:
            raise CassetteError(path, f"{where}.responses: not a non-empty list")
        if not isinstance(exchange.get("agent", ""), str) or not isinstance(
            exchange.get("turn", 0), int
        ):
            raise CassetteError(path, f"{where}: agent must be a string and turn a number")
        for number, response in enumerate(responses):
            try:
                _response_from_json(response, f"{where}.responses[{number}]")
            except ValueError as exc:
                raise CassetteError(path, str(exc)) from None
    return exchanges


class RecordingRuntime(AnthropicRuntime):
    """The Anthropic runtime, storing every exchange in a cassette as it happens.

    Takes ``AnthropicRuntime``'s arguments, plus ``cassette``, the file to record into.

    Raises:
        ConfigurationError: as ``AnthropicRuntime`` (no key, ...).
        CassetteError: the file exists but is no cassette, or its folder is missing.
    """

    def __init__(self, cassette: str | Path, **options: Any) -> None:
        key = options.get("api_key") or os.environ.get("ANTHROPIC_API_KEY") or ""
        built = options.get("client") is None and bool(key)
        if built:
            options["client"] = _client_without_keepalive(
                key, options.pop("base_url", None), options.pop("request_timeout_s", None)
            )
            options.pop("api_key", None)
        super().__init__(**options)
        self.cassette = Cassette.for_recording(cassette, secrets=(key,))
        self._owns_client = built  # a client built here is closed by ``aclose``

    async def _call_model(self, request: ModelRequest) -> ModelResponse:
        response = await super()._call_model(request)
        self.cassette.add(request, response)  # a failed call raised above: nothing is stored
        return response


def _client_without_keepalive(
    key: str, base_url: str | None, timeout_s: float | None
) -> anthropic.AsyncAnthropic:
    """A client that closes each connection after its answer: a recording is made once, and a
    pooled socket would outlive the event loop of a test or a command that recorded it."""
    import anthropic
    from anthropic._constants import DEFAULT_CONNECTION_LIMITS as DEFAULT

    # the client's own limits type (this client version vendors its HTTP library)
    limits = type(DEFAULT)(max_connections=DEFAULT.max_connections, max_keepalive_connections=0)
    return anthropic.AsyncAnthropic(
        api_key=key,
        base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL") or None,
        max_retries=0,
        timeout=timeout_s if timeout_s is not None else anthropic.NOT_GIVEN,
        http_client=anthropic.DefaultAsyncHttpxClient(limits=limits),
    )


class ReplayRuntime(RuntimeBase):
    """Serves a cassette's recorded responses: no key, no client, no network.

    ``default_model``, ``default_max_turns`` and ``default_max_tokens`` must be what the
    recording runtime used (the defaults are the same), since they shape the requests.

    Raises:
        CassetteError: the cassette cannot be used (see ``Cassette.load``).
    """

    def __init__(
        self,
        cassette: str | Path,
        *,
        default_model: str | None = None,
        default_max_turns: int = DEFAULT_MAX_TURNS,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        self.cassette = Cassette.load(cassette)
        self._default_model = default_model
        self._default_max_turns = default_max_turns
        self._default_max_tokens = default_max_tokens

    async def _run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        tools: Sequence[ToolSpec] = (),
        output_type: type[OutputT] | None = None,
    ) -> AgentResult[OutputT]:
        """Run ``spec`` on ``prompt`` from the cassette; a request not in it raises."""

        async def call_model(request: ModelRequest) -> ModelResponse:
            return self.cassette.answer(request)

        return await run_agent_loop(
            spec,
            prompt,
            call_model=call_model,
            model=resolve_model(spec, self._default_model),
            tools=tools,
            output_type=output_type,
            default_max_turns=self._default_max_turns,
            default_max_tokens=self._default_max_tokens,
            cost=estimate_cost_usd,
            read_only_tools=self.read_only_tools,
        )
