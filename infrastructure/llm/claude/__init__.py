"""The claude-agent-sdk runtime: the Claude Code CLI run, its hooks, tools, errors and state."""
