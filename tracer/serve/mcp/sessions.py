"""What ``tracer mcp`` remembers of each session, for how long, and how many sessions it keeps per tenant.

A session's activity is read by the index as a chat (each query a user message, each call an assistant
tool call and its result), so only its recent part matters for ranking: a session keeps its last
``max_messages`` messages, and each text in them (a query, a call's arguments as JSON, a result) is cut to
``max_text`` characters (MiniLM reads 256 word pieces, about 1,000 to 1,500 characters of prose, from the
start of what it is given, so a cut query ranks as the whole one). Arguments whose JSON is longer are
replaced by ``{}``: a cut JSON text would be a malformed call.

Sessions are keyed as :mod:`tracer.serve.mcp.tenants` says. A session counts once it has *done something*
(a ``tools/list``, a ``tools/call``, a ``subscriptions/listen``): from then on it is kept until it ends (its
connection closes, its HTTP session is deleted), until it is idle for ``idle_s`` seconds, or until it is
the least recently used one when its tenant holds ``max_tenant_sessions`` or the server ``max_sessions``.
So what the table holds is at most ``max_sessions * max_messages * max_text`` characters of client text,
and (``max_tenant_sessions`` being below ``max_sessions``) one tenant that opens sessions without end only
ever drops its own.

An HTTP session that has only been opened (``initialize``, nothing since) is *pending*: it holds no state
and counts against no cap. At most ``max_sessions`` are pending; the oldest is ended first when room is
needed, and any is ended ``handshake_s`` seconds after it opened (:mod:`tracer.serve.mcp.http` ends
them). So bare ``initialize`` requests, however many, never keep a client out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler

from tracer.core.lru import LRU
from tracer.serve.mcp.tenants import SessionKey
from tracer.serve.selection import StickyPresenter

MAX_LISTEN_STREAMS = 8  # a session's open subscriptions/listen streams


@dataclass(frozen=True)
class SessionCaps:
    """Bounds on what the server keeps per session and tenant (docs/gateway.md). Each is a flag of ``tracer
    mcp``, its help in the field's metadata (:mod:`tracer.cli.options`)."""

    max_sessions: int = field(default=1000, metadata={"help": (
        "sessions kept in all, once used (least recently used dropped); as many HTTP sessions may be "
        "pending (opened, unused; the oldest ended first)")})
    max_tenant_sessions: int = field(default=100, metadata={"help": (
        "sessions kept per tenant (a credential; anonymous HTTP clients are one), its least recently used "
        "dropped")})
    # 1800 s: the SDK's own default idle timeout for a streamable-HTTP session
    idle_s: float = field(default=1800.0, metadata={"flag": "--session-idle", "help": (
        "seconds after which an idle session is dropped (HTTP: the SDK ends it too)")})
    handshake_s: float = field(default=30.0, metadata={"flag": "--handshake-deadline", "help": (
        "seconds an HTTP session may stay opened and unused before it is ended")})
    max_messages: int = field(default=32, metadata={"help": (
        "messages of a session's activity kept for ranking (the oldest dropped)")})
    max_text: int = field(default=2048, metadata={"help": (
        "characters kept of each query, call's arguments (JSON) and result")})

    def __post_init__(self):
        for name in ("max_sessions", "max_tenant_sessions", "max_messages", "max_text"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("idle_s", "handshake_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(eq=False)
class Activity:
    """One session: its chat (bounded as the module docstring says), its presented tools, its listen streams
    (2026-07-28: ``subscriptions/listen`` hears of this session's changes only) and, for a handshake-era
    session, ``peer``: the SDK's ``ServerSession`` of its latest request, whose standalone channel tells it
    when an upstream's tools come or go."""

    caps: SessionCaps
    presenter: StickyPresenter
    key: SessionKey | None = None  # None: a request's own activity, kept for no other
    peer: Any = None
    chat: list[dict[str, Any]] = field(default_factory=list)
    presented: list[str] = field(default_factory=list)
    calls: int = 0  # call ids stay unique as old messages are dropped
    bus: InMemorySubscriptionBus = field(default_factory=InMemorySubscriptionBus)
    listener: ListenHandler = field(init=False)

    def __post_init__(self):
        self.listener = ListenHandler(self.bus, max_subscriptions=MAX_LISTEN_STREAMS)

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

    def close(self) -> None:
        """The session ended: end its listen streams."""
        self.listener.close()


@dataclass(frozen=True)
class Pending:
    """An HTTP session opened and not used yet: its tenant and when it opened."""

    tenant: str
    opened: float


class Sessions:
    """The activities by :class:`SessionKey`, capped per tenant and in all (least recently used dropped
    first), expired when idle; and the pending HTTP sessions (see the module docstring)."""

    def __init__(self, caps: SessionCaps, sticky: bool, max_presented: int, clock=time.monotonic):
        self.caps, self.sticky, self.max_presented, self.clock = caps, sticky, max_presented, clock
        # key -> (its activity, when last used), popped and set again at each use; each tenant's keys in
        # an LRU of their own. Either one full drops its least recently used session (_evicted), which
        # goes from both.
        self._table = LRU(caps.max_sessions, on_evict=self._evicted)
        self._tenants: dict[str, LRU] = {}
        self._dropped: list[Activity] = []  # what the current get() evicted
        self._pending: dict[str, Pending] = {}  # by Mcp-Session-Id, oldest first
        self._http: dict[str, SessionKey] = {}  # Mcp-Session-Id -> the session it carries, once used

    def __len__(self) -> int:
        return len(self._table)

    def activities(self) -> list[Activity]:
        return [a for a, _ in self._table.values()]

    def tenants(self) -> dict[str, int]:
        """Sessions held per tenant."""
        return {tenant: len(keys) for tenant, keys in self._tenants.items()}

    def held(self) -> tuple[int, int]:
        """(messages, characters of client text) held over all sessions: the router's own accounting."""
        return sum(len(a.chat) for a in self.activities()), sum(a.chars() for a in self.activities())

    def new_activity(self, key: SessionKey | None = None) -> Activity:
        return Activity(self.caps, StickyPresenter(self.sticky, self.max_presented, max_conversations=1), key)

    def get(self, key: SessionKey) -> tuple[Activity, list[Activity]]:
        """The activity of session ``key`` (made on its first use), marked as used now, and the activities
        this dropped to make room or because they were idle (the caller ends their HTTP sessions)."""
        now = self.clock()
        if key.http_session is not None:
            self._pending.pop(key.http_session, None)
            self._http.setdefault(key.http_session, key)
        found = self._table.pop(key, None)
        activity = found[0] if found else self.new_activity(key)
        # the tenant's cap first, then the server's: a tenant at its cap makes room from its own sessions
        tenant = self._tenants.get(key.tenant)
        if tenant is None:
            tenant = LRU(self.caps.max_tenant_sessions, on_evict=self._evicted)
        tenant[key] = None
        self._tenants[key.tenant] = tenant  # again: evicting its only other session may have removed it
        self._table[key] = (activity, now)
        while True:  # popped and set at each use: the table's first entry is the least recently used
            oldest, (_, used) = self._table.first()
            if used >= now - self.caps.idle_s:  # (the current one is not idle: the table never empties)
                break
            self._dropped.append(self._drop(oldest))
        dropped, self._dropped = self._dropped, []
        return activity, dropped

    def _evicted(self, key: SessionKey, entry: tuple[Activity, float] | None) -> None:
        """An LRU dropped ``key`` to make room (the table, with its entry; a tenant's, with None): it goes
        from the other too."""
        self._dropped.append(self._drop(key, entry))

    def _drop(self, key: SessionKey, evicted: tuple[Activity, float] | None = None) -> Activity:
        """Session ``key`` goes from the table, its tenant and its HTTP session, and is ended (``evicted``:
        its table entry, when the table has dropped it already)."""
        activity, _ = self._table.pop(key, evicted)
        if key.http_session is not None and self._http.get(key.http_session) == key:
            del self._http[key.http_session]
        tenant = self._tenants.get(key.tenant)
        if tenant is not None:
            tenant.pop(key, None)
            if not tenant:
                del self._tenants[key.tenant]
        activity.close()
        return activity

    def forget(self, key: SessionKey) -> None:
        """Session ``key`` ended."""
        if key in self._table:
            self._drop(key)

    def forget_http(self, http_session: str) -> None:
        """The HTTP session ``http_session`` ended: its pending entry or its activity goes."""
        self._pending.pop(http_session, None)
        key = self._http.get(http_session)
        if key is not None:
            self._drop(key)

    # ---- pending HTTP sessions -------------------------------------------------------------------
    def opened(self, http_session: str, tenant: str) -> None:
        self._pending[http_session] = Pending(tenant, self.clock())

    def pending(self) -> int:
        return len(self._pending)

    def owner(self, http_session: str) -> str | None:
        """The tenant that opened ``http_session``, when it is pending or held."""
        if http_session in self._pending:
            return self._pending[http_session].tenant
        key = self._http.get(http_session)
        return key.tenant if key is not None else None

    def expired_pending(self) -> list[str]:
        """Pending sessions past their handshake deadline, oldest first."""
        deadline = self.clock() - self.caps.handshake_s
        return [s for s, p in self._pending.items() if p.opened < deadline]

    def to_make_room(self, opening: int) -> list[str]:
        """Pending sessions to end so that one more can open while ``opening`` others are being opened:
        the expired ones, then the oldest while the pending and opening ones fill ``max_sessions``."""
        expired = self.expired_pending()
        live = list(self._pending)[len(expired):]  # oldest first, as the expired ones before them
        excess = len(live) + opening + 1 - self.caps.max_sessions
        return expired + live[:max(excess, 0)]
