"""``tracer mcp``: one MCP server in front of many, whose ``tools/list`` is the best k for the session.

Upstream MCP servers are configured in a JSON file in the shape MCP hosts use::

    {"mcpServers": {
        "office": {"command": "python", "args": ["office_server.py"], "env": {}},
        "search": {"url": "http://127.0.0.1:9000/mcp"}}}

(``command``: stdio, launched by the SDK; ``url``: streamable HTTP.) Their tools are aggregated in
canonical order (servers in file order, each server's own order); a name served twice is refused.

Per session (what a session and its tenant are, in each transport and protocol era, is
:mod:`tracer.serve.mcp.tenants`'s job; no two tenants share one) the server keeps its recent activity,
bounded, capped per tenant and forgotten when the session ends (:mod:`tracer.serve.mcp.sessions`): the
calls made through it (name, arguments, result text) and the queries, in order. A query comes from a
``find_tools`` call (free text: it answers with the best tools' names and descriptions) or from
``tools/list``'s ``_meta["io.tracer/query"]``. ``tools/list`` answers ``find_tools`` plus the k tools
the index chooses for that activity (read as a chat: each query a user message, each call an assistant tool
call and its result; :func:`tracer.serve.selection.choose`), kept stable and appended to as the
gateway does. When a call or a query changes that set the server sends ``notifications/tools/list_changed``
(on handshake-era connections directly; on 2026-07-28 connections to the session's own
``subscriptions/listen`` streams).
No session is a trial conversation (:mod:`tracer.scorer_base.trial`): a trial buys evidence for a refit with
prompt tokens, and ``tracer mcp`` writes no log for a refit to read, so it lists the served choice only.
``tools/call`` of any aggregated tool, presented or not, is proxied to the server that owns it. An
upstream that is lost (its process exits, its connection fails) has its tools leave both lists, with a
``list_changed`` to every session, until it is reconnected (:mod:`tracer.serve.mcp.upstreams`); a call
to one of them is an ``is_error`` result naming the server.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import anyio
from mcp import types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tracer.core.errors import DataError
from tracer.data.native import read_json
from tracer.serve.mcp.http import SessionGate, gated_app
from tracer.serve.mcp.sessions import Activity, SessionCaps, Sessions
from tracer.serve.mcp.tenants import LOCAL, LocalConnection, SessionKey, Tenants
from tracer.serve.mcp.upstreams import Upstream
from tracer.serve.reload import IndexHolder
from tracer.serve.selection import UnknownToolVectors, choose

logger = logging.getLogger(__name__)

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
            raise DataError(path, "needs exactly one of command (stdio) or url (streamable HTTP)",
                            field=where)
        if "command" in spec and not isinstance(spec.get("args", []), list):
            raise DataError(path, "args must be an array of strings", field=where + ".args")
    return servers


def openai_tool(tool: types.Tool) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": tool.input_schema}}


class _ListChangingServer(Server):
    """A lowlevel server that advertises ``tools.listChanged`` on every transport (the SDK's transports
    build their initialize result from ``create_initialization_options()`` without arguments)."""

    def create_initialization_options(self, notification_options=None, *args, **kwargs):
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), *args, **kwargs)


class ToolRouter:
    """Aggregates upstream servers (``async with``) and serves the filtered server (:attr:`server`).

    ``caps`` bound what is kept per session (:mod:`tracer.serve.mcp.sessions`); ``retries`` and
    ``retry_delay_s`` how a lost upstream is reconnected (:mod:`tracer.serve.mcp.upstreams`)."""

    def __init__(self, config_path: str | Path, holder: IndexHolder, k: int = 5, sticky: bool = True,
                 caps: SessionCaps | None = None, retries: int = 5, retry_delay_s: float = 1.0):
        self.config_path = Path(config_path)
        self.specs = read_config(self.config_path)
        self.holder, self.k = holder, k
        self.caps = caps or SessionCaps()
        self.unknown = UnknownToolVectors()
        self.upstreams = {name: Upstream(name, spec, self.config_path.parent, self._upstreams_changed,
                                         retries, retry_delay_s) for name, spec in self.specs.items()}
        self.tools: dict[str, types.Tool] = {}  # the live upstreams' tools, in canonical order
        self.owner: dict[str, Upstream] = {}  # every tool ever listed, live or not: who serves it
        self.sessions = Sessions(self.caps, sticky, 4 * k)
        self.tenants = Tenants()
        self.bus = InMemorySubscriptionBus()  # upstream changes, for listen streams of no session
        self._listener = ListenHandler(self.bus)
        self._gate: SessionGate | None = None  # on streamable HTTP: ends the HTTP sessions the table drops
        self._stack = contextlib.AsyncExitStack()
        self.server = _ListChangingServer("tracer", on_list_tools=self.list_tools,
                                          on_call_tool=self.call_tool,
                                          on_subscriptions_listen=self.listen,
                                          lifespan=self._lifespan)

    async def __aenter__(self) -> ToolRouter:  # noqa: PYI034
        self._stack = contextlib.AsyncExitStack()
        tasks = await self._stack.enter_async_context(anyio.create_task_group())  # the upstreams' tasks
        self._stack.callback(tasks.cancel_scope.cancel)  # unwound first: leaving the group cancels them
        try:
            for upstream in self.upstreams.values():
                await tasks.start(upstream.run)
            self._index_tools(strict=True)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def http_app(self, host: str = "127.0.0.1"):
        """The streamable-HTTP app (path ``/mcp``): the SDK's session manager (built by the SDK, with its
        transport security for ``host``) behind :class:`SessionGate`. The SDK's own session cap is a
        backstop the gate keeps it under: held and pending sessions, ``max_sessions`` of each."""
        self.server.streamable_http_app(host=host, session_idle_timeout=self.caps.idle_s,
                                        max_sessions=2 * self.caps.max_sessions)
        manager = self.server.session_manager
        self._gate = SessionGate(manager, self.sessions, self.tenants)
        return gated_app(manager, self._gate)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _server):
        """The server's lifespan: entered once per stdio or in-process connection (once in all on HTTP,
        where requests say whose they are), so its object names the connection and its end ends the
        session (:mod:`tracer.serve.mcp.tenants`)."""
        connection = LocalConnection()
        try:
            yield connection
        finally:
            self.sessions.forget(SessionKey(LOCAL, connection.id))

    async def _activity(self, ctx) -> Activity:
        """The activity of the session ``ctx`` belongs to, marked as used; a request of no session gets one
        of its own. Sessions the table drops to make room, and their HTTP sessions, end here."""
        key = self.tenants.key_of(ctx)
        if key is None:
            return self.sessions.new_activity()
        activity, dropped = self.sessions.get(key)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            activity.peer = ctx.session  # its standalone channel reaches the session's client
        for old in dropped:
            if old.key.http_session is not None and self._gate is not None:
                await self._gate.end(old.key.http_session)
        return activity

    def _index_tools(self, strict: bool = False) -> None:
        """Rebuild :attr:`tools` and :attr:`owner` from the upstreams, in file order. A name served twice is
        refused at start (``strict``); later (an upstream reconnected with other tools) the first one keeps
        it."""
        tools: dict[str, types.Tool] = {}
        owner: dict[str, Upstream] = {}
        for name, upstream in self.upstreams.items():
            for tool in upstream.tools:
                if tool.name in owner or tool.name == FIND_TOOLS.name:
                    if strict:
                        raise DataError(self.config_path,
                                        f"tool {tool.name!r} is served twice (again by {name!r})",
                                        field=f"mcpServers.{name}")
                    logger.warning("upstream %r: tool %r is served already; ignored", name, tool.name)
                    continue
                owner[tool.name] = upstream
                if upstream.alive:
                    tools[tool.name] = tool
        self.tools, self.owner = tools, owner

    async def _upstreams_changed(self) -> None:
        """An upstream was lost or came back: relist, and tell every session its list may have changed."""
        self._index_tools()
        await self.bus.publish(ToolsListChanged())  # 2026-07-28: listen streams of no session
        for activity in self.sessions.activities():
            await activity.bus.publish(ToolsListChanged())  # 2026-07-28: the session's listen streams
            if activity.peer is not None:  # handshake era; the standalone channel never raises
                await activity.peer.send_tool_list_changed()

    # ---- selection -------------------------------------------------------------------------------
    async def _choose(self, activity: Activity, tools: dict[str, types.Tool]) -> list[str]:
        return await anyio.to_thread.run_sync(choose, self.holder.retriever, activity.messages(),
                                              [openai_tool(t) for t in tools.values()], self.k, self.unknown)

    async def _present(self, activity: Activity) -> bool:
        """Recompute the session's presented tools; True when they changed."""
        tools = self.tools  # one snapshot: an upstream may come or go while the index ranks
        shown = activity.presenter.present("session", await self._choose(activity, tools), list(tools))
        changed, activity.presented = shown != activity.presented, shown
        return changed

    @staticmethod
    async def _announce(activity: Activity) -> None:
        """The session's presented tools changed: tell it, and no other session."""
        if activity.key is None:
            return  # a request's own activity: nobody to tell
        await activity.bus.publish(ToolsListChanged())  # 2026-07-28: the session's listen streams
        if activity.peer is not None:
            with contextlib.suppress(Exception):  # handshake era: straight on the session
                await activity.peer.send_tool_list_changed()

    # ---- handlers --------------------------------------------------------------------------------
    async def listen(self, ctx, params: types.SubscriptionsListenRequestParams
                     ) -> types.SubscriptionsListenResult:
        """``subscriptions/listen`` (2026-07-28): the stream hears of its own session's changes and of the
        upstreams'; a request of no session hears of the upstreams' only."""
        if self.tenants.key_of(ctx) is None:
            return await self._listener(ctx, params)
        activity = await self._activity(ctx)
        return await activity.listener(ctx, params)

    async def list_tools(self, ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        activity = await self._activity(ctx)
        query = (params.meta or {}).get(QUERY_META) if params is not None and params.meta else None
        if isinstance(query, str) and query.strip():
            activity.ask(query)
        await self._present(activity)
        return types.ListToolsResult(tools=[FIND_TOOLS] + [self.tools[n] for n in activity.presented
                                                           if n in self.tools])

    async def call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        activity = await self._activity(ctx)
        args = dict(params.arguments or {})
        if params.name == FIND_TOOLS.name:
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                return _error("find_tools: query must be a non-empty string")
            activity.ask(query)
            tools = self.tools
            found = await self._choose(activity, tools)
            result = types.CallToolResult(
                content=[types.TextContent(type="text", text="\n".join(
                    f"{n}: {tools[n].description or ''}" for n in found))],
                structured_content={"tools": found})
        elif params.name in self.owner:
            result = await self.owner[params.name].call(params.name, args)
            if not self.owner[params.name].alive:
                return result
            text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
            activity.called(params.name, args, text)
        else:
            return _error(f"unknown tool {params.name!r}; find_tools lists what is available")
        if await self._present(activity):
            await self._announce(activity)
        return result


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


async def serve_stdio(router: ToolRouter) -> None:
    async with router, stdio_server() as (read, write):
        await router.server.run(read, write, router.server.create_initialization_options())
