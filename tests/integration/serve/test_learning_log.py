"""The gateway's conversation log as the learning loop reads it (issue 32, defects 3, 7, 11 and 14): hostile
but accepted requests are logged as records the strict loader reads, only called tools reach ``tools.json``, a
cut stream does not apply its outcome, and pending conversations and the files stay within their caps.

Real servers on loopback: the gateway (uvicorn), the stub OpenAI upstream or a streaming Starlette upstream,
and httpx as the client."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time

import httpx
import pytest
from builders import TINY_TOOLS
from gateway_harness import make_gateway, serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from stub_openai_server import StubOpenAIServer

from tracer.cli import serve as serve_cli
from tracer.data import load_native
from tracer.data.native import trajectory_files
from tracer.serve.log.sink import ConversationLog, LogLimits

TOOLS = [t.to_openai() for t in TINY_TOOLS]
OFFERED = TOOLS + [{"type": "function", "function": {"name": f"offered_{i}", "description": "never called"}}
                   for i in range(300)]


def chat(url: str, messages: list, conversation: str, tools=None, outcome: str | None = None, **body):
    headers = {"x-tracer-conversation": conversation} | ({"x-tracer-outcome": outcome} if outcome else {})
    return httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": messages,
                                                           "tools": TOOLS if tools is None else tools,
                                                           **body},
                      headers=headers, timeout=60)


def wait_written(sink: ConversationLog, n: int) -> None:
    deadline = time.monotonic() + 20
    while sink.written < n and time.monotonic() < deadline:
        time.sleep(0.02)


# ---- defects 3 and 11: valid by construction; only called tools ---------------------------------------
def test_hostile_requests_are_logged_as_records_the_strict_loader_reads(index_dir, minilm, tmp_path):
    history = [
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": 5},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "h1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Par'}},
            {"id": "h2", "type": "function", "function": {"name": "legacy_tool", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "h1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "trimmed",
         "content": "an answer to a call no longer in the history"},
        {"role": "function", "name": "old", "content": "a legacy role"},
        {"role": "user", "content": [{"type": "text", "text": "now email Bob call:send_email"}, 7]},
    ]
    sink = ConversationLog(tmp_path / "log")
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url, sink=sink).app) as url:
        answer = chat(url, history, "hostile", OFFERED, "success")
        malformed = chat(url, [{"role": "user", "content": "[malformed] call:get_weather"}], "bad-reply",
                         OFFERED, "success")
        assert answer.status_code == malformed.status_code == 200
        chat(url, [{"role": "user", "content": "weather please"}], "pending")
        for reward in (float("nan"), float("inf"), 10 ** 400):  # what /v1/tracer/outcome also refuses (400)
            with pytest.raises(ValueError, match="finite"):
                sink.finish("pending", True, reward)
        wait_written(sink, 2)
    ds = load_native(tmp_path / "log")  # the strict loader: every line valid
    by_group = {t.group: t for t in ds.trajectories}
    hostile = by_group["hostile"]
    assert ([m["role"] for m in hostile.messages]
            == ["system", "user", "assistant", "tool", "user", "assistant"])
    assert hostile.messages[1]["content"] == "5"
    calls = hostile.messages[2]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ["{}", '{"a": 1}']
    assert hostile.metadata["raw_arguments"] == {"messages[2].tool_calls[0]": '{"city": "Par'}
    assert hostile.messages[4]["content"][1] == {"type": "text", "text": "7"}
    assert hostile.metadata["called"] == ["get_weather", "legacy_tool", "send_email"]
    assert hostile.metadata["normalised"] == {"developer_as_system": 1, "content_as_text": 1,
                                              "arguments_replaced": 1,
                                              "arguments_object_as_text": 1, "orphan_tool_message_dropped": 1,
                                              "message_dropped": 1, "content_part_as_text": 1}
    assert hostile.success and hostile.metadata["outcome"] == "reported"
    assert by_group["bad-reply"].messages[-1]["tool_calls"][0]["function"]["arguments"] == "{}"
    # the pending conversation kept its state through the refused rewards: logged at shutdown, unreported
    assert by_group["pending"].metadata["outcome"] == "unreported" and by_group["pending"].reward == 0.0
    # only the called tools, with the schema the request offered (a placeholder for one never offered)
    tools = {t.name: t for t in ds.registry}
    assert (set(tools)
            == {"get_weather", "legacy_tool", "send_email"} | set(by_group["pending"].metadata["called"]))
    assert tools["send_email"].description == TINY_TOOLS[4].description
    assert tools["legacy_tool"].description == "" and tools["legacy_tool"].parameters == {"type": "object",
                                                                                           "properties": {}}


# ---- defect 14: a stream that did not complete does not apply its outcome -----------------------------
HEAD = {"id": "c", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}


def event(delta: dict, finish: str | None = None) -> bytes:
    chunk = {**HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def cutting_upstream() -> Starlette:
    """Streams a tool call; the last user message says how it ends: ``whole``, ``abort`` (the connection is
    broken mid-stream), ``short`` (the body ends cleanly but before the finish reason and ``[DONE]``) or
    ``linger`` (whole, then the body stays open 1 s before it ends)."""
    async def completions(request: Request) -> StreamingResponse:
        how = (await request.json())["messages"][-1]["content"]

        async def body():
            yield event({"role": "assistant", "content": None})
            await asyncio.sleep(0.01)
            yield event({"tool_calls": [{"index": 0, "id": "s0", "type": "function",
                                         "function": {"name": "get_weather", "arguments": "{}"}}]})
            if how == "abort":
                raise RuntimeError("upstream died mid-stream")
            if how in ("whole", "linger"):
                yield event({}, "tool_calls") + b"data: [DONE]\n\n"
            if how == "linger":  # done, but the connection stays open a while before it ends
                await asyncio.sleep(1.0)
        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


def test_a_cut_stream_leaves_its_conversation_pending_whatever_its_outcome_header(index_dir, minilm,
                                                                                  tmp_path):
    sink = ConversationLog(tmp_path / "log")
    with serving(cutting_upstream()) as up, serving(make_gateway(index_dir, minilm, up + "/v1",
                                                                 sink=sink).app) as url:
        for how in ("whole", "abort", "short"):
            body = {"model": "m", "messages": [{"role": "user", "content": how}], "tools": TOOLS,
                    "stream": True}
            headers = {"x-tracer-conversation": how, "x-tracer-outcome": "success"}
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers,
                              timeout=30) as r:
                try:
                    for _ in r.iter_raw():
                        pass
                except httpx.HTTPError:  # the aborted one
                    assert how == "abort"
        wait_written(sink, 1)
        time.sleep(0.3)  # a wrongly applied outcome of the cut ones would be queued by now
        assert sink.written == 1
    by_group = {t.group: t for t in load_native(tmp_path / "log").trajectories}
    assert by_group["whole"].success and by_group["whole"].messages[-1]["tool_calls"][0]["id"] == "s0"
    for cut in ("abort", "short"):  # finished at shutdown as unreported, without a reply
        assert (by_group[cut].success, by_group[cut].metadata["outcome"]) == (False, "unreported")
        assert [m["role"] for m in by_group[cut].messages] == ["user"]


def test_an_outcome_posted_while_its_stream_is_still_open_is_applied_once_with_the_answer(index_dir, minilm,
                                                                                         tmp_path):
    """A client reads ``[DONE]`` and posts the outcome at once, before the gateway's stream has ended: the
    outcome waits for the stream, so the record holds the streamed answer and is written once."""
    sink = ConversationLog(tmp_path / "log")
    with serving(cutting_upstream()) as up, serving(make_gateway(index_dir, minilm, up + "/v1",
                                                                 sink=sink).app) as url:
        body = {"model": "m", "messages": [{"role": "user", "content": "linger"}], "tools": TOOLS,
                "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
            conv, token = r.headers["x-tracer-conversation"], r.headers["x-tracer-outcome-token"]
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    posted = httpx.post(url + "/v1/tracer/outcome",
                                        json={"conversation": conv, "success": True},
                                        headers={"x-tracer-outcome-token": token}, timeout=30)
                    assert posted.status_code == 200 and posted.json()["logged"] is True
                    assert sink.written == 0  # held: the stream is still open
        wait_written(sink, 1)
    # the gateway has stopped: anything pending is written
    records = load_native(tmp_path / "log").trajectories
    assert len(records) == 1 and records[0].success and records[0].metadata["outcome"] == "reported"
    assert records[0].messages[-1]["tool_calls"][0]["id"] == "s0"


# ---- defect 7: caps on what is held and what is written ---------------------------------------------
def test_pending_conversations_and_the_log_files_stay_within_their_caps(index_dir, minilm, tmp_path):
    limits = LogLimits(max_pending=4, max_pending_bytes=250_000, max_record_bytes=60_000, max_bytes=200_000,
                       segment_bytes=60_000)
    sink = ConversationLog(tmp_path / "log", limits=limits)
    big = "word " * 10_000  # 50 KB (words: the stub upstream's argument regex is quadratic in one long word)
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url, sink=sink).app) as url:
        held = []
        for i in range(12):  # 12 x ~50 KB never finished: at most 4 held, within 250 KB
            chat(url, [{"role": "user", "content": f"{big} conversation {i} call:get_weather"}], f"p{i}")
            held.append(sink.stats())
        assert max(s["pending"] for s in held) == 4 and max(s["pending_bytes"] for s in held) <= 250_000
        assert held[-1]["dropped"] == {"evicted": 8}
        scraped = httpx.get(url + "/metrics").text.splitlines()  # the log's accounting, read at each scrape
        assert {'tracer_log_dropped_total{reason="evicted"} 8.0', "tracer_log_pending 4.0",
                f"tracer_log_pending_bytes {float(held[-1]['pending_bytes'])}"} <= set(scraped)
        chat(url, [{"role": "user", "content": "many " * 18_000 + "call:get_weather"}], "huge",
             outcome="success")
        assert sink.stats()["dropped"]["oversized"] == 1 and sink.stats()["pending"] == 4  # not held
        for i in range(8, 12):  # the four still held are finished and written
            assert chat(url, [{"role": "user", "content": f"{big} conversation {i} call:get_weather"}],
                        f"p{i}", outcome="success").status_code == 200
    stats = sink.stats()  # the gateway has stopped: its sink wrote everything queued
    files = [p for p in trajectory_files(tmp_path / "log") if p.exists()] + [tmp_path / "log" / "tools.json"]
    on_disk = sum(p.stat().st_size for p in files)
    # 50 KB records in 60 KB segments, 200 KB in all: three written, the fourth refused and counted
    assert stats["written"] == 3 and stats["dropped"] == {"evicted": 8, "oversized": 1, "log_full": 1}
    assert on_disk <= 200_000 and stats["log_bytes"] == on_disk
    assert [p.name for p in files] == ["trajectories-000001.jsonl", "trajectories-000002.jsonl",
                                       "trajectories.jsonl", "tools.json"]
    ds = load_native(tmp_path / "log")  # every segment, in write order
    assert [t.group for t in ds.trajectories] == ["p8", "p9", "p10"]


def test_finished_records_wait_for_the_writer_within_the_backlog_cap(tmp_path):
    entered, release = threading.Event(), threading.Event()

    def slow_redactor(record):  # holds the writer thread: what finishes meanwhile waits in memory
        entered.set()
        release.wait(10)
        return record

    sink = ConversationLog(tmp_path / "log", redact=slow_redactor,
                           limits=LogLimits(max_pending_bytes=30_000, max_record_bytes=12_000))
    finished = []
    for i in range(5):  # ~10 KB each, finished one after the other
        sink.observe(f"c{i}", [{"role": "user", "content": "z" * 10_000}], [TOOLS[3]], [], None)
        finished.append(sink.finish(f"c{i}", True))
        assert i or entered.wait(10)  # the writer holds c0 until released
        assert sink.stats()["queued_bytes"] <= 30_000
    release.set()
    sink.close()
    # the first is in the writer's hands, two more fit the 30 KB backlog, the last two are refused
    assert (finished == [True, True, True, False, False] and sink.dropped == {"backlog": 2}
            and sink.written == 3)
    assert sink.stats()["queued_bytes"] == 0 and sink.stats()["pending_bytes"] == 0


def test_the_caps_are_tracer_serve_flags(index_dir, tmp_path):
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    base = ["--index", str(index_dir), "--upstream", "http://127.0.0.1:9/v1", "--log", str(tmp_path / "log")]
    gateway = serve_cli.build(parser.parse_args([*base, "--log-max-pending", "7",
                                                 "--log-max-pending-bytes", "9000",
                                                 "--log-max-record-bytes", "800", "--log-max-bytes", "5000",
                                                 "--log-segment-bytes", "1000"]))
    assert gateway.sink.limits == LogLimits(7, 9000, 800, 5000, 1000)
    assert serve_cli.build(parser.parse_args(base)).sink.limits == LogLimits()  # the documented defaults
    with pytest.raises(SystemExit, match="--log-max-bytes 0: must be a positive integer"):
        serve_cli.build(parser.parse_args([*base, "--log-max-bytes", "0"]))
