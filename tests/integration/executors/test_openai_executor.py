"""The OpenAI-compatible executor (tracer/executors/openai.py) against a real local HTTP stub: the request
on the wire, the reply parsed, retries and errors (a deadline, a dripping server, an oversized or
wrong-shaped reply), order and concurrency."""

from __future__ import annotations

import socket
import time

import pytest
from executor_requests import TOOLS, user
from stub_openai_server import StubOpenAIServer, count_prompt_tokens

from tracer.core.types import ToolCall
from tracer.executors import Executor, Request
from tracer.executors.openai import ExecutorError, OpenAIExecutor


def client(server: StubOpenAIServer, **kw) -> OpenAIExecutor:
    kw = {"timeout_s": 2, "max_retries": 3, "backoff_s": 0.01, **kw}
    return OpenAIExecutor(base_url=server.url, model="stub-model", api_key_env="TRACER_TEST_KEY", **kw)


# -- the request on the wire -------------------------------------------------------------------


def test_request_body_carries_model_messages_tools_and_choice(stub):
    ex = client(stub, tool_choice="required", temperature=0.3, max_tokens=64, extra_body={"seed": 7})
    messages = user("what is the weather in city=Paris")
    ex.choose([Request(messages=messages, tools=TOOLS)])
    [body] = stub.requests
    assert body == {"model": "stub-model", "messages": messages, "tools": TOOLS, "tool_choice": "required",
                    "temperature": 0.3, "max_tokens": 64, "seed": 7}
    assert "Authorization" not in stub.headers[0]  # no key in the environment: no auth header
    assert stub.headers[0]["Content-Type"] == "application/json"


def test_no_tools_omits_tools_and_tool_choice(stub):
    ex = client(stub)
    [d] = ex.choose([Request(messages=user("hello"), tools=[])])
    assert "tools" not in stub.requests[0] and "tool_choice" not in stub.requests[0]
    assert d.call is None and d.text == "echo: hello"


def test_api_key_from_the_environment(stub, monkeypatch):
    monkeypatch.setenv("TRACER_TEST_KEY", "sk-test")
    client(stub).choose([Request(messages=user("x"), tools=TOOLS)])
    assert stub.headers[0]["Authorization"] == "Bearer sk-test"


def test_base_url_trailing_slash(stub):
    ex = OpenAIExecutor(base_url=stub.url + "/", model="m", api_key_env=None)
    assert ex.url == stub.url + "/chat/completions"
    assert ex.choose([Request(messages=user("hi"), tools=TOOLS)])[0].call is not None


# -- parsing the reply ---------------------------------------------------------------------------


def test_tool_call_parsed_with_name_arguments_and_id(stub):
    ex = client(stub)
    [d] = ex.choose(
        [Request(messages=user("book_flight origin=SFO dest=JFK seats=2 ignored=1"), tools=TOOLS)])
    assert d.call == ToolCall("book_flight", {"origin": "SFO", "dest": "JFK", "seats": 2}, id="call_0")
    assert d.text == "" and d.raw == {"finish_reason": "tool_calls", "n_tool_calls": 1}  # usage: its own test
    assert not d.malformed and d.error is None


def test_no_named_tool_falls_back_to_first_presented(stub):
    [d] = client(stub).choose([Request(messages=user("city=Oslo please"), tools=TOOLS)])
    assert d.call == ToolCall("get_weather", {"city": "Oslo"}, id="call_0")


def test_text_only_reply_is_no_call(stub):
    ex = client(stub)
    [d] = ex.choose([Request(messages=user("[text] just answer"), tools=TOOLS)])
    assert d.call is None and d.text == "echo: [text] just answer"
    assert not d.malformed and d.error is None and ex.n_malformed == 0


def test_malformed_arguments_counted(stub):
    # the stub numbers ids by arrival; in flight together, either may come first
    ex = client(stub, concurrency=1)
    d1, d2 = ex.choose([Request(messages=user("get_weather [malformed]"), tools=TOOLS),
                        Request(messages=user("get_weather city=Rome"), tools=TOOLS)])
    assert d1.call is None and d1.malformed and d1.error is None
    assert d1.raw["name"] == "get_weather" and d1.raw["arguments"] == '{"city": "Par'
    assert d2.call == ToolCall("get_weather", {"city": "Rome"}, id="call_1") and not d2.malformed
    assert ex.n_malformed == 1 and ex.n_errors == 0


def test_call_to_a_tool_not_presented_is_kept_and_flagged(stub):
    [d] = client(stub).choose([Request(messages=user("call:delete_account"), tools=TOOLS)])
    assert d.call == ToolCall("delete_account", {}, id="call_0")
    assert d.raw["not_presented"] is True and not d.malformed


def test_token_usage_recorded(stub):
    ex = client(stub)
    reqs = [Request(messages=user("get_weather city=Paris"), tools=TOOLS),
            Request(messages=user("book_hotel"), tools=TOOLS[2:])]
    decisions = ex.choose(reqs)
    expected = [count_prompt_tokens(list(r.messages), list(r.tools)) for r in reqs]
    assert [d.prompt_tokens for d in decisions] == expected
    assert all(d.completion_tokens and d.completion_tokens > 0 for d in decisions)
    assert ex.prompt_tokens == sum(expected)
    assert ex.completion_tokens == sum(d.completion_tokens for d in decisions)
    assert ex.n_requests == 2 and ex.tokenizer_name == "server:stub-model"


def test_complete_returns_content_without_tools(stub):
    ex = client(stub)
    assert ex.complete(user("summarise the state")) == "echo: summarise the state"
    assert "tools" not in stub.requests[0]
    assert ex.prompt_tokens == count_prompt_tokens(user("summarise the state"), [])


# -- retries and errors --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 429, 503])
def test_retries_then_succeeds(status):
    with StubOpenAIServer(fail_first=2, fail_status=status) as server:
        ex = client(server, max_retries=3)
        [d] = ex.choose([Request(messages=user("get_weather city=Lima"), tools=TOOLS)])
    assert d.call == ToolCall("get_weather", {"city": "Lima"}, id="call_2")
    assert ex.n_retries == 2 and ex.n_errors == 0 and ex.n_requests == 1
    assert len(server.requests) == 3


def test_gives_up_after_max_retries():
    with StubOpenAIServer(fail_first=100, fail_status=500) as server:
        ex = client(server, max_retries=2)
        [d] = ex.choose([Request(messages=user("x"), tools=TOOLS)])
        with pytest.raises(ExecutorError, match="gave up after 3 attempts"):
            ex.complete(user("y"))
    assert d.call is None and d.error is not None
    assert "gave up after 3 attempts" in d.error and "HTTP 500" in d.error and "injected failure 3" in d.error
    assert len(server.requests) == 6 and ex.n_retries == 4 and ex.n_errors == 2


def test_400_is_not_retried():
    with StubOpenAIServer(fail_first=100, fail_status=400) as server:
        ex = client(server, max_retries=3)
        [d] = ex.choose([Request(messages=user("x"), tools=TOOLS)])
    assert d.call is None and d.error.startswith("HTTP 400") and "injected failure 1" in d.error
    assert len(server.requests) == 1 and ex.n_retries == 0 and ex.n_errors == 1


def test_timeout_is_retried():
    with StubOpenAIServer(delay_first=1, delay_first_s=0.6) as server:
        ex = client(server, timeout_s=0.2, max_retries=2)
        [d] = ex.choose([Request(messages=user("book_hotel city=Kyoto"), tools=TOOLS)])
    assert d.call == ToolCall("book_hotel", {"city": "Kyoto"}, id="call_1")
    assert ex.n_retries == 1 and ex.n_errors == 0


def test_connection_refused_is_retried_then_an_error():
    with socket.socket() as s:  # a port that nothing listens on once the socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ex = OpenAIExecutor(base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key_env=None,
                        max_retries=2, backoff_s=0.01, timeout_s=1)
    [d] = ex.choose([Request(messages=user("x"), tools=TOOLS)])
    assert d.call is None and "gave up after 3 attempts" in d.error and "refused" in d.error.lower()
    assert ex.n_retries == 2 and ex.n_errors == 1


def test_a_dripping_server_is_cut_at_the_deadline():
    """One byte per 0.25 s keeps every read alive; the 1.5 s deadline covers the whole reply, so it is cut."""
    with StubOpenAIServer(drip_s=0.25) as server:
        ex = client(server, timeout_s=1.5, max_retries=1, backoff_s=0.01)
        start = time.perf_counter()
        [d] = ex.choose([Request(messages=user("get_weather city=Oslo"), tools=TOOLS)])
        elapsed = time.perf_counter() - start
    assert d.call is None and "gave up after 2 attempts" in d.error and "within 1.5 s" in d.error
    assert 3.0 <= elapsed < 8  # two attempts of 1.5 s, plus scheduling; the whole reply takes 100 s
    assert ex.n_errors == 1 and ex.n_retries == 1


def test_an_oversized_reply_is_an_error_not_retried():
    big = {"content": "x" * 300_000, "tool_calls": []}
    with StubOpenAIServer(policy=lambda body: big) as server:
        ex = client(server, max_response_bytes=100_000)
        [d] = ex.choose([Request(messages=user("hi"), tools=TOOLS)])
        assert d.call is None and "over max_response_bytes=100000" in d.error
        assert len(server.requests) == 1 and ex.n_errors == 1 and ex.n_retries == 0
        assert client(server).choose([Request(messages=user("hi"), tools=TOOLS)])[0].text == big["content"]


def _message(message, usage=None) -> dict:
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": message,
                                                               "finish_reason": "stop"}],
            **({"usage": usage} if usage is not None else {})}


WRONG_SHAPES = {
    "message a string": _message("get_weather"),
    "tool_calls an object": _message({"content": None, "tool_calls": {"function": {"name": "get_weather"}}}),
    "function a string": _message({"content": None, "tool_calls": [{"id": "c", "function": "get_weather"}]}),
    "usage a string": _message({"content": "hi"}, usage="12"),
    "negative usage": _message({"content": "hi"}, usage={"prompt_tokens": -5, "completion_tokens": 1}),
    "usage a float": _message({"content": "hi"}, usage={"prompt_tokens": 5.5, "completion_tokens": 1}),
    "no choices": {"choices": []},
    "a list": [1, 2],
}


def test_each_wrong_shaped_reply_is_one_counted_error_never_a_crash():
    """Each reply below is HTTP 200 with a wrong shape: one error for that step, and the next steps go on."""
    shapes = list(WRONG_SHAPES.values())
    with StubOpenAIServer(reply=lambda n, body: shapes[n] if n < len(shapes) else _message(
            {"content": None,
             "tool_calls": [{"id": "ok", "function": {"name": "get_weather", "arguments": "{}"}}]},
            usage={"prompt_tokens": 3, "completion_tokens": 1})) as server:
        ex = client(server, concurrency=1)
        decisions = ex.choose([Request(messages=user(str(i)), tools=TOOLS) for i in range(len(shapes) + 1)])
    *bad, good = decisions
    for what, d in zip(WRONG_SHAPES, bad):
        assert d.call is None and d.error is not None and "wrong shape in reply" in d.error, what
    assert good.call == ToolCall("get_weather", {}, id="ok") and good.prompt_tokens == 3
    # no count from a bad usage
    assert ex.n_errors == len(shapes) and ex.n_retries == 0 and ex.prompt_tokens == 3


# -- concurrency ---------------------------------------------------------------------------------


def test_order_preserved_and_concurrency_bounded():
    names = [t["function"]["name"] for t in TOOLS]
    # later requests sleep less, so they finish first: order must come from the client, not arrival
    reqs = [Request(messages=user(f"{names[i % 3]} city=c{i} sleep={0.02 * (12 - i):.2f}"), tools=TOOLS)
            for i in range(12)]
    with StubOpenAIServer() as server:
        ex = client(server, concurrency=3)
        start = time.perf_counter()
        decisions = ex.choose(reqs)
        elapsed = time.perf_counter() - start
    assert [d.call.name for d in decisions] == [names[i % 3] for i in range(12)]
    assert [d.call.arguments.get("city") for d in decisions] == [
        f"c{i}" if names[i % 3] != "book_flight" else None for i in range(12)]
    assert 1 < server.max_in_flight <= 3
    assert elapsed < sum(0.02 * (12 - i) for i in range(12))  # ran concurrently (serial would take 1.56 s)
    assert ex.n_requests == 12


def test_concurrency_one_is_serial():
    with StubOpenAIServer(delay_s=0.01) as server:
        client(server, concurrency=1).choose([Request(messages=user(str(i)), tools=TOOLS) for i in range(4)])
    assert server.max_in_flight == 1 and len(server.requests) == 4


def test_openai_executor_satisfies_protocol(stub):
    ex = client(stub)
    assert isinstance(ex, Executor) and not ex.is_oracle and ex.name == "openai"


def test_needs_base_url_and_model():
    with pytest.raises(ValueError, match="model"):
        OpenAIExecutor(base_url="http://127.0.0.1:1/v1", model="")


def test_calls_written_in_the_text_are_read_only_when_asked():
    """llama_cpp.server on Qwen's own chat template returns its <tool_call> block as the message's text."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    texts = iter([call, call, '{"name": "teleport", "arguments": {}}',
                  '{"name": "get_weather", "arguments": {"ci', "It is sunny.", f"Checking.\n{call}"])
    with StubOpenAIServer(policy=lambda body: {"content": next(texts), "tool_calls": None}) as server:
        plain, reading = client(server), client(server, calls_in_text=True)
        [off] = plain.choose([Request(messages=user("weather"), tools=TOOLS)])
        ask = [Request(messages=user("weather"), tools=TOOLS)]
        [on, invented, cut, prose, said] = [reading.choose(ask)[0] for _ in range(5)]
    assert off.call is None and off.text.startswith("<tool_call>") and not off.malformed
    assert on.call == ToolCall("get_weather", {"city": "Oslo"}) and on.raw["calls_in_text"]
    # a call read from the text keeps only the text before it, as a server's tool-call parser returns it:
    # carried forward with the call as tool_calls, the call is not shown to the model twice
    assert on.text is None and said.text == "Checking." and said.call == on.call
    assert invented.call.name == "teleport" and invented.raw["not_presented"]
    assert cut.call is None and cut.malformed and reading.n_malformed == 1
    assert prose.call is None and prose.text == "It is sunny." and not prose.malformed
