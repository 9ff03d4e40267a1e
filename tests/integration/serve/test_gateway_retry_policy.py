"""The gateway never sends a chat completion to the upstream twice (issue 56, defect 5), on real servers
over loopback with the official ``openai`` client: an upstream that reads the request and closes the
connection without answering may have run it, so the client gets a 502 and the upstream saw one POST."""

from __future__ import annotations

import asyncio
import re
import socket
import threading

import httpx
import openai
import pytest
from gateway_harness import CHAT, TOOLS, make_gateway, serving


class ReadAndDrop:
    """A raw-socket upstream that reads each request whole, counts it by method, and closes the
    connection without a byte of answer (what a crashing or overloaded server does after reading)."""

    def __init__(self):
        self.methods: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            self.methods.append(head.split(b" ", 1)[0].decode())
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        self._server = self._loop.run_until_complete(asyncio.start_server(self._connection, sock=sock))
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> ReadAndDrop:  # noqa: PYI034 (no typing.Self on 3.10)
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def test_a_chat_completion_the_upstream_read_and_dropped_is_sent_once(index_dir, minilm):
    with ReadAndDrop() as up, serving(make_gateway(index_dir, minilm, up.url).app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(model="m", messages=CHAT["messages"], tools=TOOLS)
        with pytest.raises(openai.InternalServerError):   # the passthrough's POST too
            client.embeddings.create(model="m", input="hi")
        metrics = httpx.get(url + "/metrics").text
    assert failed.value.status_code == 502 and failed.value.body["type"] == "upstream_unreachable"
    assert up.methods == ["POST", "POST"]                   # one each: neither was sent again
    assert 'tracer_errors_total{kind="upstream_unreachable"} 2.0' in metrics
