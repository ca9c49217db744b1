"""Which arm of a rollout serves a run: a stable hash of its routing key, so both arms see one mix.

The key is the caller's (a user or conversation id: the same user stays on one arm for the whole
rollout) or, when none is given, a random run id. The hash is keyed with the rollout's secret
(``Rollouts.routing_key_of``; the rollout id for rollouts started before they had one), so a
user who drew the canary in one rollout is not always the one who draws it in the next, and no
caller can pick keys that land on an arm of their choosing.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from typing import Literal

from agentmend.infrastructure.errors import InvalidArgument, WrongArgumentType

__all__ = ["DEFAULT_SHARE", "Arm", "check_share", "choose_arm", "new_run_key"]

Arm = Literal["stable", "canary"]

DEFAULT_SHARE = 0.10
"""The share of each agent's runs a new release serves first."""

_BUCKETS = 1 << 32


def check_share(share: object) -> float:
    """``share`` if it is a number strictly between 0 and 1.

    Raises:
        InvalidArgument: outside (0, 1), or not a finite number.
    """
    if isinstance(share, bool) or not isinstance(share, int | float):
        raise WrongArgumentType("canary share", share, "must be a number in (0, 1)")
    value = float(share)
    if not math.isfinite(value) or not 0.0 < value < 1.0:
        raise InvalidArgument("canary share", share, "must lie strictly between 0 and 1")
    return value


def new_run_key() -> str:
    """A random run id, the routing key of a run whose caller gave none."""
    return uuid.uuid4().hex


def choose_arm(key: object, share: float, salt: str) -> Arm:
    """The arm that serves the run with routing key ``key`` (``share`` of keys go to canary).

    Raises:
        WrongArgumentType: ``key`` is not a string (an int id would hash differently from its
            text on another worker, splitting one user across arms).
    """
    if not isinstance(key, str):
        raise WrongArgumentType("routing key", key, "must be a string (a user or run id)")
    digest = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    bucket = int.from_bytes(digest[:4], "big")
    return "canary" if bucket < share * _BUCKETS else "stable"
