"""Logging a streamed answer: the official ``openai`` client (``stream=True``) -> the gateway with ``--log``
-> an upstream (a real HTTP server on loopback) that streams two tool calls in interleaved fragments.
The bytes reach the client unchanged, and the logged trajectory holds the calls with their whole
arguments, as the client itself assembled them."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
from builders import TINY_TOOLS
from gateway_harness import make_gateway, serving
from openai.lib.streaming.chat import ChatCompletionStreamState
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tracer.data import load_native
from tracer.serve.log.sink import ConversationLog

TOOLS = [t.to_openai() for t in TINY_TOOLS]
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Email it to Bob"}]
HEAD = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}
DELTAS = [
    {"role": "assistant", "content": ""},
    {"content": "Checking "},
    {"content": "now."},
    {"tool_calls": [{"index": 0, "id": "call_w", "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 1, "id": "call_e", "type": "function",
                     "function": {"name": "send_email", "arguments": '{"to": "bob",'}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
    {"tool_calls": [{"index": 1, "function": {"arguments": ' "body": "sunny"}'}}]},
]


def sse_events() -> list[bytes]:
    """The upstream's answer, event by event (a keep-alive comment and a usage-only chunk included)."""
    chunks = [{**HEAD, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in DELTAS]
    chunks.append({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    chunks.append({**HEAD, "choices": [],
                   "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}})
    events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    return [b": keep-alive\n\n", *events, b"data: [DONE]\n\n"]


def streaming_upstream() -> Starlette:
    async def completions(request: Request) -> StreamingResponse:
        await request.body()

        async def body():
            for event in sse_events():
                half = len(event) // 2  # each event in two writes: the copy must not rely on event boundaries
                yield event[:half]
                await asyncio.sleep(0.002)
                yield event[half:]
        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def test_a_streamed_answer_is_logged_with_its_reassembled_tool_calls(index_dir, minilm, tmp_path):
    sink = ConversationLog(tmp_path / "log")
    with serving(streaming_upstream()) as up, \
            serving(make_gateway(index_dir, minilm, up + "/v1", sink=sink).app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)
        state = ChatCompletionStreamState()
        stream = client.chat.completions.create(model="m", messages=WEATHER, tools=TOOLS, stream=True,
                                                extra_headers={"X-Tracer-Conversation": "streamed",
                                                               "X-Tracer-Outcome": "success"})
        for chunk in stream:
            state.handle_chunk(chunk)
        expected = state.get_final_completion().choices[0].message  # what the official client assembled
        body = {"model": "m", "messages": WEATHER, "tools": TOOLS, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                          headers={"X-Tracer-Conversation": "raw"}) as r:
            raw = b"".join(r.iter_raw())
        assert raw == b"".join(sse_events())  # logging on: the passthrough is still byte-identical
        deadline = time.monotonic() + 10
        while sink.written < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    by_group = {t.group: t for t in load_native(tmp_path / "log").trajectories}
    done = by_group["streamed"]
    assert done.success and done.metadata["outcome"] == "reported"
    assert done.metadata["called"] == ["get_weather", "send_email"]
    reply = done.messages[-1]
    assert reply["role"] == "assistant" and reply["content"] == expected.content == "Checking now."
    assert [(c["id"], c["type"], c["function"]["name"], c["function"]["arguments"])
            for c in reply["tool_calls"]] \
        == [(c.id, c.type, c.function.name, c.function.arguments) for c in expected.tool_calls] \
        == [("call_w", "function", "get_weather", '{"city": "Paris"}'),
            ("call_e", "function", "send_email", '{"to": "bob", "body": "sunny"}')]
    assert list(done.messages[:-1]) == WEATHER
    # the second request's stream was also whole: its reply is logged at shutdown, unreported
    assert by_group["raw"].messages[-1]["tool_calls"] == reply["tool_calls"]
    assert by_group["raw"].metadata["outcome"] == "unreported"
