"""The gateway's hop to the upstream (tracer/serve/http/upstream.py) on real servers: bytes and headers pass
through untouched (compressed bodies, repeated headers, query strings), a kept-alive connection the
upstream dropped is retried once for an idempotent method only, an unreachable upstream is a 502."""

from __future__ import annotations

import asyncio
import gzip
import socket

import httpx
from gateway_harness import RawUpstream, make_gateway, serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ANSWER = b'{"id": "c", "object": "chat.completion", "choices": []}'
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def upstream_app() -> Starlette:
    """Answers chat completions gzip-compressed with two Set-Cookie headers; echoes other paths' query."""
    seen: list[dict] = []

    async def completions(request: Request) -> Response:
        seen.append(dict(request.headers))
        answer = Response(gzip.compress(ANSWER), headers={"content-encoding": "gzip", "x-upstream": "yes"},
                          media_type="application/json")
        answer.raw_headers += [(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")]
        return answer

    async def other(request: Request) -> Response:
        return Response(f"{request.url.path}?{request.url.query}", media_type="text/plain")

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]),
                            Route("/v1/{path:path}", other, methods=["GET"])])
    app.state.seen = seen
    return app


def test_answers_pass_through_byte_for_byte_compressed_with_repeated_headers(index_dir, minilm):
    upstream = upstream_app()
    with serving(upstream) as up, serving(make_gateway(index_dir, minilm, up + "/v1").app) as url:
        headers = {"authorization": "Bearer sk-x", "accept-encoding": "gzip", "x-tracer-conversation": "c1"}
        with httpx.stream("POST", url + "/v1/chat/completions", json=CHAT, headers=headers) as r:
            raw = b"".join(r.iter_raw())
            assert r.status_code == 200 and raw == gzip.compress(ANSWER)  # not decompressed on the way
            assert r.headers["content-encoding"] == "gzip" and r.headers["x-upstream"] == "yes"
            assert r.headers.get_list("set-cookie") == ["a=1", "b=2"]
            assert r.headers["x-tracer-conversation"] == "c1"
        sent = upstream.state.seen[0]
        assert sent["authorization"] == "Bearer sk-x" and sent["accept-encoding"] == "gzip"
        assert not any(k.startswith("x-tracer-") for k in sent)
        assert httpx.get(url + "/v1/models/m?a=1&b=two").text == "/v1/models/m?a=1&b=two"


class DroppingUpstream(RawUpstream):
    """An upstream that answers the first request of each connection and keeps it alive, then closes it
    on the second request without answering: the race between reusing an idle kept-alive connection and
    the server closing it, made to happen every time (a raw socket server: no framework closes this way)."""

    def __init__(self):
        super().__init__()
        self.answered = self.dropped = 0

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for n in range(2):
            try:
                await self.read_request(reader)
            except asyncio.IncompleteReadError:
                break
            if n == 1:
                self.dropped += 1
                break
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
            await writer.drain()
            self.answered += 1
        writer.close()



def test_a_kept_alive_connection_the_upstream_dropped_is_retried_only_for_an_idempotent_method(index_dir,
                                                                                                minilm):
    """The upstream read the second POST before it closed: it may have run it, so it is not sent again (a
    502; issue 56, defect 5). A GET on the same race is sent again once, on a fresh connection (aiohttp's
    rule for idempotent methods, RFC 9112 9.3.1.1)."""
    with DroppingUpstream() as up, serving(make_gateway(index_dir, minilm, up.url).app) as url:
        posts = [httpx.post(url + "/v1/chat/completions", json=CHAT) for _ in range(2)]
        posts_seen = (up.answered, up.dropped)
        gets = [httpx.get(url + "/v1/models") for _ in range(2)]
    assert [a.status_code for a in posts] == [200, 502] and posts_seen == (1, 1)
    assert [(a.status_code, a.content) for a in gets] == [(200, ANSWER)] * 2
    assert (up.answered, up.dropped) == (3, 2)  # the second GET went again, on a fresh connection


def test_an_unreachable_upstream_is_a_502(index_dir, minilm):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once the socket is closed
    with serving(make_gateway(index_dir, minilm, f"http://127.0.0.1:{closed}/v1").app) as url:
        r = httpx.post(url + "/v1/chat/completions", json=CHAT)
        metrics = httpx.get(url + "/metrics").text
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_unreachable"
    assert 'tracer_errors_total{kind="upstream_unreachable"} 1.0' in metrics
