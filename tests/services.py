"""Tests that need a real service (a browser, a database server) find it here or skip.

Locally a missing service skips the test with the reason. CI sets
``AGENTMEND_REQUIRE_SERVICES=1``, which turns that skip into a failure, so a service that CI
failed to install cannot silently drop a suite.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE_ENV = "AGENTMEND_REQUIRE_SERVICES"


def unavailable(reason: str) -> NoReturn:
    """Skip (locally) or fail (with ``AGENTMEND_REQUIRE_SERVICES=1``) for ``reason``."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1 requires it)", pytrace=False)
    pytest.skip(reason)


def chromium_path() -> str:
    """Debian's Chromium, or skip/fail saying how to get it."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    unavailable("Chromium is not installed (apt-get install chromium)")
