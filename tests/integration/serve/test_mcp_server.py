"""``tracer mcp`` on real parts: upstream MCP servers written with the SDK (one a stdio subprocess, one
on streamable HTTP), the SDK's own client, a real index (MiniLM, FAISS) built from data/example."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from builders import ROOT, TESTS, TINY_TOOLS
from gateway_harness import serving
from mcp import Client, StdioServerParameters, types
from mcp_upstream import build

from tracer.core.errors import DataError
from tracer.retriever import Retriever
from tracer.serve.mcp.server import ToolRouter, read_config
from tracer.serve.reload import IndexHolder

NAMES = [t.name for t in TINY_TOOLS]  # travel's three, then office's three: the canonical order
UPSTREAM = str(TESTS / "mcp_upstream.py")


def write_config(path: Path, office: dict) -> Path:
    path.write_text(json.dumps({"mcpServers": {
        "travel": {"command": sys.executable, "args": [UPSTREAM, "travel"]}, "office": office}}))
    return path


def top(reference: Retriever, messages: list[dict], k: int = 2) -> list[str]:
    return reference.rank(messages)[:k]


def test_lists_the_best_k_proxies_calls_and_announces_changes(index_dir, minilm, tmp_path):
    reference = Retriever.load(index_dir, embedder=minilm, device="cpu")
    start = [{"role": "user", "content": ""}]
    after = start + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c0", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "c0", "content": 'office.get_weather({"city": "Paris"})'}]
    first = sorted(top(reference, start), key=NAMES.index)
    second = first + sorted(set(top(reference, after)) - set(first), key=NAMES.index)
    assert second != first  # the data makes the call change the list
    notes: list = []

    async def on_message(message) -> None:
        notes.append(message)

    async def scenario(office_url: str) -> None:
        config = write_config(tmp_path / "servers.json", {"url": office_url})
        holder = IndexHolder(index_dir, lambda d: Retriever.load(d, embedder=minilm, device="cpu"))
        async with ToolRouter(config, holder, k=2) as router, \
                Client(router.server, mode="legacy", message_handler=on_message) as client:
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == ["find_tools"] + first
            assert client.server_capabilities.tools.list_changed
            weather = await client.call_tool("get_weather", {"city": "Paris"})  # owned by the HTTP upstream
            assert weather.content[0].text == 'office.get_weather({"city": "Paris"})' and not weather.is_error
            with anyio.fail_after(10):
                while not notes:
                    await anyio.sleep(0.01)
            assert isinstance(notes[0], types.ToolListChangedNotification)
            assert [t.name for t in (await client.list_tools()).tools] == ["find_tools"] + second
            # the stdio upstream; not listed
            booked = await client.call_tool("book_flight", {"flight": "UA1"})
            assert booked.content[0].text == 'travel.book_flight({"flight": "UA1"})'
            found = await client.call_tool("find_tools", {"query": "cancel my booking"})
            asked = after + [booked_messages(1), booked_result(1),
                             {"role": "user", "content": "cancel my booking"}]
            assert found.structured_content == {"tools": top(reference, asked)}
            missing = await client.call_tool("no_such_tool", {})
            assert missing.is_error and "find_tools" in missing.content[0].text

    with serving(build("office").streamable_http_app()) as url:
        anyio.run(scenario, url + "/mcp")


def booked_messages(i: int) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
        "name": "book_flight", "arguments": json.dumps({"flight": "UA1"})}}]}


def booked_result(i: int) -> dict:
    return {"role": "tool", "tool_call_id": f"c{i}", "content": 'travel.book_flight({"flight": "UA1"})'}


def test_tracer_mcp_over_stdio_with_a_listen_stream(process_index_dir, tmp_path):
    """The real command as a subprocess, a 2026-07-28 client: list_changed arrives on subscriptions/listen."""
    config = write_config(tmp_path / "servers.json",
                          {"command": sys.executable, "args": [UPSTREAM, "office"]})
    root = ROOT
    params = StdioServerParameters(command=sys.executable, cwd=root, env={
        "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}, args=[
        "-m", "tracer.cli", "mcp", "--config", str(config), "--index", str(process_index_dir), "--k", "2"])

    async def scenario() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            assert client.protocol_version == "2026-07-28"
            before = [t.name for t in (await client.list_tools()).tools]
            async with client.listen(tools_list_changed=True) as sub:
                await client.call_tool("get_weather", {"city": "Paris"})
                with anyio.fail_after(20):
                    event = await sub.__anext__()
            assert type(event).__name__ == "ToolsListChanged"
            after = [t.name for t in (await client.list_tools()).tools]
            assert after[:len(before)] == before and len(after) > len(before)

    anyio.run(scenario)


def test_a_bad_config_names_the_field(tmp_path):
    bad = tmp_path / "servers.json"
    bad.write_text(json.dumps({"mcpServers": {"x": {"command": "a", "url": "http://b"}}}))
    with pytest.raises(DataError, match=r"field 'mcpServers.x'.*exactly one of command"):
        read_config(bad)
    bad.write_text("{}")
    with pytest.raises(DataError, match="field 'mcpServers'"):
        read_config(bad)


def test_streamable_http_keeps_one_activity_per_session(index_dir, minilm, tmp_path):
    """``tracer mcp --transport http`` in process: two handshake-era clients, each with its own
    Mcp-Session-Id."""
    import socket

    import uvicorn

    config = write_config(tmp_path / "servers.json",
                          {"command": sys.executable, "args": [UPSTREAM, "office"]})
    holder = IndexHolder(index_dir, lambda d: Retriever.load(d, embedder=minilm, device="cpu"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def scenario() -> None:
        async with ToolRouter(config, holder, k=2) as router, anyio.create_task_group() as tg:
            server = uvicorn.Server(uvicorn.Config(router.server.streamable_http_app(), host="127.0.0.1",
                                                   port=port, log_level="warning"))
            tg.start_soon(server.serve)
            with anyio.fail_after(20):
                while not server.started:
                    await anyio.sleep(0.02)
            url = f"http://127.0.0.1:{port}/mcp"
            async with Client(url, mode="legacy") as a, Client(url, mode="legacy") as b:
                first = [t.name for t in (await a.list_tools()).tools]
                assert [t.name for t in (await b.list_tools()).tools] == first
                await a.call_tool("get_weather", {"city": "Oslo"})
                grown = [t.name for t in (await a.list_tools()).tools]
                assert grown[:len(first)] == first and len(grown) > len(first)
                assert [t.name for t in (await b.list_tools()).tools] == first  # b did nothing
            server.should_exit = True

    anyio.run(scenario)
