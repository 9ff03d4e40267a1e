"""The gateway against hostile and broken traffic, on real servers over loopback (issue 32): paths that
leave ``/v1``, client values echoed into logs, wrong-shaped upstream answers, secrets in logs and errors,
the admin endpoints, a corrupt snapshot, slow (dripping) clients and clients that hang up mid-body.

Raw sockets send what an HTTP client library would refuse or normalise (``..`` in a path, a body that
stops half-way); everything else goes through httpx or the official ``openai`` client."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from builders import TINY_TOOLS
from gateway_harness import drip, make_gateway, save_test_index, serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from stub_openai_server import StubOpenAIServer

from tracer.data import load_native
from tracer.retriever import Retriever
from tracer.serve.deadline import deadline_protocol
from tracer.serve.gateway import Gateway, GatewayConfig
from tracer.serve.logging_sink import ConversationLog
from tracer.serve.metrics import JsonFormatter
from tracer.serve.reload import IndexHolder, version_name

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, minilm):
    return save_test_index(tmp_path_factory.mktemp("hardening") / "index", minilm)


def recording_upstream() -> Starlette:
    """Answers every path with ``{"path": ...}`` and records (method, raw path, headers) of each request."""
    seen: list[tuple[str, str, dict]] = []

    async def anything(request: Request) -> JSONResponse:
        seen.append((request.method, request.scope["raw_path"].decode("latin-1"), dict(request.headers)))
        return JSONResponse({"path": request.url.path})

    app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST", "DELETE"])])
    app.state.seen = seen
    return app


def raw_request(url: str, head: bytes, body: bytes = b"", timeout: float = 10.0) -> tuple[int, bytes]:
    """Send ``head`` (request line and headers, ``\\r\\n\\r\\n`` added) and ``body`` as given on a raw
    socket; the status and body of the answer (read until the server closes)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(head + b"\r\nconnection: close\r\n\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


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


# ---- 11: the admin endpoints ---------------------------------------------------------------------------
TOOLS = [t.to_openai() for t in TINY_TOOLS]


def outcome(url: str, body: dict | bytes, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + "/v1/tracer/outcome", content=content, headers=headers, timeout=30)


def test_only_the_conversations_owner_or_the_admin_can_report_its_outcome(index_dir, minilm, tmp_path):
    sink = ConversationLog(tmp_path / "log")
    with (
        StubOpenAIServer() as stub,
        serving(make_gateway(index_dir, minilm, stub.url, sink=sink, admin_token="adm-1").app) as url,
    ):
        answers = [
            httpx.post(
                url + "/v1/chat/completions",
                json={**CHAT, "tools": TOOLS},
                headers={"x-tracer-conversation": conv},
            )
            for conv in ("a", "b", "c")
        ]
        token = {a.headers["x-tracer-conversation"]: a.headers["x-tracer-outcome-token"] for a in answers}
        no_token = outcome(url, {"conversation": "a", "success": True})
        others = outcome(
            url, {"conversation": "a", "success": True}, **{"x-tracer-outcome-token": token["b"]}
        )
        wrong_admin = outcome(url, {"conversation": "a", "success": True}, authorization="Bearer adm-2")
        owner = outcome(
            url,
            {"conversation": "a", "success": True, "reward": 0.5},
            **{"x-tracer-outcome-token": token["a"]},
        )
        admin = outcome(url, {"conversation": "b", "success": False}, authorization="Bearer adm-1")
        again = outcome(url, {"conversation": "a", "success": True}, **{"x-tracer-outcome-token": token["a"]})
    assert len(set(token.values())) == 3 and all(len(t) == 64 for t in token.values())
    assert [r.status_code for r in (no_token, others, wrong_admin)] == [403] * 3
    assert no_token.json()["error"]["type"] == "permission_error"
    assert (owner.status_code, admin.status_code, again.status_code) == (200, 200, 404)
    by_group = {t.group: t for t in load_native(tmp_path / "log").trajectories}
    assert (by_group["a"].success, by_group["a"].reward, by_group["a"].metadata["outcome"]) == (
        True,
        0.5,
        "reported",
    )
    assert (by_group["b"].success, by_group["b"].metadata["outcome"]) == (False, "reported")
    assert by_group["c"].metadata["outcome"] == "unreported"


@pytest.mark.parametrize(
    "reward", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"1" + b"0" * 400, b"true", b'"1"']
)
def test_a_reward_that_is_not_a_finite_number_is_a_400_naming_reward(index_dir, minilm, tmp_path, reward):
    sink = ConversationLog(tmp_path / "log")
    with serving(
        make_gateway(index_dir, minilm, "http://127.0.0.1:9/v1", sink=sink, admin_token="t").app
    ) as url:
        r = outcome(
            url, b'{"conversation": "a", "success": true, "reward": %s}' % reward, authorization="Bearer t"
        )
    assert r.status_code == 400 and r.json()["error"]["param"] == "reward"


def test_the_outcome_body_is_limited_before_it_is_read(index_dir, minilm, tmp_path):
    sink = ConversationLog(tmp_path / "log")
    with serving(make_gateway(index_dir, minilm, "http://127.0.0.1:9/v1", sink=sink).app) as url:
        declared, _ = raw_request(
            url,
            b"POST /v1/tracer/outcome HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: 41943040",
        )
        chunked = httpx.post(
            url + "/v1/tracer/outcome", content=iter([b'{"conversation": "' + b"x" * 65536] * 8)
        )
    assert declared == 413 and chunked.status_code == 413  # 40 MB announced, 512 KiB streamed: 16 KiB at most


def test_reload_is_off_without_the_admin_token_and_coalesced_and_rate_limited_with_it(index_dir, minilm):
    async def flood(url: str, n: int, token: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(
                *(c.post(url + "/v1/tracer/reload", headers={"authorization": token}) for _ in range(n))
            )

    with serving(make_gateway(index_dir, minilm, "http://127.0.0.1:9/v1").app) as url:
        off = httpx.post(url + "/v1/tracer/reload", headers={"authorization": "Bearer x"})
    assert off.status_code == 403 and "--admin-token" in off.json()["error"]["message"]
    gateway = make_gateway(index_dir, minilm, "http://127.0.0.1:9/v1", admin_token="adm", reload_interval_s=0)
    with serving(gateway.app) as url:
        assert asyncio.run(flood(url, 2, "Bearer wrong"))[0].status_code == 403
        answers = asyncio.run(flood(url, 20, "Bearer adm"))
        after = httpx.post(url + "/v1/tracer/reload", headers={"authorization": "Bearer adm"})
    statuses = [a.status_code for a in answers]
    assert gateway.holder.reloads == 1 and set(statuses) <= {200, 429} and statuses.count(200) >= 1
    assert all(a.json() == {"reloaded": True, "reloads": 1} for a in answers if a.status_code == 200)
    assert after.status_code == 429 and 1 <= int(after.headers["retry-after"]) <= 10


# ---- 12: a corrupt snapshot is tried once per version, and /health says so -----------------------------
def test_a_corrupt_snapshot_is_loaded_once_and_health_reports_it_until_a_good_one_is_published(
    index_dir, minilm, tmp_path
):
    served = tmp_path / "index"
    shutil.copytree(index_dir, served)
    loads: list[str] = []

    def load(d: Path) -> Retriever:
        loads.append((d / "CURRENT").read_text().strip())
        return Retriever.load(d, embedder=minilm, device="cpu")

    holder = IndexHolder(served, load)
    good = loads[0]
    gateway = Gateway(holder, GatewayConfig(upstream="http://127.0.0.1:9/v1", k=2, reload_interval_s=0.05))
    holder.retriever.save(served)  # publish a snapshot, then flip one byte of it
    bad = (served / "CURRENT").read_text().strip()
    victim = max((served / bad).glob("*.npy"), key=lambda p: p.stat().st_size)
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with serving(gateway.app) as url:
        deadline = time.monotonic() + 10
        while httpx.get(url + "/health").json()["status"] == "ok":
            assert time.monotonic() < deadline, "the corrupt snapshot was never tried"
            time.sleep(0.02)
        time.sleep(1.0)  # 20 polls
        degraded = httpx.get(url + "/health")
        tries = loads.count(bad)
        holder.retriever.save(served)  # a good snapshot again: a new version, loaded at the next poll
        while httpx.get(url + "/health").json()["status"] != "ok":
            assert time.monotonic() < deadline + 10, "the good snapshot was not loaded"
            time.sleep(0.02)
        healthy = httpx.get(url + "/health").json()
        metrics = httpx.get(url + "/metrics").text
    assert tries == 1 and degraded.status_code == 200
    report = degraded.json()
    assert report["status"] == "degraded" and report["version"] == good and report["failed_version"] == bad
    assert victim.name in report["reload_error"] and "SHA-256" in report["reload_error"]
    assert healthy["version"] == (served / "CURRENT").read_text().strip() and "reload_error" not in healthy
    assert 'tracer_errors_total{kind="reload_failed"} 1.0' in metrics and holder.reloads == 1


def test_a_version_that_failed_for_a_passing_reason_is_tried_again_with_backoff(index_dir, minilm, tmp_path):
    served, now, loads = tmp_path / "index", [0.0], []
    shutil.copytree(index_dir, served)

    def load(d: Path) -> Retriever:
        loads.append(now[0])
        if len(loads) > 1 and now[0] < 15:
            raise OSError(24, "Too many open files")
        return Retriever.load(d, embedder=minilm, device="cpu")

    holder = IndexHolder(served, load, clock=lambda: now[0])
    holder.retriever.save(served)  # a new version
    for now[0] in (0.0, 0.5, 1.0, 1.5, 2.9, 3.0, 6.9, 7.0, 14.0, 14.9):
        assert not holder.maybe_reload()
    assert loads[1:] == [0.0, 1.0, 3.0, 7.0] and holder.failure.attempts == 4  # after 1, 2, 4 s; next 8 s
    assert "Too many open files" in holder.failure.error and holder.version != version_name(
        holder.failure.token
    )
    now[0] = 15.0
    assert holder.maybe_reload() and holder.failure is None and loads[-1] == 15.0


# ---- 13: read deadlines: dripping clients are dropped, others are served meanwhile ----------------------
CHAT_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


@pytest.mark.parametrize(
    ("case", "first", "rest", "answer"),
    [
        ("headers dripped", b"", CHAT_HEAD + b"x-pad: " + b"a" * 200, b"HTTP/1.1 408 "),
        ("body dripped", CHAT_HEAD + b"content-length: 500\r\n\r\n", b"{" * 500, b"HTTP/1.1 408 "),
        ("nothing sent", b"", b"", b""),
        (
            "answered, body dripped",
            b"GET /health HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n",
            b"x" * 500,
            b"HTTP/1.1 200 ",
        ),
    ],
    ids=["headers-dripped", "body-dripped", "nothing-sent", "answered-body-dripped"],
)
def test_a_request_that_does_not_arrive_within_the_deadline_is_dropped(
    index_dir, minilm, case, first, rest, answer
):
    gateway = make_gateway(index_dir, minilm, "http://127.0.0.1:9/v1", read_timeout_s=1.0)
    protocol = deadline_protocol(1.0, lambda kind: gateway.metrics.errors.labels(kind).inc())
    with serving(gateway.app, http=protocol) as url, ThreadPoolExecutor(1) as pool:
        dripping = pool.submit(drip, url, first, rest, 20)
        time.sleep(0.3)
        t0 = time.monotonic()
        health = httpx.get(url + "/health", timeout=5)  # served meanwhile
        served_s = time.monotonic() - t0
        results = dripping.result()
        metrics = httpx.get(url + "/metrics").text
    assert health.status_code == 200 and served_s < 0.5
    assert all(1.0 <= t < 2.5 for t, _ in results), sorted(t for t, _ in results)
    assert all(got.startswith(answer) for _, got in results), results[0][1][:200]
    if answer == b"HTTP/1.1 408 ":
        assert all(b"connection: close" in got for _, got in results)
        kind = "header_timeout" if case == "headers dripped" else "body_timeout"
        assert f'tracer_errors_total{{kind="{kind}"}} 20.0' in metrics


# ---- 14: a client that hangs up mid-body -----------------------------------------------------------------
class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/files", "/v1/tracer/outcome"])
def test_a_client_that_hangs_up_mid_body_is_counted_and_logged_without_a_traceback(index_dir, minilm, path):
    caught = Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "tracer.serve")]
    with StubOpenAIServer() as stub, serving(make_gateway(index_dir, minilm, stub.url).app) as url:
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.addHandler(caught)
            logger.setLevel(logging.INFO)
        try:
            with socket.create_connection(url.removeprefix("http://").split(":")) as s:
                s.sendall(
                    f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n".encode() + b"{" * 300
                )
                time.sleep(0.2)
            deadline = time.monotonic() + 5
            while "client_disconnect" not in httpx.get(url + "/metrics").text:
                assert time.monotonic() < deadline, "the hang-up was not counted"
                time.sleep(0.05)
            time.sleep(0.2)
            served = httpx.post(url + "/v1/chat/completions", json=CHAT)
        finally:
            for logger, level in zip(loggers, levels):
                logger.removeHandler(caught)
                logger.setLevel(level)
        metrics = httpx.get(url + "/metrics").text
    assert served.status_code == 200 and not any(r.exc_info for r in caught.records), [
        r.getMessage() for r in caught.records
    ]
    events = [getattr(r, "event", None) for r in caught.records]
    assert (
        events.count("client_disconnect") == 1
        and 'tracer_errors_total{kind="client_disconnect"} 1.0' in metrics
    )
    if path != "/v1/tracer/outcome":  # the gateway's own endpoints are not in tracer_requests_total
        assert 'tracer_requests_total{status="499"} 1.0' in metrics
