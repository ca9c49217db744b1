"""``python -m agentmend.mcp_server``: starts the MCP server face
(``agentmend.faces.mcp.server``)."""

import sys

from agentmend.faces.mcp.server import main

if __name__ == "__main__":
    sys.exit(main())
