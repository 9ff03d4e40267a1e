"""Input the gateway cannot use is refused or reported, never dropped silently (issue 56, defect 16), on real
servers over loopback with the official ``openai`` client: an ``X-Tracer-Outcome`` that is not applied
says why in ``X-Tracer-Outcome-Ignored`` and is counted; a tool whose ``parameters`` is not an object is a
400 naming ``tools[i].function.parameters``, never forwarded."""

from __future__ import annotations

import copy
import time

import httpx
import openai
import pytest
from gateway_harness import TOOLS, WEATHER, client, make_gateway, serving
from stub_openai_server import StubOpenAIServer

from tracer.data import load_native
from tracer.serve.log.sink import ConversationLog


def ask(c: openai.OpenAI, conversation: str, outcome: str):
    return c.chat.completions.with_raw_response.create(
        model="m", messages=WEATHER, tools=TOOLS,
        extra_headers={"X-Tracer-Conversation": conversation, "X-Tracer-Outcome": outcome})


def test_an_outcome_header_that_is_not_applied_says_why(index_dir, minilm, tmp_path):
    sink = ConversationLog(tmp_path / "log")
    with StubOpenAIServer(fail_first=1) as stub, \
            serving(make_gateway(index_dir, minilm, stub.url, sink=sink).app) as url:
        c = client(url)
        with pytest.raises(openai.InternalServerError) as failed:  # the upstream's 500: not sent whole
            ask(c, "failed", "success")
        invalid = ask(c, "invalid", "yes")
        valid = ask(c, "valid", "SUCCESS")
        metrics = httpx.get(url + "/metrics").text
        deadline = time.monotonic() + 10
        while sink.written < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert failed.value.response.headers["x-tracer-outcome-ignored"].startswith("status: ")
    assert invalid.headers["x-tracer-outcome-ignored"] == "invalid: expected success or failure"
    assert "x-tracer-outcome-ignored" not in valid.headers
    assert 'tracer_outcome_ignored_total{reason="invalid"} 1.0' in metrics
    assert 'tracer_outcome_ignored_total{reason="status"} 1.0' in metrics
    records = load_native(tmp_path / "log").trajectories
    outcome = {t.group: (t.success, t.metadata["outcome"]) for t in records}
    assert outcome == {"failed": (False, "unreported"), "invalid": (False, "unreported"),
                       "valid": (True, "reported")}


def test_an_outcome_header_without_logging_says_so(index_dir, minilm):
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        answer = ask(client(url), "c", "success")
        metrics = httpx.get(url + "/metrics").text
    assert answer.headers["x-tracer-outcome-ignored"].startswith("logging_off: ")
    assert 'tracer_outcome_ignored_total{reason="logging_off"} 1.0' in metrics


@pytest.mark.parametrize("parameters", ["notanobject", ["a"], 3, True])
def test_tool_parameters_that_are_not_an_object_are_a_400_naming_the_field(index_dir, minilm, parameters):
    tools = copy.deepcopy(TOOLS)
    tools[1]["function"]["parameters"] = parameters
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        with pytest.raises(openai.BadRequestError) as refused:
            client(url).chat.completions.create(model="m", messages=WEATHER, tools=tools)
        with pytest.raises(openai.BadRequestError) as few:  # at most k tools, forwarded whole: checked too
            client(url).chat.completions.create(model="m", messages=WEATHER, tools=tools[:2])
    for e in (refused.value, few.value):
        assert e.body["param"] == "tools[1].function.parameters" and "object" in e.body["message"]
    assert stub.requests == []
