"""Settings come from arguments or AGENTMEND_* variables, read when made, never at import."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.principal import ADMIN
from agentmend.infrastructure.settings import InvalidSetting, Settings, load_settings


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


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("AGENTMEND_BASELINE_N", "5", "should be greater than or equal to 10"),
        ("AGENTMEND_PROVIDER", "openai", "should be 'offline', 'anthropic' or 'claude-agent-sdk'"),
        ("AGENTMEND_TEST_COMMAND", "pytest -x", "should be a JSON list of strings"),
        ("AGENTMEND_YOLO_MODE", "maybe", "should be a valid boolean"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it_the_value_and_what_is_allowed(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, allowed: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidSetting) as raised:
        load_settings()
    assert str(raised.value).startswith(f"{variable}={value!r} is not allowed: {allowed}")
    assert "\n" not in str(raised.value)
    assert (raised.value.setting, raised.value.value) == (variable, value)
    assert isinstance(raised.value, ConfigurationError)


def test_a_bad_argument_is_named_as_the_argument() -> None:
    with pytest.raises(InvalidSetting, match=r"^min_confidence='2' is not allowed: should be"):
        load_settings(min_confidence=2)
