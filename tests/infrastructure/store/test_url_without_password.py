"""A PostgreSQL URL without its password: what a workspace records. The result names exactly
the same server, database, user and options, or the URL is refused by name (never kept with a
piece of the password left in it)."""

from __future__ import annotations

import pytest

from agentmend.infrastructure.errors import StoreError
from agentmend.infrastructure.store.postgres import (
    connection_parameters,
    without_password,
)

SECRET = "Pl4ntedSecret"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"postgresql://app:{SECRET}@db:5433/fleet", "postgresql://app@db:5433/fleet"),
        (f"postgres://app:{SECRET}@db/fleet", "postgres://app@db/fleet"),
        (
            f"postgresql://app@db/fleet?sslmode=require&password={SECRET}",
            "postgresql://app@db/fleet?sslmode=require",
        ),
        (f"postgresql://app:{SECRET}%40x@db/fleet", "postgresql://app@db/fleet"),
        (f"postgresql://app:{SECRET}@h1:1,h2:2/fleet", "postgresql://app@h1:1,h2:2/fleet"),
        (f"postgresql://app:{SECRET}@[::1]:5432/fleet", "postgresql://app@[::1]:5432/fleet"),
        ("postgresql:///?service=fleet", "postgresql:///?service=fleet"),
        ("postgresql://app@db/fleet", "postgresql://app@db/fleet"),
    ],
)
def test_the_password_is_taken_out_and_nothing_else(url: str, expected: str) -> None:
    stripped = without_password(url)
    assert stripped == expected
    assert SECRET not in stripped
    assert connection_parameters(stripped) == connection_parameters(url)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{SECRET[:5]}/{SECRET[5:]}@db/fleet",  # an unencoded "/"
        f"postgresql://app:{SECRET[:5]}@{SECRET[5:]}@db/fleet",  # an unencoded "@"
        f"postgresql://app:{SECRET}@db/fleet?nosuch=1",  # libpq refuses it
    ],
)
def test_a_url_whose_password_cannot_be_taken_out_cleanly_is_refused(url: str) -> None:
    with pytest.raises(StoreError) as raised:
        without_password(url)
    message = str(raised.value)
    assert SECRET[5:] not in message
    assert "PostgreSQL URL" in message or "percent-encode" in message
