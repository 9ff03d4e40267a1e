"""Live traffic through the real gateway (the official ``openai`` client -> uvicorn on loopback -> a stub
upstream; a real MiniLM index): what agents send is ranked leniently (issue 32, defect 1), a request with
thousands of tools the index does not know holds up nobody (defect 2), and two agents that open alike keep
two conversations (defect 15)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid

import httpx
import openai
import pytest
from builders import TINY_TOOLS, call, result
from gateway_harness import make_gateway, metric, serving
from stub_openai_server import StubOpenAIServer

from tracer.core.tool_text import tool_text
from tracer.core.types import Step
from tracer.data import load_native
from tracer.retriever import Retriever
from tracer.serve import selection
from tracer.serve.http.metrics import GatewayMetrics
from tracer.serve.http.offload import SelectionStage
from tracer.serve.log.sink import ConversationLog
from tracer.serve.selection import StickyPresenter, UnknownToolVectors, choose

TOOLS = [t.to_openai() for t in TINY_TOOLS]
NAMES = [t.name for t in TINY_TOOLS]
FLIGHT = {"role": "user", "content": "Find me a flight from SFO to JFK tomorrow and book it"}
WEATHER = {"role": "user", "content": "What is the weather in Paris? Email it to Bob"}
STOCK = {"type": "function", "function": {"name": "get_stock_price",
                                          "description": "Get the stock price of a ticker",
                                          "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def reference(index_dir, minilm):
    return Retriever.load(index_dir, embedder=minilm, device="cpu")


def client(url: str, key: str = "sk-test") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def presented(request: dict) -> list[str]:
    return [t["function"]["name"] for t in request["tools"]]


def index_top(reference: Retriever, context: list, prefix: tuple = (), turn: int = 0, k: int = 2
              ) -> list[str]:
    """The index's own top k for a step written out by hand (the tidy reading of a live conversation)."""
    step = Step(trajectory_id="live", group="live", turn=turn, position=len(prefix), prefix=prefix,
                history=prefix, gold="", context=tuple(context), index=len(prefix))
    scorer = reference.scorer
    return [reference.registry.names[i] for i in scorer.rank_one(step, scorer.embed([step]))[:k]]


def with_args(name: str, i: int, arguments) -> dict:
    m = call(name, i)
    m["tool_calls"][0]["function"]["arguments"] = arguments
    return m


DEVELOPER = {"role": "developer", "content": "You are a travel agent"}
SYSTEM = {"role": "system", "content": "You are a travel agent"}
NOW_EMAIL = {"role": "user", "content": "Now email it to Bob"}
# (kind, the live messages, the tidy reading written by hand, its prefix, its turn)
TRIGGERS = [
    ("developer_role", [DEVELOPER, FLIGHT], [SYSTEM, FLIGHT], (), 0),
    ("unknown_tool_call", [WEATHER, call("lookup_contact", 0), result(0), call("get_weather", 1), result(1)],
     [WEATHER, call("lookup_contact", 0), result(0), call("get_weather", 1), result(1)], ("get_weather",), 0),
    ("orphan_tool_message", [WEATHER, result(5, "sunny, 21C"), NOW_EMAIL], [WEATHER, result(5, "sunny, 21C"),
                                                                          NOW_EMAIL], (), 1),
    ("bad_arguments", [FLIGHT, with_args("search_flights", 0, '{"from": "SF'), result(0)],
     [FLIGHT, with_args("search_flights", 0, "{}"), result(0)], ("search_flights",), 0),
]


@pytest.mark.parametrize(("kind", "live", "tidy", "prefix", "turn"), TRIGGERS, ids=[t[0] for t in TRIGGERS])
def test_a_live_request_the_dataset_rules_refuse_gets_the_index_choice(index_dir, minilm, reference, caplog,
                                                                     kind, live, tidy, prefix, turn):
    caplog.set_level(logging.INFO, logger="tracer.serve")
    expected = index_top(reference, tidy, prefix, turn)
    with StubOpenAIServer() as stub, \
            serving(make_gateway(index_dir, minilm, stub.url, sticky=False).app) as url:
        client(url).chat.completions.create(model="m", messages=live, tools=TOOLS)
        assert presented(stub.requests[0]) == expected       # exactly k, the index's choice, in rank order
        assert metric(url, "tracer_lenient_total", kind=kind) == 1
        assert metric(url, "tracer_errors_total", kind="selection") == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_call_of_an_unknown_tool_the_gateway_presented_is_context_next_step(index_dir, minilm, reference,
                                                                              caplog):
    caplog.set_level(logging.INFO, logger="tracer.serve")
    offered = TOOLS + [STOCK]
    first = [{"role": "user", "content": "call:get_stock_price What is ACME trading at? Email it to Bob"}]
    with StubOpenAIServer() as stub, \
            serving(make_gateway(index_dir, minilm, stub.url, sticky=False).app) as url:
        c = client(url)
        reply = c.chat.completions.create(model="m", messages=first, tools=offered).choices[0].message
        assert reply.tool_calls[0].function.name == "get_stock_price"
        second = first + [reply.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "ACME: 41.5"}]
        c.chat.completions.create(model="m", messages=second, tools=offered)
        expected = choose(reference, second, offered, 2, UnknownToolVectors())
        assert presented(stub.requests[1]) == expected and len(expected) == 2
        assert metric(url, "tracer_lenient_total", kind="unknown_tool_call") == 1
        assert metric(url, "tracer_errors_total", kind="selection") == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# ---- defect 2: thousands of unknown tools ------------------------------------------------------------------
def archive_tools(n: int) -> list[dict]:
    tag = uuid.uuid4().hex[:8]  # names no cache has seen
    return [{"type": "function", "function": {"name": f"fetch_{tag}_{i}", "description": f"Fetch archived "
             f"record number {i} of collection {tag} from cold storage", "parameters": {"type": "object"}}}
            for i in range(n)]


def test_a_request_with_thousands_of_unknown_tools_holds_up_no_other_request(index_dir, minilm):
    big = {"model": "m", "messages": [FLIGHT], "tools": TOOLS + archive_tools(3000)}  # 560 KB
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url,
                                                          max_unknown_embed=64).app) as url:
        small_client = client(url)
        answers: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: answers.append(
            httpx.post(url + "/v1/chat/completions", json=big, timeout=300)))
        worker.start()
        probes, during = [], 0
        while worker.is_alive():
            t0 = time.perf_counter()
            assert httpx.get(url + "/health", timeout=30).status_code == 200
            small = small_client.chat.completions.create(model="m", messages=[WEATHER], tools=TOOLS)
            probes.append(time.perf_counter() - t0)
            during += worker.is_alive() and small.choices[0].message.tool_calls is not None
        worker.join()
        assert during >= 2, "the big request finished before the probes could overlap it"
        assert max(probes) < 2.0, probes                           # a generous bound, not a latency goal
        forwarded = next(r for r in stub.requests if len(r["messages"]) == 1 and r["messages"][0] == FLIGHT)
        assert answers[0].status_code == 200 and len(forwarded["tools"]) == 2
        assert metric(url, "tracer_unknown_tools_total", fate="embedded") == 64
        assert metric(url, "tracer_unknown_tools_total", fate="over_cap") == 2936


def test_unknown_tools_past_the_cap_rank_last_and_get_their_vectors_on_later_requests(reference):
    """Cap 1: the stock tool's text is second among the new ones, so the first request cannot present it; the
    second embeds it (the first is cached) and presents it, as an uncapped choice does at once."""
    noise = archive_tools(1)[0]
    offered = TOOLS + [noise, STOCK]
    msgs = [{"role": "user", "content": "What is the stock price of ACME today?"}]
    uncapped = choose(reference, msgs, offered, 2, UnknownToolVectors(max_new=None))
    assert "get_stock_price" in uncapped
    capped = UnknownToolVectors(max_new=1)
    first = choose(reference, msgs, offered, 2, capped)
    assert "get_stock_price" not in first and len(first) == 2
    assert choose(reference, msgs, offered, 2, capped) == uncapped
    archive = archive_tools(3)  # none embedded (cap 0): the request's order fills the slots
    assert choose(reference, msgs, archive, 2, UnknownToolVectors(max_new=0)) == \
        [t["function"]["name"] for t in archive[:2]]


def test_a_request_renders_and_hashes_its_unknown_tools_once(reference, monkeypatch):
    """The select stage asks whether a request's unknown tools need embedding (to leave the event loop), then
    looks them up: one rendering of each tool serves both, and the choice is the one rendered twice."""
    offered = TOOLS + archive_tools(5) + [STOCK]
    msgs = [{"role": "user", "content": "the stock price of ACME"}]
    body = {"model": "m", "messages": msgs, "tools": offered}
    names = [t["function"]["name"] for t in offered]
    want = choose(reference, msgs, offered, 2, UnknownToolVectors())
    rendered = []  # the real texts, each rendering counted
    monkeypatch.setattr(selection, "tool_text",
                        lambda tool, style: rendered.append(tool.name) or tool_text(tool, style))
    stage = SelectionStage(2, StickyPresenter(sticky=False), UnknownToolVectors(), GatewayMetrics())
    assert asyncio.run(stage(reference, "conv", body, names)) == want
    assert sorted(rendered) == sorted(n for n in names if n not in reference.registry)


# ---- defect 15: two agents that open alike -----------------------------------------------------------------
def sticky_lists(reference: Retriever, *steps: tuple[list, str | None]) -> list[list[str]]:
    """The sticky presentation of one conversation's steps (context, tool_choice's tool): the index's top 2
    (the forced tool first when it is not among them), new tools appended in canonical order."""
    out, shown = [], []
    for context, must in steps:
        chosen = reference.rank(context)[:2]
        if must is not None and must not in chosen:
            chosen = [must] + chosen[:1]
        shown = shown + sorted(set(chosen) - set(shown), key=NAMES.index)
        out.append(shown)
    return out


def force(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def test_two_agents_with_the_same_opening_keep_two_conversations(index_dir, minilm, reference, tmp_path):
    opening = [{"role": "system", "content": "You are a helpful assistant"}, WEATHER]
    sink = ConversationLog(tmp_path / "log")
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url, sink=sink).app) as url:
        a, b = client(url), client(url)
        ra = a.chat.completions.with_raw_response.create(model="m", messages=opening, tools=TOOLS)
        rb = b.chat.completions.with_raw_response.create(model="m", messages=opening, tools=TOOLS)
        ids = [r.headers["x-tracer-conversation"] for r in (ra, rb)]
        assert ids[0] != ids[1]

        def next_turn(raw, text):
            reply = raw.parse().choices[0].message.model_dump(exclude_none=True)
            return opening + [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"],
                                      "content": "sunny"}, {"role": "user", "content": text}]
        turn_a = next_turn(ra, "Now find me a flight from SFO to JFK and book it")
        turn_b = next_turn(rb, "Show the files here")
        done = {"X-Tracer-Outcome": "success"}
        seconds = [c.chat.completions.with_raw_response.create(  # B first: the order does not matter
            model="m", messages=m, tools=TOOLS, tool_choice=force(must), extra_headers=done)
            for c, m, must in ((b, turn_b, "list_files"), (a, turn_a, "book_flight"))]
        assert [r.headers["x-tracer-conversation"] for r in seconds] == ids[::-1]
        other_key = client(url, "sk-other").chat.completions.with_raw_response.create(
            model="m", messages=turn_a, tools=TOOLS)                 # another credential never continues it
        assert other_key.headers["x-tracer-conversation"] not in ids
        named = a.chat.completions.with_raw_response.create(model="m", messages=turn_a, tools=TOOLS,
                                                           extra_headers={"X-Tracer-Conversation": "mine"})
        assert named.headers["x-tracer-conversation"] == "mine"
        assert metric(url, "tracer_conversations_total", how="continued") == 2
        shown = [presented(r) for r in stub.requests[:4]]
    list_a = sticky_lists(reference, (opening, None), (turn_a, "book_flight"))
    list_b = sticky_lists(reference, (opening, None), (turn_b, "list_files"))
    assert shown == [list_a[0], list_b[0], list_b[1], list_a[1]] and list_a[1] != list_b[1]
    logged = {t.group: t for t in load_native(tmp_path / "log").trajectories if t.success}
    assert set(logged) == set(ids)
    assert logged[ids[0]].messages[-2]["content"].startswith("Now find me a flight")
    assert logged[ids[1]].messages[-2]["content"] == "Show the files here"
