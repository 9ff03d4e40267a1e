"""The production loop end to end (issue 32): an agent on the official ``openai`` client talks through the
gateway (``--log``) to an upstream, with the messages real agents send; the gateway presents k tools at every
step; ``tracer update`` (a real process) learns the log once; the saved index then ranks what was learned.

Real components: the MiniLM index on disk, uvicorn, the stub OpenAI upstream on loopback, the ``openai``
client, and ``python -m tracer.cli update`` as a subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from builders import TINY_TOOLS
from gateway_harness import make_gateway, serving
from stub_openai_server import StubOpenAIServer

from tracer.cli import main as tracer_cli
from tracer.retriever import Retriever
from tracer.serve.log.sink import ConversationLog

ROOT = Path(__file__).resolve().parents[3]
K = 3
ARCHIVE = {"type": "function", "function": {
    "name": "archive_files", "description": "Compress the listed files into a zip archive",
    "parameters": {"type": "object",
                   "properties": {"files": {"type": "array", "items": {"type": "string"}}}}}}
UNUSED = [{"type": "function", "function": {"name": name, "description": text}} for name, text in (
    ("convert_currency", "Convert an amount between two currencies"), ("translate_text", "Translate text"),
    ("create_event", "Create a calendar event"), ("play_music", "Play a song or playlist"),
    ("set_alarm", "Set an alarm for a time"), ("order_food", "Order food from a restaurant"),
    ("get_stock_price", "Get the latest price of a stock"), ("book_hotel", "Book a hotel room"),
    ("call_taxi", "Call a taxi to an address"), ("check_balance", "Check a bank account balance"),
)]  # offered at every step, never called: none may reach the index
TOOLS = [t.to_openai() for t in TINY_TOOLS] + [ARCHIVE] + UNUSED
# what the agent has already done before this session (a trimmed history, as real clients send it):
HISTORY = [
    {"role": "developer", "content": "You manage the user's files. Be brief."},   # the current OpenAI role
    {"role": "user", "content": "Earlier: check the weather"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "old1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Par'}}]},                   # malformed arguments
    {"role": "tool", "tool_call_id": "old1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "trimmed", "content": "a result whose call was cut from the history"},
    {"role": "user", "content": "Show the files here and archive them"},
]
SCRIPT = {  # the model's next call, by the number of tool results since the last user message
    "archive": ["list_files", "archive_files", None],
    "invent": ["teleport_files", None],   # a name no request offered: the model invented it
}


def policy(body: dict) -> dict:
    msgs = body["messages"]
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    done = sum(m["role"] == "tool" for m in msgs[last_user:])
    script = SCRIPT["invent" if "teleport" in msgs[last_user]["content"] else "archive"]
    name = script[done]
    if name is None:
        return {"content": "Done.", "tool_calls": None}
    return {"content": None, "tool_calls": [{"id": f"c{len(msgs)}", "type": "function",
                                             "function": {"name": name, "arguments": "{}"}}]}


def run_agent(client: openai.OpenAI, messages: list[dict], tools: list[dict] = TOOLS) -> list[str]:
    """Step until the model answers in text, then report success. Returns each answer's conversation id."""
    ids = []
    for _ in range(5):
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=tools)
        reply = raw.parse().choices[0].message
        ids.append(raw.headers["x-tracer-conversation"])
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        messages.append({"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "ok"})
    # the outcome goes with one more request (the client's report of the finished task)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=tools,
                                                           extra_headers={"X-Tracer-Outcome": "success"})
    return [*ids, raw.headers["x-tracer-conversation"]]


def update(index: Path, log: Path, cache: Path) -> tuple[int, dict, str]:
    out = subprocess.run([sys.executable, "-m", "tracer.cli", "update", "--index", str(index),
                          "--log", str(log), "--cache-dir", str(cache)],
                         check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.heavy(seconds=30)
def test_traffic_is_filtered_logged_learned_once_and_ranked(minilm, saved_index, tmp_path, capsys):
    index = Path(shutil.copytree(saved_index, tmp_path / "index"))
    sink = ConversationLog(tmp_path / "log")
    with (StubOpenAIServer(policy=policy) as stub,
          serving(make_gateway(index, minilm, stub.url, sink=sink, k=K).app) as url):
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        ids = run_agent(client, [*HISTORY])
        invented = run_agent(client, [{"role": "user", "content": "Please teleport the files"}])
        # an agent whose requests never offer archive_files calls it: not offered here, offered elsewhere:
        # real
        run_agent(client, [{"role": "user", "content": "Show the files here and archive them"}],
                  [t.to_openai() for t in TINY_TOOLS] + UNUSED)
        metrics = httpx.get(url + "/metrics").text
    # no request fell back to the whole list: k tools at a conversation's start, then its sticky list (the
    # tools presented before stay, so the prompt prefix stays cacheable) grows by at most k a step
    shown = [[t["function"]["name"] for t in r["tools"]] for r in stub.requests]
    assert [len(s) for s in shown] == [3, 4, 4, 4, 3, 4, 4, 3, 3, 3, 3] and len(TOOLS) == 17
    assert "archive_files" in shown[0]  # a tool the index has never seen, chosen for what it says
    assert 'tracer_errors_total{kind="selection"}' not in metrics
    assert len(set(ids)) == 1 and len(set(invented)) == 1 and ids != invented  # continuation, no header

    code, report, err = update(index, tmp_path / "log", tmp_path / "cache")
    assert code == 0, err
    # archive_files, offered to the first agent, is real where the third agent called it unoffered: learned
    assert ((report["trajectories"], report["new_tools"], report["saved"], report["skipped"])
            == (2, 1, True, 1))
    assert report["problems"][0].endswith(
        "metadata.unoffered: calls teleport_files, which no request offered and the index lacks: not learned")
    learned = Retriever.load(index, embedder=minilm, device="cpu")
    names = set(learned.registry.names)
    assert "archive_files" in names and "teleport_files" not in names and not names & {t["function"]["name"]
                                                                                      for t in UNUSED}
    after_listing = [{"role": "user", "content": "Show the files here and archive them"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "a", "type": "function",
                          "function": {"name": "list_files", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "a", "content": "a.txt b.txt"}]
    assert learned.rank(after_listing)[0] == "archive_files"

    # the log only grows; updating from it again learns nothing twice (in this process: the first update
    # ran as a user runs it)
    capsys.readouterr()
    assert tracer_cli(["update", "--index", str(index), "--log", str(tmp_path / "log"),
                       "--cache-dir", str(tmp_path / "cache")]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (again["trajectories"], again["new_tools"], again["saved"]) == (0, 0, False)
