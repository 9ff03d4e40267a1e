"""``tracer mcp``: one MCP server in front of many, whose ``tools/list`` is the best k for the session.

Upstream MCP servers are configured in a JSON file in the shape MCP hosts use::

    {"mcpServers": {
        "office": {"command": "python", "args": ["office_server.py"], "env": {}},
        "search": {"url": "http://127.0.0.1:9000/mcp"}}}

(``command``: stdio, launched by the SDK; ``url``: streamable HTTP.) Their tools are aggregated in
canonical order (servers in file order, each server's own order); a name served twice is refused.

Per session (a streamable-HTTP ``Mcp-Session-Id``; a stdio server serves one client, so one session;
a 2026-07-28 HTTP client without a session shares ``default``) the server keeps its activity: the calls made through it (name,
arguments, result text) and the queries, in order. A query comes from a ``find_tools`` call (free text:
it answers with the best tools' names and descriptions) or from ``tools/list``'s
``_meta["io.tracer/query"]``. ``tools/list`` answers ``find_tools`` plus the k tools the index
chooses for that activity (read as a chat: each query a user message, each call an assistant tool
call and its result; :func:`tracer.serve.selection.choose`), kept stable and appended to as the
gateway does. When a call or a query changes that set the server sends ``notifications/tools/list_changed``
(on handshake-era connections directly; on 2026-07-28 connections to ``subscriptions/listen`` streams).
``tools/call`` of any aggregated tool, presented or not, is proxied to the server that owns it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters, types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged

from tracer.core.errors import DataError
from tracer.data.native import read_json
from tracer.serve.reload import IndexHolder
from tracer.serve.selection import StickyPresenter, UnknownToolVectors, choose

QUERY_META = "io.tracer/query"
FIND_TOOLS = types.Tool(
    name="find_tools",
    description="Find the tools that fit a task described in free text; the best ones are also added to "
                "this server's tool list.",
    input_schema={"type": "object", "properties": {"query": {"type": "string", "description": "what to do"}},
                  "required": ["query"]})


def read_config(path: str | Path) -> dict[str, dict[str, Any]]:
    """The ``mcpServers`` of a config file, each checked (a DataError names file and field)."""
    cfg = read_json(path)
    servers = cfg.get("mcpServers") if isinstance(cfg, dict) else None
    if not isinstance(servers, dict) or not servers:
        raise DataError(path, "expected a non-empty object of servers", field="mcpServers")
    for name, spec in servers.items():
        where = f"mcpServers.{name}"
        if not isinstance(spec, dict) or ("command" in spec) == ("url" in spec):
            raise DataError(path, "needs exactly one of command (stdio) or url (streamable HTTP)", field=where)
        if "command" in spec and not isinstance(spec.get("args", []), list):
            raise DataError(path, "args must be an array of strings", field=where + ".args")
    return servers


def _transport(spec: Mapping[str, Any], base: Path) -> StdioServerParameters | str:
    if "url" in spec:
        return spec["url"]
    return StdioServerParameters(command=spec["command"], args=[str(a) for a in spec.get("args", [])],
                                 env=spec.get("env"), cwd=spec.get("cwd", base))


def openai_tool(tool: types.Tool) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": tool.input_schema}}


class _ListChangingServer(Server):
    """A lowlevel server that advertises ``tools.listChanged`` on every transport (the SDK's transports
    build their initialize result from ``create_initialization_options()`` without arguments)."""

    def create_initialization_options(self, notification_options=None, *args, **kwargs):
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), *args, **kwargs)


@dataclass
class Activity:
    """What one session did, as the chat the index reads: each query a user message, each call an
    assistant tool call followed by its result (the last ``max_messages`` kept)."""

    chat: list[dict[str, Any]] = field(default_factory=list)
    presented: list[str] = field(default_factory=list)
    max_messages: int = 200

    def ask(self, query: str) -> None:
        self._add({"role": "user", "content": query})

    def called(self, name: str, args: Mapping[str, Any], text: str) -> None:
        i = sum(m["role"] == "tool" for m in self.chat)
        self._add({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(dict(args))}}]})
        self._add({"role": "tool", "tool_call_id": f"c{i}", "content": text[:2000]})

    def _add(self, message: dict[str, Any]) -> None:
        self.chat = (self.chat + [message])[-self.max_messages:]

    def messages(self) -> list[dict[str, Any]]:
        return self.chat if self.chat and self.chat[0]["role"] == "user" else \
            [{"role": "user", "content": ""}] + self.chat


class ToolRouter:
    """Aggregates upstream servers (``async with``) and serves the filtered server (:attr:`server`)."""

    def __init__(self, config_path: str | Path, holder: IndexHolder, k: int = 5, sticky: bool = True):
        self.config_path = Path(config_path)
        self.specs = read_config(self.config_path)
        self.holder, self.k = holder, k
        self.presenter = StickyPresenter(sticky, 4 * k)
        self.unknown = UnknownToolVectors()
        self.tools: dict[str, types.Tool] = {}
        self.owner: dict[str, Client] = {}
        self.sessions: dict[str, Activity] = {}
        self.bus = InMemorySubscriptionBus()
        self._stack = contextlib.AsyncExitStack()
        self.server = _ListChangingServer("tracer", on_list_tools=self.list_tools, on_call_tool=self.call_tool,
                             on_subscriptions_listen=ListenHandler(self.bus))

    async def __aenter__(self) -> ToolRouter:  # noqa: PYI034
        try:
            for name, spec in self.specs.items():
                client = await self._stack.enter_async_context(Client(_transport(spec, self.config_path.parent)))
                for tool in await self._all_tools(client):
                    if tool.name in self.tools or tool.name == FIND_TOOLS.name:
                        raise DataError(self.config_path, f"tool {tool.name!r} is served twice (again by {name!r})",
                                        field=f"mcpServers.{name}")
                    self.tools[tool.name], self.owner[tool.name] = tool, client
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @staticmethod
    async def _all_tools(client: Client) -> list[types.Tool]:
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            if not (cursor := page.next_cursor):
                return tools

    # ---- selection -------------------------------------------------------------------------------
    def _activity(self, ctx) -> tuple[str, Activity]:
        """The session's activity: by ``Mcp-Session-Id`` over streamable HTTP; a stdio server has one client."""
        headers = getattr(ctx.request, "headers", None)
        key = (headers.get("mcp-session-id") if headers is not None else None) or "default"
        return key, self.sessions.setdefault(key, Activity())

    async def _present(self, key: str, activity: Activity) -> bool:
        """Recompute the session's presented tools; True when they changed."""
        tools = [openai_tool(t) for t in self.tools.values()]
        chosen = await anyio.to_thread.run_sync(
            choose, self.holder.retriever, activity.messages(), tools, self.k, self.unknown)
        shown = self.presenter.present(key, chosen, list(self.tools))
        changed, activity.presented = shown != activity.presented, shown
        return changed

    async def _announce(self, ctx) -> None:
        await self.bus.publish(ToolsListChanged())  # 2026-07-28: listen streams
        with contextlib.suppress(Exception):  # handshake era: straight on the session
            await ctx.session.send_tool_list_changed()

    # ---- handlers --------------------------------------------------------------------------------
    async def list_tools(self, ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        key, activity = self._activity(ctx)
        query = (params.meta or {}).get(QUERY_META) if params is not None and params.meta else None
        if isinstance(query, str) and query.strip():
            activity.ask(query)
        await self._present(key, activity)
        return types.ListToolsResult(tools=[FIND_TOOLS] + [self.tools[n] for n in activity.presented])

    async def call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        key, activity = self._activity(ctx)
        args = dict(params.arguments or {})
        if params.name == FIND_TOOLS.name:
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return _error("find_tools: query must be a non-empty string")
            activity.ask(query)
            tools = [openai_tool(t) for t in self.tools.values()]
            found = await anyio.to_thread.run_sync(
                choose, self.holder.retriever, activity.messages(), tools, self.k, self.unknown)
            result = types.CallToolResult(
                content=[types.TextContent(type="text", text="\n".join(
                    f"{n}: {self.tools[n].description or ''}" for n in found))],
                structured_content={"tools": found})
        elif params.name in self.tools:
            result = await self.owner[params.name].call_tool(params.name, args)
            text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
            activity.called(params.name, args, text)
        else:
            return _error(f"unknown tool {params.name!r}; find_tools lists what is available")
        if await self._present(key, activity):
            await self._announce(ctx)
        return result


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


async def serve_stdio(router: ToolRouter) -> None:
    async with router, stdio_server() as (read, write):
        await router.server.run(read, write, router.server.create_initialization_options())
