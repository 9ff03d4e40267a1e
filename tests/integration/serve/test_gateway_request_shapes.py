"""Current OpenAI request shapes through the gateway (issue 56, defects 8 and 9): ``tool_choice`` of type
``allowed_tools`` (nested, as Chat Completions sends it, and flat) keeps the selection inside the allowed set,
and a body with lone-surrogate escapes (what JavaScript's ``JSON.stringify`` emits for a sliced emoji) is read
leniently and forwarded as received.

Real servers on loopback: the gateway (uvicorn), the stub OpenAI upstream (which records what it received),
the official ``openai`` client, and httpx for the bytes a JavaScript client sends."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from builders import TINY_TOOLS
from gateway_harness import make_gateway, metric, serving
from stub_openai_server import StubOpenAIServer

from tracer.data import load_native
from tracer.serve.log.sink import ConversationLog

TOOLS = [t.to_openai() for t in TINY_TOOLS]
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Email it to Bob"}]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def allowed_tools(names: list[str], mode: str, shape: str) -> dict:
    refs = [{"type": "function", "function": {"name": n}} for n in names]
    if shape == "nested":  # Chat Completions
        return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": refs}}
    return {"type": "allowed_tools", "mode": mode, "tools": [{"type": "function", "name": n} for n in names]}


def allowed_in(choice: dict) -> tuple[str, list[str]]:
    """(mode, names) of a forwarded ``allowed_tools`` choice, either shape."""
    inner = choice.get("allowed_tools", choice)
    return inner["mode"], [r["function"]["name"] if "function" in r else r["name"] for r in inner["tools"]]


# ---- defect 8: tool_choice allowed_tools --------------------------------------------------------------
@pytest.mark.parametrize("shape", ["nested", "flat"])
@pytest.mark.parametrize("sticky", [True, False], ids=["sticky", "plain"])
def test_allowed_tools_keeps_the_selection_inside_the_allowed_set(index_dir, minilm, shape, sticky):
    """The conversation asks for the weather and an email, the tools the index ranks first; the request allows
    only three others. Before the fix the upstream got get_weather and send_email, none of the allowed."""
    allowed = ["search_flights", "cancel_booking", "list_files"]
    headers = {"X-Tracer-Conversation": f"allowed-{shape}"}
    with StubOpenAIServer() as stub, \
            serving(make_gateway(index_dir, minilm, stub.url, sticky=sticky).app) as url, client(url) as c:
        for mode in ("required", "auto"):  # the second request continues the conversation
            c.chat.completions.create(model="m", messages=WEATHER, tools=TOOLS,
                                      tool_choice=allowed_tools(allowed, mode, shape), extra_headers=headers)
            sent = stub.requests[-1]
            names = [t["function"]["name"] for t in sent["tools"]]
            assert names and set(names) <= set(allowed) and len(names) <= 2  # k = 2
            # the forwarded tool_choice keeps its shape and mode and allows what was presented
            assert ("allowed_tools" in sent["tool_choice"]) == (shape == "nested")
            assert allowed_in(sent["tool_choice"]) == (mode, [n for n in allowed if n in names])
        # the allowed set changes: the sticky list does not carry tools it no longer allows
        now = ["get_weather", "book_flight"]
        c.chat.completions.create(model="m", messages=WEATHER, tools=TOOLS,
                                  tool_choice=allowed_tools(now, "auto", shape), extra_headers=headers)
        assert {t["function"]["name"] for t in stub.requests[-1]["tools"]} == set(now)


@pytest.mark.parametrize("choice, param", [
    ({"type": "allowed_tools", "allowed_tools": {"mode": "sometimes", "tools": []}},
     "tool_choice.allowed_tools.mode"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": "get_weather"}},
     "tool_choice.allowed_tools.tools"),
    ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function"}]}, "tool_choice.tools[0].name"),
])
def test_a_malformed_allowed_tools_is_a_400_naming_the_field(index_dir, minilm, choice, param):
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        with client(url) as c, pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="m", messages=WEATHER, tools=TOOLS, tool_choice=choice)
        assert e.value.body["param"] == param and not stub.requests


# ---- defect 9: lone-surrogate escapes -----------------------------------------------------------------
def test_lone_surrogate_escapes_are_read_leniently_and_forwarded_as_received(index_dir, minilm, tmp_path):
    """A JavaScript client slices an emoji: its JSON carries the escape of a lone surrogate, which strict JSON
    parsers (orjson) refuse and the upstream accepts. Before the fix the gateway answered 400."""
    text = "What is the weather in Paris? \\ud83c Email it to Bob"  # the JSON text of the content
    sink = ConversationLog(tmp_path / "log")
    with StubOpenAIServer() as stub, \
            serving(make_gateway(index_dir, minilm, stub.url, sink=sink).app) as url:
        for tools, conversation in ((TOOLS, "ranked"), (TOOLS[:2], "few-tools")):  # selection, passed as is
            raw = ('{"model": "m", "messages": [{"role": "user", "content": "' + text + '"}], "tools": '
                   + json.dumps(tools) + "}").encode()
            headers = {"content-type": "application/json", "x-tracer-conversation": conversation,
                       "x-tracer-outcome": "success"}
            answer = httpx.post(url + "/v1/chat/completions", content=raw, headers=headers)
            assert answer.status_code == 200, answer.text
            sent = stub.requests[-1]
            assert sent["messages"] == json.loads(raw)["messages"]  # the lone surrogate reached the upstream
            assert "\ud83c" in sent["messages"][0]["content"]
        assert len(stub.requests[0]["tools"]) == 2 and stub.requests[1]["tools"] == TOOLS[:2]
        assert metric(url, "tracer_lenient_total", kind="surrogate_escape") == 2
        assert metric(url, "tracer_lenient_total", kind="bad_unicode") >= 1  # the ranking's reading
        deadline = time.monotonic() + 10
        while sink.written < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    records = {t.group: t for t in load_native(tmp_path / "log").trajectories}  # the strict loader
    assert records["ranked"].messages[0]["content"] == "What is the weather in Paris? ? Email it to Bob"
