"""The gateway against slow and vanishing clients, on real servers over loopback (issue 32): requests that
do not arrive within the read deadline are dropped while others are served, and a client that hangs
up mid-body is counted and logged without a traceback. Raw sockets send what an HTTP client library
would not (a request dripped one byte at a time, a body that stops half-way)."""

from __future__ import annotations

import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gateway_harness import CHAT, drip, make_gateway, serving
from stub_openai_server import StubOpenAIServer

from tracer.serve.http.deadline import deadline_protocol

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
