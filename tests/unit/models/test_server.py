"""The model server's launcher: the health wait against a stub HTTP server run as the process (slow to
start, dying at start, never answering), the llama_cpp command line, and llama.cpp's timings read back."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tracer.models import ServerError, get_model, start_server, timings
from tracer.models.llama_shim import FillContent, fill_content, light_states
from tracer.models.server import SHIM, free_port, server_command

# a stand-in for llama_cpp.server: answers GET /v1/models with 200 after `delay` seconds (404 elsewhere)
STUB = """
import signal, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
signal.signal(signal.SIGTERM, signal.default_int_handler)
port, delay = int(sys.argv[1]), float(sys.argv[2])
print("loading the model", flush=True)
time.sleep(delay)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/v1/models"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b'{"data": []}' if ok else b"")
    def log_message(self, *a):
        pass
try:
    HTTPServer(("127.0.0.1", port), H).serve_forever()
except KeyboardInterrupt:
    print("stopped", flush=True)
"""

SPEC = get_model("smollm2")


def launch(tmp_path: Path, *argv: str, timeout_s: float = 30, port: int | None = None):
    port = port or free_port()
    return start_server(SPEC, Path(sys.executable), tmp_path / "w.gguf", port=port, root=tmp_path,
                        timeout_s=timeout_s, command=[sys.executable, "-c", *argv] if argv else None)


def test_the_launcher_waits_until_the_server_answers_then_stops_it(tmp_path):
    port = free_port()
    with launch(tmp_path, STUB, str(port), "1.0", port=port) as server:
        assert server.url == f"http://127.0.0.1:{port}/v1" and server.model == "smollm2"
        assert server.started_s >= 1.0 and server.process.poll() is None
    assert server.process.returncode is not None
    assert server.log == tmp_path / "logs" / f"smollm2-{port}.log"
    assert server.log.read_text().splitlines() == ["loading the model", "stopped"]  # SIGTERM: a clean stop


def test_a_server_that_exits_while_starting_is_reported_with_its_log(tmp_path):
    start = time.monotonic()
    with pytest.raises(ServerError, match=r"(?s)exited \(3\) before answering.*no such model file"):
        launch(tmp_path, "import sys; print('error: no such model file'); sys.exit(3)")
    assert time.monotonic() - start < 10  # not the whole deadline


def test_a_server_that_never_answers_is_killed_at_the_deadline(tmp_path):
    with pytest.raises(ServerError, match=r"(?s)did not answer at .* within 1 s.*loading"):
        launch(tmp_path, "import time; print('loading', flush=True); time.sleep(60)", timeout_s=1)


def test_the_command_line_carries_the_models_chat_format_and_context():
    smol = server_command(SPEC, Path("py"), Path("w.gguf"), 8001, threads=2)
    assert smol[:2] == ["py", str(SHIM)]
    assert smol[smol.index("--chat_format") + 1] == "chatml-function-calling"
    assert smol[smol.index("--host") + 1] == "127.0.0.1" and smol[smol.index("--n_ctx") + 1] == "2048"
    assert smol[smol.index("--model_alias") + 1] == "smollm2"
    qwen = server_command(get_model("qwen-coder"), Path("py"), Path("w.gguf"), 8001, n_ctx=8192)
    assert "--chat_format" not in qwen and qwen[qwen.index("--n_ctx") + 1] == "8192"  # the GGUF's template
    assert "--cache" not in qwen  # the last prompt's KV only, llama_cpp's default
    cached = server_command(get_model("qwen-coder"), Path("py"), Path("w.gguf"), 8001, prompt_cache_mb=512)
    assert cached[cached.index("--cache") + 1] == "true" and cached[cached.index("--cache_type") + 1] == "ram"
    assert cached[cached.index("--cache_size") + 1] == str(512 * 1024 * 1024)


def test_timings_are_read_from_llama_cpps_perf_lines():
    perf = "llama_perf_context_print: "
    log = "\n".join([
        'INFO: 127.0.0.1 - "POST /v1/chat/completions HTTP/1.1" 200',
        perf + "       load time =     120.00 ms",
        perf + "prompt eval time =    2000.00 ms /   400 tokens (    5.00 ms per token,   200.00 tokens/s)",
        perf + "       eval time =    1000.00 ms /    19 runs   (   52.63 ms per token,    19.00 tokens/s)",
        perf + "      total time =    3100.00 ms /   419 tokens",
        perf + "prompt eval time =       0.00 ms /     0 tokens (    -nan ms per token,     -nan tokens/s)",
        perf + "       eval time =     500.00 ms /    10 runs   (   50.00 ms per token,    20.00 tokens/s)"])
    assert timings(log) == [
        {"prompt_tokens": 400, "prompt_ms": 2000.0, "generated_tokens": 19, "generation_ms": 1000.0,
         "prompt_tps": 200.0, "generation_tps": 19.0},
        {"prompt_tokens": 0, "prompt_ms": 0.0, "generated_tokens": 10, "generation_ms": 500.0,
         "prompt_tps": 0.0, "generation_tps": 20.0}]


def test_the_shim_fills_null_content_of_assistant_and_tool_messages_only():
    body = {"model": "m", "messages": [
        {"role": "user", "content": None}, {"role": "assistant", "tool_calls": [{"id": "a"}]},
        {"role": "assistant", "content": None}, {"role": "tool", "tool_call_id": "a", "content": None},
        {"role": "assistant", "content": "kept"}]}
    filled = json.loads(fill_content(json.dumps(body).encode()))
    assert [m.get("content") for m in filled["messages"]] == [None, "", "", "", "kept"]
    assert filled["messages"][1]["tool_calls"] == [{"id": "a"}] and filled["model"] == "m"
    for untouched in (b"not json", b'{"messages": "x"}',
                      b'{"messages": [{"role": "user", "content": "hi"}]}'):
        assert fill_content(untouched) == untouched


def test_the_shim_rewrites_chat_bodies_sent_in_chunks_with_their_length():
    seen = []

    async def app(scope, receive, send):
        seen.append((scope["path"], dict(scope["headers"]), (await receive())["body"]))

    def call(path: str, chunks: list[bytes]):
        queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                 for i, c in enumerate(chunks)]

        async def receive():
            return queue.pop(0)

        scope = {"type": "http", "method": "POST", "path": path,
                 "headers": [(b"content-length", str(sum(map(len, chunks))).encode())]}
        asyncio.run(FillContent(app)(scope, receive, None))

    raw = b'{"messages": [{"role": "assistant", "content": null}]}'
    call("/v1/chat/completions", [raw[:10], raw[10:]])
    call("/v1/completions", [raw])
    (_, headers, body), (_, other_headers, other) = seen
    assert json.loads(body) == {"messages": [{"role": "assistant", "content": ""}]}
    assert headers[b"content-length"] == str(len(body)).encode() and other == raw
    assert other_headers[b"content-length"] == str(len(raw)).encode()


def test_saved_states_keep_one_row_of_logits():
    """llama_cpp's save_state copies a row of logits per context token (n_tokens x n_vocab floats) into every
    state the RAM prompt cache keeps, uncounted by the cache: light_states keeps the last row, which
    load_state's assignment broadcasts over the rows it fills (on the real engine:
    tests/integration/models/test_light_states.py)."""

    class State:
        def __init__(self, scores):
            self.scores, self.llama_state_size = scores, 1000

    class Engine:  # llama_cpp.Llama's save_state and load_state, as far as the logits go
        def __init__(self):
            self.scores = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)   # [n_tokens, n_vocab]

        def save_state(self):
            return State(self.scores.copy())

        def load_state(self, state, n_tokens=5):
            self.scores[:n_tokens, :] = state.scores.copy()

    light_states(Engine)
    engine = Engine()
    state = engine.save_state()
    assert state.scores.shape == (1, 4) and state.scores.tolist() == [[20.0, 21.0, 22.0, 23.0]]
    engine.load_state(state)
    assert engine.scores[4].tolist() == [20.0, 21.0, 22.0, 23.0]
