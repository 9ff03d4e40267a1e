"""Executors: the oracle, the vLLM tool-call parser (and the in-process executor's glue over a stand-in
``vllm`` module), the registry. The OpenAI-compatible client: test_openai_executor.py."""

from __future__ import annotations

import json
import sys
import types

import pytest
from executor_requests import HOTEL, TOOLS, WEATHER, user

from tracer.build import build_executor
from tracer.core.types import ToolCall
from tracer.executors import OracleExecutor, Request
from tracer.executors.openai import OpenAIExecutor
from tracer.executors.vllm import parse_tool_calls

# -- the oracle ----------------------------------------------------------------------------------


def test_oracle_calls_gold_when_presented():
    gold = ToolCall("book_flight", {"origin": "SFO", "dest": "JFK"}, id="g1")
    [d] = OracleExecutor().choose([Request(messages=user("x"), tools=TOOLS, gold=gold)])
    assert d.call == gold


def test_oracle_gold_absent_calls_top_tool_with_accepted_arguments():
    gold = ToolCall("book_flight", {"origin": "SFO", "city": "Paris", "seats": 2}, id="g2")
    presented = [HOTEL.to_openai(), WEATHER.to_openai()]
    [d] = OracleExecutor().choose([Request(messages=user("x"), tools=presented, gold=gold)])
    assert d.call == ToolCall("book_hotel", {"city": "Paris"}, id="g2")  # book_hotel accepts only city


def test_oracle_nothing_presented():
    [d] = OracleExecutor().choose([Request(messages=user("x"), tools=[], gold=ToolCall("f"))])
    assert d.call is None


# -- vLLM: the tool-call parser ------------------------------------------------------------------


@pytest.mark.parametrize("text, calls, malformed", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     [ToolCall("get_weather", {"city": "Paris"})], False),
    ('Let me check.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>'
     + '{"name": "b", "arguments": {"x": 1}}</tool_call>',
     [ToolCall("a", {}), ToolCall("b", {"x": 1})], False),
    ('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call><tool_call>{"name": "b", "argum',
     [ToolCall("a", {"x": 1})], True),  # cut off by max_tokens after the first call
    ('<tool_call>{"name": "a", "arguments": {"x": </tool_call>', [], True),
    ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>', [ToolCall("a", {"x": 1})], False),
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', [ToolCall("get_weather", {"city": "Oslo"})],
     False),
    ('{"name": "get_weather", "parameters": {"city": "Oslo"}}', [ToolCall("get_weather", {"city": "Oslo"})],
     False),
    ('<|python_tag|>{"name": "f", "parameters": {"q": "x"}}', [ToolCall("f", {"q": "x"})], False),
    ('```json\n{"name": "f", "arguments": {}}\n```', [ToolCall("f", {})], False),
    ('{"name": "f", "arguments": {"a": 1}} I called f.', [ToolCall("f", {"a": 1})], False),
    ('[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]',
     [ToolCall("a", {"x": 1}), ToolCall("b", {})], False),
    ('[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}]', [ToolCall("a", {"x": 1})], False),
    ('[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}', [], True),
    ('{"type": "function", "id": "c7", "function": {"name": "f", "arguments": "{}"}}',
     [ToolCall("f", {}, id="c7")], False),
    ('{"name": "f", "arguments": {"x": ', [], True),
    ('{"name": "f", "arguments": "not json"}', [], True),
    ('{"name": "f", "arguments": [1, 2]}', [], True),
    ('{"answer": 42}', [], False),  # JSON, but not a call
    ("The weather in Paris is sunny.", [], False),
    ("", [], False),
])
def test_parse_tool_calls(text, calls, malformed):
    assert parse_tool_calls(text) == (calls, malformed)


# -- vLLM: the executor's glue over a stand-in vllm module ---------------------------------------


class _FakeTokenizer:
    def apply_chat_template(self, conversation, tools=None, add_generation_prompt=False, tokenize=False):
        assert add_generation_prompt and tokenize
        for m in conversation:  # templates get tool-call arguments as dicts
            for c in m.get("tool_calls") or []:
                assert isinstance(c["function"]["arguments"], dict)
        return list(range(len(json.dumps([conversation, tools]).split())))


class _FakeLLM:
    """Replies with the text after ``reply:`` in the last user message."""

    def __init__(self, model, **kwargs):
        self.model, self.kwargs, self.batches = model, kwargs, []

    def get_tokenizer(self):
        return _FakeTokenizer()

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.batches.append(prompts)
        return [types.SimpleNamespace(prompt_token_ids=p["prompt_token_ids"],
                                      outputs=[types.SimpleNamespace(text=self.replies.pop(0),
                                                                     token_ids=[0] * 5)])
                for p in prompts]


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = _FakeLLM
    module.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", module)


def test_vllm_executor_batches_and_parses(fake_vllm):
    ex = build_executor("vllm", model="tiny", temperature=0.0, max_tokens=32,
                        llm_kwargs={"max_model_len": 512})
    assert (ex.llm.kwargs == {"max_model_len": 512}
            and ex.sampling_params == {"temperature": 0.0, "max_tokens": 32})
    history = user("first") + [{"role": "assistant", "content": "", "tool_calls": [
        ToolCall("get_weather", {"city": "Paris"}, id="c0").to_openai()]},
        {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]
    ex.llm.replies = ['<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
                      "No tool needed.",
                      '<tool_call>{"name": "get_weather", "arguments": {"ci',
                      '{"name": "nuke", "arguments": {}}']
    reqs = [Request(messages=history, tools=TOOLS), Request(messages=user("b"), tools=TOOLS),
            Request(messages=user("c"), tools=TOOLS), Request(messages=user("d"), tools=TOOLS[:1])]
    d = ex.choose(reqs)
    assert len(ex.llm.batches) == 1 and len(ex.llm.batches[0]) == 4  # one batch for all requests
    assert d[0].call == ToolCall("get_weather", {"city": "Oslo"}, id="call_0")
    assert d[1].call is None and d[1].text == "No tool needed." and not d[1].malformed
    assert d[2].call is None and d[2].malformed
    assert d[3].call.name == "nuke" and d[3].raw["not_presented"] is True
    assert [x.prompt_tokens for x in d] == [len(p["prompt_token_ids"]) for p in ex.llm.batches[0]]
    assert ex.n_malformed == 1 and ex.n_requests == 4 and ex.completion_tokens == 20
    ex.llm.replies = ["  a summary "]
    assert ex.complete(user("summarise")) == "a summary"


def test_vllm_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'tracer-toolret\[vllm\]'"):
        build_executor("vllm", model="tiny")


# -- built from tracer/configs/executor/
# ------------------------------------------------------------------------------


def test_build_executor_by_name(stub):
    assert isinstance(build_executor("oracle"), OracleExecutor)
    ex = build_executor("openai", base_url=stub.url, model="m", timeout_s=1, unknown_key=1)
    assert isinstance(ex, OpenAIExecutor) and ex.model == "m"


def test_build_executor_unknown_name_lists_valid_ones():
    with pytest.raises(KeyError, match="valid names: openai, oracle, vllm"):
        build_executor("gpt5")
