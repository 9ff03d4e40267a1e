"""How long the OpenAI executor waits between attempts (tracer/executors/openai.py: tenacity's retries with
tracer.core.backoff's waits), read off when each attempt reached a real HTTP server: ``backoff_s``,
doubled at each retry, or the server's ``Retry-After`` when that is longer. The server answers from a
script of (status, headers), then a completion."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from executor_requests import user

from tracer.executors.openai import OpenAIExecutor

COMPLETION = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": "done"}}]}


class ScriptedServer:
    """Answers the i-th POST with ``script[i]`` (a status and headers, an error body), then with
    :data:`COMPLETION`; ``arrived`` holds each POST's ``time.monotonic()``."""

    def __init__(self, script: list[tuple[int, dict[str, str]]]):
        self.script, self.arrived = script, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                server.arrived.append(time.monotonic())
                n = len(server.arrived) - 1
                status, headers = server.script[n] if n < len(server.script) else (200, {})
                body = json.dumps(COMPLETION if status == 200 else {"error": {"message": "busy"}}).encode()
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedServer:  # noqa: PYI034 (no typing.Self on 3.10)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize(
    ("script", "waits"),
    [
        # 0.1, then 0.2, then 0.4: backoff_s doubled at each retry
        ([(503, {}), (500, {}), (429, {})], [0.1, 0.2, 0.4]),
        # the server's 0.4 s is longer than 0.1 and is kept; its 0.01 s is not, and 0.2 is waited
        ([(429, {"Retry-After": "0.4"}), (503, {"Retry-After": "0.01"})], [0.4, 0.2]),
    ],
    ids=["doubling", "retry-after-when-longer"],
)
def test_the_waits_between_attempts(script, waits):
    with ScriptedServer(script) as server:
        ex = OpenAIExecutor(base_url=server.url, model="m", api_key_env=None, timeout_s=2,
                            max_retries=len(script), backoff_s=0.1)
        assert ex.complete(user("go")) == "done"
    gaps = [b - a for a, b in zip(server.arrived, server.arrived[1:])]
    assert len(gaps) == len(waits) and ex.n_retries == len(waits)
    # at least the wait, and less than the shortest wait beyond it (a local round trip takes a few ms)
    assert all(w <= g < w + 0.09 for g, w in zip(gaps, waits)), (gaps, waits)
