"""Where a request's time goes inside ``tracer serve``, and what the cyclic collector does meanwhile.

    python -m benchmarks.gateway_stages --index DIR                 # 16 clients, 250 ms pauses, 1000 requests
    python -m benchmarks.gateway_stages --index DIR --gc-threshold 700  # CPython's default young threshold

The stub upstream and the load generator are those of ``benchmarks/bench_gateway.py``; the gateway is ``tracer
serve`` itself, started by this file with ``--role gateway``, which wraps the gateway's stages with timestamps
(a per-request ``contextvars`` record: the ASGI call, body read, parse and checks, choosing, building the
forwarded body, the upstream round trip to its headers, reading its body, the answer sent) and times every
collection of the cyclic collector from the first request on (``gc.callbacks``), both after a warm-up. It
prints medians / p90 / p99 per stage (ms), the collections per generation, how many texts the gateway had to
embed (0: every context was cached), and, with ``--quiet-loop``, the same choosing done in one plain loop over
the bodies (no HTTP, no other process): the CPU of each part.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import gc
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

STAGES = ("asgi", "chat", "body_read", "parsed", "select_start", "selected", "forward_start",
          "upstream_headers", "upstream_body", "chat_done", "sent")


def instrumented_gateway(argv: list[str], gc_threshold: int | None) -> None:
    """``tracer serve`` with stage timestamps and collector timings, printed as JSON on stderr at shutdown."""
    import tracer.cli.serve as cli_serve
    import tracer.serve.http.gateway as g
    from tracer.cli import main

    current: contextvars.ContextVar[dict] = contextvars.ContextVar("stages")
    records: list[dict] = []
    collections: list[tuple[int, float]] = []
    started: dict[str, float] = {}

    def mark(name: str) -> None:
        current.get()[name] = time.perf_counter()

    def timed(fn, before: str | None, after: str):
        if asyncio.iscoroutinefunction(fn):
            async def wrapper(*a, **k):
                if before:
                    mark(before)
                out = await fn(*a, **k)
                mark(after)
                return out
        else:
            def wrapper(*a, **k):
                if before:
                    mark(before)
                out = fn(*a, **k)
                mark(after)
                return out
        return wrapper

    g.Gateway.chat = timed(g.Gateway.chat, "chat", "chat_done")
    g.Gateway._read_body = timed(g.Gateway._read_body, None, "body_read")
    g.parse_chat_request = timed(g.parse_chat_request, None, "parsed")
    g.Gateway._select = timed(g.Gateway._select, "select_start", "selected")
    g.Upstream.open = timed(g.Upstream.open, "forward_start", "upstream_headers")
    g.read_all = timed(g.read_all, None, "upstream_body")

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif records:  # steady state only: loading the index collects too
            collections.append((info["generation"], time.perf_counter() - started["t"]))
    gc.callbacks.append(on_gc)
    # SIGUSR1 (sent by the driver after its warm-up): start counting again
    signal.signal(signal.SIGUSR1, lambda *_: (records.clear(), collections.clear()))

    built: list[g.Gateway] = []
    build, run_uvicorn, freeze = cli_serve.build, cli_serve.uvicorn.run, cli_serve.freeze_long_lived

    def build_and_keep(args):
        built.append(build(args))
        return built[-1]

    def freeze_then_threshold() -> None:
        freeze()
        if gc_threshold is not None:
            gc.set_threshold(gc_threshold, *gc.get_threshold()[1:])

    def serve_timed(app, **kw):
        async def asgi(scope, receive, send):
            if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
                return await app(scope, receive, send)
            record = {"asgi": time.perf_counter()}
            current.set(record)
            await app(scope, receive, send)
            record["sent"] = time.perf_counter()
            records.append(record)
        run_uvicorn(asgi, **kw)

    close = g.Upstream.close

    async def report_then_close(self):  # the lifespan's exit, before uvicorn re-raises SIGTERM
        print(json.dumps(summary(records, collections, built[0].holder.retriever.res.embedder.n_encoded)),
              file=sys.stderr, flush=True)
        await close(self)

    cli_serve.build, cli_serve.uvicorn.run, cli_serve.freeze_long_lived = build_and_keep, serve_timed, \
        freeze_then_threshold
    g.Upstream.close = report_then_close
    main(["serve", *argv])


def summary(records: list[dict], collections: list[tuple[int, float]], encoded: int) -> dict:
    whole = np.array([[r[s] for s in STAGES] for r in records if all(s in r for s in STAGES)])  # [R, S]
    steps = np.diff(whole, axis=1) * 1e3                                                     # [R, S-1] ms
    out = {"requests": len(whole), "texts_embedded": encoded, "stages_ms_p50_p90_p99": {
        f"{a} -> {b}": np.round(np.percentile(steps[:, i], [50, 90, 99]), 3).tolist()
        for i, (a, b) in enumerate(itertools.pairwise(STAGES))}}
    own = (whole[:, -1] - whole[:, 0]) * 1e3 - steps[:, STAGES.index("select_start")] \
        - steps[:, STAGES.index("forward_start")]  # beyond choosing and the upstream round trip
    out["gateway_own_ms_p50_p90_p99"] = np.round(np.percentile(own, [50, 90, 99]), 3).tolist()
    by_gen = {}
    for gen in range(3):
        d = np.array([t for g_, t in collections if g_ == gen]) * 1e3
        by_gen[f"gen{gen}"] = {"count": len(d), "total_ms": round(float(d.sum()), 1),
                               "max_ms": round(float(d.max()), 3) if len(d) else 0.0}
    out["collections"] = by_gen
    return out


def quiet_loop(bodies: list[bytes], index: Path) -> dict:
    """CPU per request of parsing and choosing in one plain loop (no HTTP), after a warm-up pass."""
    from tracer.retriever import Retriever
    from tracer.serve.conversations import ConversationIds
    from tracer.serve.http.validation import parse_chat_request
    from tracer.serve.selection import StickyPresenter, UnknownToolVectors, choose

    r = Retriever.load(index, k=5, device="cpu")
    gc.collect()
    gc.freeze()
    unknown, presenter, conversations = UnknownToolVectors(), StickyPresenter(True, 20), ConversationIds()
    parsed = [parse_chat_request(b) for b in bodies]
    for body, names in parsed[:200]:
        choose(r, body["messages"], body["tools"], 5, unknown, None, names)
    t0 = time.process_time()
    for b in bodies:
        parse_chat_request(b)
    t1 = time.process_time()
    for body, names in parsed:
        presenter.present(conversations.assign(body["messages"]).id,
                          choose(r, body["messages"], body["tools"], 5, unknown, None, names), names)
    t2 = time.process_time()
    for body, _ in parsed:
        r.rank(body["messages"])
    t3 = time.process_time()
    n = len(bodies) / 1e3
    return {"parse_and_check_ms": round((t1 - t0) / n, 3), "choose_and_present_ms": round((t2 - t1) / n, 3),
            "retriever_rank_ms": round((t3 - t2) / n, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=("drive", "gateway", "stub"), default="drive")
    p.add_argument("--index", type=Path, default=None, help="a saved BFCL index (see bench_gateway)")
    p.add_argument("--stub-port", type=int, default=0, help="(--role stub) its port")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--think-ms", type=float, default=250.0)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--gc-threshold", type=int, default=None, help="the gateway's young-generation threshold")
    p.add_argument("--quiet-loop", action="store_true")
    args, rest = p.parse_known_args()
    if args.role == "gateway":
        instrumented_gateway(["--index", str(args.index), *rest], args.gc_threshold)
        return
    # imported after the gateway's branch: the instrumented gateway process imports only what ``tracer serve``
    # does
    from benchmarks import loopback

    if args.role == "stub":
        loopback.serve(loopback.stub_app(), args.stub_port)
        return
    if args.index is None:
        p.error("--index is required")

    bodies, index = loopback.build_requests(args.requests, args.index)
    stub_port, gw_port = loopback.free_port(), loopback.free_port()
    env = {**os.environ, "PYTHONPATH": str(loopback.ROOT), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    stub = subprocess.Popen([sys.executable, "-m", "benchmarks.gateway_stages", "--role", "stub",
                             "--stub-port", str(stub_port)], env=env)
    gateway = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gateway_stages", "--role", "gateway", "--index", str(index),
         # the rest is tracer serve's
         *(["--gc-threshold", str(args.gc_threshold)] if args.gc_threshold is not None else []),
         "--upstream", f"http://127.0.0.1:{stub_port}/v1", "--port", str(gw_port), "--k", "5",
         "--log-level", "warning"], env=env, cwd=loopback.ROOT, stderr=subprocess.PIPE, text=True)
    try:
        loopback.wait_ready(f"http://127.0.0.1:{stub_port}/health", stub)
        loopback.wait_ready(f"http://127.0.0.1:{gw_port}/health", gateway)
        url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        asyncio.run(loopback.run_phase(url, bodies[:200], 4, 60))  # warm-up
        gateway.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        load = os.getloadavg()[0]
        phase = asyncio.run(loopback.run_phase(url, bodies, args.clients, 120, args.think_ms / 1e3))
    finally:
        gateway.send_signal(signal.SIGTERM)
        _, err = gateway.communicate(timeout=60)
        stub.terminate()
        stub.wait(30)
    report = json.loads([line for line in err.splitlines() if line.startswith('{"requests"')][-1])
    report.update(load_avg_1m=round(load, 2), errors=phase["errors"], clients=args.clients,
                  think_ms=args.think_ms)
    if args.quiet_loop:
        report["quiet_loop_cpu_per_request"] = quiet_loop(bodies, index)
    for key, value in report.items():
        print(f"{key}: {json.dumps(value)}")


if __name__ == "__main__":
    main()
