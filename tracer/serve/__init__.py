"""tracer in an agent's path: an OpenAI-compatible tool-filtering gateway and an MCP server.

By job: ``http/`` (``tracer serve``, the gateway), ``mcp/`` (``tracer mcp``, the MCP server) and ``log/``
(the gateway's conversation log, for ``tracer update``). What both servers share sits here: ``selection``
(which tools, in what order), ``reload`` (the served index, swapped without a restart), ``conversations``
(which conversation a request belongs to, and whose) and ``bounded`` (clipping values a client chose).
Imports point one way: ``http`` and ``mcp`` use ``log`` and the shared modules, ``log`` only the shared
ones (tests/unit/test_layers.py). See docs/gateway.md.
"""
