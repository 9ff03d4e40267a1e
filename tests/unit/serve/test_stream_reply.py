"""Rebuilding a streamed reply (tracer/serve/log/stream_reply.py) against the official ``openai`` client's own
assembly of the same chunks, and the copy that passes a stream through."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from tracer.serve.log.stream_reply import StreamCopy, assemble_reply

HEAD = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
DELTAS = [
    {"role": "assistant"},
    {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather"}}]},
    {"tool_calls": [{"index": 1, "id": "call_", "type": "function",
                     "function": {"name": "send_", "arguments": "{"}}]},
    {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "email", "arguments": '"to": "x"}'}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]},
]


def chunks() -> list[dict]:
    out = [{**HEAD, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in DELTAS]
    return out + [{**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]


def reference() -> list[tuple[str, str, str]]:
    state = ChatCompletionStreamState()
    for c in chunks():
        state.handle_chunk(ChatCompletionChunk.model_validate(c))
    message = state.get_final_completion().choices[0].message
    return [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_fragments_merge_by_index_as_the_openai_client_merges_them(newline):
    events = [b"data: " + json.dumps(c).encode() for c in chunks()]
    events.insert(2, b": a comment\n" + b"event: ping\ndata: not json")  # skipped
    stream = ((newline * 2).join(events) + newline * 2 + b"data: [DONE]" + newline * 2
              + b"data: {\"after\": 1}\n\n")
    reply = assemble_reply(stream)
    assert ([(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in reply["tool_calls"]]
            == reference())
    assert (reference()
            == [("call_a", "get_weather", '{"city": "Oslo"}'), ("call_b", "send_email", '{"to": "x"}')])
    assert reply["role"] == "assistant" and reply["content"] is None
    assert all(c["type"] == "function" and "index" not in c for c in reply["tool_calls"])


def test_multi_line_data_is_one_event_and_an_unfinished_last_event_is_dropped():
    content = {**HEAD, "choices": [{"index": 0, "delta": {"content": "a"}}]}
    text = json.dumps(content, indent=1).encode()  # several lines: each its own data: field
    stream = b"".join(b"data: " + line + b"\n" for line in text.splitlines()) + b"\n"
    assert assemble_reply(stream)["content"] == "a"
    # no blank line: not sent
    assert assemble_reply(stream + b"data: " + json.dumps(content).encode())["content"] == "a"
    assert assemble_reply(b"data: [DONE]\n\n") is None
    odd = {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": "x", "function": {"name": "f"}}, {"index": None, "function": {"name": "g"}}]}}]}
    assert assemble_reply(b"data: " + json.dumps(odd).encode() + b"\n\n")["tool_calls"] == [
        {"function": {"name": "f"}, "type": "function"}, {"function": {"name": "g"}, "type": "function"}]
    # a malformed index is taken as the call's position: no error, nothing merged across calls


async def _drain(source, copy: StreamCopy, on_cut) -> bytes:
    return b"".join([chunk async for chunk in copy.tee(source, on_cut)])


def test_the_copy_passes_chunks_through_and_rebuilds_only_a_whole_stream():
    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks()) + b"data: [DONE]\n\n"
    parts = [data[i:i + 7] for i in range(0, len(data), 7)]

    async def whole():
        for p in parts:
            yield p

    async def broken():
        yield parts[0]
        raise ConnectionError("upstream gone")

    async def run():
        cut: list = []
        copy = StreamCopy(limit=1 << 20)
        assert (await _drain(whole(), copy, lambda complete: cut.append("whole" if complete else "cut"))
                == data and copy.complete and cut == ["whole"])
        assert [c["function"]["arguments"] for c in copy.reply()["tool_calls"]] == [r[2] for r in reference()]
        small = StreamCopy(limit=100)  # over the limit: passed through, not rebuilt
        assert (await _drain(whole(), small, lambda complete: cut.append("whole" if complete else "cut"))
                == data and small.reply() is None and cut == ["whole", "whole"])
        broken_copy = StreamCopy(limit=1 << 20)
        with pytest.raises(ConnectionError):
            await _drain(broken(), broken_copy, lambda complete: cut.append("whole" if complete else "cut"))
        assert cut == ["whole", "whole", "cut"] and broken_copy.reply() is None

    asyncio.run(run())
