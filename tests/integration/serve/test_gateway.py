"""The gateway on real parts: the official ``openai`` client -> the gateway (uvicorn, loopback) -> a stub
upstream (a real HTTP server) that records what it received; the index is real (MiniLM, FAISS)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from builders import ROOT, TINY_TOOLS, call, result
from gateway_harness import drip, make_gateway, save_test_index, serving
from stub_openai_server import StubOpenAIServer

from tracer.data import load_native
from tracer.retriever import Retriever
from tracer.serve.logging_sink import ConversationLog
from tracer.serve.reload import IndexHolder, version_token

TOOLS = [t.to_openai() for t in TINY_TOOLS]
NAMES = [t.name for t in TINY_TOOLS]
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Email it to Bob"}]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, minilm):
    return save_test_index(tmp_path_factory.mktemp("gateway") / "index", minilm)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


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


def redact_bob(record: dict) -> dict:
    for m in record["messages"]:
        if isinstance(m.get("content"), str):
            m["content"] = m["content"].replace("Bob", "[name]")
    return record


def test_finished_conversations_are_logged_in_the_native_format(index_dir, minilm, tmp_path):
    sink = ConversationLog(tmp_path / "log", redact=redact_bob)
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url, sink=sink).app) as url:
        c = client(url)
        first = c.chat.completions.with_raw_response.create(model="m", messages=WEATHER, tools=TOOLS)
        conv = first.headers["x-tracer-conversation"]
        reply = first.parse().choices[0].message.model_dump(exclude_none=True)
        step2 = WEATHER + [reply,
                           {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "sunny"}]
        c.chat.completions.create(model="m", messages=step2, tools=TOOLS,
                                  extra_headers={"X-Tracer-Outcome": "success"})
        other = [{"role": "user", "content": "list the files"}]
        c.chat.completions.create(model="m", messages=other, tools=TOOLS)  # never reported
        missing = httpx.post(url + "/v1/tracer/outcome", json={"conversation": "nope", "success": True},
                             headers={"x-tracer-outcome-token": first.headers["x-tracer-outcome-token"]})
        assert missing.status_code == 403  # a conversation's token is good for that conversation only
        deadline = time.monotonic() + 10
        while sink.written < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    # shutting the gateway down finished the unreported conversation
    ds = load_native(tmp_path / "log")
    by_group = {t.group: t for t in ds.trajectories}
    done = by_group[conv]
    assert done.success and done.reward == 1.0 and done.metadata["outcome"] == "reported"
    assert done.messages[0]["content"] == "What is the weather in Paris? Email it to [name]"
    called = [reply["tool_calls"][0]["function"]["name"], stub.requests[1]["tools"][0]["function"]["name"]]
    assert done.metadata["called"] == called and len(done.messages) == 4
    unreported = [t for g, t in by_group.items() if g != conv]
    assert len(unreported) == 1 and not unreported[0].success
    assert unreported[0].metadata["outcome"] == "unreported"
    # tools.json holds the tools called, not every tool offered (issue 32, defect 11)
    assert set(ds.registry.names) == {n for t in ds.trajectories for n in t.metadata["called"]} < set(NAMES)


def test_a_torn_last_line_is_cut_off_when_the_log_opens(tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    (log / "trajectories.jsonl").write_text('{"id": "a"}\n{"id": "tor')
    ConversationLog(log).close()
    assert (log / "trajectories.jsonl").read_text() == '{"id": "a"}\n'


def test_the_index_reloads_when_its_version_changes(index_dir, minilm, tmp_path):
    import shutil

    served = tmp_path / "index"
    shutil.copytree(index_dir, served)
    loads = []
    holder = IndexHolder(served,
                         lambda d: loads.append(d) or Retriever.load(d, embedder=minilm, device="cpu"))
    assert not holder.maybe_reload() and len(loads) == 1
    first, token = holder.retriever, version_token(served)
    first.save(served)  # a new snapshot of the same index is published: CURRENT names it
    assert version_token(served) != token
    assert holder.maybe_reload() and holder.retriever is not first and holder.reloads == 1
    assert not holder.maybe_reload() and len(loads) == 2
    (served / "CURRENT").write_text("snapshots/missing\n")  # a bad version keeps the index being served
    serving = holder.retriever
    assert not holder.maybe_reload() and holder.retriever is serving and holder.reloads == 1


def test_the_command_serves_reloads_on_sighup_and_shuts_down_gracefully(index_dir, tmp_path):
    """``python -m tracer.cli serve`` as a real process: /health, SIGHUP reload, SIGTERM flushes the log; its
    flags and environment reach the gateway: ``--read-timeout`` drops a client dripping its headers (408),
    ``TRACER_ADMIN_TOKEN`` enables the reload endpoint, the upstream's password is sent, never logged."""
    import shutil
    import signal
    import socket
    import subprocess
    import sys

    served = tmp_path / "index"
    shutil.copytree(index_dir, served)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = ROOT
    with StubOpenAIServer() as stub:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tracer.cli", "serve", "--index", str(served), "--port", str(port),
             "--k", "2", "--upstream", stub.url.replace("http://", "http://user:s3cret@"),
             "--log", str(tmp_path / "log"), "--reload-interval", "0", "--read-timeout", "1"],
            cwd=root, env={"PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                           "PATH": "/usr/bin:/bin", "TRACER_ADMIN_TOKEN": "adm-env"},
            stderr=subprocess.PIPE, text=True)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, proc.stderr.read()
                try:
                    assert httpx.get(url + "/health").json()["reloads"] == 0
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, "the gateway did not start"
                    time.sleep(0.2)
            client(url).chat.completions.create(model="m", messages=WEATHER, tools=TOOLS)
            proc.send_signal(signal.SIGHUP)  # forces a reload of the index as it is
            while httpx.get(url + "/health").json()["reloads"] != 1:
                assert time.monotonic() < deadline, "no reload after SIGHUP"
                time.sleep(0.05)
            dripped = drip(url, b"", b"POST /v1/chat/completions HTTP/1.1\r\nx-pad: " + b"a" * 100, 2)
            reload = httpx.post(url + "/v1/tracer/reload", headers={"authorization": "Bearer adm-env"},
                                timeout=60)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # uvicorn re-raises the signal once it has shut down cleanly
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    events = [r["event"] for r in records if "event" in r]
    assert events[0] == "started" and "reloaded" in events and events[-1] == "stopped"
    # uvicorn's own records (start-up, shutdown) are JSON lines too, never a bare line or traceback
    assert any(r["logger"] == "uvicorn.error" and r["msg"].startswith("Uvicorn running on") for r in records)
    assert not [line for line in err.splitlines() if "uvicorn" in line.lower() and not line.startswith("{")]
    assert all(1.0 <= t < 2.5 and got.startswith(b"HTTP/1.1 408 ") for t, got in dripped), dripped
    assert reload.status_code == 200 and reload.json() == {"reloaded": True, "reloads": 2}
    assert stub.headers[0]["Authorization"] == "Basic dXNlcjpzM2NyZXQ="  # in place of the client's key
    started = next(r for r in records if r.get("event") == "started")
    assert started["upstream"] == stub.url.replace("http://", "http://***@") and "s3cret" not in err
    logged = load_native(tmp_path / "log").trajectories
    assert len(logged) == 1 and logged[0].metadata["outcome"] == "unreported"



def test_a_cascade_index_is_served_each_step_by_the_stage_its_gate_picks(tmp_path):
    """A saved cascade (two trained encoders, both rebuilt from the index's configs): the upstream receives
    exactly the cascade's selection, for steps the fast stage answers and steps it escalates alike."""
    from builders import cascade_retriever, tiny_trajectories

    from tracer.core.steps import step_from_messages
    from tracer.core.types import Registry
    from tracer.data import write_native
    from tracer.serve.gateway import Gateway, GatewayConfig

    write_native(tmp_path / "data", Registry(TINY_TOOLS), tiny_trajectories())
    cascade_retriever(tmp_path / "data", tmp_path / "enc").save(tmp_path / "index")
    reference = Retriever.load(tmp_path / "index", device="cpu", cache_dir=None)
    holder = IndexHolder(tmp_path / "index", lambda d: Retriever.load(d, device="cpu", cache_dir=None))
    convs = [WEATHER, [{"role": "user", "content": "Find me a flight to Rome and book it"}],
             [{"role": "user", "content": "Show the files here"}],
             [{"role": "user", "content": "cancel my booking"}],
             [{"role": "user", "content": "Search flights to Oslo"}, call("search_flights", 0), result(0)]]
    escalated = reference.scorer.score([step_from_messages(m) for m in convs]).diagnostics["escalated"]
    assert 0 < int(escalated.sum()) < len(convs)                                 # both stages answer here
    with StubOpenAIServer() as stub, serving(Gateway(holder, GatewayConfig(upstream=stub.url, k=2,
                                                                           sticky=False)).app) as url:
        for i, msgs in enumerate(convs):
            client(url).chat.completions.create(model="m", messages=msgs, tools=TOOLS)
            # not sticky: in the index's order
            want = [NAMES[j] for j in reference.select_ids(msgs, 2)]
            assert [t["function"]["name"] for t in stub.requests[i]["tools"]] == want, i
