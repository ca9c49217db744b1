"""Seed 003's TestAskAgentTool, unchanged but for the import: users' existing tests must pass."""
# mypy: allow-untyped-defs

import pytest

from agentmend import AskAgentTool


class TestAskAgentTool:
    """Test inter-agent communication tool"""

    @pytest.mark.asyncio
    async def test_ask_agent_success(self):
        async def mock_agent(question):
            return f"Answer to: {question}"

        registry = {"agent1": mock_agent}
        tool = AskAgentTool(registry)

        result = await tool.ask_agent("agent1", "What is 2+2?")

        assert result["success"] is True
        assert "Answer to: What is 2+2?" in result["answer"]

    @pytest.mark.asyncio
    async def test_ask_agent_not_found(self):
        tool = AskAgentTool({})

        result = await tool.ask_agent("nonexistent", "Question")

        assert result["success"] is False
        assert "not found" in result["error"]

    @pytest.mark.asyncio
    async def test_query_history(self):
        async def mock_agent(q):
            return "Answer"

        tool = AskAgentTool({"agent1": mock_agent})

        await tool.ask_agent("agent1", "Q1")
        await tool.ask_agent("agent1", "Q2")

        history = tool.get_query_history()
        assert len(history) == 2
        assert history[0]["question"] == "Q1"
        assert history[1]["question"] == "Q2"
