"""One detection baseline per store: recorded by the first writer, replaced only explicitly,
read by every face (on both backends)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentmend.faces.workspace import Workspace
from agentmend.infrastructure.detection.team_baseline import (
    read_team_baseline,
    settle_team_baseline,
)
from agentmend.infrastructure.settings import Settings, load_settings
from agentmend.infrastructure.store.api import Store


def test_the_first_writer_records_it_and_only_an_explicit_value_replaces_it(
    store_url: str,
) -> None:
    with Store(store_url) as store:
        assert read_team_baseline(store) is None
        unset = load_settings(store_url=store_url)
        assert "baseline_n" not in unset.model_fields_set
        assert settle_team_baseline(store, unset, default=30).baseline_n == 30
        assert read_team_baseline(store) == 30
        # another process with its own default follows the store
        assert settle_team_baseline(store, unset, default=40).baseline_n == 30
        assert settle_team_baseline(store, unset).baseline_n == 30
        # a value set explicitly is the team's from now on
        assert settle_team_baseline(store, Settings(baseline_n=80)).baseline_n == 80
        assert read_team_baseline(store) == 80
        assert settle_team_baseline(store, unset, default=30).baseline_n == 80


def test_status_judges_against_the_baseline_the_session_used(tmp_path: Path) -> None:
    """A workspace the simulated session opened (baseline 30): the CLI reads 30, not 500."""
    settings = load_settings(store_url=str(tmp_path / "ws" / "agentmend.db"))
    with Workspace.open(tmp_path / "ws", settings=settings, baseline_default=30) as workspace:
        assert workspace.settings.baseline_n == 30
        for _ in range(35):
            workspace.monitor.record("writer", success=True, duration_ms=10.0)
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentmend.faces.cli",
            "status",
            "--json",
            "--workspace",
            str(tmp_path / "ws"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert status.returncode == 0, status.stderr
    assert '"warming_up": []' in status.stdout
    assert '"needed": 30' in status.stdout
