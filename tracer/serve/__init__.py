"""tracer in an agent's path: an OpenAI-compatible tool-filtering gateway and an MCP server.

``gateway`` (the ASGI app), ``selection`` (which tools, in what order), ``validation``, ``reload``
(the served index), ``logging_sink`` (conversations for learning), ``metrics``, ``command`` (the
``tracer serve`` arguments), ``mcp_server`` (``tracer mcp``). See docs/gateway.md.
"""
