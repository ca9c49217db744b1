"""The faces people use: the agentmend command, session, MCP server, demo, pytest plugin."""
