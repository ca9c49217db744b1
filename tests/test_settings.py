"""Settings come from arguments or AGENTMEND_* variables, read when made, never at import."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infrastructure.principal import ADMIN
from infrastructure.settings import Settings


def test_the_default_principal_has_standard_rights() -> None:
    principal = Settings().default_principal
    assert principal.user_id == "agentmend"
    assert not principal.is_admin


def test_an_admin_principal_is_configured_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTMEND_PRINCIPAL_ADMIN", "true")
    monkeypatch.setenv("AGENTMEND_PRINCIPAL_ID", "ops-lead")
    principal = Settings().default_principal
    assert principal.is_admin
    assert principal.permissions == frozenset({ADMIN})
    assert principal.user_id == "ops-lead"


def test_the_test_command_is_a_json_list_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTMEND_TEST_COMMAND", '["python", "-m", "pytest", "-q"]')
    assert Settings().test_command == ("python", "-m", "pytest", "-q")


@pytest.mark.parametrize(
    ("field", "value"),
    [("false_alarm_rate", 0), ("min_confidence", 1.5), ("provider", "openai"), ("nope", 1)],
)
def test_bad_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        Settings(**{field: value})  # type: ignore[arg-type]
