"""The registry held by the gateway (``tracer serve --tools-from-index``): a client sends no schemas, or only
its own additions; the upstream receives the k tools chosen among the index's and those, with the index's
saved schemas. Real parts: the official ``openai`` client, the gateway on loopback, the stub upstream that
records what it received, a MiniLM index."""

from __future__ import annotations

import openai
from builders import call, result
from gateway_harness import make_gateway, serving
from stub_openai_server import StubOpenAIServer

from tracer.data import load_native
from tracer.retriever import Retriever
from tracer.serve.log.sink import ConversationLog

K = 2
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Email it to Bob"}]
ARCHIVE = {
    "type": "function",
    "function": {
        "name": "archive_files",
        "description": "Compress the listed files into a zip archive",
        "parameters": {
            "type": "object",
            "properties": {"files": {"type": "array", "items": {"type": "string"}}},
        },
    },
}


def held(index_dir, minilm, upstream: str, sink=None):
    """The gateway app with the registry held, plain top-k presentation."""
    return make_gateway(index_dir, minilm, upstream, sink=sink, k=K, sticky=False, tools_from_index=True).app


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def names(body: dict) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]


def test_a_request_without_tools_gets_the_indexs_choice_with_its_saved_schemas(index_dir, minilm):
    reference = Retriever.load(index_dir, embedder=minilm, device="cpu")
    saved = {t.name: t.to_openai() for t in reference.registry}
    step2 = WEATHER + [call("get_weather", 0), result(0, "sunny")]
    with StubOpenAIServer() as stub, serving(held(index_dir, minilm, stub.url)) as url:
        for messages in (WEATHER, step2):
            client(url).chat.completions.create(model="m", messages=messages)
    for body, messages in zip(stub.requests, (WEATHER, step2)):
        assert names(body) == reference.rank(messages)[:K]
        assert body["tools"] == [saved[n] for n in names(body)]


def test_additions_compete_overrides_win_and_tool_choice_none_sends_nothing(index_dir, minilm):
    reference = Retriever.load(index_dir, embedder=minilm, device="cpu")
    changed = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather, the client's words",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    archive = [{"role": "user", "content": "Compress these files into a zip archive"}]
    with StubOpenAIServer() as stub, serving(held(index_dir, minilm, stub.url)) as url:
        c = client(url)
        c.chat.completions.create(model="m", messages=archive, tools=[ARCHIVE])
        c.chat.completions.create(model="m", messages=WEATHER, tools=[changed])
        c.chat.completions.create(model="m", messages=WEATHER, tools=[ARCHIVE], tool_choice="none")
    added, overridden, none = stub.requests
    assert "archive_files" in names(added) and len(names(added)) == K  # the addition asked for, plainly
    assert names(overridden) == reference.rank(WEATHER)[:K] and "get_weather" in names(overridden)
    assert overridden["tools"][names(overridden).index("get_weather")] == changed
    assert names(none) == ["archive_files"]  # as sent: nothing of the index's is offered


def test_without_the_flag_a_request_without_tools_passes_as_it_came(index_dir, minilm):
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url, k=K).app) as url:
        client(url).chat.completions.create(model="m", messages=WEATHER)
    assert "tools" not in stub.requests[0]


def test_a_logged_call_of_a_held_tool_carries_its_schema(index_dir, minilm, tmp_path):
    """The log knows what was offered: a call of an index tool the request never named is learned with the
    schema the model saw, not as an invented name."""
    sink = ConversationLog(tmp_path / "log")
    with StubOpenAIServer() as stub, serving(held(index_dir, minilm, stub.url, sink)) as url:
        raw = client(url).chat.completions.with_raw_response.create(
            model="m",
            messages=[{"role": "user", "content": "weather in Oslo call:get_weather"}],
            extra_headers={"X-Tracer-Outcome": "success", "X-Tracer-Conversation": "held-1"},
        )
        assert raw.parse().choices[0].message.tool_calls[0].function.name == "get_weather"
    ds = load_native(tmp_path / "log")
    assert [t.group for t in ds.trajectories] == ["held-1"]
    assert "get_weather" in ds.registry and not ds.trajectories[0].metadata.get("unoffered")
    saved = Retriever.load(index_dir, embedder=minilm, device="cpu").registry.get("get_weather")
    assert ds.registry.get("get_weather").to_openai() == saved.to_openai()  # the schema the index presented
