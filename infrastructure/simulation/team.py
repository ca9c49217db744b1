"""The simulated team: six agents, the models they can run on, and their definitions.

The numbers here are the ground truth the simulated runtime behaves by: how many tokens each
agent's answers need, which tools its work calls, which tool a changed task would need, how fast
each model generates. They are chosen so the shipped definition files are healthy, and so each
fault is fixed by the configuration change a competent engineer would make (see ``faults.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType

from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.files.atomic import atomic_write, read_if_exists

__all__ = [
    "AVAILABLE_MODELS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODEL",
    "DEFAULT_TIMEOUT_S",
    "FORMAT_HEADING",
    "FORMAT_INSTRUCTION",
    "MODEL_ALIASES",
    "RETIRED_MODELS",
    "SIMULATED_AGENTS",
    "TEAM_AGENT_NAMES",
    "TOKEN_SPREAD",
    "AgentProfile",
    "ModelProfile",
    "copy_team",
    "format_instruction_line",
    "has_format_instruction",
    "profile_for",
    "resolve_model",
    "team_files",
]

FORMAT_HEADING = "## Answer"
FORMAT_INSTRUCTION = (
    "Format: start your reply with a '## Answer' heading, then write the rest in Markdown."
)
"""The one line that keeps an agent's replies in format; every shipped prompt contains it."""

DEFAULT_MODEL = "claude-sonnet-4-6"
DEFAULT_MAX_TOKENS = 4096
DEFAULT_TIMEOUT_S = 300.0
TOKEN_SPREAD = 0.15
"""An answer's length varies by up to this fraction around the agent's typical length."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """How a simulated model behaves: speed, reliability at following format, price, limits.

    Attributes:
        name: the model id a definition file names.
        first_token_ms: latency before the first output token.
        ms_per_output_token: generation speed; the main part of a run's duration.
        quality: probability that a reply keeps to a format its prompt states (the rest slip).
        input_usd_per_mtok: price per million input tokens.
        output_usd_per_mtok: price per million output tokens.
        max_output_tokens: the largest ``max_tokens`` the API accepts for this model.
    """

    name: str
    first_token_ms: float
    ms_per_output_token: float
    quality: float
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    max_output_tokens: int

    def generation_ms(self, output_tokens: int) -> float:
        return self.first_token_ms + output_tokens * self.ms_per_output_token

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return (
            input_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok
        ) / 1_000_000


AVAILABLE_MODELS: Mapping[str, ModelProfile] = MappingProxyType(
    {
        profile.name: profile
        for profile in (
            ModelProfile("claude-opus-4-6", 2400.0, 28.0, 0.995, 15.0, 75.0, 32_000),
            ModelProfile("claude-sonnet-4-6", 1400.0, 16.0, 0.99, 3.0, 15.0, 64_000),
            ModelProfile("claude-haiku-4-5", 500.0, 6.0, 0.98, 1.0, 5.0, 64_000),
        )
    }
)
"""The models a model change is validated against (what ``available_models.json`` lists)."""

RETIRED_MODELS: frozenset[str] = frozenset(
    {"claude-2.1", "claude-2.0", "claude-instant-1.2", "claude-3-sonnet-20240229"}
)
"""Names that once existed; like any name not in the available models they get a 404."""

MODEL_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "sonnet": "claude-sonnet-4-6",
        "haiku": "claude-haiku-4-5",
        "opus": "claude-opus-4-6",
        "inherit": DEFAULT_MODEL,
    }
)
"""Claude Code's short model names, resolved the way Claude Code resolves them."""


def resolve_model(model: str | None) -> str:
    """The model id a definition's ``model`` value runs on (``None`` means the default)."""
    if model is None:
        return DEFAULT_MODEL
    return MODEL_ALIASES.get(model.strip().lower(), model.strip())


@dataclass(frozen=True, slots=True)
class AgentProfile:
    """What one agent's work needs, independent of how its definition file configures it.

    Attributes:
        name: the agent's name.
        answer_tokens: typical length of its answers, in output tokens.
        uses_tools: the tools its normal work calls, in order.
        extra_tool: the tool a changed task needs (what a tool denial is about).
        extra_tool_purpose: why it would call ``extra_tool``, in its own words.
        deliverable: what its answers are, for the simulated reply text.
    """

    name: str
    answer_tokens: int
    uses_tools: tuple[str, ...]
    extra_tool: str
    extra_tool_purpose: str
    deliverable: str


SIMULATED_AGENTS: Mapping[str, AgentProfile] = MappingProxyType(
    {
        profile.name: profile
        for profile in (
            AgentProfile(
                "knowledge-builder",
                1100,
                ("Glob", "Read", "Write"),
                "WebSearch",
                "to find a standard statement of each definition it writes",
                "concept note",
            ),
            AgentProfile(
                "quality-agent",
                500,
                ("Read", "Grep"),
                "Bash",
                "to run the LaTeX checker on the note",
                "review",
            ),
            AgentProfile(
                "research-agent",
                900,
                ("WebSearch", "Read"),
                "WebFetch",
                "to read the full text of a source instead of its search snippet",
                "research brief",
            ),
            AgentProfile(
                "example-generator",
                800,
                ("Read", "Write"),
                "WebSearch",
                "to look up a reference solution for each worked example",
                "set of worked examples",
            ),
            AgentProfile(
                "dependency-mapper",
                550,
                ("Glob", "Grep", "Read"),
                "WebFetch",
                "to read the curriculum standard a prerequisite comes from",
                "prerequisite map",
            ),
            AgentProfile(
                "socratic-planner",
                700,
                ("Read", "TodoWrite"),
                "Grep",
                "to search the vault for the notes the learner already has",
                "session plan",
            ),
        )
    }
)

TEAM_AGENT_NAMES: tuple[str, ...] = tuple(SIMULATED_AGENTS)


def profile_for(agent_name: str) -> AgentProfile:
    """The agent's profile; an agent the team does not ship gets a plain generic one.

    A generic profile lets a user's own definitions (or an agent the loop created) run on the
    simulated runtime too: it calls no tools and writes medium-length answers.
    """
    known = SIMULATED_AGENTS.get(agent_name)
    if known is not None:
        return known
    return AgentProfile(
        agent_name, 600, (), "WebFetch", "to fetch a page the task refers to", "answer"
    )


def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


_INSTRUCTION_KEY = _normalise(FORMAT_INSTRUCTION)


def has_format_instruction(prompt: str) -> bool:
    """Whether ``prompt`` states ``FORMAT_INSTRUCTION`` (whitespace and case do not matter)."""
    return _INSTRUCTION_KEY in _normalise(prompt)


def format_instruction_line(prompt: str) -> tuple[int | None, int]:
    """(1-based line of the last non-blank line stating the instruction or None, non-blank lines).

    Lines are counted without blank ones, so "the last line" means the last thing said.
    """
    lines = [line for line in prompt.splitlines() if line.strip()]
    found: int | None = None
    for number, line in enumerate(lines, start=1):
        if _INSTRUCTION_KEY in _normalise(line):
            found = number
    return found, len(lines)


_DEFINITION = re.compile(r"^[a-z0-9][a-z0-9-]*\.(md|evals\.yaml)$")


def team_files() -> dict[str, Traversable]:
    """The shipped team's files (definitions and eval suites) by file name."""
    folder = resources.files("agentmend.infrastructure") / "simulated_team"
    return {
        entry.name: entry
        for entry in sorted(folder.iterdir(), key=lambda item: item.name)
        if entry.is_file() and _DEFINITION.match(entry.name)
    }


def copy_team(destination_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Copy the six definition files (and their eval suites) into ``destination_dir``.

    The improvement loop edits the copies, never the package's own files, so every demo and test
    starts from the same healthy team.

    Args:
        destination_dir: the folder to copy into; created if missing.
        overwrite: replace files that already exist there with different content.

    Returns:
        The destination folder.

    Raises:
        ConfigurationError: a file of the same name with other content is already there (and
            ``overwrite`` is false); nothing is written in that case.
    """
    destination = Path(destination_dir)
    files = {name: entry.read_bytes() for name, entry in team_files().items()}
    if not overwrite:
        for name, data in files.items():
            target = destination / name
            current = read_if_exists(target)
            if current is not None and current != data:
                raise ConfigurationError(
                    f"{target}: a different file is already there; "
                    "pass overwrite=True to replace it"
                )
    destination.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        target = destination / name
        if read_if_exists(target) != data:
            atomic_write(target, data)
    return destination
