"""Runs made storable before anything counts or writes them.

``record()`` checks types and signs on the caller's path and nothing more, so a run may still
hold a value no store takes (a NUL in its agent name, a lone surrogate in its error, ``inf``
milliseconds, ``10**30`` tokens) or one too large to keep (a megabyte agent name). The
store-backed monitor passes every batch through :func:`storable_rows` when it takes the batch
from the buffer, before its per-agent state sees it, so what the monitor counts under a name
and what the store holds under it are the same (see
:mod:`agentmend.infrastructure.store.storable`). A monitor in memory stores nothing and keeps
runs as given.
"""

from __future__ import annotations

from agentmend.infrastructure.monitoring.agent_window import Row
from agentmend.infrastructure.store.storable import (
    MAX_ERROR_CHARS,
    MAX_NAME_CHARS,
    MAX_NUMBER,
    json_storable_as_is,
    storable_count,
    storable_json,
    storable_number,
    storable_text,
)

__all__ = ["storable_rows"]


def storable_rows(rows: list[Row]) -> list[Row]:
    """``rows`` with every row that needs it replaced by its storable form (the list itself
    is changed in place and returned); a row that needs nothing is kept as it is."""
    names: set[str] = set()  # agent names found storable: a batch has a few, many times
    for i, row in enumerate(rows):
        agent, _, _, duration, error, tin, tout, cost, _, extra = row
        if agent not in names:
            if len(agent) <= MAX_NAME_CHARS and agent.isascii() and "\x00" not in agent:
                names.add(agent)
            else:
                rows[i] = _storable(row)
                continue
        if (
            (error is None or (len(error) <= MAX_ERROR_CHARS and error.isascii()))
            and (error is None or "\x00" not in error)
            and (extra is None or json_storable_as_is(extra))
            and 0.0 <= duration <= MAX_NUMBER
            and type(tin) is int
            and type(tout) is int
            and tin <= MAX_NUMBER
            and tout <= MAX_NUMBER
            and cost <= MAX_NUMBER
        ):
            continue
        rows[i] = _storable(row)
    return rows


def _storable(row: Row) -> Row:
    agent, source, success, duration, error, tin, tout, cost, ts, extra = row
    return (
        storable_text(agent, MAX_NAME_CHARS),
        source,
        success,
        storable_number(duration),
        None if error is None else storable_text(error, MAX_ERROR_CHARS),
        storable_count(tin),
        storable_count(tout),
        storable_number(cost),
        ts,
        None if extra is None else storable_json(extra),
    )
