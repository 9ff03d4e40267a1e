"""What ``tracer mcp`` remembers of each client session, and for how long.

A session's activity is read by the index as a chat (each query a user message, each call an assistant
tool call and its result), so only its recent part matters for ranking: a session keeps its last
``max_messages`` messages, and each text in them (a query, a call's arguments as JSON, a result) is cut to
``max_text`` characters (MiniLM reads 256 word pieces, about 1,000 to 1,500 characters of prose, from the
start of what it is given, so a cut query ranks as the whole one). Arguments whose JSON is longer are
replaced by ``{}``: a cut JSON text would be a malformed call.

Sessions are kept in a table that forgets one when its connection ends (the SDK unwinds the connection's
``exit_stack`` on a streamable-HTTP DELETE, its idle timeout, a stdio or in-memory transport closing), and
that also holds at most ``max_sessions`` (least recently used dropped first) and drops a session idle for
``idle_s`` seconds. So what the table holds is at most ``max_sessions * max_messages * max_text``
characters of client text. A 2026-07-28 request carries no session: those share the ``default`` one.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp.server.connection import Connection
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tracer.serve.selection import StickyPresenter

SESSION_STATE = "io.tracer/session"  # the key of a connection's activity, in Connection.state


@dataclass(frozen=True)
class SessionCaps:
    """Bounds on what the server keeps per session (flags of ``tracer mcp``; defaults in docs/gateway.md)."""

    max_sessions: int = 1000
    idle_s: float = 1800.0  # the SDK's own default idle timeout for a streamable-HTTP session
    max_messages: int = 32
    max_text: int = 2048

    def __post_init__(self):
        for name in ("max_sessions", "max_messages", "max_text"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.idle_s > 0:
            raise ValueError(f"idle_s must be positive, got {self.idle_s}")


@dataclass
class Activity:
    """One session: its chat (bounded as the module docstring says), its presented tools and, for a
    handshake-era connection, the connection (to tell it when an upstream's tools come or go)."""

    caps: SessionCaps
    presenter: StickyPresenter
    connection: Connection | None = None
    chat: list[dict[str, Any]] = field(default_factory=list)
    presented: list[str] = field(default_factory=list)
    calls: int = 0  # call ids stay unique as old messages are dropped

    def ask(self, query: str) -> None:
        self._add({"role": "user", "content": query[:self.caps.max_text]})

    def called(self, name: str, args: Mapping[str, Any], text: str) -> None:
        arguments = json.dumps(dict(args))
        if len(arguments) > self.caps.max_text:
            arguments = "{}"
        i, self.calls = self.calls, self.calls + 1
        self._add({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}]})
        self._add({"role": "tool", "tool_call_id": f"c{i}", "content": text[:self.caps.max_text]})

    def _add(self, message: dict[str, Any]) -> None:
        chat = (self.chat + [message])[-self.caps.max_messages:]
        while chat and chat[0]["role"] == "tool":  # a result whose call was dropped: drop it too
            chat = chat[1:]
        self.chat = chat  # a new list: a ranking thread may still be reading the old one

    def messages(self) -> list[dict[str, Any]]:
        return self.chat if self.chat and self.chat[0]["role"] == "user" else \
            [{"role": "user", "content": ""}] + self.chat

    def chars(self) -> int:
        """Characters of client text held: contents and call arguments."""
        return sum(len(m["content"] or "")
                   + sum(len(c["function"]["arguments"]) for c in m.get("tool_calls", ()))
                   for m in self.chat)


class Sessions:
    """The activities by session key: forgotten when the session ends, LRU-capped, expired when idle."""

    def __init__(self, caps: SessionCaps, sticky: bool, max_presented: int, clock=time.monotonic):
        self.caps, self.sticky, self.max_presented, self.clock = caps, sticky, max_presented, clock
        self._table: OrderedDict[str, tuple[Activity, float]] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._table)

    def activities(self) -> list[Activity]:
        return [a for a, _ in self._table.values()]

    def held(self) -> tuple[int, int]:
        """(messages, characters of client text) held over all sessions: the router's own accounting."""
        return sum(len(a.chat) for a in self.activities()), sum(a.chars() for a in self.activities())

    def get(self, ctx) -> tuple[str, Activity]:
        """The activity of the session ``ctx`` belongs to (made on its first request), marked as used now."""
        key, connection = session_of(ctx, self.forget)
        now = self.clock()
        activity = self._table.pop(key, (None, 0.0))[0] or Activity(
            self.caps, StickyPresenter(self.sticky, self.max_presented, max_conversations=1), connection)
        self._table[key] = (activity, now)
        while len(self._table) > self.caps.max_sessions:
            self._table.popitem(last=False)
        while next(iter(self._table.values()))[1] < now - self.caps.idle_s:  # the current one is not
            self._table.popitem(last=False)
        return key, activity

    def forget(self, key: str) -> None:
        self._table.pop(key, None)


def connection_of(ctx) -> Connection | None:
    """The request's :class:`Connection`. mcp 2.3 gives lowlevel handlers no public route to it: its runner
    builds each request's ``ServerSession`` around it (``ServerRequestContext`` is to carry it after the SDK's
    context rework). Without it a session has no end hook, and only the LRU cap and idle expiry bound it."""
    connection = getattr(ctx, "connection", None) or getattr(ctx.session, "_connection", None)
    return connection if isinstance(connection, Connection) else None


def session_of(ctx, on_end) -> tuple[str, Connection | None]:
    """The session key of a request, and the connection to notify (handshake era only).

    A handshake-era connection is a session: keyed by its streamable-HTTP session id (or a fresh id on
    stdio and in memory), with ``on_end(key)`` pushed on its ``exit_stack`` the first time it is seen. A
    2026-07-28 connection lives for one request, so those requests share ``default``."""
    connection = connection_of(ctx)
    if connection is None or connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
        headers = getattr(ctx.request, "headers", None)
        return (headers.get("mcp-session-id") if headers is not None else None) or "default", None
    key = connection.state.get(SESSION_STATE)
    if key is None:
        key = connection.state[SESSION_STATE] = connection.session_id or uuid.uuid4().hex
        connection.exit_stack.callback(on_end, key)
    return key, connection
