"""``python -m agents.mcp_server``: starts the MCP server face (``agents.faces.mcp_server``)."""

import sys

from agents.faces.mcp_server import main

if __name__ == "__main__":
    sys.exit(main())
