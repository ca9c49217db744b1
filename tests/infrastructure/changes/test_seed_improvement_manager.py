"""Seed 003's TestImprovementManager, unchanged but for the import: users' existing tests must pass.

The seed's paths under /tmp persist between runs; the manager opens them as SQLite stores and
``manager.history`` holds only this session's changes, so the file passes run after run.
"""
# mypy: allow-untyped-defs

from agentmend import ChangeType, ImprovementAction, ImprovementManager


# fmt: off
class TestImprovementManager:
    """Test improvement history and rollback"""

    def test_log_and_retrieve_change(self):
        manager = ImprovementManager(history_file="/tmp/test_history.json")

        action = ImprovementAction(
            target_agent="test-agent",
            action_type=ChangeType.PROMPT_MODIFICATION,
            old_value="old prompt",
            new_value="new prompt",
            rationale="Test change",
            confidence_score=0.9
        )

        change_id = manager.log_change(action)

        assert len(manager.history) == 1
        assert manager.history[0].change_id == change_id
        assert manager.history[0].action.target_agent == "test-agent"

    def test_rollback_last(self):
        manager = ImprovementManager(history_file="/tmp/test_history2.json")

        action = ImprovementAction(
            target_agent="test-agent",
            action_type=ChangeType.PARAMETER_ADJUSTMENT,
            old_value=0.7,
            new_value=0.5,
            rationale="Lower temperature",
            confidence_score=0.8
        )

        manager.log_change(action)
        rolled_back = manager.rollback_last()

        assert rolled_back is not None
        assert rolled_back.status.value == "rolled_back"

    def test_max_improvements_limit(self):
        manager = ImprovementManager(history_file="/tmp/test_history3.json")
        manager.max_improvements_per_session = 2

        action = ImprovementAction(
            target_agent="test",
            action_type=ChangeType.PROMPT_MODIFICATION,
            old_value="",
            new_value="",
            rationale="Test",
            confidence_score=0.5
        )

        manager.log_change(action)
        manager.log_change(action)

        can_improve, reason = manager.can_make_improvement()
        assert not can_improve
        assert "Max improvements" in reason
# fmt: on
