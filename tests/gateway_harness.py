"""Serving an ASGI app on a loopback port from a test (uvicorn in a thread, stopped on exit), and the
gateway the tests serve: a small real index (MiniLM, ``tracer_fixed`` on ``data/example``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from tracer.retriever import Retriever
from tracer.serve.gateway import Gateway, GatewayConfig
from tracer.serve.reload import IndexHolder


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
