"""The gateway never sends a chat completion to the upstream twice (issue 56, defect 5), on real servers
over loopback with the official ``openai`` client: an upstream that reads the request and closes the
connection without answering may have run it, so the client gets a 502 and the upstream saw one POST."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from gateway_harness import CHAT, TOOLS, RawUpstream, make_gateway, serving


class ReadAndDrop(RawUpstream):
    """A raw-socket upstream that reads each request whole, counts it by method, and closes the
    connection without a byte of answer (what a crashing or overloaded server does after reading)."""

    def __init__(self):
        super().__init__()
        self.methods: list[str] = []

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await self.read_request(reader)
            self.methods.append(head.split(b" ", 1)[0].decode())
        except asyncio.IncompleteReadError:
            pass
        writer.close()



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
