"""A small real MCP server over stdio, written with the SDK, for the MCP tests.

``python tests/mcp_upstream.py travel`` serves search_flights, book_flight and cancel_booking;
``office`` serves get_weather, send_email and list_files (the tools of ``data/example``). Each tool
answers ``"<server>.<tool>(<arguments as JSON>)"`` so a test can see which upstream ran it. With
``MCP_UPSTREAM_PIDFILE`` set it writes its process id there first (a test that kills it reads it), and
with ``MCP_UPSTREAM_REFUSE`` naming a file that exists it exits at once (an upstream that cannot restart);
with ``MCP_UPSTREAM_DIE_ON`` naming a tool, a call of that tool ends the process before it answers (an
upstream that dies during a call).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp.server import MCPServer

FAMILIES = {
    "travel": {"search_flights": "Search flights between two airports on a date",
               "book_flight": "Book a flight for the user by flight number",
               "cancel_booking": "Cancel an existing booking by its id"},
    "office": {"get_weather": "Get the weather forecast for a city",
               "send_email": "Send an email message to a recipient",
               "list_files": "List the files in the current directory"},
}


def make_tool(family: str, name: str):
    def tool(city: str = "", to: str = "", flight: str = "") -> str:
        if os.environ.get("MCP_UPSTREAM_DIE_ON") == name:
            os._exit(1)
        args = {k: v for k, v in (("city", city), ("to", to), ("flight", flight)) if v}
        return f"{family}.{name}({json.dumps(args, sort_keys=True)})"
    return tool


def build(family: str) -> MCPServer:
    server = MCPServer(family)
    for name, description in FAMILIES[family].items():
        server.add_tool(make_tool(family, name), name=name, description=description)
    return server


if __name__ == "__main__":
    if os.environ.get("MCP_UPSTREAM_REFUSE") and Path(os.environ["MCP_UPSTREAM_REFUSE"]).exists():
        sys.exit(3)
    if os.environ.get("MCP_UPSTREAM_PIDFILE"):
        Path(os.environ["MCP_UPSTREAM_PIDFILE"]).write_text(str(os.getpid()))
    build(sys.argv[1]).run("stdio")
