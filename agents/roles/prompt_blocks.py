"""Tagged JSON blocks: how one role hands structured context to the next inside a prompt.

A role prompt is human-readable text plus exactly one ``<tag>{json}</tag>`` block per piece of
context (``<issue_report>``, ``<analysis>``, ``<agent_config>``, ``<available_models>``,
``<proposed_change>``). A model reads the whole prompt; an offline playbook reads only the
blocks, so the two never disagree about what the context was.

The block body never contains ``<``: ``render_block`` writes it as the JSON escape ``\\u003c``
(which decodes back to ``<``). An error message quoted inside the JSON therefore cannot close the
block early. Text elsewhere in the prompt can still *imitate* a block (an agent's error message
saying ``<issue_report>{...}</issue_report>``), so ``extract_block`` refuses a prompt holding two
different blocks of one tag instead of guessing which one is real.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentmend.infrastructure.errors import AgentmendError, InvalidArgument

__all__ = ["PromptBlockError", "extract_block", "render_block"]

_TAG = re.compile(r"[a-z][a-z0-9_-]*")


class PromptBlockError(AgentmendError, ValueError):
    """A prompt block that is missing, ambiguous or not JSON; ``tag`` names which one."""

    def __init__(self, tag: str, problem: str) -> None:
        self.tag = tag
        self.problem = problem
        super().__init__(f"<{tag}> block: {problem}")


def _check_tag(tag: str) -> None:
    if not _TAG.fullmatch(tag):
        raise InvalidArgument(
            "tag", tag, "is an invalid block tag: use lowercase letters, digits, '_' and '-'"
        )


def render_block(tag: str, obj: Any) -> str:
    """``<tag>{json}</tag>`` for ``obj`` (anything ``json.dumps`` takes; sorted keys for stability).

    Raises:
        InvalidArgument: ``tag`` is not a plain lowercase name.
        TypeError: ``obj`` is not JSON-serialisable.
    """
    _check_tag(tag)
    body = json.dumps(obj, ensure_ascii=False, sort_keys=True).replace("<", "\\u003c")
    return f"<{tag}>{body}</{tag}>"


def extract_block(text: str, tag: str) -> Any:
    """The decoded JSON of the one ``<tag>`` block in ``text``.

    Candidates whose body is not JSON are ignored (prose may mention ``<tag>``); identical
    duplicates count once.

    Raises:
        PromptBlockError: (a ``ValueError``) no ``<tag>`` block with a JSON body, or two
            different ones.
    """
    _check_tag(tag)
    pattern = re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL)
    found: list[Any] = []
    invalid = 0
    for match in pattern.finditer(text):
        try:
            value = json.loads(match.group(1))
        except json.JSONDecodeError:
            invalid += 1
            continue
        if value not in found:
            found.append(value)
    if not found:
        detail = f" ({invalid} with a body that is not JSON)" if invalid else ""
        raise PromptBlockError(tag, f"not found in the prompt{detail}")
    if len(found) > 1:
        raise PromptBlockError(
            tag, f"{len(found)} different blocks in the prompt; refusing to guess which is real"
        )
    return found[0]
