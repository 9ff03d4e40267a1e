"""The upstream MCP servers of ``tracer mcp``: each one connected by a task of its own, watched, and
reconnected a bounded number of times when it is lost.

An upstream is *lost* when its stdio process exits (the end of its stdout, seen by :func:`watched`, a
transport in the SDK's sense wrapped around the SDK's own), when its connection fails (a streamable-HTTP
server that stopped answering fails the SDK client's task group), or when a call through it finds the
connection closed. Its tools then leave the router's list (:attr:`Upstream.tools` is kept, so a call to
one can name the server that served it), and the upstream is connected again after ``retry_delay_s``
seconds, doubling up to :data:`MAX_RETRY_DELAY_S` (:func:`tracer.core.backoff.backoff_s`), at most
``retries`` times in a row; a connection that lists its tools resets the count. After that it stays lost
until ``tracer mcp`` restarts.

The SDK's client holds task groups that must be left by the task that entered them, so each
:class:`Upstream` keeps its client inside :meth:`Upstream.run`, one task of the router's task group.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from tracer.core.backoff import backoff_s

logger = logging.getLogger(__name__)

MAX_RETRY_DELAY_S = 60.0


def transport_of(spec: Mapping[str, Any], base: Path):
    """The SDK transport a config entry names: ``url`` (streamable HTTP) or ``command`` (stdio)."""
    if "url" in spec:
        return streamable_http_client(spec["url"])
    return stdio_client(StdioServerParameters(command=spec["command"],
                                              args=[str(a) for a in spec.get("args", [])],
                                              env=spec.get("env"), cwd=spec.get("cwd", base)))


class _EndSignalling:
    """A read stream (the SDK's ``ReadStream`` protocol) that calls ``on_end`` when its sender closes it."""

    def __init__(self, inner, on_end: Callable[[], None]):
        self.inner, self.on_end = inner, on_end

    @property
    def last_context(self):
        # the SDK reads a sender's context off a stream that has one, and its ReadStream protocol
        # (mcp.shared._stream_protocols) states that contract as getattr(stream, "last_context", None):
        # this wrapper passes the inner stream's on under the SDK's own rule
        return getattr(self.inner, "last_context", None)

    async def receive(self):
        try:
            return await self.inner.receive()
        except anyio.EndOfStream:
            self.on_end()
            raise

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def watched(transport, on_end: Callable[[], None]):
    """``transport`` whose read stream reports its end (a stdio server's exit) to ``on_end``."""
    async with transport as (read, write):
        yield _EndSignalling(read, on_end), write


async def all_tools(client: Client) -> list[types.Tool]:
    tools, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        if not (cursor := page.next_cursor):
            return tools


class Upstream:
    """One upstream server. ``on_change()`` is awaited when its tools come back or leave (not at start)."""

    def __init__(self, name: str, spec: Mapping[str, Any], base: Path,
                 on_change: Callable[[], Awaitable[None]], retries: int = 5, retry_delay_s: float = 1.0):
        if retries < 0 or not retry_delay_s > 0:
            raise ValueError(f"retries must be >= 0 and retry_delay_s > 0, got {retries}, {retry_delay_s}")
        self.name, self.spec, self.base, self.on_change = name, spec, base, on_change
        self.retries, self.retry_delay_s = retries, retry_delay_s
        self.tools: list[types.Tool] = []  # as last listed; kept while lost
        self.client: Client | None = None
        self.attempts = 0  # failed or pending connection attempts since the last success
        self.gave_up = False
        self._lost: anyio.Event | None = None

    @property
    def alive(self) -> bool:
        return self.client is not None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect (a failure here is raised: the router does not start), serve, then reconnect as above."""
        await self._serve(task_status)
        while self.attempts < self.retries:
            await anyio.sleep(backoff_s(self.retry_delay_s, self.attempts + 1, cap=MAX_RETRY_DELAY_S))
            self.attempts += 1
            try:
                await self._serve()  # connected (the count is back to 0), then lost
            except Exception as e:  # noqa: BLE001 - any failure to connect is one failed attempt
                logger.warning("upstream %r: reconnection %d of %d failed: %s", self.name, self.attempts,
                               self.retries, _short(e))
        self.gave_up = True
        logger.error("upstream %r: lost; %s", self.name, self.next_step())

    async def _serve(self, task_status: anyio.abc.TaskStatus[None] | None = None) -> None:
        """One connection: list the tools, then hold the client until it is lost."""
        self._lost = lost = anyio.Event()
        try:
            async with Client(watched(transport_of(self.spec, self.base), lost.set)) as client:
                self.tools = await all_tools(client)
                self.client, self.attempts = client, 0
                if task_status is not None:
                    task_status.started()
                else:
                    logger.warning("upstream %r: connected again (%d tools)", self.name, len(self.tools))
                    await self.on_change()
                await lost.wait()
        except Exception as e:
            if self.client is None:
                raise  # never connected: the caller counts the attempt
            logger.warning("upstream %r: connection failed: %s", self.name, _short(e))
        if self.client is not None:
            self.client = None
            logger.warning("upstream %r: lost (its tools are no longer listed)", self.name)
            await self.on_change()

    def lose(self) -> None:
        """Mark the current connection lost (a call found it closed)."""
        if self._lost is not None:
            self._lost.set()

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """``tools/call`` through this upstream; when it cannot be made, an ``is_error`` result that names
        the server, says what happened to it and what comes next."""
        client = self.client
        if client is None:
            happened = "is not connected"
        else:
            try:
                return await client.call_tool(name, arguments)
            except MCPError as e:
                if e.code != CONNECTION_CLOSED:
                    raise
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass
            self.lose()  # the connection is still set until run() sees the loss: say what this call saw
            happened = "closed its connection during the call"
        return types.CallToolResult(is_error=True, content=[types.TextContent(
            type="text", text=f"tool {name!r} was not called: upstream server {self.name!r} {happened}; "
                              f"{self.next_step()}")])

    def next_step(self) -> str:
        """What happens next to a lost upstream."""
        if self.retries == 0:
            return "reconnection is off (--upstream-retries 0)"
        if self.gave_up:
            return f"gave up after {self.retries} attempts to reconnect"
        return f"reconnecting (attempt {self.attempts + 1} of {self.retries})"


def _short(e: BaseException) -> str:
    """One line for the log: an exception group's first leaf, type and message, at most 300 characters."""
    # an exception group: BaseExceptionGroup from Python 3.11, the exceptiongroup backport's class on the 3.10
    # pyproject allows; both hold their leaves in .exceptions
    while getattr(e, "exceptions", None):
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"[:300]
