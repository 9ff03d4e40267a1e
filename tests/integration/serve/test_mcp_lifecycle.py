"""``tracer mcp`` over time: what a session leaves behind when it ends, what one session may make the server
hold, and what happens to the tools of an upstream that dies. Real parts throughout: the SDK's own client
(in memory and on streamable HTTP), upstream MCP servers as real stdio processes (``tests/mcp_upstream.py``)
or on real HTTP, and a real index (MiniLM, ``tracer_fixed`` on data/example)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import anyio
from builders import TESTS
from gateway_harness import mcp_served, serving
from mcp import Client, types
from mcp_upstream import FAMILIES, build

from tracer.retriever import Retriever
from tracer.serve.mcp.server import ToolRouter
from tracer.serve.mcp.sessions import SessionCaps
from tracer.serve.reload import IndexHolder

UPSTREAM = str(TESTS / "mcp_upstream.py")
TRAVEL, OFFICE = list(FAMILIES["travel"]), list(FAMILIES["office"])


def holder(index_dir, minilm) -> IndexHolder:
    return IndexHolder(index_dir, lambda d: Retriever.load(d, embedder=minilm, device="cpu"))


def stdio(family: str, **env: str) -> dict:
    return {"command": sys.executable, "args": [UPSTREAM, family], "env": env}


def write_config(tmp_path: Path, **servers: dict) -> Path:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def names(listed: types.ListToolsResult) -> list[str]:
    return [t.name for t in listed.tools]


def top(reference: Retriever, messages: list[dict], among: list[str], k: int = 2) -> list[str]:
    return [n for n in reference.rank(messages) if n in among][:k]


async def until(condition, timeout_s: float = 20.0) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():
            await anyio.sleep(0.02)


def test_a_session_is_forgotten_when_it_ends(index_dir, minilm, tmp_path):
    """Streamable HTTP (the client's DELETE) and an in-memory connection: nothing of a closed session is
    kept."""
    config = write_config(tmp_path, office=stdio("office"))
    big = "what is the weather " * 20_000  # 400 KB

    async def scenario() -> None:
        async with ToolRouter(config, holder(index_dir, minilm), k=2) as router, mcp_served(router) as url:
            for _ in range(4):
                async with Client(url, mode="legacy") as client:
                    await client.call_tool("find_tools", {"query": big})
                    await client.call_tool("get_weather", {"city": "Oslo"})
                    assert len(router.sessions) >= 1
            await until(lambda: len(router.sessions) == 0)
            async with Client(router.server, mode="legacy") as client:
                await client.call_tool("find_tools", {"query": big})
                assert len(router.sessions) == 1
            await until(lambda: len(router.sessions) == 0)

    anyio.run(scenario)


def test_sessions_are_capped_least_recently_used_first(index_dir, minilm, tmp_path):
    config = write_config(tmp_path, office=stdio("office"), travel=stdio("travel"))

    async def scenario() -> None:
        async with ToolRouter(config, holder(index_dir, minilm), k=2,
                              caps=SessionCaps(max_sessions=2)) as router, \
                Client(router.server, mode="legacy") as a, Client(router.server, mode="legacy") as b, \
                Client(router.server, mode="legacy") as c:
            first = names(await a.list_tools())
            await a.call_tool("get_weather", {"city": "Oslo"})
            assert names(await a.list_tools()) != first  # a's activity changed its list
            await b.list_tools()
            await c.list_tools()  # a third session: a, the least recently used, is dropped
            assert len(router.sessions) == 2
            assert names(await a.list_tools()) == first  # a starts again from nothing
            assert len(router.sessions) == 2

    anyio.run(scenario)


def test_an_idle_session_expires(index_dir, minilm, tmp_path):
    config = write_config(tmp_path, office=stdio("office"), travel=stdio("travel"))

    async def scenario() -> None:
        async with ToolRouter(config, holder(index_dir, minilm), k=2,
                              caps=SessionCaps(idle_s=2.0)) as router, \
                Client(router.server, mode="legacy") as a, Client(router.server, mode="legacy") as b:
            first = names(await a.list_tools())
            await a.call_tool("get_weather", {"city": "Oslo"})
            assert names(await a.list_tools()) != first
            await anyio.sleep(2.3)
            await b.list_tools()  # a has been idle for longer than idle_s
            assert len(router.sessions) == 1
            assert names(await a.list_tools()) == first

    anyio.run(scenario)


def test_one_session_holds_bounded_text(index_dir, minilm, tmp_path):
    """Large queries, arguments and results: the router keeps the last max_messages messages, each text cut to
    max_text characters, and ranks a cut query exactly as the cut text."""
    config = write_config(tmp_path, office=stdio("office"), travel=stdio("travel"))
    caps = SessionCaps(max_messages=6, max_text=1000)
    reference = Retriever.load(index_dir, embedder=minilm, device="cpu")
    query = "cancel my booking " + "please " * 150_000  # 1 MB

    async def scenario() -> None:
        async with ToolRouter(config, holder(index_dir, minilm), k=2, caps=caps) as router:
            async with Client(router.server, mode="legacy") as client:
                for i in range(6):
                    await client.call_tool("find_tools", {"query": query})
                    sent = await client.call_tool("send_email", {"to": f"{i}" * 1_000_000})
                    assert len(sent.content[0].text) > 1_000_000  # the client gets the whole result
                messages, chars = router.sessions.held()
                assert messages <= 6 and chars <= 6 * 1000
            async with Client(router.server, mode="legacy") as client:
                found = await client.call_tool("find_tools", {"query": query})
            assert found.structured_content == {
                "tools": top(reference, [{"role": "user", "content": query[:1000]}], TRAVEL + OFFICE)}

    anyio.run(scenario)


def test_a_dead_stdio_upstream_leaves_the_lists(index_dir, minilm, tmp_path):
    """Kill the travel server's process: its tools leave tools/list and find_tools, the client is told
    (list_changed), and calling one is an error naming the server."""
    pidfile = tmp_path / "travel.pid"
    config = write_config(tmp_path, travel=stdio("travel", MCP_UPSTREAM_PIDFILE=str(pidfile)),
                          office=stdio("office"))
    reference = Retriever.load(index_dir, embedder=minilm, device="cpu")
    ask = {"role": "user", "content": "book a flight to Paris"}
    notes: list = []

    async def on_message(message) -> None:
        notes.append(message)

    async def scenario() -> None:
        async with ToolRouter(config, holder(index_dir, minilm), k=2, retries=0) as router, \
                Client(router.server, mode="legacy", message_handler=on_message) as client:
            found = await client.call_tool("find_tools", {"query": ask["content"]})
            assert found.structured_content == {"tools": top(reference, [ask], TRAVEL + OFFICE)}
            assert set(found.structured_content["tools"]) & set(TRAVEL)
            notes.clear()
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            await until(lambda: any(isinstance(n, types.ToolListChangedNotification) for n in notes))
            listed = names(await client.list_tools())
            assert listed[0] == "find_tools" and not set(listed) & set(TRAVEL) and len(listed) == 3
            found = await client.call_tool("find_tools", {"query": ask["content"]})
            assert found.structured_content == {"tools": top(reference, [ask, ask], OFFICE)}
            booked = await client.call_tool("book_flight", {"flight": "UA1"})
            assert booked.is_error and "'travel'" in booked.content[0].text
            weather = await client.call_tool("get_weather", {"city": "Oslo"})
            assert weather.content[0].text == 'office.get_weather({"city": "Oslo"})'

    anyio.run(scenario)


def test_a_failed_http_upstream_leaves_the_lists(index_dir, minilm, tmp_path):
    """Stop the office server (streamable HTTP): the next call to it is an error naming it, and its tools
    leave the list; the router and its other upstream keep serving."""
    stopped = contextlib.ExitStack()
    url = stopped.enter_context(serving(build("office").streamable_http_app())) + "/mcp"
    config = write_config(tmp_path, travel=stdio("travel"), office={"url": url})

    async def scenario() -> None:
        async with ToolRouter(config, holder(index_dir, minilm), k=2, retries=0) as router, \
                Client(router.server, mode="legacy") as client:
            weather = await client.call_tool("get_weather", {"city": "Oslo"})
            assert weather.content[0].text == 'office.get_weather({"city": "Oslo"})'
            stopped.close()
            weather = await client.call_tool("get_weather", {"city": "Oslo"})
            assert weather.is_error and "'office'" in weather.content[0].text
            await until(lambda: "get_weather" not in router.tools)
            listed = names(await client.list_tools())
            assert not set(listed) & set(OFFICE) and len(listed) == 3
            booked = await client.call_tool("book_flight", {"flight": "UA1"})
            assert booked.content[0].text == 'travel.book_flight({"flight": "UA1"})'

    with stopped:
        anyio.run(scenario)


def test_a_lost_upstream_is_restarted_a_bounded_number_of_times(index_dir, minilm, tmp_path):
    """With retries, a killed stdio server is started again and its tools come back (list_changed each way);
    once it cannot start, the router gives up after ``retries`` attempts and says so."""
    pidfile, refuse = tmp_path / "travel.pid", tmp_path / "refuse"
    config = write_config(tmp_path, travel=stdio("travel", MCP_UPSTREAM_PIDFILE=str(pidfile),
                                                 MCP_UPSTREAM_REFUSE=str(refuse)), office=stdio("office"))
    notes: list = []

    async def on_message(message) -> None:
        notes.append(message)

    def changes() -> int:
        return sum(isinstance(n, types.ToolListChangedNotification) for n in notes)

    async def scenario() -> None:
        async with ToolRouter(config, holder(index_dir, minilm), k=2,
                              retries=2, retry_delay_s=0.1) as router, \
                Client(router.server, mode="legacy", message_handler=on_message) as client:
            assert set(TRAVEL) & set(router.tools)
            await client.list_tools()  # the session begins
            first_pid = int(pidfile.read_text())
            os.kill(first_pid, signal.SIGKILL)
            await until(lambda: changes() >= 2 and "book_flight" in router.tools)
            assert int(pidfile.read_text()) != first_pid
            booked = await client.call_tool("book_flight", {"flight": "UA1"})
            assert booked.content[0].text == 'travel.book_flight({"flight": "UA1"})'
            refuse.touch()
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            await until(lambda: router.upstreams["travel"].gave_up)
            assert "book_flight" not in router.tools
            booked = await client.call_tool("book_flight", {"flight": "UA1"})
            assert (booked.is_error and "'travel'" in booked.content[0].text
                    and "2 attempts" in booked.content[0].text)

    anyio.run(scenario)
