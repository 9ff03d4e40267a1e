"""Serving an ASGI app on a loopback port from a test (uvicorn in a thread, stopped on exit), the
gateway the tests serve: a small real index (MiniLM, ``tracer_fixed`` on ``data/example``), what the tests
send it (the tiny tools, a weather request, a minimal chat body, the official ``openai`` client), and raw
sockets: :func:`raw_request`, a request sent as given, :func:`drip`, clients that send a request one byte
at a time, and :class:`RawUpstream`, an upstream that answers as no framework would. :func:`metric` reads
the gateway's ``/metrics``; :func:`mcp_served` serves ``tracer mcp``'s HTTP app in a test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import openai
import uvicorn
from builders import TINY_TOOLS
from prometheus_client.parser import text_string_to_metric_families

from tracer.retriever import Retriever
from tracer.serve.http.gateway import Gateway, GatewayConfig
from tracer.serve.reload import IndexHolder

TOOLS = [t.to_openai() for t in TINY_TOOLS]
NAMES = [t.name for t in TINY_TOOLS]
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Email it to Bob"}]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def save_test_index(path: Path, minilm) -> Path:
    """The gateway tests' index: ``tracer_fixed`` fitted on ``data/example``, saved to ``path``."""
    Retriever.from_dataset("data/example", "tracer_fixed", embedder=minilm, device="cpu").save(path)
    return path


def make_gateway(index_dir, minilm, upstream: str, sink=None, **config) -> Gateway:
    holder = IndexHolder(index_dir, lambda d: Retriever.load(d, embedder=minilm, device="cpu"))
    return Gateway(holder, GatewayConfig(upstream=upstream, **{"k": 2, **config}), sink)


@contextlib.contextmanager
def serving(app, timeout_s: float = 20.0, **options) -> Iterator[str]:
    """Run ``app`` on 127.0.0.1 (an ephemeral port) and yield its ``http://127.0.0.1:PORT`` root;
    ``options`` go to ``uvicorn.Config`` (``http=`` a protocol class, ...)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           access_log=False, lifespan="on", **options))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)


def drip(url: str, first: bytes, rest: bytes, n: int, every_s: float = 0.1,
         give_up_s: float = 8.0) -> list[tuple[float, bytes]]:
    """``n`` connections each send ``first`` at once, then ``rest`` one byte every ``every_s``; for each,
    (seconds until the server closed it, or inf past ``give_up_s``; the bytes it answered)."""
    host, port = url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(n)]
    t0, got, closed = time.monotonic(), {s: b"" for s in socks}, {}
    for s in socks:
        if first:
            s.sendall(first)
        s.setblocking(False)
    i = 0
    while len(closed) < n and time.monotonic() - t0 < give_up_s:
        for s in (s for s in socks if s not in closed):
            with contextlib.suppress(BlockingIOError):
                try:
                    while chunk := s.recv(65536):
                        got[s] += chunk
                    closed[s] = time.monotonic() - t0  # EOF
                    continue
                except ConnectionResetError:
                    closed[s] = time.monotonic() - t0
                    continue
            if i < len(rest):
                try:
                    s.send(rest[i:i + 1])
                except (BrokenPipeError, ConnectionResetError):
                    closed[s] = time.monotonic() - t0
        i += 1
        time.sleep(every_s)
    for s in socks:
        s.close()
    return [(closed.get(s, float("inf")), got[s]) for s in socks]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


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


def metric(url: str, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels`` on the gateway at ``url`` (``/metrics``); 0 if absent."""
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


class RawUpstream:
    """An upstream on a raw asyncio socket server in a thread of its own (``with RawUpstream() as up:``,
    ``up.url`` its ``/v1`` root), for answers no framework gives: a subclass writes ``_connection``."""

    def __init__(self):
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    @staticmethod
    async def read_request(reader: asyncio.StreamReader) -> bytes:
        """One request read whole (its body by Content-Length); its head. A closed connection raises
        ``asyncio.IncompleteReadError``."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length.group(1)) if length else 0)
        return head

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        self._server = self._loop.run_until_complete(asyncio.start_server(self._connection, sock=sock))
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self):
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextlib.asynccontextmanager
async def mcp_served(router) -> AsyncIterator[str]:
    """``tracer mcp``'s streamable-HTTP app (:meth:`ToolRouter.http_app`) on a loopback port, uvicorn in this
    event loop; yields the /mcp URL."""
    server = uvicorn.Server(uvicorn.Config(router.http_app(), host="127.0.0.1", port=0, log_level="warning"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(20):
            while not server.started:
                await anyio.sleep(0.02)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/mcp"
        server.should_exit = True
