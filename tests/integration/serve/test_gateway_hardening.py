"""The gateway against hostile and broken traffic, on real servers over loopback (issue 32): paths that
leave ``/v1``, client values echoed into logs, wrong-shaped upstream answers, secrets in logs and errors.
The admin endpoints and a corrupt snapshot: test_gateway_admin.py; slow (dripping) clients and clients
that hang up mid-body: test_gateway_slow_clients.py.

Raw sockets send what an HTTP client library would refuse or normalise (``..`` in a path, a body that
stops half-way); everything else goes through httpx or the official ``openai`` client."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import sys
from collections.abc import Iterator

import httpx
import pytest
from builders import TINY_TOOLS
from gateway_harness import CHAT, make_gateway, raw_request, serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from stub_openai_server import StubOpenAIServer

from tracer.serve.http.metrics import JsonFormatter
from tracer.serve.log.sink import ConversationLog


def recording_upstream() -> Starlette:
    """Answers every path with ``{"path": ...}`` and records (method, raw path, headers) of each request."""
    seen: list[tuple[str, str, dict]] = []

    async def anything(request: Request) -> JSONResponse:
        seen.append((request.method, request.scope["raw_path"].decode("latin-1"), dict(request.headers)))
        return JSONResponse({"path": request.url.path})

    app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST", "DELETE"])])
    app.state.seen = seen
    return app


# ---- 5: paths that leave /v1 -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/v1/../admin",
        "/v1/%2e%2e/admin",
        "/v1/..%2fadmin",
        "/v1/x/../../../etc/passwd",
        "/v1/%2E%2E%2Fadmin",
        "/v1/./models",
        "/v1/x%5c..%5cadmin",
        "/v1/x\\..\\admin",
        "/v1/models%00",
        "/v1/a/%2e/b",
    ],
)
def test_a_passthrough_path_that_could_leave_v1_is_refused_and_never_forwarded(index_dir, minilm, path):
    upstream = recording_upstream()
    with serving(upstream) as up, serving(make_gateway(index_dir, minilm, up + "/v1").app) as url:
        status, body = raw_request(
            url, f"GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-x".encode()
        )
        ok = httpx.get(url + "/v1/models/m%20n?a=1", headers={"authorization": "Bearer sk-x"})
    assert status == 400, body
    assert httpx.Response(400, content=body).json()["error"]["param"] == "path"
    # only the well-formed request reached the upstream, its path as the client encoded it
    assert [(m, p) for m, p, _ in upstream.state.seen] == [
        ("GET", "/v1/models/m%20n")
    ] and ok.status_code == 200


# ---- 8: client values in logs and errors are bounded --------------------------------------------------
@contextlib.contextmanager
def json_log_lines() -> Iterator[list[str]]:
    """The ``tracer.serve`` records as the gateway's JSON formatter writes them (lines appended on exit)."""
    stream, lines = io.StringIO(), []
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tracer.serve")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        lines.extend(stream.getvalue().splitlines())


def test_a_2mb_client_value_makes_a_short_error_and_short_log_lines(index_dir, minilm):
    huge = "r" * 2 * 1024 * 1024
    tools = [t.to_openai() for t in TINY_TOOLS]
    dup = tools + [{"type": "function", "function": {"name": huge}}] * 2
    odd_role = {**CHAT, "messages": [{"role": huge, "content": "the weather in Paris"}], "tools": tools}
    with (
        StubOpenAIServer() as stub,
        serving(make_gateway(index_dir, minilm, stub.url).app) as url,
        json_log_lines() as lines,
    ):
        refused = httpx.post(url + "/v1/chat/completions", json={**CHAT, "tools": dup}, timeout=30)
        answered = httpx.post(url + "/v1/chat/completions", json=odd_role, timeout=30)
        long_id = {"x-tracer-conversation": "c" * 10_000}
        named = httpx.post(url + "/v1/chat/completions", json=CHAT, headers=long_id)
    error, first = refused.json()["error"], len(tools) + 1
    assert refused.status_code == 400 and error["param"] == f"tools[{first}].function.name"
    assert error["message"].startswith(
        f"tools[{first}].function.name: duplicate tool name (first at tools[{first - 1}]): 'rrr"
    ) and error["message"].endswith(" chars)")
    assert len(error["message"]) < 1100
    assert answered.status_code == 200 and len(stub.requests) == 1
    # a conversation id keys the sticky lists, the pending log and the outcome tokens: refused, not kept
    assert named.status_code == 400 and named.json()["error"] == {
        "message": "X-Tracer-Conversation: a conversation id is 1 to 256 printable ASCII characters "
                   "(got 10000 characters)", "type": "invalid_request_error",
        "param": "X-Tracer-Conversation", "code": None}
    assert lines and max(map(len, lines)) < 20_000, sorted(map(len, lines))[-3:]


def test_the_json_formatter_bounds_every_field_and_the_traceback():
    huge = "x" * 2 * 1024 * 1024
    record = logging.LogRecord("tracer.serve", logging.ERROR, __file__, 1, "msg %s", (huge,), None)
    record.conversation, record.nested = huge, {"a": [huge] * 3, huge: 1}
    try:
        raise ValueError(f"unknown role {huge!r}")
    except ValueError:
        record.exc_info = sys.exc_info()
    out = json.loads(JsonFormatter().format(record))
    marker = f"…({len(huge)} chars)"
    assert (out["conversation"] == "x" * 200 + marker
            and out["msg"] == "msg " + "x" * 996 + "…(2097156 chars)")
    assert out["nested"]["a"] == ["x" * 200 + marker] * 3
    assert (
        len(out["exc"]) < 10_000
        and out["exc"].startswith("Traceback")
        and "ValueError: unknown role" in out["exc"]
    )


# ---- 9: a wrong-shaped upstream answer is passed through, and /metrics counts what was sent ------------
@pytest.mark.parametrize("message", ["hi", 5, ["a"], None])
def test_an_answer_whose_message_is_not_an_object_passes_through_unchanged(
    index_dir, minilm, tmp_path, message
):
    answer = {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}
    sink = ConversationLog(tmp_path / "log")
    with (
        StubOpenAIServer(reply=lambda n, body: answer) as stub,
        serving(make_gateway(index_dir, minilm, stub.url, sink=sink).app) as url,
    ):
        r = httpx.post(
            url + "/v1/chat/completions",
            json={**CHAT, "tools": [t.to_openai() for t in TINY_TOOLS]},
            headers={"x-tracer-outcome": "success"},
        )
        metrics = httpx.get(url + "/metrics").text
    assert r.status_code == 200 and r.content == stub.replies[0]
    assert 'tracer_requests_total{status="200"} 1.0' in metrics and 'status="500"' not in metrics
    logged = [json.loads(line) for line in (tmp_path / "log" / "trajectories.jsonl").read_text().splitlines()]
    assert [m["role"] for m in logged[0]["messages"]] == ["user"]  # the request, no reply


# ---- 10: secrets: the upstream's password, the internal address ---------------------------------------
def test_the_upstream_password_is_never_logged_and_is_sent_as_basic_auth(index_dir, minilm):
    upstream = recording_upstream()
    with serving(upstream) as up:
        credentialed = up.replace("http://", "http://user:s3cret@") + "/v1"
        with json_log_lines() as lines, serving(make_gateway(index_dir, minilm, credentialed).app) as url:
            r = httpx.get(url + "/v1/models", headers={"authorization": "Bearer sk-client"})
    started = [json.loads(line) for line in lines if '"started"' in line]
    assert started and started[0]["upstream"] == up.replace("http://", "http://***@") + "/v1"
    assert not any("s3cret" in line for line in lines)
    # the URL's credentials authenticate the gateway to the upstream, in place of the client's header
    assert r.status_code == 200 and upstream.state.seen[0][2]["authorization"] == "Basic dXNlcjpzM2NyZXQ="


def test_an_unreachable_upstream_tells_the_client_nothing_of_its_address(index_dir, minilm):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once the socket is closed
    gateway = make_gateway(index_dir, minilm, f"http://user:s3cret@127.0.0.1:{port}/v1")
    with json_log_lines() as lines, serving(gateway.app) as url:
        r = httpx.post(url + "/v1/chat/completions", json=CHAT)
    error = r.json()["error"]
    assert r.status_code == 502 and error == {
        "message": "cannot reach the upstream",
        "type": "upstream_unreachable",
        "param": None,
        "code": None,
    }
    failed = [json.loads(line) for line in lines if '"upstream_unreachable"' in line]
    assert str(port) in failed[0]["error"] and not any(
        "s3cret" in line for line in lines
    )  # the detail: logged
