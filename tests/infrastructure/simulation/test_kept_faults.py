"""Injected faults kept in a file: every runtime opened on it sees them; a bad file is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmend.infrastructure.errors import ConfigurationError
from agentmend.infrastructure.simulation import Fault, FaultKind, SimulatedRuntime


def test_faults_outlive_the_runtime_that_injected_them(tmp_path: Path) -> None:
    kept = tmp_path / "faults.json"
    first = SimulatedRuntime(faults_file=kept)
    first.inject("writer", Fault(FaultKind.SLOW, latency_factor=4.0))
    first.inject("critic", "truncation")
    second = SimulatedRuntime(faults_file=kept)
    assert second.faults("writer") == (Fault(FaultKind.SLOW, latency_factor=4.0),)
    assert second.faults("critic") == (Fault(FaultKind.TRUNCATION),)
    second.heal("writer")
    assert SimulatedRuntime(faults_file=kept).faults("writer") == ()
    assert SimulatedRuntime().faults("critic") == ()  # without a file, nothing is shared


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"version": 2, "faults": []}',
        '{"version": 1, "faults": [{"agent": "a", "kind": "melting"}]}',
        '{"version": 1, "faults": [{"agent": "a", "kind": "slow", "latency_factor": 0}]}',
        '{"version": 1, "faults": [{"agent": "a", "kind": "slow", "colour": "red"}]}',
        '{"version": 1, "faults": [7]}',
    ],
)
def test_a_file_that_is_not_one_is_a_named_error_and_left_as_it_is(
    tmp_path: Path, text: str
) -> None:
    kept = tmp_path / "faults.json"
    kept.write_text(text)
    with pytest.raises(ConfigurationError, match=r"faults\.json: not a file of injected faults"):
        SimulatedRuntime(faults_file=kept)
    assert kept.read_text() == text
