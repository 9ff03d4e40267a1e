"""What reached the client whole is logged whole (issue 56, defects 6, 7 and 12): a stream the official
``openai`` client closes right after ``data: [DONE]``, answers the upstream compressed (gzip, deflate; plain
and streamed) and a vision conversation whose screenshot is a megabyte of base64.

Real servers on loopback: the gateway (uvicorn) with ``--log``, an upstream that streams and compresses
(:mod:`scripted_upstream`) or the stub OpenAI server, and the official ``openai`` client (a fresh one per
request) or httpx for the raw bytes."""

from __future__ import annotations

import base64
import os
import time

import httpx
import openai
import pytest
from builders import TINY_TOOLS
from gateway_harness import make_gateway, serving
from openai.lib.streaming.chat import ChatCompletionStreamState
from scripted_upstream import ScriptedUpstream
from stub_openai_server import StubOpenAIServer

from tracer.data import load_native
from tracer.serve.log.sink import ConversationLog

TOOLS = [t.to_openai() for t in TINY_TOOLS]
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Email it to Bob"}]
WEATHER_CALL = {"id": "call_0", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
EMAIL_CALL = {"id": "call_1", "type": "function",
              "function": {"name": "send_email", "arguments": '{"to": "bob", "body": "sunny"}'}}


def fresh_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def wait_written(sink: ConversationLog, n: int, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while sink.written < n and time.monotonic() < deadline:
        time.sleep(0.02)


def ask(url: str, messages: list, conversation: str, stream: bool, outcome: str | None = None):
    """One request through a fresh official client; the assistant message it assembled."""
    headers = {"X-Tracer-Conversation": conversation} | ({"X-Tracer-Outcome": outcome} if outcome else {})
    with fresh_client(url) as client:
        if not stream:
            return client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                  extra_headers=headers).choices[0].message
        state = ChatCompletionStreamState()
        for chunk in client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                    extra_headers=headers):
            state.handle_chunk(chunk)
        return state.get_final_completion().choices[0].message


def as_sent(message) -> dict:
    return {"role": "assistant", "content": message.content,
            "tool_calls": [{"id": c.id, "type": c.type,
                            "function": {"name": c.function.name, "arguments": c.function.arguments}}
                           for c in message.tool_calls or []]}


# ---- defect 6: the client closes its connection right after [DONE] ------------------------------------
def test_a_stream_the_client_closes_after_done_is_logged_whole_with_its_outcome(index_dir, minilm, tmp_path):
    """The upstream's body ends 0.3 s after its ``[DONE]`` event; each fresh client has read ``[DONE]`` and
    closed its connection by then, so the gateway's stream is closed before its upstream ends. Before the
    fix every one of these was taken for a cut stream: no outcome, no reply, written unreported at
    shutdown."""
    upstream = ScriptedUpstream(tail_s=0.3)
    sink = ConversationLog(tmp_path / "log")
    with serving(upstream.app) as up, \
            serving(make_gateway(index_dir, minilm, up + "/v1", sink=sink).app) as url:
        got = [ask(url, WEATHER, f"closed-{i}", stream=True, outcome="success") for i in range(3)]
        assert all(as_sent(g)["tool_calls"] == [WEATHER_CALL] for g in got)
        wait_written(sink, 3)
        assert sink.written == 3  # finished by the outcome header, not at shutdown
    records = load_native(tmp_path / "log").trajectories
    assert sorted(t.group for t in records) == ["closed-0", "closed-1", "closed-2"]
    for t in records:
        assert t.success and t.metadata["outcome"] == "reported"
        assert t.metadata["called"] == ["get_weather"]
        assert t.messages[-1] == as_sent(got[0])  # as the client assembled it


# ---- defect 7: compressed answers ---------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_answer_is_decoded_for_the_log_and_passed_through_as_sent(index_dir, minilm, tmp_path,
                                                                               encoding, stream):
    """Two steps of an agent through the official client (``Accept-Encoding: gzip, deflate``); the upstream
    compresses every answer. The record ends with the second answer's call, as the client got it. Before
    the fix the record ended at the tool message and ``called`` lacked ``send_email``."""
    upstream = ScriptedUpstream(encoding=encoding)
    sink = ConversationLog(tmp_path / "log")
    with serving(upstream.app) as up, \
            serving(make_gateway(index_dir, minilm, up + "/v1", sink=sink).app) as url:
        first = ask(url, WEATHER, "zipped", stream)
        history = [*WEATHER, as_sent(first), {"role": "tool", "tool_call_id": first.tool_calls[0].id,
                                              "content": "sunny, 21 C"}]
        second = ask(url, history, "zipped", stream, outcome="success")
        assert second.tool_calls[0].function.name == "send_email"
        # the client gets the bytes as the upstream sent them, Content-Encoding and all
        body = {"model": "m", "messages": WEATHER, "tools": TOOLS, "stream": stream}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                          headers={"accept-encoding": encoding, "x-tracer-conversation": "raw"}) as r:
            assert r.headers["content-encoding"] == encoding
            raw = b"".join(r.iter_raw())
        assert raw == bytes(upstream.sent[-1])
        wait_written(sink, 1)
    (record,) = [t for t in load_native(tmp_path / "log").trajectories if t.group == "zipped"]
    assert record.success and record.metadata["called"] == ["get_weather", "send_email"]
    assert record.messages[-1] == as_sent(second) and as_sent(second)["tool_calls"] == [EMAIL_CALL]
    assert [m["role"] for m in record.messages] == ["user", "assistant", "tool", "assistant"]


# ---- defect 12: images, audio and files ---------------------------------------------------------------
def test_a_vision_conversation_is_learned_with_placeholders_not_bytes(index_dir, minilm, tmp_path):
    """A 1.1 MB base64 screenshot (over the 1 MiB record cap), a clip of audio and a PDF: the upstream gets
    every byte, the ranking reads the text part, the record keeps each part's media type and size. Before
    the fix the record was ``oversized`` and dropped."""
    png = os.urandom(825_000)
    wav, pdf = os.urandom(3_000), os.urandom(5_001)
    pdf_url = "data:application/pdf;base64," + base64.b64encode(pdf).decode()
    content = [
        {"type": "text", "text": "What is the weather in Paris? Email it to Bob"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode(),
                                            "detail": "high"}},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}},
        {"type": "file", "file": {"filename": "forecast.pdf", "file_data": pdf_url}},
        {"type": "image_url", "image_url": {"url": "https://example.com/map.png"}},
    ]
    messages = [{"role": "user", "content": content}]
    sink = ConversationLog(tmp_path / "log")
    with StubOpenAIServer() as stub, \
            serving(make_gateway(index_dir, minilm, stub.url, sink=sink).app) as url:
        with fresh_client(url) as client:
            reply = client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS,
                extra_headers={"X-Tracer-Conversation": "vision", "X-Tracer-Outcome": "success"})
        assert stub.requests[-1]["messages"] == messages  # forwarded whole
        presented = [t["function"]["name"] for t in stub.requests[-1]["tools"]]
        wait_written(sink, 1)
        assert sink.written == 1 and not sink.dropped
    (record,) = load_native(tmp_path / "log").trajectories
    assert record.metadata["presented"] == presented and "get_weather" in presented  # ranked on the text
    assert record.metadata["called"] == [reply.choices[0].message.tool_calls[0].function.name]
    assert record.messages[0]["content"] == [
        content[0],
        {"type": "image_url", "image_url": {"detail": "high"},
         "omitted": {"media_type": "image/png", "bytes": 825_000}},
        {"type": "input_audio", "input_audio": {"format": "wav"},
         "omitted": {"media_type": "audio/wav", "bytes": 3_000}},
        {"type": "file", "file": {"filename": "forecast.pdf"},
         "omitted": {"media_type": "application/pdf", "bytes": 5_001}},
        content[4],  # a URL is a reference, not the bytes: kept
    ]
    assert record.metadata["normalised"]["media_omitted"] == 3
