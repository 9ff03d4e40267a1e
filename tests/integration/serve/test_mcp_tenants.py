"""``tracer mcp`` on streamable HTTP with clients of several tenants: whose state is whose, who may open a
session, and what a call to an upstream that dies says. Real parts: ``tracer mcp`` served by uvicorn on a
loopback port (in this process), upstream MCP servers as stdio processes
(``tests/mcp_upstream.py``), the SDK's own client in the current protocol (2026-07-28, its default) and in the
legacy one (the ``initialize`` handshake, answered on SSE streams), and a real index (MiniLM, ``tracer_fixed``
on data/example). An attacker's requests are plain HTTP (httpx), as a probe sends them."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

import anyio
import httpx
import httpx2
import pytest
from builders import TESTS
from gateway_harness import mcp_served
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp_upstream import FAMILIES

from tracer.cli import mcp as mcp_cli
from tracer.retriever import Retriever
from tracer.serve.mcp.server import ToolRouter
from tracer.serve.mcp.sessions import SessionCaps
from tracer.serve.reload import IndexHolder

UPSTREAM = str(TESTS / "mcp_upstream.py")
LEGACY = "legacy"  # the SDK client's handshake mode; the current protocol is its default ("auto")
OPEN = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}}
LEGACY_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
                  "mcp-protocol-version": "2025-11-25"}


def stdio(family: str, **env: str) -> dict:
    return {"command": sys.executable, "args": [UPSTREAM, family], "env": env}


def write_config(tmp_path, **servers: dict):
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def names(listed: types.ListToolsResult) -> list[str]:
    return [t.name for t in listed.tools]


def router_of(index_dir, minilm, config, **options) -> ToolRouter:
    holder = IndexHolder(index_dir, lambda d: Retriever.load(d, embedder=minilm, device="cpu"))
    return ToolRouter(config, holder, k=2, **options)


def client(url: str, credential: str | None = None, mode: str = "auto", on_response=None) -> Client:
    """The SDK's client of ``url``, sending ``Authorization: <credential>`` when given."""
    http = httpx2.AsyncClient(headers={"authorization": credential} if credential else None,
                              timeout=httpx2.Timeout(30.0, read=60.0),
                              event_hooks={"response": [on_response]} if on_response else None)
    return Client(streamable_http_client(url, http_client=http), mode=mode)


def test_current_protocol_clients_share_nothing_across_tenants(index_dir, minilm, tmp_path):
    """2026-07-28 requests carry no session: a client's calls are remembered for its credential (and the
    session it names), and no other client lists, or hears of, what they changed. Before the fix every
    such client shared one session."""
    config = write_config(tmp_path, office=stdio("office"), travel=stdio("travel"))

    async def scenario() -> None:
        async with router_of(index_dir, minilm, config) as router, mcp_served(router) as url:
            async with client(url) as fresh:
                assert fresh.protocol_version == "2026-07-28"
                first = names(await fresh.list_tools())
            async with client(url) as a, client(url) as b:  # no credential: nothing is kept between requests
                await a.call_tool("get_weather", {"city": "Oslo"})
                assert names(await b.list_tools()) == first
                assert names(await a.list_tools()) == first
            async with client(url, "Bearer alice") as alice, client(url, "Bearer bob") as bob:
                async with alice.listen(tools_list_changed=True) as heard_by_alice, \
                        bob.listen(tools_list_changed=True) as heard_by_bob:
                    await alice.call_tool("get_weather", {"city": "Oslo"})
                    with anyio.fail_after(20):
                        assert type(await heard_by_alice.__anext__()).__name__ == "ToolsListChanged"
                    with anyio.move_on_after(1.0) as waited:
                        await heard_by_bob.__anext__()
                    assert waited.cancelled_caught  # bob heard nothing of alice's session
                grown = names(await alice.list_tools())
                assert grown[:len(first)] == first and len(grown) > len(first)
                assert names(await bob.list_tools()) == first
            async with client(url, "Bearer alice") as again:  # the same credential: the same session
                assert names(await again.list_tools()) == grown
                other = {"io.tracer/session": "second task"}  # a session of her own naming: a fresh one
                assert names(await again.list_tools(meta=other)) == first
                with pytest.raises(Exception, match=r'_meta\["io.tracer/session"\] must be a string'):
                    await again.list_tools(meta={"io.tracer/session": 7})
            assert sorted(router.sessions.tenants().values()) == [1, 2]  # bob's one, alice's two

    anyio.run(scenario)


def test_legacy_sessions_are_their_own_and_bound_to_their_credential(index_dir, minilm, tmp_path):
    """Handshake-era sessions (answered on SSE streams): each is its own, and its Mcp-Session-Id is refused
    (404) under another credential or none, instead of serving that session's tools. Before the fix the id
    alone was the session."""
    config = write_config(tmp_path, office=stdio("office"), travel=stdio("travel"))
    seen: list[str] = []

    async def remember(response) -> None:
        if sid := response.headers.get("mcp-session-id"):
            seen.append(sid)

    async def scenario() -> None:
        async with router_of(index_dir, minilm, config) as router, mcp_served(router) as url:
            async with client(url, "Bearer alice", LEGACY, on_response=remember) as alice, \
                    client(url, "Bearer bob", LEGACY) as bob, client(url, mode=LEGACY) as anonymous:
                assert alice.protocol_version == "2025-11-25"
                first = names(await alice.list_tools())
                await alice.call_tool("get_weather", {"city": "Oslo"})
                grown = names(await alice.list_tools())
                assert grown != first
                assert names(await bob.list_tools()) == first
                assert names(await anonymous.list_tools()) == first
                listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
                async with httpx.AsyncClient(timeout=30) as thief:
                    for credential in ("Bearer bob", None):
                        headers = {**LEGACY_HEADERS, "mcp-session-id": seen[0]}
                        if credential:
                            headers["authorization"] = credential
                        stolen = await thief.post(url, json=listing, headers=headers)
                        assert stolen.status_code == 404 and "get_weather" not in stolen.text
                assert names(await alice.list_tools()) == grown  # alice's session is untouched
            assert len(router.sessions) == 0  # each client's DELETE ended its session

    anyio.run(scenario)


def test_a_tenant_flooding_sessions_only_drops_its_own(index_dir, minilm, tmp_path):
    """One credential naming session after session (2026-07-28) and anonymous clients opening handshake
    sessions one after another: each keeps at most max_tenant_sessions, and another tenant's session keeps
    its state."""
    config = write_config(tmp_path, office=stdio("office"), travel=stdio("travel"))
    caps = SessionCaps(max_sessions=5, max_tenant_sessions=2)

    async def scenario() -> None:
        async with router_of(index_dir, minilm, config, caps=caps) as router, mcp_served(router) as url, \
                client(url, "Bearer alice") as alice, client(url, "Bearer mallory") as mallory:
            first = names(await alice.list_tools())
            await alice.call_tool("get_weather", {"city": "Oslo"})
            grown = names(await alice.list_tools())
            assert grown != first
            for i in range(12):  # each in a session of its own naming
                session = {"io.tracer/session": f"s{i}"}
                await mallory.call_tool("book_flight", {"flight": "UA1"}, meta=session)
                await mallory.list_tools(meta={**session, "io.tracer/query": "cancel my booking"})
            async with contextlib.AsyncExitStack() as held:  # legacy sessions, never closed meanwhile
                for _ in range(4):
                    anonymous = await held.enter_async_context(client(url, mode=LEGACY))
                    await anonymous.list_tools()
                assert router.sessions.tenants()["anonymous"] == 2
            assert sorted(router.sessions.tenants().values()) == [1, 2]  # alice's; mallory's last two
            assert names(await alice.list_tools()) == grown

    anyio.run(scenario)


def test_bare_initialize_posts_do_not_lock_clients_out(index_dir, tmp_path):
    """The probe: 40 ``initialize`` POSTs that never DELETE, against ``tracer mcp --max-sessions 5`` (the
    router built from those flags). Clients of both protocols still get in and work; the oldest bare sessions
    were ended to make room, and the rest end at the handshake deadline. Before the fix the SDK's cap answered
    every new session 503 until its idle timeout (30 minutes)."""
    config = write_config(tmp_path, office=stdio("office"), travel=stdio("travel"))
    parser = argparse.ArgumentParser()
    mcp_cli.add_arguments(parser)
    args = parser.parse_args(["--config", str(config), "--index", str(index_dir), "--k", "2", "--transport",
                              "http", "--max-sessions", "5", "--handshake-deadline", "1"])

    async def scenario() -> None:
        async with mcp_cli.build(args) as router, mcp_served(router) as url, \
                httpx.AsyncClient(timeout=30) as probe:
            opened = []
            for _ in range(40):
                reply = await probe.post(url, json=OPEN, headers=LEGACY_HEADERS)
                assert reply.status_code == 200
                opened.append(reply.headers["mcp-session-id"])
            for mode in (LEGACY, "auto"):
                async with client(url, mode=mode) as victim:
                    assert names(await victim.list_tools())[0] == "find_tools"
                    weather = await victim.call_tool("get_weather", {"city": "Oslo"})
                    assert weather.content[0].text == 'office.get_weather({"city": "Oslo"})'
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}

            async def status(sid: str) -> int:
                reply = await probe.post(url, json=listing, headers={**LEGACY_HEADERS, "mcp-session-id": sid})
                return reply.status_code

            assert await status(opened[0]) == 404  # ended to make room
            await anyio.sleep(2.5)  # past the handshake deadline
            assert await status(opened[-1]) == 404
            assert len(router.sessions) == 0 and router.sessions.pending() == 0

    anyio.run(scenario)


def test_a_call_to_an_upstream_that_dies_during_it_says_what_happened(index_dir, minilm, tmp_path):
    """The travel server exits while it serves book_flight (a client of each protocol in turn): the error
    names it, says it closed its connection and that it is being reconnected; a call while it is away says
    it is not connected. Before the fix the first said "unavailable: connected"."""
    config = write_config(tmp_path, office=stdio("office"),
                          travel=stdio("travel", MCP_UPSTREAM_DIE_ON="book_flight"))

    async def until(condition) -> None:
        with anyio.fail_after(30):
            while not condition():
                await anyio.sleep(0.02)

    async def scenario() -> None:
        async with router_of(index_dir, minilm, config, retries=2, retry_delay_s=1.0) as router, \
                mcp_served(router) as url:
            travel = router.upstreams["travel"]
            for mode in (LEGACY, "auto"):
                await until(lambda: travel.alive)  # back after the first death
                async with client(url, mode=mode) as caller:
                    booked = await caller.call_tool("book_flight", {"flight": "UA1"})
                    assert booked.is_error and booked.content[0].text == (
                        "tool 'book_flight' was not called: upstream server 'travel' closed its connection "
                        "during the call; reconnecting (attempt 1 of 2)"), booked.content[0].text
                    await until(lambda: not travel.alive)
                    booked = await caller.call_tool("book_flight", {"flight": "UA1"})
                    assert booked.content[0].text.endswith(
                        "upstream server 'travel' is not connected; reconnecting (attempt 1 of 2)")
                    assert set(FAMILIES["travel"]).isdisjoint(names(await caller.list_tools()))

    anyio.run(scenario)
