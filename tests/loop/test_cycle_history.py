"""Reading recorded cycles in bulk and a change's cycle by its id: the same results as
replaying each cycle on its own, on the demo's workspace and with cycles interleaved."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from cli_run import demo_workspace

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.changes.protocol.decisions import record_decision
from agentmend.infrastructure.store.api import Store
from agentmend.loop.cycle import DECISION_PREFIX, cycle_events, list_cycle_ids, replay_cycle
from agentmend.loop.cycle_history import cycle_of_change, cycle_summaries, latest_cycles


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_workspace(tmp_path_factory.mktemp("cycles") / "ws") / "agentmend.db"


def test_the_latest_cycles_equal_their_replays_newest_first(demo_store: Path) -> None:
    with Store(demo_store) as store:
        ids = list(reversed(list_cycle_ids(store, limit=50)))
        assert len(ids) >= 3
        replayed = [replay_cycle(store, cycle_id) for cycle_id in ids]
        assert latest_cycles(store, limit=50) == replayed
        assert latest_cycles(store, limit=2) == replayed[:2]
        assert latest_cycles(store, limit=0) == []


def test_older_cycles_are_summarised_as_their_fold_says(demo_store: Path) -> None:
    with Store(demo_store) as store:
        replayed = [replay_cycle(store, i) for i in reversed(list_cycle_ids(store, limit=50))]
        for skip in (0, 1, len(replayed)):
            summaries = cycle_summaries(store, skip=skip, limit=50)
            assert [(s.cycle_id, s.started_at, s.issue, s.status) for s in summaries] == [
                (c.cycle_id, c.started_at, c.issue, c.status) for c in replayed[skip:]
            ]
        assert len(cycle_summaries(store, skip=1, limit=1)) == 1


def test_each_change_is_found_in_the_cycle_that_applied_it(demo_store: Path) -> None:
    with Store(demo_store) as store:
        manager = ImprovementManager(store=store, recover=False)
        changes = manager.get_history(limit=100)
        manager.close()
        assert changes
        by_change = {
            change_id: cycle
            for cycle in (replay_cycle(store, i) for i in list_cycle_ids(store, limit=50))
            for change_id in cycle.change_ids
        }
        assert by_change
        for record in changes:
            assert cycle_of_change(store, record.change_id) == by_change.get(record.change_id)
        assert cycle_of_change(store, "no-such-change") is None


def test_interleaved_cycles_are_told_apart(demo_store: Path, tmp_path: Path) -> None:
    """Two cycles recorded at once (events alternating) read back as they were recorded."""
    with Store(demo_store) as source:
        first, second = list_cycle_ids(source, limit=2)
        streams = [cycle_events(source, first), cycle_events(source, second)]
        expected = [replay_cycle(source, second), replay_cycle(source, first)]
    with Store(tmp_path / "mixed.db") as store:
        for event in itertools.chain.from_iterable(itertools.zip_longest(*streams)):
            if event is not None:
                record_decision(
                    store,
                    DECISION_PREFIX + event.step,
                    agent_name=event.agent_name,
                    payload=event.model_dump(mode="json", exclude={"timestamp"}),
                    timestamp=event.timestamp,
                )
        assert latest_cycles(store, limit=2) == expected
        assert latest_cycles(store, limit=1) == expected[:1]
        for cycle in expected:
            for change_id in cycle.change_ids:
                assert cycle_of_change(store, change_id) == cycle
