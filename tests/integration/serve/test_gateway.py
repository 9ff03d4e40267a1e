"""The gateway on real parts: the official ``openai`` client -> the gateway (uvicorn, loopback) -> a stub
upstream (a real HTTP server) that records what it received; the index is real (MiniLM, FAISS): the tools it
forwards, the answers and errors it passes back, the requests it refuses, /health and /metrics. Its log,
reloads and command: test_gateway_lifecycle.py."""

from __future__ import annotations

import httpx
import openai
import pytest
from builders import call, result
from gateway_harness import NAMES, TOOLS, WEATHER, client, make_gateway, serving
from stub_openai_server import StubOpenAIServer

from tracer.retriever import Retriever


def test_forwards_exactly_the_selected_tools_and_returns_the_answer_byte_identical(index_dir, minilm):
    reference = Retriever.load(index_dir, embedder=minilm, device="cpu")
    best_two = reference.rank(WEATHER)[:2]
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        raw = client(url).chat.completions.with_raw_response.create(model="m", messages=WEATHER, tools=TOOLS)
        completion = raw.parse()
        forwarded = stub.requests[0]
        # first step of a conversation: the index's best two, in the request's (canonical) order
        assert [t["function"]["name"] for t in forwarded["tools"]] == sorted(best_two, key=NAMES.index)
        assert forwarded["tools"] == [TOOLS[NAMES.index(n)] for n in sorted(best_two, key=NAMES.index)]
        assert forwarded["messages"] == WEATHER and forwarded["model"] == "m"
        assert {k.lower(): v for k, v in stub.headers[0].items()}["authorization"] == "Bearer sk-test"
        assert raw.http_response.content == stub.replies[0]
        assert completion.choices[0].message.tool_calls[0].function.name in best_two
        assert raw.headers["x-tracer-conversation"]


def test_streaming_passes_the_events_through_unchanged(index_dir, minilm):
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        stream = client(url).chat.completions.create(model="m", messages=WEATHER, tools=TOOLS, stream=True)
        chunks = list(stream)
        names = [tc.function.name for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        # the stub calls the first presented
        assert names == [stub.requests[0]["tools"][0]["function"]["name"]]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        body = {"model": "m", "messages": WEATHER, "tools": TOOLS, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            data = b"".join(r.iter_raw())
        assert data == stub.replies[1] and data.endswith(b"data: [DONE]\n\n")


def test_an_upstream_error_passes_through_with_its_status(index_dir, minilm):
    with StubOpenAIServer(fail_first=1, fail_status=429) as stub, \
            serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        with pytest.raises(openai.RateLimitError) as e:
            client(url).chat.completions.create(model="m", messages=WEATHER, tools=TOOLS)
        assert e.value.status_code == 429 and e.value.response.content == stub.replies[0]


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "messages": WEATHER, "tools": [TOOLS[0], {"type": "function", "function": {}}]},
     "tools[1].function.name"),
    ({"model": "m", "messages": WEATHER, "tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    ({"model": "m", "messages": [], "tools": TOOLS}, "messages"),
    ({"model": "m", "messages": [{"content": "hi"}], "tools": TOOLS}, "messages[0].role"),
    ({"model": "m", "messages": WEATHER, "tools": {"a": 1}}, "tools"),
])
def test_a_malformed_request_is_a_400_naming_the_field(index_dir, minilm, body, param):
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        with pytest.raises(openai.BadRequestError) as e:
            client(url).chat.completions.create(**body)
        assert e.value.status_code == 400 and e.value.body["param"] == param and param in e.value.message
        assert stub.requests == []  # nothing reached the upstream


def test_sticky_presentation_keeps_earlier_tools_in_place_and_appends(index_dir, minilm):
    step1 = WEATHER
    step2 = step1 + [call("get_weather", 0), result(0, "sunny")]
    reference = Retriever.load(index_dir, embedder=minilm, device="cpu")
    chosen1, chosen2 = reference.rank(step1)[:2], reference.rank(step2)[:2]
    first = sorted(chosen1, key=NAMES.index)
    second = first + sorted(set(chosen2) - set(first), key=NAMES.index)
    assert len(second) > len(first)  # the data makes the second step choose something new
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        c = client(url)
        for msgs in (step1, step2):
            c.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        assert [[t["function"]["name"] for t in r["tools"]] for r in stub.requests] == [first, second]
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url,
                                                          sticky=False).app) as url:
        client(url).chat.completions.create(model="m", messages=step2, tools=TOOLS)
        assert [t["function"]["name"] for t in stub.requests[0]["tools"]] == chosen2


def test_unknown_tools_compete_by_vector_search_and_omitted_tools_are_never_presented(index_dir, minilm):
    stock = {"type": "function", "function": {
        "name": "get_stock_price", "description": "Get the current stock price of a company ticker",
        "parameters": {"type": "object", "properties": {}}}}
    msgs = [{"role": "user", "content": "What is the stock price of ACME today?"}]
    offered = [TOOLS[0], TOOLS[3], stock, TOOLS[4]]  # no book_flight, cancel_booking, list_files
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url,
                                                          sticky=False).app) as url:
        client(url).chat.completions.create(model="m", messages=msgs, tools=offered)
        presented = [t["function"]["name"] for t in stub.requests[0]["tools"]]
    assert "get_stock_price" in presented and len(presented) == 2
    assert set(presented) <= {t["function"]["name"] for t in offered}


def test_tool_choice_naming_a_tool_keeps_it(index_dir, minilm):
    forced = {"type": "function", "function": {"name": "list_files"}}
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        client(url).chat.completions.create(model="m", messages=WEATHER, tools=TOOLS, tool_choice=forced)
    assert "list_files" in [t["function"]["name"] for t in stub.requests[0]["tools"]]


def test_health_metrics_size_limit_and_upstream_deadline(index_dir, minilm):
    with StubOpenAIServer(delay_first=1, delay_first_s=1.5) as stub, serving(make_gateway(
            index_dir, minilm, stub.url, max_body_bytes=4096, upstream_timeout_s=0.5).app) as url:
        with pytest.raises(openai.APIStatusError) as e:
            client(url).chat.completions.create(model="m", messages=WEATHER, tools=TOOLS)
        assert e.value.status_code == 504
        client(url).chat.completions.create(model="m", messages=WEATHER, tools=TOOLS)
        big = [{"role": "user", "content": "x" * 5000}]
        with pytest.raises(openai.APIStatusError) as e:
            client(url).chat.completions.create(model="m", messages=big, tools=TOOLS)
        assert e.value.status_code == 413 and len(stub.requests) == 2
        health = httpx.get(url + "/health").json()
        assert (health["status"] == "ok" and health["tools"] == len(TOOLS)
                and health["scorer"] == "tracer_fixed")
        text = httpx.get(url + "/metrics").text
    assert 'tracer_requests_total{status="200"} 1.0' in text
    assert ('tracer_requests_total{status="504"} 1.0' in text
            and 'tracer_requests_total{status="413"} 1.0' in text)
    assert 'tracer_errors_total{kind="upstream_timeout"} 1.0' in text
    assert "tracer_selection_seconds_count 2.0" in text and "tracer_upstream_seconds_count 1.0" in text
