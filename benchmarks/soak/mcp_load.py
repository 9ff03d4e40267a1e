"""MCP clients against ``tracer mcp --transport http`` during the soak (``--mcp-clients``): the SDK's own
client in the current protocol (2026-07-28, its default) and in the handshake mode (``mode="legacy"``),
half each, each with its tenant's credential (client i: tenant i mod ``--tenants``).

An episode of a current-protocol client names a session ``task-<n>``, n counted per tenant (so every tenant
uses the same names at about the same time), lists the tools, calls one and lists again; a legacy client
opens a session (the handshake), does the same, and, while it is open, sends another tenant's live
``Mcp-Session-Id`` with its own credential (plain HTTP, as a probe would). Counted:

- **leaks**: a first listing of a session that is fresh for its tenant that is not the fresh list (a session
  of another tenant's, or one of the same name, served instead), and a borrowed session id answered other
  than 404;
- errors (an exception of the client, by type) and episodes by mode.

``tracer mcp``'s upstreams are ``tests/mcp_upstream.py`` (``travel`` and ``office``: the tools of
data/example) over stdio, its index a copy of the soak's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.soak.constants import ROOT
from benchmarks.soak.traffic import tenant_key

UPSTREAM = ROOT / "tests" / "mcp_upstream.py"
CALLS = [("get_weather", {"city": "Oslo"}), ("send_email", {"to": "bob@example.com"}), ("list_files", {}),
         ("search_flights", {"city": "Paris"}), ("book_flight", {"flight": "UA1"}),
         ("cancel_booking", {"flight": "BK-7"})]
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
LEGACY_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
                  "mcp-protocol-version": "2025-11-25"}


def write_config(path: Path, python: str) -> Path:
    servers = {name: {"command": python, "args": [str(UPSTREAM), name]} for name in ("travel", "office")}
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def names(listed: Any) -> list[str]:
    return [t.name for t in listed.tools]


class McpLoad:
    def __init__(self, url: str, clients: int, tenants: int, seed: int):
        self.url, self.clients, self.tenants, self.seed = url, clients, tenants, seed
        self.fresh: list[str] | None = None
        self.episodes: Counter[str] = Counter()
        self.calls = 0
        self.errors: Counter[str] = Counter()
        self.error_samples: list[str] = []
        self.fresh_checked = 0
        self.not_fresh = 0
        self.grown = 0  # listings after the episode's calls that differ from the fresh list
        self.not_fresh_samples: list[dict[str, Any]] = []
        self.probes = 0
        self.probe_status: Counter[str] = Counter()
        self.borrowed_served = 0
        self.counter: dict[int, int] = {}
        self.live: dict[int, str] = {}  # tenant -> the session id of one of its open legacy sessions
        self.latency_ms: list[float] = []
        self.stop = False
        # the SDK warns at each call of a tool the session's last listing left out (tracer mcp lists k)
        logging.getLogger("client").setLevel(logging.ERROR)  # the logger mcp.client.session uses

    def client(self, credential: str | None, mode: str, on_response=None):
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers={"authorization": credential} if credential else None,
                                  timeout=httpx2.Timeout(30.0, read=60.0),
                                  event_hooks={"response": [on_response]} if on_response else None)
        return Client(streamable_http_client(self.url, http_client=http), mode=mode)

    def check_fresh(self, listed: list[str], tenant: int | None, mode: str, session: str) -> None:
        self.fresh_checked += 1
        if listed != self.fresh:
            self.not_fresh += 1
            if len(self.not_fresh_samples) < 10:
                self.not_fresh_samples.append({"tenant": tenant, "mode": mode, "session": session,
                                               "listed": listed, "fresh": self.fresh})

    def error(self, e: BaseException, where: str) -> None:
        self.errors[f"{where}: {type(e).__name__}"] += 1
        if len(self.error_samples) < 20:
            self.error_samples.append(f"{where}: {type(e).__name__}: {str(e)[:200]}")

    async def learn_fresh(self) -> None:
        """The list a fresh session gets: an anonymous current-protocol client (nothing kept)."""
        async with self.client(None, "auto") as c:
            self.fresh = names(await c.list_tools(cache_mode="bypass"))

    async def run(self, deadline: float) -> None:
        try:
            await self.learn_fresh()
        except Exception as e:  # noqa: BLE001  (counted: the run goes on without MCP traffic)
            self.error(e, "fresh list")
            return
        tasks = [asyncio.ensure_future(self.agent(i, deadline)) for i in range(self.clients)]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def agent(self, i: int, deadline: float) -> None:
        rng = random.Random(self.seed * 1000 + 500 + i)
        tenant = i % self.tenants if self.tenants else None
        mode = "legacy" if i % 2 else "auto"
        credential = f"Bearer {tenant_key(tenant if tenant is not None else 0)}"
        current: contextlib.AsyncExitStack | None = None  # the current-protocol client, kept across episodes
        client = None
        while not self.stop and time.monotonic() < deadline:
            t0 = time.perf_counter()
            try:
                if mode == "auto":
                    if current is None:
                        current = contextlib.AsyncExitStack()
                        client = await current.enter_async_context(self.client(credential, "auto"))
                    await asyncio.wait_for(self.current_episode(client, tenant, rng), 120)
                else:
                    await asyncio.wait_for(self.legacy_episode(credential, tenant, rng), 120)
                self.episodes[mode] += 1
                self.latency_ms.append((time.perf_counter() - t0) * 1e3)
            except Exception as e:  # noqa: BLE001  (counted, never silent)
                self.error(e, mode)
                if current is not None:
                    with contextlib.suppress(Exception):
                        await current.aclose()
                    current = None
            await asyncio.sleep(rng.uniform(0.2, 0.6))
        if current is not None:
            with contextlib.suppress(Exception):
                await current.aclose()

    def next_session(self, tenant: int | None) -> str:
        key = -1 if tenant is None else tenant
        self.counter[key] = self.counter.get(key, 0) + 1
        return f"task-{self.counter[key]}"

    async def current_episode(self, client, tenant: int | None, rng: random.Random) -> None:
        name = self.next_session(tenant)
        meta = {"io.tracer/session": name}
        self.check_fresh(names(await client.list_tools(meta=meta, cache_mode="bypass")), tenant, "auto", name)
        for tool, arguments in rng.sample(CALLS, 2):
            await client.call_tool(tool, arguments, meta=meta)
            self.calls += 1
        self.grown += names(await client.list_tools(meta=meta, cache_mode="bypass")) != self.fresh

    async def legacy_episode(self, credential: str, tenant: int | None, rng: random.Random) -> None:
        import httpx

        seen: list[str] = []

        async def remember(response) -> None:
            if sid := response.headers.get("mcp-session-id"):
                seen.append(sid)

        async with self.client(credential, "legacy", on_response=remember) as c:
            self.check_fresh(names(await c.list_tools(cache_mode="bypass")), tenant, "legacy",
                             seen[0] if seen else "?")
            if tenant is not None and seen:
                self.live[tenant] = seen[0]
            try:
                for tool, arguments in rng.sample(CALLS, 2):
                    await c.call_tool(tool, arguments)
                    self.calls += 1
                self.grown += names(await c.list_tools(cache_mode="bypass")) != self.fresh
                others = [sid for t, sid in self.live.items() if t != tenant]
                if others:  # another tenant's session id, this tenant's credential: a 404
                    headers = {**LEGACY_HEADERS, "mcp-session-id": rng.choice(others),
                               "authorization": credential}
                    async with httpx.AsyncClient(timeout=30) as probe:
                        reply = await probe.post(self.url, json=LIST, headers=headers)
                    self.probes += 1
                    self.probe_status[str(reply.status_code)] += 1
                    if reply.status_code != 404:
                        self.borrowed_served += 1
            finally:
                if tenant is not None and seen and self.live.get(tenant) == seen[0]:
                    del self.live[tenant]

    def report(self) -> dict[str, Any]:
        lat = sorted(self.latency_ms)
        return {"clients": self.clients, "episodes": dict(self.episodes), "calls": self.calls,
                "fresh_list": self.fresh, "fresh_checked": self.fresh_checked, "not_fresh": self.not_fresh,
                "grown_after_calls": self.grown,
                "not_fresh_samples": self.not_fresh_samples, "borrowed_probes": self.probes,
                "borrowed_status": dict(self.probe_status), "borrowed_served": self.borrowed_served,
                "leaks": self.not_fresh + self.borrowed_served,
                "errors": dict(self.errors), "error_count": sum(self.errors.values()),
                "error_samples": self.error_samples,
                "episode_ms_p50": lat[len(lat) // 2] if lat else None,
                "episode_ms_max": lat[-1] if lat else None}
