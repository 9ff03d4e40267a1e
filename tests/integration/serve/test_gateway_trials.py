"""Trial conversations through the gateway (tracer/scorer_base/trial.py): a logged trial conversation is shown
the served choice and then the other ranking's top k, its record is marked ``metadata.explored``, and ``tracer
update --refit`` on that log fits as on a gateway's own logs.

Real servers on loopback: the gateway (uvicorn) with and without ``--log``, the stub OpenAI upstream, the
official ``openai`` client; the index is tracer_plus fitted on the tiny dataset with ``zero_shot.trial`` 1.0
(every conversation of a logging gateway is a trial once the guard has judged a model)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from builders import TINY_TOOLS, tiny_trajectories
from gateway_harness import client, make_gateway, serving
from stub_openai_server import StubOpenAIServer

from tracer.cli import main as tracer_cli
from tracer.cli.update import read_log
from tracer.core.types import Registry
from tracer.data import write_native
from tracer.retriever import Retriever
from tracer.scorer_base.trial import EXPLORED, widened
from tracer.serve.log.sink import ConversationLog
from tracer.serve.selection import UnknownToolVectors, choose

TOOLS = [t.to_openai() for t in TINY_TOOLS]
K = 2
# after search_flights the two rankings' top 2 differ (tests/integration/test_retriever.py)
FLIGHTS = [{"role": "user", "content": "Find a flight from SFO to JFK and book it"}]


@pytest.fixture(scope="module")
def trial_index(tmp_path_factory, minilm) -> tuple[Retriever, Path, Path]:
    """(the fitted retriever, its saved index, the dataset it was fitted on): tracer_plus whose guard judged a
    model, with every conversation a trial."""
    root = tmp_path_factory.mktemp("trials")
    write_native(root / "dataset", Registry(TINY_TOOLS), tiny_trajectories())
    r = Retriever.from_dataset(root / "dataset", embedder=minilm, device="cpu", zero_shot={"trial": 1.0})
    assert r.scorer.trial_ready and "own_logs" not in r.scorer.history
    return r, r.save(root / "index"), root / "dataset"


def names(request: dict) -> list[str]:
    return [t["function"]["name"] for t in request["tools"]]


def step(url: str, messages: list[dict], conversation: str | None = None, outcome: str | None = None) -> dict:
    """One request through the gateway at ``url`` (``X-Tracer-Conversation`` when given); the reply's
    message as the client sends it back."""
    headers = {"X-Tracer-Conversation": conversation} if conversation else {}
    if outcome:
        headers["X-Tracer-Outcome"] = outcome
    reply = client(url).chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                extra_headers=headers)
    return reply.choices[0].message.model_dump(exclude_none=True)


def wait_written(sink: ConversationLog, n: int) -> None:
    deadline = time.monotonic() + 20
    while sink.written < n and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_logged_trial_conversation_is_shown_the_other_ranking_too(trial_index, minilm, tmp_path):
    """Without a log no conversation is a trial (the served top k); with one, the same request presents
    ``widened(served, other ranking's top k, k)``, as Retriever.select_ids does for that conversation."""
    reference, index, _ = trial_index
    msgs = [*FLIGHTS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "search_flights", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "UA 1"}]
    sink = ConversationLog(tmp_path / "log")
    with (StubOpenAIServer() as stub,
          serving(make_gateway(index, minilm, stub.url, sticky=False).app) as plain_url,
          serving(make_gateway(index, minilm, stub.url, sink=sink, sticky=False).app) as logged_url):
        step(plain_url, msgs, "c-1")
        step(logged_url, msgs, "c-1")
        step(logged_url, msgs)   # no header: the id continuation gives it draws as any other
    served, trial, unnamed = (names(r) for r in stub.requests)
    assert served == choose(reference, msgs, TOOLS, K, UnknownToolVectors())
    other = [reference.registry.names[i] for i in reference.scorer.trial_rankings([reference.read(msgs).step],
                                                                                   K)[0]]
    assert trial == widened(served, other, K) and len(trial) > K   # the rankings differ here
    assert trial == [reference.registry.names[i] for i in reference.select_ids(msgs, K, conversation="c-1")]
    assert unnamed == trial


def test_the_log_marks_a_trial_conversation_and_a_refit_reads_the_mark(trial_index, minilm, tmp_path, capsys):
    """A trial conversation seen from its start is written with ``metadata.explored: true``; one the log took
    up midway (its first request already held a call) is not; ``tracer update --refit`` fits on the log as a
    gateway's own (``own_logs``), and an old record without the field still loads, unmarked."""
    _, saved, dataset = trial_index
    index = Path(shutil.copytree(saved, tmp_path / "index"))
    sink = ConversationLog(tmp_path / "log")
    with (StubOpenAIServer() as stub,
          serving(make_gateway(index, minilm, stub.url, sink=sink, sticky=False).app) as url):
        messages = list(FLIGHTS)
        reply = step(url, messages, "whole")
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "UA 1"},
                     {"role": "user", "content": "now book it call:book_flight"}]
        step(url, messages, "whole", outcome="success")
        midway = [{"role": "user", "content": "the weather in Paris"}, {"role": "assistant", "content": None,
                  "tool_calls": [{"id": "w", "type": "function",
                                  "function": {"name": "get_weather", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "w", "content": "sunny"},
                  {"role": "user", "content": "email it to Bob call:send_email"}]
        step(url, midway, "midway", outcome="success")
        wait_written(sink, 2)
    old = {"id": "old-1", "group": "old", "domain": "gateway", "messages": midway[:3], "success": True,
           "metadata": {"called": ["get_weather"], "presented": ["get_weather"], "outcome": "reported"}}
    with open(tmp_path / "log" / "trajectories.jsonl", "a") as f:
        f.write(json.dumps(old) + "\n")
    read, _ = read_log(tmp_path / "log", Registry(TINY_TOOLS), problems=None)
    marks = {t.group: t.metadata.get(EXPLORED) for t in read}
    assert marks == {"whole": True, "midway": None, "old": None}

    capsys.readouterr()
    assert tracer_cli(["update", "--index", str(index), "--log", str(tmp_path / "log"), "--refit",
                       "--history", str(dataset), "--cache-dir", ""]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["trajectories"] == 3 and report["saved"] and report["skipped"] == 0
    assert Retriever.load(index, embedder=minilm, device="cpu").scorer.history.get("own_logs") is True


def test_a_trial_widens_among_the_requests_tools_and_the_sticky_list_keeps_it_whole(trial_index, minilm,
                                                                                    tmp_path):
    """A request that offers part of the registry: the other ranking's k are taken among its tools; the sticky
    list (on by default) shows the widened set, in the request's order."""
    reference, index, _ = trial_index
    msgs = [*FLIGHTS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "search_flights", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "UA 1"}]
    at = reference.read(msgs).step
    full = [reference.registry.names[i]
            for i in reference.scorer.trial_rankings([at], len(reference.registry))[0]]
    offered = [t for t in TOOLS if t["function"]["name"] != full[0]]   # the other ranking's best is missing
    offered_names = [t["function"]["name"] for t in offered]
    served = choose(reference, msgs, offered, K, UnknownToolVectors())
    want = widened(served, [n for n in full if n in offered_names], K)
    with (StubOpenAIServer() as stub,
          serving(make_gateway(index, minilm, stub.url, sink=ConversationLog(tmp_path / "log")).app) as url):
        client(url).chat.completions.create(model="m", messages=msgs, tools=offered,
                                            extra_headers={"X-Tracer-Conversation": "part"})
    [shown] = (names(r) for r in stub.requests)
    assert shown == sorted(want, key=offered_names.index) and len(want) > K
