"""A local, deterministic OpenAI-compatible chat-completions server for tests.

``POST /v1/chat/completions`` answers with realistic OpenAI JSON (``choices[0].message`` with
``tool_calls``, ``finish_reason``, ``usage``). The policy reads the last user message:

* no tools given, ``tool_choice: "none"``, or the message contains ``[text]``: a content-only
  reply, ``"echo: <last user message>"``;
* otherwise one tool call: the token ``call:NAME`` forces ``NAME`` (presented or not); else the
  first presented tool whose name occurs in the message; else the first presented tool;
* arguments: each ``key=value`` token of the message whose key is a property of the chosen tool
  (the value JSON-decoded when it parses, else kept as a string); ``[malformed]`` in the message
  makes the arguments a truncated JSON string; ``sleep=SECONDS`` delays that one reply;
* ``id`` is ``call_<n>`` with ``n`` the 0-based index of the request (failed ones included);
* ``usage.prompt_tokens`` is the number of whitespace-separated tokens in
  ``json.dumps({"messages": ..., "tools": ...})`` (see :func:`count_prompt_tokens`) and
  ``completion_tokens`` the same count over the returned message.

``policy``: a function of the request body returning the assistant message (``content`` and
``tool_calls``) replaces the built-in policy, for tests that script a whole agent (the response
envelope, ids' numbering and ``usage`` stay the server's).

``reply``: a function of (request index, body) returning the whole 200 reply (any JSON value),
for wrong-shaped replies. ``drip_s``: the reply's body is written one byte every ``drip_s``
seconds (its Content-Length announced up front), a server that never times a client out read by read.

Fault injection: ``fail_first=N`` answers the first N requests with ``fail_status`` (500, 429,
400, ...) and an OpenAI-style error body; ``delay_s`` delays every reply; ``delay_first=N`` with
``delay_first_s`` delays only the first N (to make a client time out). Every request body and its
headers are recorded in order; ``max_in_flight`` is the largest number of requests it was serving
at once; ``replies`` holds the exact bytes of every answer body it sent.

Streaming: a request with ``"stream": true`` that succeeds is answered as server-sent events, one
``chat.completion.chunk`` per field of the message (role, then content or each tool call), then
``data: [DONE]``; the connection closes at the end (HTTP/1.0), as a chunked upstream would end.

Use it as a context manager; it listens on 127.0.0.1 on an ephemeral port and serves only what the
test sends::

    with StubOpenAIServer(fail_first=1, fail_status=429) as server:
        executor = OpenAIExecutor(base_url=server.url, model="stub")
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_KV = re.compile(r"(\w+)=(\S+)")
_FORCE = re.compile(r"\bcall:(\S+)")
_SLEEP = re.compile(r"\bsleep=([0-9.]+)")


def count_prompt_tokens(messages: list, tools: list) -> int:
    """The stub's deterministic prompt-token count."""
    return len(json.dumps({"messages": messages, "tools": tools}).split())


def _last_user_text(messages: list) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):  # content parts
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content or ""
    return ""


def _arguments(text: str, tool: dict | None) -> dict[str, Any]:
    props = ((tool or {}).get("parameters") or {}).get("properties") or {}
    args: dict[str, Any] = {}
    for key, value in _KV.findall(text):
        if key in props:
            try:
                args[key] = json.loads(value)
            except ValueError:
                args[key] = value
    return args


class StubOpenAIServer:
    """See the module docstring. Attributes to read after a test: ``requests`` (bodies),
    ``headers``, ``max_in_flight``, ``url`` (the ``/v1`` root)."""

    def __init__(self, *, fail_first: int = 0, fail_status: int = 500, delay_s: float = 0.0,
                 delay_first: int = 0, delay_first_s: float = 0.0,
                 policy: Callable[[dict], dict] | None = None,
                 reply: Callable[[int, dict], Any] | None = None, drip_s: float = 0.0):
        self.policy = policy
        self.reply = reply
        self.drip_s = drip_s
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.delay_s = delay_s
        self.delay_first = delay_first
        self.delay_first_s = delay_first_s
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.replies: list[bytes] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> StubOpenAIServer:  # noqa: PYI034 (no typing.Self on 3.10)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                stub._handle(self)

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="stub-openai", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    @property
    def port(self) -> int:
        assert self._httpd is not None, "the server is not running"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- one request -----------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            status, reply = self._reply(h)
        finally:
            with self._lock:  # before the reply is written: the client cannot start its next one earlier
                self.in_flight -= 1
        streamed = status == 200 and isinstance(reply, dict) and reply.get("_stream")
        data = _sse(reply) if streamed else json.dumps(reply).encode("utf-8")
        with self._lock:
            self.replies.append(data)
        try:
            h.send_response(status)
            h.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
            if not streamed:
                h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if not self.drip_s:
                h.wfile.write(data)
            for i in range(len(data) if self.drip_s else 0):
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                time.sleep(self.drip_s)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and hung up
            pass

    def _reply(self, h: BaseHTTPRequestHandler) -> tuple[int, dict]:
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with self._lock:
            n = len(self.requests)
            self.requests.append(body if isinstance(body, dict) else {"_raw": raw.decode("utf-8", "replace")})
            self.headers.append(dict(h.headers))
        delay = self.delay_s + (self.delay_first_s if n < self.delay_first else 0.0)
        text = _last_user_text(body.get("messages") or []) if isinstance(body, dict) else ""
        sleep = _SLEEP.search(text)
        time.sleep(delay + (float(sleep.group(1)) if sleep else 0.0))

        if h.path.rstrip("/") != "/v1/chat/completions":
            return 404, _error(f"no route {h.path}", "not_found_error", 404)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or "model" not in body:
            return 400, _error("body must be a JSON object with model and messages", "invalid_request_error",
                               400)
        if n < self.fail_first:
            kind = "rate_limit_error" if self.fail_status == 429 else "server_error"
            return self.fail_status, _error(f"injected failure {n + 1} of {self.fail_first}", kind,
                                            self.fail_status)
        if self.reply is not None:
            return 200, self.reply(n, body)
        return 200, self._completion(n, body, text)

    def _completion(self, n: int, body: dict, text: str) -> dict:
        messages, tools = body["messages"], body.get("tools") or []
        message: dict[str, Any]
        if self.policy is not None:
            message = {"role": "assistant", **self.policy(body)}
            finish = "tool_calls" if message.get("tool_calls") else "stop"
        elif not tools or body.get("tool_choice") == "none" or "[text]" in text:
            message = {"role": "assistant", "content": f"echo: {text}", "tool_calls": []}
            finish = "stop"
        else:
            functions = [t["function"] for t in tools]
            forced = _FORCE.search(text)
            if forced:
                name = forced.group(1)
            else:
                name = next((f["name"] for f in functions if f["name"] in text), functions[0]["name"])
            tool = next((f for f in functions if f["name"] == name), None)
            arguments = '{"city": "Par' if "[malformed]" in text else json.dumps(_arguments(text, tool))
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": arguments}}]}
            finish = "tool_calls"
        prompt_tokens = count_prompt_tokens(messages, tools)
        completion_tokens = len(json.dumps(message).split())
        return {
            **({"_stream": True} if body.get("stream") else {}),
            "id": f"chatcmpl-stub-{n}",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


def _sse(reply: dict) -> bytes:
    """A completion as server-sent events: role, then content or each tool call, then the finish reason."""
    message, choice = reply["choices"][0]["message"], reply["choices"][0]
    head = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for i, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": i, **call}]})
    chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _error(message: str, kind: str, code: int) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
