"""The MCP server face: the tools (``tools``), their answers (``results``), the stdio server."""
