"""``tracer mcp``: one MCP server in front of many, whose ``tools/list`` is the best k for the session.

``server`` (the router and its stdio entry), ``http`` (streamable HTTP behind a session gate), ``tenants``
(whom a request belongs to), ``sessions`` (what a session remembers, capped per tenant), ``upstreams`` (the
MCP servers behind it, reconnected when lost). The choice of tools is the gateway's
(:mod:`tracer.serve.selection`). See docs/gateway.md.
"""
