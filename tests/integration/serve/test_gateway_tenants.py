"""Tenants of the gateway (issue 56, defect 1), on real servers over loopback with the official ``openai``
client: every piece of per-conversation state (the sticky presentation list, the pending log, the outcome
token) belongs to the credential that sent the request, so two API keys that send the same
``X-Tracer-Conversation`` never share a conversation; a request without a credential is the anonymous
tenant, apart from every key."""

from __future__ import annotations

import httpx
import openai
from builders import call, result
from gateway_harness import TOOLS, make_gateway, serving
from stub_openai_server import StubOpenAIServer

from tracer.data import load_native
from tracer.serve.log.sink import ConversationLog

# two conversations one step in, whose next tools differ ([text]: the stub answers in words)
FLIGHTS = [{"role": "user", "content": "Find me a flight from SFO to JFK tomorrow and book it [text]"},
           call("search_flights", 0), result(0)]
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Email it to Bob [text]"},
           call("get_weather", 0), result(0)]


def keyed_client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def ask(c: openai.OpenAI, messages: list, conversation: str, **headers: str):
    return c.chat.completions.with_raw_response.create(
        model="m", messages=messages, tools=TOOLS,
        extra_headers={"X-Tracer-Conversation": conversation, **headers})


def presented(stub: StubOpenAIServer, i: int) -> list[str]:
    return [t["function"]["name"] for t in stub.requests[i]["tools"]]


def test_two_keys_sending_the_same_conversation_id_share_nothing(index_dir, minilm, tmp_path):
    sink = ConversationLog(tmp_path / "log")
    with StubOpenAIServer() as stub, \
            serving(make_gateway(index_dir, minilm, stub.url, sink=sink, admin_token="adm").app) as url:
        a, b = keyed_client(url, "sk-tenant-a"), keyed_client(url, "sk-tenant-b")
        a1 = ask(a, FLIGHTS, "1")
        b1 = ask(b, WEATHER, "1")
        ask(b, WEATHER, "fresh")                             # B's request in a conversation of its own
        a2 = ask(a, FLIGHTS + [{"role": "assistant", "content": "ok"},
                               {"role": "user", "content": "and the weather there? [text]"}], "1")
        anonymous = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": WEATHER,
                                                                   "tools": TOOLS},
                               headers={"x-tracer-conversation": "1", "x-tracer-outcome": "success"})
        tokens = [r.headers["x-tracer-outcome-token"] for r in (a1, b1, anonymous)]
        # B finishes its own "1" with its token; the operator finishes A's, naming A's tenant
        by_b = httpx.post(url + "/v1/tracer/outcome", json={"conversation": "1", "success": True},
                          headers={"x-tracer-outcome-token": tokens[1]})
        by_admin = httpx.post(url + "/v1/tracer/outcome",
                              json={"conversation": "1", "success": False, "tenant": tokens[0][:32]},
                              headers={"authorization": "Bearer adm"})
    # B was presented its own choice, not A's tools plus its own
    assert len(presented(stub, 1)) == 2 and presented(stub, 1) == presented(stub, 2)
    assert presented(stub, 3)[:2] == presented(stub, 0)     # the same key's "1" is one conversation (sticky)
    assert len(presented(stub, 4)) == 2                      # the anonymous tenant's "1": its own too
    assert len(set(tokens)) == 3
    assert all(r.headers["x-tracer-conversation"] == "1" for r in (a1, b1, a2, anonymous))
    assert (by_b.status_code, by_admin.status_code) == (200, 200)
    records = load_native(tmp_path / "log").trajectories
    assert sorted(t.group for t in records) == ["1", "1", "1", "fresh"]
    by_text = {t.messages[0]["content"]: t for t in records if t.metadata["outcome"] == "reported"}
    a_rec = by_text[FLIGHTS[0]["content"]]
    assert not a_rec.success and len(a_rec.messages) == 6    # A's whole conversation, A's messages only
    b_recs = [t for t in records if t.group == "1" and t.messages[0]["content"] == WEATHER[0]["content"]]
    assert [t.success for t in b_recs] == [True, True]      # B's (by its token) and the anonymous one's
    assert all(len(t.messages) == 4 for t in b_recs)


def test_another_keys_continuation_id_sent_as_a_header_is_a_conversation_of_its_own(index_dir, minilm):
    """A continuation id is random, but it travels in answers: B sending A's id as its header gets a
    conversation of B's, not A's sticky list or A's outcome token."""
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        a = keyed_client(url, "sk-a").chat.completions.with_raw_response.create(model="m", messages=FLIGHTS,
                                                                               tools=TOOLS)
        a_id = a.headers["x-tracer-conversation"]
        b = ask(keyed_client(url, "sk-b"), WEATHER, a_id)
        ask(keyed_client(url, "sk-b"), WEATHER, "fresh")
        ask(keyed_client(url, "sk-a"), WEATHER, a_id)            # A itself may name its own id
    assert b.headers["x-tracer-conversation"] == a_id
    assert presented(stub, 1) == presented(stub, 2) and len(presented(stub, 1)) == 2
    assert presented(stub, 3)[:2] == presented(stub, 0)
