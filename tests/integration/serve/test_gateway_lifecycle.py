"""The gateway's life around the requests, on real parts (the official ``openai`` client, uvicorn on
loopback, a stub upstream, a real index): the conversation log it writes, the index reloaded when its
version changes, the ``tracer serve`` command (SIGHUP, SIGTERM, its flags and environment), and a
cascade index served step by step."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from builders import ROOT, TINY_TOOLS, call, result
from gateway_harness import NAMES, TOOLS, WEATHER, client, drip, make_gateway, serving
from stub_openai_server import StubOpenAIServer

from tracer.data import load_native
from tracer.retriever import Retriever
from tracer.serve.log.sink import ConversationLog
from tracer.serve.reload import IndexHolder, version_token


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


@pytest.mark.heavy(seconds=9)
def test_the_command_serves_reloads_on_sighup_and_shuts_down_gracefully(process_index_dir, tmp_path):
    """``python -m tracer.cli serve`` as a real process: /health, SIGHUP reload, SIGTERM flushes the log; its
    flags and environment reach the gateway: ``--read-timeout`` drops a client dripping its headers (408),
    ``TRACER_ADMIN_TOKEN`` enables the reload endpoint, the upstream's password is sent, never logged."""
    import shutil
    import signal
    import socket
    import subprocess
    import sys

    served = tmp_path / "index"
    shutil.copytree(process_index_dir, served)
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



@pytest.mark.heavy(seconds=10)
def test_a_cascade_index_is_served_each_step_by_the_stage_its_gate_picks(tmp_path, minilm_small):
    """A saved cascade (two trained encoders, both rebuilt from the index's configs): the upstream receives
    exactly the cascade's selection, for steps the fast stage answers and steps it escalates alike."""
    from builders import cascade_retriever, tiny_trajectories

    from tracer.core.steps import step_from_messages
    from tracer.core.types import Registry
    from tracer.data import write_native
    from tracer.serve.http.gateway import Gateway, GatewayConfig

    write_native(tmp_path / "data", Registry(TINY_TOOLS), tiny_trajectories())
    cascade_retriever(tmp_path / "data", tmp_path / "enc", minilm_small).save(tmp_path / "index")
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
