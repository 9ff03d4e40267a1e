"""The gateway in front of a real model (issue 58): SmolLM2-135M served by llama.cpp (``tracer.models``),
``tracer serve`` as a real process in front of it, the official ``openai`` client sending more than k tools.

Checked: the model received exactly the k tools the index selects (the gateway's log record lists them,
and the model server counts the same prompt tokens for the proxied request as for the same request sent
to it directly with those k tools, and more with all of them); the model answered (a call of a presented
tool or text); ``tracer update`` learns the log (a trajectory), or its report says why the record is not
learnable. Skipped, with the reason, when the engine or the weights are not in the cache
(``python -m tracer.models build`` and ``python -m tracer.models fetch --model smollm2``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from gateway_harness import save_test_index

from tracer.data import load_native
from tracer.models import engine_python, get_model, models_dir, serve
from tracer.models.server import free_port
from tracer.models.weights import is_verified
from tracer.retriever import Retriever

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
K = 3
SPEC = get_model("smollm2")
TOOLS = json.loads((ROOT / "data" / "example" / "tools.json").read_text())  # 6 tools
# chatml-function-calling lists the tools in the system message: a request without one shows the model none
MESSAGES = [{"role": "system", "content": "You are a helpful assistant. Use a tool when one fits."},
            {"role": "user", "content": "What is the weather in Paris tomorrow?"}]


def _missing() -> str | None:
    if not is_verified(SPEC.weights_path(), SPEC):
        return (f"no verified {SPEC.name} weights under {models_dir()}: "
                "python -m tracer.models fetch --model smollm2")
    if engine_python() is None:
        return f"no llama.cpp engine under {models_dir()}: python -m tracer.models build (30-60 min)"
    return None


@pytest.fixture(scope="module")
def model():
    reason = _missing()
    if reason:
        pytest.skip(reason)
    with serve(SPEC.name, timeout_s=300) as server:
        yield server


def names(tools) -> list[str]:
    return [t["function"]["name"] for t in tools]


def start_gateway(index: Path, upstream: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracer.cli", "serve", "--index", str(index), "--port", str(port),
         "--k", str(K), "--upstream", upstream, "--log", str(log), "--reload-interval", "0"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                       "TOKENIZERS_PARALLELISM": "false"},
        stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.2)


def test_the_gateway_presents_k_tools_to_a_real_model_and_learns_its_log(model, minilm, tmp_path):
    index = save_test_index(tmp_path / "index", minilm)
    expected = names(Retriever.load(index, embedder=minilm, device="cpu").select(MESSAGES, k=K))
    gateway, url = start_gateway(index, model.url, tmp_path / "log")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
        first = client.chat.completions.with_raw_response.create(
            model=SPEC.name, messages=MESSAGES, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=64)
        reply = first.parse()
        message = reply.choices[0].message
        # llama_cpp.server wants an assistant message's content to be a string, never null (and its
        # chatml-function-calling template renders no tool message: the model never sees a result)
        answer = {"role": "assistant", "content": message.content or ""}
        if message.tool_calls:
            answer["tool_calls"] = [c.model_dump() for c in message.tool_calls]
        conversation = [*MESSAGES, answer]
        if message.tool_calls:
            conversation.append({"role": "tool", "tool_call_id": message.tool_calls[0].id,
                                 "content": "sunny"})
        # the client reports the finished task with its next request
        client.chat.completions.create(model=SPEC.name, messages=conversation, tools=TOOLS,
                                       tool_choice="auto", temperature=0, max_tokens=64,
                                       extra_headers={"X-Tracer-Outcome": "success"})
    finally:
        gateway.send_signal(signal.SIGTERM)
        _, err = gateway.communicate(timeout=60)

    # the model answered: a call of a presented tool (its grammar allows no other name) or text
    called = [c.function.name for c in message.tool_calls or []]
    assert called or message.content is not None, reply
    assert set(called) <= set(expected)

    # the model received exactly the k selected tools: the log lists them, and the model's own prompt count
    # for the proxied request equals that of the same request sent directly with those k tools
    (record,) = load_native(tmp_path / "log", problems=[]).trajectories
    assert set(record.metadata["presented"][:K]) == set(expected) and len(expected) == K < len(TOOLS)
    chosen = [t for t in TOOLS if t["function"]["name"] in expected]  # forwarded in the request's order

    def prompt_tokens(tools: list[dict]) -> int:
        body = {"model": SPEC.name, "messages": MESSAGES, "tools": tools, "tool_choice": "auto",
                "temperature": 0, "max_tokens": 1}
        return httpx.post(f"{model.url}/chat/completions", json=body, timeout=300).json()["usage"][
            "prompt_tokens"]

    assert reply.usage.prompt_tokens == prompt_tokens(chosen) < prompt_tokens(TOOLS)

    out = subprocess.run([sys.executable, "-m", "tracer.cli", "update", "--index", str(index), "--log",
                          str(tmp_path / "log"), "--cache-dir", str(tmp_path / "cache")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["trajectories"] == 1 and report["saved"], report
    # each logged call is one step learned; text answers hold none (a record of text only teaches no step)
    logged_calls = [c["function"]["name"] for m in record.messages if m["role"] == "assistant"
                    for c in m.get("tool_calls") or ()]
    assert called == logged_calls[:len(called)] and report["steps"] == len(logged_calls), report
    print(json.dumps({"answer": {"called": called, "content": message.content}, "logged": logged_calls,
                      "presented": expected, "prompt_tokens": reply.usage.prompt_tokens, "update": report,
                      "timings": model.timings()}, default=str), file=sys.stderr)
    assert '"event": "stopped"' in err or "stopped" in err
